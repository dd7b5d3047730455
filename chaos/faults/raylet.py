"""Raylet kill: the node's raylet dies at once, as when a node's Ray runtime crashes."""

from __future__ import annotations

import shlex

from chaos.cluster import Target
from chaos.errors import InjectionError
from chaos.faults.base import Fault, FaultContext, FaultSettings, Injection, placement_target
from chaos.transport import ray as ray_transport

# Finds the raylet by its exact node id (never by name) and SIGKILLs that one PID.
KILL_RAYLET_BY_NODE_ID = r"""
id={node_id}
for d in /proc/[0-9]*; do
  cmd=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null) || continue
  case "$cmd" in */raylet/raylet\ *"--node_id=$id"*) pid=${{d#/proc/}}; kill -9 "$pid" && echo "$pid"; exit 0;; esac
done
echo "no raylet with --node_id=$id on $(hostname)" >&2; exit 3
"""


class RayletKill(Fault):
    kind = "raylet-kill"
    METHODS = ("grpc", "sigkill")

    def __init__(self, rank: int = 1, method: str = "grpc"):
        if method not in self.METHODS:
            raise ValueError(f"raylet-kill method {method!r} unknown; expected one of {self.METHODS}")
        self.rank = rank
        self.method = method

    @classmethod
    def build(cls, settings: FaultSettings, **params) -> "RayletKill":
        """The session's --chaos-raylet-kill unless ``method`` is given."""
        return cls(**{"method": settings.raylet_kill, **params})

    def describe(self) -> str:
        how = "ShutdownRaylet(graceful=False)" if self.method == "grpc" else "SIGKILL of the raylet PID"
        return f"raylet kill via {how} on the node hosting rank {self.rank}"

    def resolve(self, ctx: FaultContext) -> Target:
        return placement_target(ctx, self.rank)

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        target = inj.target
        if self.method == "grpc":
            address, port = ctx.cluster.raylet_endpoint(target.node_id)
            ray_transport.shutdown_raylet(address, port, graceful=False)
            return {"method": "grpc", "raylet": f"{address}:{port}"}
        transport = inj.host.transport
        result = transport.run(KILL_RAYLET_BY_NODE_ID.format(node_id=shlex.quote(target.node_id)), timeout=20,
                               privileged=True)
        if not result.ok:
            raise InjectionError(f"SIGKILL of the raylet of node {target.node_id[:8]} on {transport.host} failed: "
                                 f"exit {result.exit_code}: {result.stderr.strip()}")
        return {"method": "sigkill", "raylet_pid": int(result.stdout.split()[0]), "via": type(transport).__name__}
