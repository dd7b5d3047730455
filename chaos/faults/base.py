"""What every fault has: a target resolved from live placement, inject, detect, revert,
sweep, and the budget its kind should be charged to (from the catalog).

A Fault object is configuration only.  Everything one injection produces (the host it
hit, its ledger entry, boot ids, the armed plan) lives in the `Injection` the experiment
keeps, so the same fault object can be injected twice.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, ClassVar

from chaos.cluster import Node, Target
from chaos.errors import InjectionError
from chaos.faults import catalog
from chaos.timeline import Event, Timeline

if TYPE_CHECKING:
    from chaos.backends.base import Backend, Host
    from chaos.cluster import ClusterView
    from chaos.profile import Profile


@dataclasses.dataclass(frozen=True)
class FaultSettings:
    """What a session says about every fault it builds (``Fault.build``): the profile of the
    cluster under test (None: the embedded one) and the command line's choices."""

    profile: "Profile | None" = None
    raylet_kill: str = "grpc"  # --chaos-raylet-kill


@dataclasses.dataclass
class Injection:
    """One injection of one fault, from its ledger entry to its revert."""

    fault: "Fault"
    target: Target
    host: "Host"  # the backend's handle for the target node's host
    ledger_id: str | None = None
    slot: int | None = None  # its live-fault slot
    t: float | None = None  # when it was injected (the fault_injected event)
    evidence: dict = dataclasses.field(default_factory=dict)  # for the report: boot ids, node ids, the plan
    handles: dict = dataclasses.field(default_factory=dict)  # live objects of this injection (timers), never reported


@dataclasses.dataclass
class FaultContext:
    """What a fault may use: the cluster view, the run's timeline and the backend's hosts."""

    cluster: "ClusterView"
    timeline: Timeline
    backend: "Backend"


class Fault(abc.ABC):
    kind: ClassVar[str] = ""
    #: the Train budget this kind should be charged to (None: no charge expected); set
    #: from the catalog, never by the fault class itself
    budget_class: ClassVar[str | None]
    #: whether the fault takes the node down (so detection means "node DEAD")
    kills_node: ClassVar[bool] = True
    #: whether the fault is disarmed as soon as it is detected (it would hit every new attempt otherwise)
    one_shot: ClassVar[bool] = False
    #: whether the fault takes the head away for a while: the node table, the Jobs API and the
    #: recorder's event log go with it (the health guard holds, losing the event log is no error)
    loses_the_head: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.budget_class = catalog.kind(cls.kind).budget_class

    @classmethod
    def build(cls, settings: FaultSettings, **params) -> "Fault":
        """The kind's factory: a fault with ``params``, the rest from the session's
        ``settings`` (a kind whose defaults come from the profile or the command line says so
        here)."""
        return cls(**params)

    @abc.abstractmethod
    def resolve(self, ctx: FaultContext) -> Target: ...

    @abc.abstractmethod
    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        """Inject; return details for the ledger.  Raise InjectionError on failure."""

    def prepare(self, ctx: FaultContext) -> str | None:
        """Before the run starts: put on the cluster's hosts what ``run_env`` names, and say
        what (most faults need nothing there: None)."""
        return None

    def prepare_node(self, ctx: FaultContext, node: Node) -> str | None:
        """A worker node joined during the run (a replacement, a rebooted host): put there
        what ``prepare`` put on the hosts before the run, and say what (None: nothing)."""
        return None

    def run_env(self) -> dict[str, str]:
        """Environment the run must be started with for this fault to be injectable."""
        return {}

    def detection(self, target: Target) -> str:
        """What detecting the fault means, for the report's step and the wait's message."""
        return (f"Ray to mark node {target.node_id[:8]} ({target.node_ip}) DEAD" if self.kills_node
                else f"Train to see rank {target.rank} fail")

    def detected(self, events: list[Event], target: Target, fault_t: float) -> Event | None:
        """The event that shows Ray noticed the fault: the node marked DEAD, or for a fault
        that leaves the node up, Train seeing a rank fail.

        The one definition of detection: the experiment waits on it and records the event
        it returns as ``fault_detected``, which the metrics read."""
        if self.kills_node:
            return next((e for e in events if e.kind == "node_dead" and e.data.get("node_id") == target.node_id),
                        None)
        return next((e for e in events if e.t >= fault_t and e.kind in ("worker_error", "failure_decision")), None)

    def detect_timeout(self, base_s: float) -> float:
        """How long detection may take, given the harness's own deadline ``base_s``."""
        return base_s

    def after_detect(self, ctx: FaultContext, inj: Injection) -> None:
        """Fault-specific waits after detection (e.g. a rebooted host answering again)."""

    def run_fate(self, inj: Injection) -> str:
        """What the run under test does after this injection, once ``after_detect`` returned:
        ``continues`` (Train restarts it, or it never stopped), ``resubmit`` (its driver is gone:
        the harness submits it again, as a RayJob's retry does) or ``lost`` (nothing is left to
        recover: the verdicts judge what happened)."""
        return "continues"

    def revert_plan(self, inj: Injection) -> dict:
        """How to undo this fault, written to the ledger before injecting; `sweep` reads it."""
        return {"action": "none", "why": f"{self.kind} leaves nothing armed; node recovery replaces the node"}

    def revert(self, ctx: FaultContext, inj: Injection) -> bool:
        """Undo what is still armed; return whether anything needed reverting."""
        return False

    @classmethod
    def sweep(cls, plan: dict, backend: "Backend") -> bool:
        """Revert, from its ledger plan, what a killed session left armed; return whether
        anything needed reverting.  Faults that arm something override this."""
        if plan.get("action", "none") != "none":
            raise InjectionError(f"{cls.kind}: no sweep for revert action {plan.get('action')!r}")
        return False

    def describe(self) -> str:
        return self.kind

    def target_rule(self) -> str:
        """How ``resolve`` will choose the target, in words, for a dry run's plan (which
        cannot resolve it: placement only exists in a live run)."""
        rank = getattr(self, "rank", None)
        if rank is None:
            return f"chosen by {self.kind} when its trigger fires"
        return (f"the node hosting rank {rank} in the attempt running when the trigger fires (the recorder's "
                "placement), if the safety rules allow that node then")


def placement_target(ctx: FaultContext, rank: int) -> Target:
    """The node hosting ``rank`` in the latest attempt (safety checks come after, in the
    experiment: the head and nodes off the allowlist are refused there)."""
    attempts = ctx.timeline.attempts()
    if not attempts:
        raise InjectionError("cannot resolve a target: no attempt has started yet (no placement seen)")
    latest = attempts[-1]
    placement = {p["rank"]: p for p in latest.data.get("placement", [])}
    if rank not in placement:
        raise InjectionError(
            f"cannot resolve a target: rank {rank} is not in attempt {latest.attempt}'s placement "
            f"(ranks {sorted(placement)})"
        )
    p = placement[rank]
    return Target(node_id=p["node_id"], node_ip=p["node_ip"], rank=rank, pid=p.get("pid"),
                  host=ctx.backend.host(p["node_id"]).name)
