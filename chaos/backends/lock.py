"""One harness session per cluster at a time.

The lock is a named actor owned by this driver: Ray removes it when its owner dies,
so a killed session never leaves the cluster locked.
"""

from __future__ import annotations

import os
import time

import ray

from chaos.errors import ClusterError

LOCK_NAME = "ray-chaos-lock"
NAMESPACE = "ray-chaos"  # the harness's Ray namespace: its driver and the lock live there


class ClusterLock:
    class _Holder:
        def __init__(self, who: dict):
            self.who = who

        def holder(self) -> dict:
            return self.who

    def __init__(self):
        self._actor = None

    def acquire(self, head_node_id: str) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        who = {"pid": os.getpid(), "host": os.uname().nodename, "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            existing = ray.get_actor(LOCK_NAME, namespace=NAMESPACE)
        except ValueError:
            existing = None
        if existing is not None:
            raise ClusterError(f"another ray-chaos session holds this cluster's lock: {ray.get(existing.holder.remote())}; "
                               "two sessions never inject into one cluster at the same time")
        try:
            self._actor = ray.remote(self._Holder).options(
                name=LOCK_NAME, namespace=NAMESPACE, num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id, soft=False)).remote(who)
            ray.get(self._actor.holder.remote(), timeout=60)
        except ValueError as e:  # lost a race for the name
            raise ClusterError(f"another ray-chaos session took this cluster's lock first: {e}") from e

    def release(self) -> None:
        if self._actor is not None:
            ray.kill(self._actor)
            self._actor = None
