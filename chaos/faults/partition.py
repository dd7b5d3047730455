"""Network partition: cut a host off from everything (all non-loopback traffic dropped
inside its network namespace) until Ray declares its node DEAD, then heal.

Healing needs a way in that does not cross the cut: the host's console.  Embedded test
hosts provide one (their netns, reached from the root namespace); the ledger records the
namespace so `ray-chaos sweep` can heal a partition a killed session left.
"""

from __future__ import annotations

from chaos.errors import InjectionError
from chaos.faults.base import Fault, FaultContext, Target, placement_target


class Partition(Fault):
    kind = "partition"
    budget_class = "worker_group"
    one_shot = True  # heal as soon as Ray has declared the node dead

    def __init__(self, rank: int = 1):
        self.rank = rank
        self._console = None

    def describe(self) -> str:
        return f"network partition of the node hosting rank {self.rank} until Ray declares it DEAD"

    def resolve(self, ctx: FaultContext) -> Target:
        target = placement_target(ctx, self.rank)
        self._console = ctx.console_for(target.node_ip)
        if self._console is None:
            raise InjectionError(f"no console for {target.node_ip}: a partition can only be healed out of band, "
                                 "which embedded test hosts (--chaos-hosts namespaces) provide")
        return target

    def revert_plan(self, target: Target) -> dict:
        return {"action": "heal-partition", "netns": self._console.netns, "host": target.node_ip}

    def inject(self, ctx: FaultContext, target: Target) -> dict:
        self._console.partition()
        if not self._console.is_partitioned():
            raise InjectionError(f"partition rules for {target.node_ip} did not take")
        return {"netns": self._console.netns}

    def revert(self, ctx: FaultContext, target: Target) -> bool:
        self._console.heal()
        if self._console.is_partitioned():
            raise InjectionError(f"partition rules on {target.node_ip} are still there after heal")
        ctx.timeline.emit("fault", "partition_healed", host=target.node_ip)
        return True
