"""Network partition: cut a host off from everything (all non-loopback traffic dropped
inside its network namespace) until Ray declares its node DEAD, then heal.

Healing needs a way in that does not cross the cut: the host's console, which the backend
provides where it has one (embedded test hosts: their netns, reached from the root
namespace).  The ledger records the namespace so `ray-chaos sweep` can heal a partition a
killed session left.
"""

from __future__ import annotations

from chaos.cluster import Target
from chaos.errors import InjectionError
from chaos.faults.base import Fault, FaultContext, Injection, placement_target


class Partition(Fault):
    kind = "partition"
    one_shot = True  # heal as soon as Ray has declared the node dead

    def __init__(self, rank: int = 1):
        self.rank = rank

    def describe(self) -> str:
        return f"network partition of the node hosting rank {self.rank} until Ray declares it DEAD"

    def resolve(self, ctx: FaultContext) -> Target:
        target = placement_target(ctx, self.rank)
        if ctx.backend.host(target.node_id).console is None:
            raise InjectionError(f"no console for {target.node_ip}: a partition can only be healed out of band, "
                                 "which embedded test hosts (--chaos-hosts namespaces) provide")
        return target

    def revert_plan(self, inj: Injection) -> dict:
        return {"action": "heal-partition", "netns": inj.host.console.netns, "host": inj.host.key}

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        console = inj.host.console
        console.partition()
        if not console.is_partitioned():
            raise InjectionError(f"partition rules for {inj.target.node_ip} did not take")
        return {"netns": console.netns}

    def revert(self, ctx: FaultContext, inj: Injection) -> bool:
        inj.host.console.heal()
        if inj.host.console.is_partitioned():
            raise InjectionError(f"partition rules on {inj.target.node_ip} are still there after heal")
        ctx.timeline.emit("fault", "partition_healed", host=inj.target.node_ip)
        return True

    @classmethod
    def sweep(cls, plan: dict, backend) -> bool:
        """Heal the namespace the plan names (the host's console; no Ray needed)."""
        from chaos.embedded import netns

        if not netns.netns_exists(plan["netns"]):
            return False  # the host is gone, and its rules with it
        console = netns.Console(plan["netns"])
        console.heal()
        if console.is_partitioned():
            raise InjectionError(f"rules still present in netns {plan['netns']}")
        return True
