"""Node reboot over SSH: the reboot command is issued without waiting (the dropped
connection is the expected outcome); then the host must stop answering, answer again with
a NEW boot id, and Ray must see a new node join on that same host (the backend says which
node runs where: a replaced machine may come back with another address)."""

from __future__ import annotations

from chaos.cluster import Target
from chaos.errors import TransportError
from chaos.faults.base import Fault, FaultContext, Injection, placement_target
from chaos.waits import poll_until


class NodeReboot(Fault):
    kind = "node-reboot"

    def __init__(self, rank: int = 1, command: str = "systemctl reboot", down_timeout_s: float = 60,
                 up_timeout_s: float = 300):
        self.rank = rank
        self.command = command
        self.down_timeout_s = down_timeout_s
        self.up_timeout_s = up_timeout_s

    def describe(self) -> str:
        return f"reboot (`{self.command}` over SSH) of the node hosting rank {self.rank}"

    def resolve(self, ctx: FaultContext) -> Target:
        return placement_target(ctx, self.rank)

    def revert_plan(self, inj: Injection) -> dict:
        return {"action": "none", "why": "a rebooted host comes back by itself"}

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        before = ctx.backend.boot_id(inj.host)
        inj.evidence.update({"host": inj.target.node_ip, "boot_id_before": before})
        inj.host.transport.launch(self.command, privileged=True)
        inj.host.transport.close()  # its connection dies with the host; the next command reconnects
        ctx.timeline.emit("fault", "reboot_issued", host=inj.target.node_ip, boot_id=before, command=self.command)
        return {"boot_id_before": before, "command": self.command}

    def after_detect(self, ctx: FaultContext, inj: Injection) -> None:
        """Host down → host up with a new boot id → a new Ray node on that host."""
        host, ip, before = inj.host, inj.target.node_ip, inj.evidence["boot_id_before"]

        def boot_id():
            try:
                return ctx.backend.boot_id(host), "answering"
            except TransportError as e:
                return None, str(e).splitlines()[0]

        # "Down" is seen as the host not answering, or — if it was quicker than us — already a new boot id.
        poll_until(lambda: ((lambda b, s: (b is None or b != before, s))(*boot_id())), self.down_timeout_s,
                   f"{ip} to go down after `{self.command}`", interval=0.2)
        ctx.timeline.emit("fault", "ssh_down", host=ip)
        after = poll_until(lambda: ((lambda b, s: (b if b and b != before else None,
                                                   f"boot id {b}" if b else s))(*boot_id())),
                           self.up_timeout_s, f"{ip} to answer with a new boot id", interval=0.3)
        ctx.timeline.emit("fault", "ssh_up", host=ip, boot_id=after)
        node = ctx.cluster.wait_until(
            lambda ns: next((n for n in ns if n.alive and n.node_id != inj.target.node_id
                             and ctx.backend.same_host(host, n)), None),
            self.up_timeout_s, f"a new Ray node to join on {host.name or ip}")
        ctx.timeline.emit("cluster", "node_rejoined", host=ip, node_id=node.node_id, node_ip=node.ip)
        inj.evidence.update({"boot_id_after": after, "new_node_id": node.node_id, "old_node_id": inj.target.node_id})
