"""The one interface between the harness and whatever runs a cluster.

A backend supplies facts: the cluster view, which host a Ray node runs on (a `Host`
handle, looked up by node id: recreated pods and replaced machines get new addresses),
node facts for the safety rules, health, and how to reach a host again from a ledger
entry.  The safety rules themselves run here, in the base class, and fail closed: the
settings refuse every node unless a profile (or the backend, explicitly) allows it, an
unknown node is refused, the head is refused unless allowed, and a subclass may not
replace the target check or the session (lock, health guard).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, ClassVar, Iterator, Mapping, Protocol

from chaos.backends.jobs_store import ClusterLedger, JobsStore
from chaos.backends.lock import ClusterLock, LockLost
from chaos.cleanup import Cleanup
from chaos.cluster import ClusterView, Node, Target
from chaos.errors import ClusterError
from chaos.faults import catalog
from chaos.profile import SafetySettings
from chaos.ray_support import dashboard_ray_version, require_same_ray
from chaos.report import Reporter
from chaos.safety import HealthGuard, LiveFaults, NodeInfo, Safety, TargetRefused
from chaos.transport.base import Transport

if TYPE_CHECKING:
    from chaos.embedded.cluster import EmbeddedCluster
    from chaos.embedded.kubernetes import EmbeddedKubernetes
    from chaos.embedded.netns import Console
    from chaos.privileges import Escalation
    from chaos.profile import Profile
    from chaos.storage.access import ObjectStorage
    from chaos.storage.proxy import ProxyAdmin
    from chaos.transport.kube_access import KubeAccess

log = logging.getLogger(__name__)

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
#: how long a session's way out (hosts closed, lock released) may take; with the dashboard
#: silent, the release is skipped after one look (chaos.cleanup.PROBE_S)
LEAVE_S = 15.0

# What a backend may not override: the target check and the session that holds the lock
# and runs the health guard.
_SHARED = ("check_target", "check_privileges", "session", "observe", "lock_state")


@dataclasses.dataclass(frozen=True)
class Host:
    """The machine (or pod) a Ray node runs on, as its backend reaches it."""

    key: str  # the backend's name for it, stable across the nodes it runs (recorded in the ledger)
    name: str | None  # for reports
    transport: Transport  # shared by everything that reaches this host in one session
    console: "Console | None" = None  # out-of-band access that survives a partition
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the platform's own labels for it


class HeadControl(Protocol):
    """The ``head`` capability: what head faults (chaos.faults.head) do to a cluster's head and
    read of it besides Ray's own APIs, which go while it is down."""

    gcs_ft: bool  # the GCS keeps its tables in an external Redis

    def kill_gcs(self) -> str: ...
    def power_cycle(self) -> str: ...
    def restart_redis(self) -> str: ...
    def boot_id(self) -> str | None:
        """The head machine's boot id (None: the head has no machine of its own)."""
    def driver_alive(self, pid: int) -> bool | None:
        """Whether the process with PID ``pid`` on the head (a job's driver) still runs."""
    def went_down_after(self, t: float) -> float | None:
        """When the head's process tree was last seen gone after ``t`` (None: not seen)."""


def profile_view(profile, where: str) -> ClusterView:
    """``profile``'s Ray cluster, reached over its dashboard (no Ray driver: ``where`` names
    the cluster in the error)."""
    ray_settings = profile.ray
    # Before anything else reaches the cluster: one it cannot judge is refused, naming both Rays.
    require_same_ray(dashboard_ray_version(ray_settings.dashboard_url), where=where)
    return ClusterView(ray_settings.dashboard_url, ray_settings.gcs_address)


def ray_node_info(cluster: ClusterView, node_id: str) -> NodeInfo | None:
    """What Ray's node table says about a node, for the safety rules (None: not in it)."""
    node = cluster.node(node_id)
    if node is None:
        return None
    return NodeInfo(node_id=node_id, ip=node.ip, hostname=cluster.hostname(node_id), labels=node.labels,
                    is_head=node.is_head)


class Backend(abc.ABC):
    """A cluster and its hosts as one kind of platform runs them.  Subclasses implement the
    abstract methods (facts); the rest — hosts by node id, target checks, the session — is
    shared."""

    #: the registry's name for it, written only here (chaos.backends.BACKENDS is keyed by it)
    name: ClassVar[str] = ""
    #: interpreter on the hosts, for small helper scripts
    python: str = "python3"
    #: whether something besides the harness may drain this cluster's nodes (a spot reclaim,
    #: an autoscaler): then Train's preemption watcher stays on in every run
    external_drains: bool = True

    # Optional capabilities, declared here so that every caller reads them the same way; a
    # backend that has one sets it itself (constructor or _open), never its caller.
    #: the Kubernetes API, for the faults and checks that act through it
    kube: "KubeAccess | None" = None
    #: the harness's own embedded cluster (chaos.embedded.cluster), while the session runs
    embedded: "EmbeddedCluster | None" = None
    #: the harness's own emulated Kubernetes cluster (chaos.embedded.kubernetes), under --chaos-kubernetes
    embedded_kubernetes: "EmbeddedKubernetes | None" = None
    #: control of the cluster's head, for the head faults
    head: HeadControl | None = None

    def __init__(self, profile: "Profile | None" = None, safety: SafetySettings | None = None):
        """``profile``: the cluster's profile, whose safety section applies; without one,
        ``safety``; without that, the defaults, which refuse every node."""
        self.profile = profile
        self.settings = profile.safety if profile is not None else (safety or SafetySettings())
        self.safety = Safety(self.settings)
        self.live_faults = LiveFaults(self.settings.max_live_faults)
        self.cluster: ClusterView | None = None
        self.head_node_id: str | None = None
        self.properties: dict = {}  # environment.properties for the report, set when opened
        self.reporter = Reporter()
        #: set while a fault that takes the head away is armed: the health guard, which counts
        #: nodes in the head's table, holds (the fault's own deadlines bound the wait)
        self.head_away = threading.Event()
        #: where the session keeps its open ledger entries on the cluster (a profile's, while locked)
        self.cluster_ledger: ClusterLedger | None = None
        self._hosts: dict[str, Host] = {}
        self._hosts_lock = threading.Lock()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        replaced = [m for m in _SHARED if m in cls.__dict__]
        if replaced:
            raise TypeError(f"{cls.__name__} overrides {', '.join(replaced)}: safety checks and the session are "
                            "shared by every backend")

    # -- what each backend supplies ------------------------------------------------
    @classmethod
    def serves(cls, profile: "Profile | None") -> bool:
        """Whether this backend runs the cluster ``profile`` describes (None: the embedded one)."""
        return False

    @property
    @abc.abstractmethod
    def label(self) -> str:
        """The backend as reports and summary.json name it."""

    @property
    @abc.abstractmethod
    def storage_path(self) -> str:
        """Where runs keep checkpoints: seen alike by every node (a shared filesystem, or S3)."""

    # The storage capabilities (chaos.faults.catalog.CAPABILITIES): properties, since the
    # embedded cluster starts its S3 server only when a run or a fault first asks for it.
    @property
    def object_storage(self) -> "ObjectStorage | None":
        """The S3 storage runs may checkpoint to (None: none): the profile's, when its
        storage path is an s3:// URI."""
        from chaos.storage.access import ObjectStorage

        storage = self.profile.storage if self.profile is not None else None
        return ObjectStorage(storage) if storage is not None and storage.path.startswith("s3://") else None

    @property
    def storage_proxy(self) -> "ProxyAdmin | None":
        """The admin API of the fault proxy the S3 endpoint is reached through (None: none)."""
        from chaos.storage.proxy import ProxyAdmin

        store = self.object_storage
        proxy = store.s3.fault_proxy if store is not None else None
        return ProxyAdmin(proxy.admin_url) if proxy is not None else None

    @abc.abstractmethod
    def _open(self) -> ClusterView:
        """Start or reach the cluster and connect this driver to it."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Undo ``_open``, also after it failed half-way."""

    @abc.abstractmethod
    def node_info(self, node_id: str) -> NodeInfo | None:
        """The node as the safety rules see it (None: not a node of this cluster)."""

    @abc.abstractmethod
    def host_key(self, node: Node) -> str:
        """Which host ``node`` runs on, as a `Host.key`."""

    @abc.abstractmethod
    def connect(self, key: str) -> Transport:
        """A new, unshared connection to the host ``key``."""

    @abc.abstractmethod
    def _reach(self, key: str, node: Node | None) -> Host:
        """A handle for the host ``key`` (``node``: a node it runs, when one is known)."""

    def escalation(self, host: Host) -> "Escalation | None":
        """How a privileged command gets root on ``host`` (chaos.privileges), or why it cannot;
        None where the catalog's privileges do not apply: no login of a user of the profile's
        (the embedded cluster's hosts run as root; pods act through the Kubernetes API)."""
        return None

    @abc.abstractmethod
    def healthy_workers(self) -> tuple[bool, str]:
        """(every worker host runs a live node, what was seen)."""

    @abc.abstractmethod
    def wait_healed(self, timeout: float) -> None:
        """Wait until every worker host runs a live node again (raise WaitTimeout/ClusterError)."""

    # -- hosts -------------------------------------------------------------------------
    def host(self, node_id: str) -> Host:
        """The host the Ray node ``node_id`` runs on."""
        node = self.cluster.node(node_id)
        if node is None:
            raise ClusterError(f"node {node_id[:8]} is not in the node table at {self.cluster.dashboard_url}")
        return self.reach(self.host_key(node), node)

    def reach(self, key: str, node: Node | None = None) -> Host:
        """The host ``key`` names, e.g. in a ledger entry after its nodes are gone.
        One handle, and one shared connection, per host and session."""
        with self._hosts_lock:
            if key not in self._hosts:
                self._hosts[key] = self._reach(key, node)
            return self._hosts[key]

    def close_hosts(self) -> None:
        """Close every shared connection (the session does, and so does a sweep)."""
        with self._hosts_lock:
            for host in self._hosts.values():
                host.transport.close()
            self._hosts.clear()

    def same_host(self, host: Host, node: Node) -> bool:
        """Whether ``node`` runs on ``host`` (e.g. a rebooted host came back as a new node)."""
        return self.host_key(node) == host.key

    def boot_id(self, host: Host) -> str:
        """The host's boot id, over a new connection (a reboot kills the shared one);
        raises TransportError while the host does not answer."""
        transport = self.connect(host.key)
        try:
            return transport.run(BOOT_ID, timeout=5).check().stdout.strip()
        finally:
            transport.close()

    # -- safety: shared, fail closed -------------------------------------------------------
    def check_target(self, target: "Target") -> None:
        """Raise TargetRefused unless the safety settings allow a fault on the target's node."""
        info = self.node_info(target.node_id)
        if info is None:
            raise TargetRefused(f"node {target.node_id[:8]} ({target.node_ip}) is not a node of this cluster: "
                                "nothing is known about it, so it is not targeted", "node table")
        self.safety.check_target(info)

    def check_privileges(self, kind: str, target: "Target") -> None:
        """Raise PrivilegeRefused when a fault of ``kind`` needs root on the target's host (the
        catalog's privileges) and the host's login cannot get it: before the ledger entry, so
        nothing is recorded or injected."""
        from chaos.privileges import PrivilegeRefused

        needs = catalog.kind(kind).privileges
        if not needs:
            return
        escalation = self.escalation(self.host(target.node_id))
        if escalation is not None and not escalation.ok:
            raise PrivilegeRefused(escalation, kind, needs)

    @contextlib.contextmanager
    def session(self, reporter: Reporter, lock: bool = True, on_abort: Callable[[str], None] = lambda reason: None,
                owner: str = "") -> Iterator["Backend"]:
        """The cluster for one harness session: opened, locked against other sessions
        (``lock``; ``owner``: the session id its ledger entries carry) and watched by the health
        guard, which calls ``on_abort`` when it fires; everything released on the way out,
        within bounds when the cluster does not answer.

        On a profile's cluster the lock beats (chaos.backends.lock) and ``cluster_ledger`` keeps
        the open ledger entries there, so that any runner's sweep can clean up after this one;
        a session finding another session's open faults there is refused until a sweep."""
        self.reporter = reporter
        if self.profile is not None:
            self.profile.ensure_not_protected()
            for note in self.profile.notes():
                reporter.say(f"profile note: {note}")
        cluster_lock: ClusterLock | None = None
        beating: threading.Thread | None = None
        stop = threading.Event()
        try:
            self.cluster = self._open()
            head = next((n for n in self.cluster.nodes() if n.is_head), None)
            if head is None:
                raise ClusterError(f"no head node in the node table at {self.cluster.dashboard_url}")
            self.head_node_id = head.node_id
            if lock:
                cluster_lock = self._lock(owner)
                beating = self._beat(cluster_lock, stop, on_abort)
            self._guard(stop, on_abort)
            yield self
        finally:
            stop.set()
            self.cluster_ledger = None
            self._leave(cluster_lock, beating)

    def _lock(self, owner: str) -> ClusterLock:
        """Take the cluster's lock; on a profile's cluster, then refuse if another session's
        faults are still open there (the live-fault limit and the ledger hold cluster-wide)."""
        store = JobsStore(self.cluster.dashboard_url)
        s = self.settings
        heartbeat = s.lock_heartbeat_s if self.profile is not None else None  # the embedded cluster ends with us
        cluster_lock = ClusterLock(self.cluster.dashboard_url, owner=owner, heartbeat_s=heartbeat,
                                   stale_after_s=s.lock_stale_after_s, store=store)
        cluster_lock.acquire()
        if self.profile is None:
            return cluster_lock
        try:
            left = ClusterLedger(store).entries()
        except BaseException:
            cluster_lock.release()
            raise
        if left:
            cluster_lock.release()
            raise ClusterError(f"{len(left)} fault(s) of another session are still open on this cluster: "
                               + "; ".join(f"{e['fault']} ({e['id']}) on {(e.get('target') or {}).get('node_ip')} "
                                           f"by session {e.get('session')}" for e in left.values())
                               + f"; `ray-chaos sweep --profile {self.profile.name}` reverts them")
        self.cluster_ledger = ClusterLedger(store)
        return cluster_lock

    def _beat(self, cluster_lock: ClusterLock, stop: threading.Event,
              on_abort: Callable[[str], None]) -> threading.Thread | None:
        """The lock's heartbeat, until ``stop``; the session is aborted once the lock is no
        longer its own, or once its beats have failed long enough for another runner to
        take it for lost."""
        if not cluster_lock.heartbeat_s:
            return None
        interval, stale_after = cluster_lock.heartbeat_s, cluster_lock.stale_after_s

        def beat():
            landed = time.monotonic()
            while not stop.wait(interval):
                try:
                    cluster_lock.beat()
                    landed = time.monotonic()
                except LockLost as e:
                    on_abort(f"lock lost: {e}")
                    return
                except ClusterError as e:
                    log.warning("heartbeat on the cluster's lock failed: %s", e)
                    if time.monotonic() - landed > stale_after - interval:
                        on_abort(f"no heartbeat reached the cluster for {time.monotonic() - landed:.0f} s: another "
                                 f"runner's sweep may take this session for lost after {stale_after:g} s ({e})")
                        return

        beating = threading.Thread(target=beat, name="lock-heartbeat", daemon=True)
        beating.start()
        return beating

    def _leave(self, cluster_lock: ClusterLock | None, beating: threading.Thread | None) -> None:
        """Close the hosts, give the lock back and close the cluster, each bounded: a cluster
        that does not answer keeps its lock until a sweep sees the heartbeat stopped."""
        way_out = Cleanup(self.reporter.say, LEAVE_S)
        way_out.step("close the connections to the hosts", self.close_hosts)
        if cluster_lock is not None and cluster_lock.held:
            way_out.unreachable = cluster_lock.store.silent  # known silent: no second look
            if not way_out.unreachable:
                way_out.probe(self.cluster)
            if beating is not None:  # a beat under way (~20 ms) lands before the release removes the beats
                way_out.step("let the last heartbeat land", lambda: beating.join(3.0), needs_cluster=True)
            way_out.step("release the cluster's lock", cluster_lock.release, needs_cluster=True)
        self._close()

    @contextlib.contextmanager
    def observe(self, reporter: Reporter) -> Iterator["Backend"]:
        """The cluster read-only, for a dry run: a profile's Ray reached over its dashboard (its
        node table, the lock's holder), nothing started, locked, watched or changed; the
        embedded cluster is not started at all (``cluster`` stays None)."""
        self.reporter = reporter
        try:
            if self.profile is not None:
                self.profile.ensure_not_protected()
                self.cluster = profile_view(self.profile, f"profile {self.profile.name!r}")
                head = next((n for n in self.cluster.nodes() if n.is_head), None)
                self.head_node_id = head.node_id if head is not None else None
            yield self
        finally:
            self.close_hosts()
            self._close()

    def lock_state(self) -> str:
        """Who holds the cluster's lock, read without taking it (a dry run's plan)."""
        if self.cluster is None:
            return "none: the embedded cluster is the session's own"
        try:
            store = JobsStore(self.cluster.dashboard_url)
            open_ = ClusterLedger(store).entries() if self.profile is not None else {}
            return ClusterLock(self.cluster.dashboard_url, store=store).state() + (
                f"; {len(open_)} fault(s) of another session still open on the cluster (a run now would be refused "
                "until `ray-chaos sweep` reverts them)" if open_ else "")
        except ClusterError as e:
            return f"unknown: {e}"

    def _guard(self, stop: threading.Event, on_abort: Callable[[str], None]) -> None:
        guard = HealthGuard.from_settings(self.settings, lambda: len(self.cluster.alive_workers()))

        def watch():
            while not stop.wait(1.0):
                if self.head_away.is_set():
                    guard.hold()
                    continue
                reason = guard.observe()
                if reason:
                    on_abort(f"stop condition: {reason}")
                    return

        threading.Thread(target=watch, name="health-guard", daemon=True).start()
