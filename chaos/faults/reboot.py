"""Node reboot over SSH: the reboot command is issued without waiting (the dropped
connection is the expected outcome); then SSH must go down, answer again with a NEW boot
id, and Ray must see a new node join from that address."""

from __future__ import annotations

from chaos.errors import InjectionError, TransportError
from chaos.faults.base import Fault, FaultContext, Target, placement_target
from chaos.waits import poll_until

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


class NodeReboot(Fault):
    kind = "node-reboot"
    budget_class = "worker_group"

    def __init__(self, rank: int = 1, command: str = "systemctl reboot", down_timeout_s: float = 60,
                 up_timeout_s: float = 300):
        self.rank = rank
        self.command = command
        self.down_timeout_s = down_timeout_s
        self.up_timeout_s = up_timeout_s
        self.evidence: dict = {}

    def describe(self) -> str:
        return f"reboot (`{self.command}` over SSH) of the node hosting rank {self.rank}"

    def resolve(self, ctx: FaultContext) -> Target:
        return placement_target(ctx, self.rank)

    def revert_plan(self, target: Target) -> dict:
        return {"action": "none", "why": "a rebooted host comes back by itself; sweep checks it answers SSH"}

    def inject(self, ctx: FaultContext, target: Target) -> dict:
        transport = ctx.transport_for(target.node_ip)
        before = transport.run(BOOT_ID, timeout=20).check().stdout.strip()
        self.evidence = {"host": target.node_ip, "boot_id_before": before}
        transport.launch(self.command)
        transport.close()
        ctx.timeline.emit("fault", "reboot_issued", host=target.node_ip, boot_id=before, command=self.command)
        return {"boot_id_before": before, "command": self.command}

    def after_detect(self, ctx: FaultContext, target: Target) -> None:
        """SSH down → SSH up with a new boot id → a new Ray node from that address."""
        host = target.node_ip

        def ssh_state():
            transport = ctx.fresh_transport_for(host)
            try:
                return transport.run(BOOT_ID, timeout=5).stdout.strip(), "answering"
            except TransportError as e:
                return None, str(e).splitlines()[0]
            finally:
                transport.close()

        before = self.evidence["boot_id_before"]
        # "Down" is seen as SSH failing, or — if the host was quicker than us — already a new boot id.
        poll_until(lambda: ((lambda b, s: (b is None or b != before, s))(*ssh_state())), self.down_timeout_s,
                   f"SSH on {host} to go down after `{self.command}`", interval=0.2)
        ctx.timeline.emit("fault", "ssh_down", host=host)
        after = poll_until(lambda: ((lambda b, s: (b if b and b != before else None,
                                                   f"boot id {b}" if b else s))(*ssh_state())),
                           self.up_timeout_s, f"SSH on {host} to answer with a new boot id", interval=0.3)
        ctx.timeline.emit("fault", "ssh_up", host=host, boot_id=after)
        node = ctx.cluster.wait_until(
            lambda ns: next((n for n in ns if n.ip == host and n.alive and n.node_id != target.node_id), None),
            self.up_timeout_s, f"a new Ray node to join from {host}")
        ctx.timeline.emit("cluster", "node_rejoined", host=host, node_id=node.node_id, node_ip=host)
        self.evidence.update({"boot_id_after": after, "new_node_id": node.node_id, "old_node_id": target.node_id})
        if after == before:
            raise InjectionError(f"{host} answered with the same boot id {before}: it did not reboot")
