"""A dry run's plan: what one chaos test would do, from read-only state only.

``--chaos-dry-run`` submits no job, takes no lock, writes no ledger entry and touches no
host.  It reads Ray's node table over the dashboard and the profile's rules, and says for
each fault what it is, how its target will be chosen, which nodes the safety rules let it
hit now (and why the others are refused, and how to allow them), when it fires, what it
should cost and how fast recovery must be — and names what only a live run can resolve.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

from chaos.errors import ChaosError
from chaos.faults.catalog import limit_name
from chaos.safety import NodeInfo

if TYPE_CHECKING:
    from chaos.backends.base import Backend
    from chaos.train.run import RunSpec
    from chaos.verdicts import Expect

#: budget limits the reference workload takes as parameters (a user's script keeps its own)
_LIMITS = ("max_failures", "max_preemption_failures")


@dataclasses.dataclass
class Nodes:
    """The cluster's live nodes as the safety rules see them now; ``unread``: why none could be
    read (the embedded cluster is not started in a dry run; a node table that did not answer)."""

    eligible: list[NodeInfo] = dataclasses.field(default_factory=list)
    refused: list[tuple[NodeInfo, str]] = dataclasses.field(default_factory=list)
    unread: str | None = None

    @classmethod
    def read(cls, backend: "Backend") -> "Nodes":
        if backend.cluster is None:
            return cls(unread=_unstarted(backend))
        try:
            alive = [n for n in backend.cluster.nodes() if n.alive]
            infos = [(n, backend.node_info(n.node_id)) for n in alive]
        except ChaosError as e:
            return cls(unread=f"the node table could not be read: {e}")
        unknown = [(NodeInfo(n.node_id, n.ip, is_head=n.is_head), "nothing is known about it (node_info found no "
                    "host for it), so it is never targeted") for n, info in infos if info is None]
        eligible, refused = backend.safety.split(info for _, info in infos if info is not None)
        return cls(eligible, refused + unknown)

    def for_fault(self, fault) -> tuple[list[NodeInfo], list[tuple[NodeInfo, str]]]:
        """(eligible, refused) among the nodes this fault can hit at all: the head for a
        head fault, else every node (the head among them, refused unless allowed)."""
        if getattr(fault, "loses_the_head", False):
            return ([n for n in self.eligible if n.is_head], [(n, why) for n, why in self.refused if n.is_head])
        return self.eligible, self.refused


def _unstarted(backend: "Backend") -> str:
    config = getattr(backend, "config", None)
    workers = f"{config.workers} worker nodes, " if config is not None else ""
    head = "the head too (a head-fault cluster)" if backend.settings.allow_head else "never the head"
    every = "every worker" if backend.settings.allow_all_workers else "workers the safety rules allow"
    return (f"the embedded cluster is not started in a dry run: it would have {workers}{every} targetable, {head}")


def lines(test_id: str, backend: "Backend", spec: "RunSpec", faults: Sequence[tuple[object, object]],
          expect: "Expect", nodes: Nodes, lock: str, baseline: bool = False) -> list[str]:
    """The plan of test ``test_id``, one line each (indented lines belong to the one above)."""
    out = [f"DRY RUN plan of {test_id}: nothing is submitted, locked, recorded or touched",
           f"  cluster: {backend.label}" + (f" at {backend.cluster.dashboard_url}" if backend.cluster else ""),
           f"  the cluster's lock: {lock}",
           f"  workload: {_workload(spec)}"]
    if nodes.unread:
        out.append(f"  nodes: {nodes.unread}")
    for i, (trigger, fault) in enumerate(faults, 1):
        out += _fault(i, trigger, fault, nodes)
    out += _expected(backend, spec, expect, baseline)
    out += ["  only a live run resolves: " + "; ".join(_live_only(spec, faults))]
    return out


def _workload(spec: "RunSpec") -> str:
    params = ", ".join(f"{k}={v}" for k, v in spec.params.items() if k not in ("workload", "python"))
    if spec.user_workload:
        return f"your script `{spec.entrypoint}` (from {spec.working_dir})"
    return f"{spec.params.get('workload', spec.entrypoint)}" + (f" ({params})" if params else "")


def _fault(i: int, trigger, fault, nodes: Nodes) -> list[str]:
    members = getattr(fault, "members", [fault])
    out = [f"  fault {i}: {fault.kind}: {fault.describe()}",
           f"    trigger: {trigger.describe()}"]
    if len(members) > 1:
        out.append(f"    {len(members)} members injected in one instant, each on a node of its own (one refusal: "
                   "none is injected)")
    for m in members:
        params = _params(m)
        out.append(f"    target: {m.target_rule()}" + (f"; parameters: {params}" if params else ""))
    if nodes.unread:
        return out
    eligible, refused = nodes.for_fault(fault)
    out.append(f"    eligible now ({len(eligible)}): " + ("; ".join(n.describe() for n in eligible) or
                                                          "none: this fault cannot run here as the profile stands"))
    out += [f"    refused now: {why}" for _, why in refused]
    return out


def _params(fault) -> str:
    """The fault's own settings (what its suite or the profile chose), not its bookkeeping."""
    simple = (bool, int, float, str)
    return ", ".join(f"{k}={v}" for k, v in sorted(vars(fault).items())
                     if not k.startswith("_") and isinstance(v, simple) and not k.endswith("_path"))


def _expected(backend: "Backend", spec: "RunSpec", expect: "Expect", baseline: bool) -> list[str]:
    source = ("the --chaos-slo-* options where given, else " + (f"profile {backend.profile.name}'s for the kind, "
              "else " if backend.profile is not None else "") + "the kind's own (docs/reference/fault-kinds.md)")
    charges = "; ".join(f"{n} to {cls} ({_limit(spec, cls)})" for cls, n in sorted(expect.charges.items())) or \
        "none (no fault of this test is charged to a retry budget)"
    out = [f"  expected charge: {charges}" + (", and the budget exhausted: the run must fail cleanly"
                                              if expect.budget_exhausted else ""),
           f"  SLOs: fault to node DEAD within {_seconds(expect.slo_detect_s)}, fault to the next attempt's first "
           f"report within {_seconds(expect.slo_recover_s)} (from {source}, unless the test sets them)",
           f"  faults live at once: at most {backend.settings.max_live_faults} (safety.max_live_faults)"]
    if baseline:
        out.append("  a fault-free baseline run of the same workload would run first (final-state / trajectory)")
    return out


def _seconds(value: float | None) -> str:
    return "(no limit)" if value is None else f"{value:g} s"


def _limit(spec: "RunSpec", budget_class: str) -> str:
    name = limit_name(budget_class)
    if name in _LIMITS and name in spec.params:
        return f"limit {name}={spec.params[name]}"
    return f"limit {name}: your script's FailureConfig, read from the live run"


def _live_only(spec: "RunSpec", faults: Sequence[tuple[object, object]]) -> list[str]:
    members = [m for _, f in faults for m in getattr(f, "members", [f])]
    out = []
    if any(getattr(m, "rank", None) is not None for m in members):
        out.append("which node hosts each rank when the trigger fires (Ray places ranks at run time), so the "
                   "target itself and whether it is still alive and allowed then")
    out.append("the processes a fault acts on (e.g. the raylet's or a training worker's PID)")
    if spec.user_workload:
        out.append("your script's FailureConfig limits and checkpoint cadence")
    out.append("when each trigger fires, the head's clock offset, time to detect and to recover, the charges Ray "
               "really makes")
    return out
