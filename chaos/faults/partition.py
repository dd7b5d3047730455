"""Network partition: cut a host off from the rest of the cluster until Ray declares its node
DEAD, then heal.

Two ways, by what the backend gives:

* **Console** (embedded test hosts: their netns, reached from the root namespace): all
  non-loopback traffic dropped inside the host's network namespace, healed out of band.
* **Over the host's transport** (a profile's SSH hosts, which have no console): the same cut
  made on the host with iptables in chains of its own (``chaos-<id>-in``/``-out``), except
  SSH (TCP port 22 both ways), so the harness can still heal it — a partition of the
  cluster's network with the management path kept, as a switch or security-group failure
  gives.  The host heals itself after ``self_heal_s`` whatever becomes of the harness
  (a timer started on the host first), and ``ray-chaos sweep`` removes the chains later.

The ledger records how to heal it (the namespace, or the host and its chains).
"""

from __future__ import annotations

import uuid

from chaos.cluster import Target
from chaos.errors import InjectionError
from chaos.faults.base import Fault, FaultContext, Injection, placement_target

# Over a transport: create the chains, start the self-healing timer, then cut (ssh stays open).
CUT = r"""
set -e
command -v iptables >/dev/null || {{ echo "refused: no iptables on $(hostname)" >&2; exit 3; }}
heal='{heal}'
setsid nohup sh -c "sleep {self_heal_s}; $heal" >/dev/null 2>&1 < /dev/null &
timer=$!
iptables -w 5 -N {chain}-in
iptables -w 5 -A {chain}-in -i lo -j RETURN
iptables -w 5 -A {chain}-in -p tcp --dport 22 -j RETURN
iptables -w 5 -A {chain}-in -j DROP
iptables -w 5 -N {chain}-out
iptables -w 5 -A {chain}-out -o lo -j RETURN
iptables -w 5 -A {chain}-out -p tcp --sport 22 -j RETURN
iptables -w 5 -A {chain}-out -j DROP
iptables -w 5 -I INPUT 1 -j {chain}-in
iptables -w 5 -I OUTPUT 1 -j {chain}-out
echo "cut $timer"
"""
# Idempotent: whatever of the chains is there goes.
HEAL = ("for d in in:INPUT out:OUTPUT; do c={chain}-${{d%%:*}}; "
        "while iptables -w 5 -D ${{d#*:}} -j $c 2>/dev/null; do :; done; "
        "iptables -w 5 -F $c 2>/dev/null; iptables -w 5 -X $c 2>/dev/null; done; true")
# Whether anything of the cut is left (a chain, or a jump to one, in or out); an iptables that
# cannot list its rules (its lock held past -w) fails the command: "healed" only when seen.
CUT_NOW = ("rules=$(iptables -w 5 -S) || exit 4; "
           "printf '%s\\n' \"$rules\" | grep -qE -- '(^-N |-j ){chain}-(in|out)$' && echo cut || echo healed")


class Partition(Fault):
    kind = "partition"
    one_shot = True  # heal as soon as Ray has declared the node dead

    def __init__(self, rank: int = 1, self_heal_s: float = 300.0):
        """``self_heal_s``: over a transport, when the host heals itself should the harness not."""
        if self_heal_s <= 0:
            raise ValueError(f"partition self_heal_s must be > 0, got {self_heal_s}")
        self.rank, self.self_heal_s = rank, self_heal_s

    def describe(self) -> str:
        return f"network partition of the node hosting rank {self.rank} until Ray declares it DEAD"

    def resolve(self, ctx: FaultContext) -> Target:
        return placement_target(ctx, self.rank)

    def revert_plan(self, inj: Injection) -> dict:
        if inj.host.console is not None:
            return {"action": "heal-partition", "netns": inj.host.console.netns, "host": inj.host.key}
        chain = inj.evidence.setdefault("chain", f"chaos-{uuid.uuid4().hex[:8]}")
        return {"action": "heal-partition-chains", "host": inj.host.key, "chain": chain,
                "why": f"the host heals itself {self.self_heal_s:.0f} s after the cut; until then over SSH"}

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        console = inj.host.console
        if console is not None:
            console.partition()
            if not console.is_partitioned():
                raise InjectionError(f"partition rules for {inj.target.node_ip} did not take")
            return {"netns": console.netns}
        chain = inj.evidence["chain"]  # named in the ledger's plan, written before this
        result = inj.host.transport.run(CUT.format(chain=chain, heal=HEAL.format(chain=chain),
                                                   self_heal_s=int(self.self_heal_s)), timeout=30,
                                         privileged=True)
        words = result.stdout.split()
        if not result.ok or words[:1] != ["cut"]:
            _heal_chains(inj.host.transport, chain)
            raise InjectionError(f"{inj.host.name or inj.host.key}: cutting the network failed (exit "
                                 f"{result.exit_code}): {(result.stderr or result.stdout).strip()[-500:]}")
        inj.evidence["timer_pid"] = int(words[1])
        return {"chains": [f"{chain}-in", f"{chain}-out"], "ssh": "kept", "self_heal_s": self.self_heal_s,
                "timer_pid": inj.evidence["timer_pid"]}

    def revert(self, ctx: FaultContext, inj: Injection) -> bool:
        console = inj.host.console
        if console is not None:
            console.heal()
            still = console.is_partitioned()
        else:
            still = _heal_chains(inj.host.transport, inj.evidence["chain"])
            if not still:  # the timer's process group (setsid made it its own); kept while the cut is not gone
                inj.host.transport.run(f"kill -- -{int(inj.evidence['timer_pid'])} 2>/dev/null; true", timeout=30,
                                       privileged=True)
        if still:
            raise InjectionError(f"partition rules on {inj.target.node_ip} are still there after heal")
        ctx.timeline.emit("fault", "partition_healed", host=inj.target.node_ip)
        return True

    def is_partitioned(self, inj: Injection) -> bool:
        """Whether the cut is still in place on the injection's host."""
        if inj.host.console is not None:
            return inj.host.console.is_partitioned()
        return _cut_now(inj.host.transport, inj.evidence["chain"])

    @classmethod
    def sweep(cls, plan: dict, backend) -> bool:
        """Heal what the plan names: the host's console's namespace, or its chains over its
        transport (no Ray needed)."""
        if plan.get("action") == "heal-partition-chains":
            transport = backend.connect(plan["host"])
            try:
                if not _cut_now(transport, plan["chain"]):
                    return False
                if _heal_chains(transport, plan["chain"]):
                    raise InjectionError(f"chains {plan['chain']}-in/-out still on {plan['host']}")
                return True
            finally:
                transport.close()
        from chaos.embedded import netns

        if not netns.netns_exists(plan["netns"]):
            return False  # the host is gone, and its rules with it
        console = netns.Console(plan["netns"])
        console.heal()
        if console.is_partitioned():
            raise InjectionError(f"rules still present in netns {plan['netns']}")
        return True


def _cut_now(transport, chain: str) -> bool:
    return transport.run(CUT_NOW.format(chain=chain), timeout=30, privileged=True).check().stdout.strip() == "cut"


def _heal_chains(transport, chain: str) -> bool:
    """Remove the chains; whether the cut is still there after."""
    transport.run(HEAL.format(chain=chain), timeout=30, privileged=True)
    return _cut_now(transport, chain)
