"""The `ray` transport: Ray's own gRPC services on a node.

This is the ONLY module that touches Ray's generated gRPC stubs
(``ray.core.generated``); tests/unit/test_ray_contracts.py fails loudly if the pinned Ray
changes them.  Ray's own chaos utilities kill raylets the same way.
"""

from __future__ import annotations

import grpc

from chaos.errors import InjectionError


def shutdown_raylet(address: str, port: int, graceful: bool = False, timeout: float = 10.0) -> None:
    """Ask the raylet at address:port to exit; graceful=False exits at once, no de-registration."""
    from ray.core.generated import node_manager_pb2, node_manager_pb2_grpc

    target = f"{address}:{port}"
    with grpc.insecure_channel(target) as channel:
        stub = node_manager_pb2_grpc.NodeManagerServiceStub(channel)
        try:
            stub.ShutdownRaylet(node_manager_pb2.ShutdownRayletRequest(graceful=graceful), timeout=timeout)
        except grpc.RpcError as e:
            # A non-graceful shutdown may drop the connection before replying: that is success.
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                return
            raise InjectionError(f"ShutdownRaylet on raylet {target} failed: {e.code().name}: {e.details()}") from e
