"""What a suite says should happen: one keyword-only, immutable ``Expect`` from the
fixture's ``chaos.expect(...)`` to every checker.

What a suite leaves unset (None) the fixture derives from its faults and the profile
(``dataclasses.replace``: an Expect is never changed in place); a checker reads an unset
field as its neutral value (no charge expected, no SLO, not deterministic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from chaos.verdicts.states import Baseline
from chaos.verdicts.tolerance import STATE_RTOL, valid_rtol


@dataclasses.dataclass(frozen=True, kw_only=True)
class Expect:
    """What a suite says should happen (``chaos.expect(...)``), e.g.
    ``chaos.expect(budget_exhausted=True)``.  ``final_state=True`` also compares the run's final
    state with a fault-free run's; ``baseline=True`` follows the run step by step against one (as
    --chaos-baseline); ``deterministic=True`` makes a state value that does not reproduce a
    failure; ``charge_outcomes``: the charges measured for an ``xid`` fault, one of which must be
    seen; ``head_outcome``: what a head fault should do to the run (default: what Ray was measured
    to do).  What it leaves unset follows from the faults: the charge each costs, the SLOs of
    their kinds (the profile's, else --chaos-slo-detect / --chaos-slo-recover), the workload's
    determinism."""

    # budget class -> failures the faults should charge (None: what each fault's kind costs)
    charged: Mapping[str, int] | None = None
    # fault kind -> the budget class each of its faults should be charged to (a kind left out: the
    # catalog's; a kind mapped to None: none claimed, where the suite's own ``charged`` does not name
    # the kind's class)
    charge_by_kind: Mapping[str, str | None] | None = None
    budget_exhausted: bool = False
    slo_detect_s: float | None = None
    slo_recover_s: float | None = None
    # A preempted run must (True) or must not (False) commit a checkpoint between the notice and
    # the node's end; None: the preemption verdict only reports what happened.
    checkpoint_in_window: bool | None = None
    final_state: bool = False  # compare the final state with the fault-free run's (``reference``)
    baseline: bool = False  # follow the run step by step against the fault-free run's (``reference``)
    # The workload gives the same metrics from the same state at the same step: a state value
    # that does not reproduce fails; without it, it is a warning (None: what the workload declares).
    deterministic: bool | None = None
    # every state comparison's relative tolerance (None: --chaos-state-rtol's, else STATE_RTOL; ``rtol``)
    state_rtol: float | None = None
    # A lasting fault's (xid, storage: catalog charge_measured) per-class charges measured on this
    # platform; the one seen must be among them (None: none measured, the charge is unverifiable).
    charge_outcomes: tuple[Mapping[str, int], ...] | None = None
    head_outcome: str | None = None  # what a head fault should do (None: what the pinned Ray does)
    reference: Baseline | None = None  # the fault-free run chaos.baseline made (final_state, baseline)

    def __post_init__(self) -> None:
        if self.charge_outcomes is not None and not isinstance(self.charge_outcomes, tuple):
            object.__setattr__(self, "charge_outcomes", tuple(self.charge_outcomes))
        if self.state_rtol is not None and not valid_rtol(self.state_rtol):
            raise ValueError(f"state_rtol={self.state_rtol!r}: a relative tolerance is a finite number >= 0 (an "
                             "infinite one reproduces every state)")

    @property
    def rtol(self) -> float:
        """The tolerance every state comparison uses."""
        return STATE_RTOL if self.state_rtol is None else self.state_rtol

    @property
    def charges(self) -> dict[str, int]:
        """The expected charges per class, the ones of zero left out."""
        return {k: v for k, v in (self.charged or {}).items() if v}

    @property
    def is_deterministic(self) -> bool:
        return bool(self.deterministic)

    @property
    def trajectory(self) -> Baseline | None:
        """The fault-free run to follow step by step, where the suite asked for it."""
        return self.reference if self.baseline else None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["reference"] = self.reference.to_json() if self.reference is not None else None
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Expect:
        """An Expect as ``to_json`` wrote it, or as the contract fixtures of earlier rounds
        hold it (``trajectory``/``final_state`` then held the baseline itself)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in fields and k not in ("reference", "final_state")}
        reference = data.get("reference") or data.get("trajectory")
        if isinstance(data.get("final_state"), Mapping):
            reference = reference or data["final_state"]
        kw["final_state"] = bool(data.get("final_state"))
        kw["baseline"] = bool(data.get("baseline") or data.get("trajectory"))
        if kw.get("charge_outcomes") is not None:
            kw["charge_outcomes"] = tuple(kw["charge_outcomes"])
        return cls(**kw, reference=Baseline.from_json(reference) if reference else None)
