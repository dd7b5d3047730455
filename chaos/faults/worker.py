"""Train worker kill: SIGKILL of one rank's process, the PID taken from live placement.

The PID is the one Ray reports for the worker, i.e. as seen on its host (inside a test
host's PID namespace too), so the kill runs through that host's transport.
"""

from __future__ import annotations

from chaos.cluster import Target
from chaos.errors import InjectionError
from chaos.faults.base import Fault, FaultContext, Injection, placement_target


class TrainWorkerKill(Fault):
    kind = "worker-kill"
    kills_node = False

    def __init__(self, rank: int = 1):
        self.rank = rank

    def describe(self) -> str:
        return f"SIGKILL of the training worker of rank {self.rank}"

    def target_rule(self) -> str:
        return (f"the training worker process of rank {self.rank} (its PID from the recorder's placement when the "
                "trigger fires), on its node if the safety rules allow that node then")

    def resolve(self, ctx: FaultContext) -> Target:
        target = placement_target(ctx, self.rank)
        if not target.pid:
            raise InjectionError(f"rank {self.rank}'s placement carries no PID")
        return target

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        target, transport = inj.target, inj.host.transport
        result = transport.run(f"kill -9 {int(target.pid)} && echo killed", timeout=20, privileged=True)
        if not result.ok:
            raise InjectionError(f"SIGKILL of pid {target.pid} (rank {self.rank}) on {transport.host} failed: "
                                 f"exit {result.exit_code}: {result.stderr.strip()}")
        return {"pid": target.pid, "via": type(transport).__name__}
