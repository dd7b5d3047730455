"""What every fault has: a target resolved from live placement, inject, revert, budget."""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING

from chaos.errors import InjectionError
from chaos.timeline import Timeline

if TYPE_CHECKING:
    from chaos.cluster import ClusterView


@dataclasses.dataclass(frozen=True)
class Target:
    node_id: str
    node_ip: str
    rank: int | None = None
    pid: int | None = None
    host: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        rank = f"rank {self.rank} on " if self.rank is not None else ""
        return f"{rank}node {self.node_id[:8]} ({self.host or self.node_ip})"


@dataclasses.dataclass
class FaultContext:
    """What a fault may use: the cluster view, the run's timeline and a transport per host."""

    cluster: "ClusterView"
    timeline: Timeline
    transport_for: "callable"  # node_ip -> Transport
    host_name_for: "callable" = lambda ip: None  # node_ip -> host name (reports)
    console_for: "callable" = lambda ip: None  # node_ip -> out-of-band host console (embedded test hosts)
    fresh_transport_for: "callable" = None  # node_ip -> a new, unshared Transport (for reconnect loops)
    python: str = "python3"  # interpreter on the hosts, for small helper scripts
    allow_head: bool = False

    def __post_init__(self):
        if self.fresh_transport_for is None:
            self.fresh_transport_for = self.transport_for


class Fault(abc.ABC):
    kind: str = ""
    #: the Train budget this fault should be charged to (None: no charge expected)
    budget_class: str | None = "worker_group"
    #: whether the fault takes the node down (so detection means "node DEAD")
    kills_node: bool = True
    #: whether the fault is disarmed as soon as it is detected (it would hit every new attempt otherwise)
    one_shot: bool = False

    @abc.abstractmethod
    def resolve(self, ctx: FaultContext) -> Target: ...

    @abc.abstractmethod
    def inject(self, ctx: FaultContext, target: Target) -> dict:
        """Inject; return details for the timeline.  Raise InjectionError on failure."""

    def run_env(self) -> dict[str, str]:
        """Environment the run must be started with for this fault to be injectable."""
        return {}

    def detected(self, events, target: Target, fault_t: float):
        """The event that shows Ray noticed the fault (default: the node marked DEAD)."""
        return next((e for e in events if e.kind == "node_dead" and e.data.get("node_id") == target.node_id), None)

    def after_detect(self, ctx: FaultContext, target: Target) -> None:
        """Fault-specific waits after detection (e.g. a rebooted host answering again)."""

    def revert_plan(self, target: Target) -> dict:
        """How to undo this fault, written to the ledger before injecting."""
        return {"action": "none", "why": f"{self.kind} leaves nothing armed; node recovery replaces the node"}

    def revert(self, ctx: FaultContext, target: Target) -> bool:
        """Undo what is still armed; return whether anything needed reverting."""
        return False

    def describe(self) -> str:
        return self.kind


def placement_target(ctx: FaultContext, rank: int) -> Target:
    """The node hosting ``rank`` in the latest attempt — never the head unless allowed."""
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
    head_ids = {n.node_id for n in ctx.cluster.nodes() if n.is_head}
    if p["node_id"] in head_ids and not ctx.allow_head:
        raise InjectionError(f"rank {rank} runs on the head node {p['node_id'][:8]}; the head is never targeted "
                             "unless the profile says allow_head: true")
    return Target(node_id=p["node_id"], node_ip=p["node_ip"], rank=rank, pid=p.get("pid"),
                  host=ctx.host_name_for(p["node_ip"]))
