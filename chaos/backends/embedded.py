"""The embedded cluster (no profile): started for the session on this machine, stopped after.

Its worker hosts keep their address for life, so a host's key is its address; test hosts
are reached over SSH with the key and known_hosts file the cluster writes, and their
network namespace is their console.  Plain hosts are processes on this machine.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import psutil
import ray

from chaos.backends.base import Backend, Host, ray_node_info
from chaos.cluster import ClusterView, Node
from chaos.profile import SafetySettings
from chaos.safety import NodeInfo
from chaos.transport.base import Transport
from chaos.transport.local import LocalTransport
from chaos.waits import poll_until

if TYPE_CHECKING:
    from chaos.embedded.cluster import EmbeddedCluster, EmbeddedConfig, WorkerHost
    from chaos.storage.access import ObjectStorage


class EmbeddedBackend(Backend):
    name = "embedded"
    external_drains = False  # only the harness's own faults drain its nodes
    python = sys.executable  # the hosts are this machine's namespaces or processes

    @classmethod
    def serves(cls, profile) -> bool:
        return profile is None

    def __init__(self, profile: None = None, config: "EmbeddedConfig | None" = None,
                 storage_path: str = "reports/storage", head_faults: bool = False):
        """``profile``: None, as for every backend the registry's ``for_profile`` builds (the
        embedded cluster has no profile).  ``head_faults``: a cluster for the head faults, whose
        head may be hit (the ``head`` capability; its config restarts the head)."""
        from chaos.embedded.cluster import EmbeddedConfig

        self.config = config or EmbeddedConfig()
        if head_faults and not self.config.head_recovery:
            raise ValueError("head_faults needs head_recovery: a head fault's cluster starts its head again")
        self.head_faults = head_faults
        # The harness's own cluster: every worker may be hit; the head only on a head-fault cluster.
        super().__init__(profile, safety=SafetySettings(allow_all_workers=True, allow_head=head_faults,
                                                        max_live_faults=self.config.workers))
        self._storage_path = storage_path
        self._local_storage = None  # chaos.storage.local.LocalStorage, once asked for

    @property
    def label(self) -> str:
        return f"embedded-{self.config.hosts}"

    @property
    def storage_path(self) -> str:
        return self._storage_path

    @property
    def object_storage(self) -> "ObjectStorage | None":
        """The cluster's own S3 storage: moto's server behind the fault proxy, started the
        first time a run or a fault asks for it, on the address the nodes reach this machine at
        (the head's loopback address, or the test-host bridge's)."""
        if self._local_storage is None and self.embedded is not None:
            from chaos.embedded.cluster import free_port
            from chaos.storage.local import LocalStorage

            cluster = self.embedded
            host = cluster.network.head_address if cluster.network is not None else cluster.head_ip
            self._local_storage = LocalStorage(host, cluster.base_dir / "s3",
                                               lambda: free_port(cluster.config.ports())).start()
            self.reporter.say(f"S3 storage up: moto_server {self._local_storage.server.url} behind the fault proxy "
                              f"{self._local_storage.endpoint_url} (admin {self._local_storage.admin_url})")
        return self._local_storage.object_storage() if self._local_storage is not None else None

    def _open(self) -> ClusterView:
        from chaos.embedded.cluster import EmbeddedCluster

        t0 = time.monotonic()
        self.embedded = EmbeddedCluster(self.config).up()
        self.reporter.say(f"embedded cluster up in {time.monotonic() - t0:.1f} s: {self.embedded.dashboard_url}")
        self.properties = _properties(self.embedded)
        if self.head_faults:
            self.head = EmbeddedHead(self.embedded)
        return ClusterView(self.embedded.dashboard_url, self.embedded.gcs_address)

    def _close(self) -> None:
        self.head = None
        if self._local_storage is not None:
            self._local_storage.stop()
            self._local_storage = None
        if self.embedded is not None:
            self.embedded.down()
            self.embedded = None
            self.reporter.say("embedded cluster stopped")

    def node_info(self, node_id: str) -> NodeInfo | None:
        return ray_node_info(self.cluster, node_id)

    def host_key(self, node: Node) -> str:
        return node.ip

    def _worker(self, key: str) -> "WorkerHost | None":
        return next((h for h in self.embedded.hosts if h.ip == key), None) if self.embedded else None

    def connect(self, key: str) -> Transport:
        net = self.embedded.network if self.embedded else None
        if net is None:  # plain hosts, or a sweep after the session's cluster is gone: this machine
            return LocalTransport(key)
        from chaos.transport.ssh import SSHTransport

        return SSHTransport(key, key_filename=str(net.ssh_key_path), known_hosts=str(net.known_hosts_path),
                            use_agent=False)

    def _reach(self, key: str, node: Node | None) -> Host:
        worker = self._worker(key)
        return Host(key=key, name=worker.name if worker else None, transport=self.connect(key),
                    console=worker.testhost if worker else None)

    def healthy_workers(self) -> tuple[bool, str]:
        alive = {n.node_id for n in self.cluster.alive_workers()}
        down = [h.name for h in self.embedded.hosts if h.node_id not in alive]
        return not down, f"all {len(self.embedded.hosts)} worker hosts alive" if not down else f"hosts down: {down}"

    def wait_healed(self, timeout: float) -> None:
        """Until healthy_workers says so: right after a kill the cluster's own record (the
        supervisor's node ids, the dashboard's table) can still show the dead node alive."""
        poll_until(self.healthy_workers, timeout, "every embedded worker host to run a live node again", interval=0.3)


class EmbeddedHead:
    """The ``head`` capability of a head-fault cluster (chaos.backends.base.HeadControl): its
    head is on a test host of its own (or, without root, a local process tree), started again
    when it goes, as Kubernetes restarts a head container."""

    def __init__(self, cluster: "EmbeddedCluster"):
        self.cluster = cluster

    @property
    def gcs_ft(self) -> bool:
        return self.cluster.redis is not None

    def kill_gcs(self) -> str:
        return f"gcs_server (pid {self.cluster.kill_gcs()}) SIGKILLed"

    def power_cycle(self) -> str:
        return f"{len(self.cluster.kill_head())} processes of the head SIGKILLed at once"

    def restart_redis(self) -> str:
        return f"redis-server (pid {self.cluster.restart_redis()}) SIGKILLed and started again"

    def boot_id(self) -> str | None:
        th = self.cluster.head_testhost
        return th.boot_id if th is not None else None

    def driver_alive(self, pid: int) -> bool | None:
        """Ray reports the PID the driver sees: on a test-host head, a PID in the host's own PID
        namespace, found among the host's processes here."""
        th = self.cluster.head_testhost
        here = [pid] if th is None else [p for p in th.namespace_pids() if _namespace_pid(p) == pid]
        for p in here:
            try:
                return psutil.Process(p).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                continue
        return False

    def went_down_after(self, t: float) -> float | None:
        return next((e["t"] for e in self.cluster.head_history if e["event"] == "down" and e["t"] >= t), None)


def _namespace_pid(pid: int) -> int | None:
    """A process's PID in its own (innermost) PID namespace (psutil has no NSpid)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next((ln for ln in f if ln.startswith("NSpid:")), "")
    except OSError:
        return None
    fields = line.split()[1:]
    return int(fields[-1]) if fields else None


def _properties(cluster: "EmbeddedCluster") -> dict:
    h = cluster.config.health
    return {
        "ray.version": ray.__version__,
        "cluster": f"embedded ({cluster.config.hosts} hosts)",
        "nodes": f"1 head + {len(cluster.hosts)} workers",
        "node.recovery": f"{'automatic' if cluster.config.node_recovery else 'off'} "
                         f"(delay {cluster.config.recovery_delay_s} s)",
        "health_check_period_ms": h.period_ms,
        "health_check_timeout_ms": h.timeout_ms,
        "health_check_failure_threshold": h.failure_threshold,
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    }
