"""The `ray` transport: Ray's own gRPC services on a node.

This is the ONLY module that touches Ray's generated gRPC stubs
(``ray.core.generated``) and its GCS client (``ray._raylet.GcsClient``);
tests/unit/test_ray_contracts.py fails loudly if the pinned Ray
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


def drain_node(gcs_address: str, node_id: str, reason_message: str, deadline_s: float) -> None:
    """Ask the GCS to drain ``node_id`` for a preemption with the absolute ``deadline_s``
    (Unix time), as ``ray drain-node`` and the autoscaler do, from this process: the
    deadline is then exactly the one the caller acts on (the CLI computes its own after its
    start-up, seconds later on a busy machine).  A node killed after the deadline dies
    "preempted"; before it, Ray calls it an unexpected termination."""
    import ray
    from ray.core.generated import autoscaler_pb2

    client = ray._raylet.GcsClient(address=gcs_address)
    accepted, why = client.drain_node(node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                      reason_message, int(deadline_s * 1000))
    if not accepted:
        raise InjectionError(f"the GCS at {gcs_address} refused to drain node {node_id[:8]}: {why}")
