"""The embedded cluster: a real Ray head and real Ray worker nodes on this machine.

Each worker host's node runs on a ``Machine``.  Plain mode (no root needed): a
``LoopbackMachine``, a ``ray start --block`` process tree on the host's own loopback
address — head 127.0.1.1, workers 127.0.1.2 and up (127.0.<n+1>.x for ``slot`` n).  127.0.0.1 is never used: Ray silently
rewrites it to the machine's network address.  Namespaces mode (root): a
``TestHostMachine``, the workload of a test host (chaos.embedded.testhost).

Every node runs in its own session, so stopping a node means signalling exactly the
PIDs of that session.  A supervisor thread watches each worker's raylet; with automatic
node recovery on (the SageMaker HyperPod behaviour) a worker whose raylet died is
started again after ``recovery_delay_s`` and joins as a new Ray node.  Every node starts
with this interpreter's directory first on PATH, so a job's ``python`` is the one with Ray.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import fcntl
import itertools
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from chaos.errors import ClusterError, WaitTimeout
from chaos.procs import TrackedProcess

if TYPE_CHECKING:
    from chaos.embedded.redis import RedisServer
    from chaos.embedded.testhost import TestHost

log = logging.getLogger(__name__)



@dataclasses.dataclass(frozen=True)
class HealthChecks:
    """GCS node health-check settings, tuned so a dead node is declared in ~2-3 s."""

    period_ms: int = 500
    timeout_ms: int = 1000
    failure_threshold: int = 3
    initial_delay_ms: int = 1000

    def env(self) -> dict[str, str]:
        return {
            "RAY_health_check_period_ms": str(self.period_ms),
            "RAY_health_check_timeout_ms": str(self.timeout_ms),
            "RAY_health_check_failure_threshold": str(self.failure_threshold),
            "RAY_health_check_initial_delay_ms": str(self.initial_delay_ms),
        }


@dataclasses.dataclass
class EmbeddedConfig:
    workers: int = 3
    cpus_per_worker: int = 1
    gpus_per_worker: int = 0  # >0 on a GPU machine: each worker advertises the GPU(s) (they may share one)
    node_recovery: bool = True  # "automatic node recovery", as HyperPod does
    recovery_delay_s: float = 2.0
    base_dir: Path = Path("reports/embedded")
    start_timeout_s: float = 180.0
    object_store_mb: int = 150
    #: "plain": loopback processes; "namespaces": each worker in its own test host
    #: (network/PID/mount/UTS namespaces, sshd, boot id) — needs root.
    hosts: str = "plain"
    #: bridge and subnet of the test hosts; None = the slot's rcbr<slot> / 198.18.<slot>.0/24
    subnet: str | None = None
    bridge: str | None = None
    #: which of the machine's SLOTS this cluster takes (0-7): its own bridge rcbr<slot>,
    #: loopback block 127.0.<slot+1>.x and port slice, held by a lock while it runs, so
    #: clusters of several processes cannot pick the same bridge or port.  None: the highest
    #: free slot (pytest-xdist's workers name theirs from the bottom: 2n, 2n+1).
    slot: int | None = None
    health: HealthChecks = dataclasses.field(default_factory=HealthChecks)
    #: RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S of every node: how long a SIGTERMed node drains
    #: (a preemption's notice).  Ray's default is 30 s; KubeRay users set it just under the
    #: pod's grace period.  Shorter here so preemption suites do not wait out 30 s each.
    drain_window_s: float = 10.0
    #: GCS fault tolerance: the GCS keeps its tables in a real external Redis (started and
    #: stopped by the cluster, 127.0.0.1 only), so a restarted head reloads them and the
    #: surviving nodes reconnect.  Off (Ray's default): a lost GCS is a lost cluster.
    gcs_ft: bool = False
    #: RAY_gcs_rpc_server_reconnect_timeout_s of every node: how long raylets, workers and
    #: drivers wait for a lost GCS before they exit (Ray's default 60 s).
    gcs_reconnect_timeout_s: float = 60.0
    #: a head that exits is started again on the same address and ports after
    #: ``recovery_delay_s``, as Kubernetes restarts a head container (or a VM boots again).
    head_recovery: bool = True
    #: "local": the head is this machine's `ray start --head` process tree; "testhost"
    #: (namespaces mode): the head is a test host of its own, so a head reboot is a real power
    #: cycle with a new boot id (the head-fault clusters; one test host more to start).
    head_host: str = "local"
    #: a directory holding libcuda.so.1, first on every node's LD_LIBRARY_PATH, as a GPU node
    #: has its driver there: a stand-in for a profile's cluster, whose sessions bring no driver
    #: (the stub of chaos/shim/cuda_stub on a machine without a GPU).
    cuda_driver_dir: Path | None = None

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"embedded cluster needs at least 1 worker node, got workers={self.workers}")
        if self.workers > 250:
            raise ValueError(f"workers={self.workers}: at most 250 loopback worker addresses (127.0.1.2-127.0.1.251)")
        if self.cpus_per_worker < 1:
            raise ValueError(f"cpus_per_worker must be >= 1, got {self.cpus_per_worker}")
        if self.hosts not in ("plain", "namespaces"):
            raise ValueError(f"hosts={self.hosts!r}: expected 'plain' or 'namespaces'")
        if self.recovery_delay_s < 0:
            raise ValueError(f"recovery_delay_s must be >= 0, got {self.recovery_delay_s}")
        if self.head_host not in ("local", "testhost"):
            raise ValueError(f"head_host={self.head_host!r}: expected 'local' or 'testhost'")
        if self.head_host == "testhost" and self.hosts != "namespaces":
            raise ValueError("head_host='testhost' needs hosts='namespaces' (test hosts, root)")
        if self.gcs_reconnect_timeout_s <= 0:
            raise ValueError(f"gcs_reconnect_timeout_s must be > 0, got {self.gcs_reconnect_timeout_s}")
        if self.cuda_driver_dir is not None and not (Path(self.cuda_driver_dir) / "libcuda.so.1").is_file():
            raise ValueError(f"cuda_driver_dir={self.cuda_driver_dir}: no libcuda.so.1 there")
        if self.slot is not None and not 0 <= self.slot < SLOTS:
            raise ValueError(f"slot={self.slot}: expected 0-{SLOTS - 1} (one per concurrent embedded cluster)")

    def ports(self) -> range:
        """The ports this cluster's nodes may take."""
        return port_slice(self.slot)

    def loopback_block(self) -> str:
        """The first three octets of the plain-mode addresses (head .1, workers .2 and up)."""
        return f"127.0.{1 if self.slot is None else self.slot + 1}"


_PORTS_HANDED_OUT: dict[int, int] = {}  # port -> serial of its latest hand-out
_HANDOUT_SERIAL = itertools.count()
_RECENT_HANDOUTS = 64  # ten node boots
_PORT_RANGE = range(61000, 65000)  # above the ephemeral range (32768-60999) and Ray's worker ports (10002-19999)
SLOTS = 8  # concurrent clusters on one machine (EmbeddedConfig.slot): 500 ports each
SLOT_LOCKS = Path("/tmp/ray-chaos-slots")


def port_slice(slot: int | None) -> range:
    """The ports of the cluster in ``slot`` (None: the whole range)."""
    if slot is None:
        return _PORT_RANGE
    size = len(_PORT_RANGE) // SLOTS
    return range(_PORT_RANGE.start + slot * size, _PORT_RANGE.start + (slot + 1) * size)


class SlotClaim:
    """A slot held by this process: an flock, so it is free again when the process ends,
    however it ends."""

    def __init__(self, slot: int, fd: int):
        self.slot, self._fd = slot, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def claim_slot(slot: int | None, bridge: bool) -> SlotClaim:
    """Hold ``slot``, or with None the highest free one — free meaning no live process holds
    it and, for a cluster of test hosts (``bridge``), no bridge is left on it by a killed
    session.  Two processes starting clusters at once thereby never share ports or a bridge."""
    SLOT_LOCKS.mkdir(parents=True, exist_ok=True)
    held = []
    for n in ([slot] if slot is not None else range(SLOTS - 1, -1, -1)):
        fd = os.open(SLOT_LOCKS / f"slot{n}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            held.append(n)
            continue
        claim = SlotClaim(n, fd)
        if bridge:
            try:
                free_bridge(n)
            except ClusterError:
                claim.release()
                if slot is not None:
                    raise
                continue
        return claim
    if slot is not None:
        raise ClusterError(f"embedded-cluster slot {slot} is held by another process on this machine "
                           f"(lock {SLOT_LOCKS}/slot{slot}.lock); stop that cluster or pick another slot")
    raise ClusterError(f"no free embedded-cluster slot on this machine (held by other processes: {sorted(held)}; "
                       "the others have bridges left by killed sessions: `ray-chaos sweep` or "
                       "`python -m chaos.embedded down`)")


#: how long a cluster start waits for another process's start to finish (three clusters of
#: test hosts on 2 cores take up to ~5 min each under load).
START_WAIT_S = 900.0


_STARTING = threading.RLock()  # this process's side of the start lock: re-entrant, threads queue
_starting_depth = 0


@contextlib.contextmanager
def one_start_at_a_time(what: str, timeout: float = START_WAIT_S):
    """Hold the machine's start lock while ``what`` boots.  A cluster start is the burst
    that saturates a small machine (a dozen Ray processes importing at once); two at once
    on 2 cores can miss Ray's own fixed waits (the dashboard agent's), so parallel
    sessions (pytest-xdist) start their clusters one after another and run side by side.
    An flock between processes (a start killed half-way frees it); within one process a
    re-entrant lock, so a start inside a start never waits for itself."""
    global _starting_depth
    from chaos.waits import poll_until

    if not _STARTING.acquire(timeout=timeout):
        raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for this process's other cluster start to finish "
                          f"before starting {what}")
    fd = None
    try:
        if _starting_depth == 0:
            SLOT_LOCKS.mkdir(parents=True, exist_ok=True)
            path = SLOT_LOCKS / "starting.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

            def take():
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = path.read_text().strip() or "another process"
                    return False, f"{path} held by {holder}"
                return True, "taken"

            poll_until(take, timeout, f"the machine's cluster-start lock to start {what}", interval=0.5)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"PID {os.getpid()} starting {what}\n".encode(), 0)
        _starting_depth += 1
        try:
            yield
        finally:
            _starting_depth -= 1
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock
        _STARTING.release()


def free_bridge(slot: int | None = None, bridge: str | None = None, subnet: str | None = None) -> tuple[str, str]:
    """The test-host bridge and subnet for a cluster: ``bridge`` if given, else rcbr<slot> /
    198.18.<slot>.0/24, else the first free pair of rcbr0..rcbr15 — refused while in use.
    Clusters pass their claimed slot (claim_slot)."""
    from chaos.embedded import netns

    if bridge is None and slot is not None:
        bridge, subnet = f"rcbr{slot}", f"198.18.{slot}.0/24"
    if bridge:
        if netns.link_exists(bridge) or netns.netns_names(f"{bridge}-"):
            raise ClusterError(f"bridge {bridge} is already in use (another embedded cluster, or one a killed "
                               "session left: `python -m chaos.embedded down` or `ray-chaos sweep`)")
        return bridge, subnet or "198.18.0.0/24"
    for n in range(16):
        name = f"rcbr{n}"
        if not netns.link_exists(name) and not netns.netns_names(f"{name}-"):
            return name, f"198.18.{n}.0/24"
    raise ClusterError("no free test-host bridge among rcbr0..rcbr15; stop other embedded clusters first")


def free_port(ports: range = _PORT_RANGE) -> int:
    """A port free on every interface: one this process never handed out, else the one it
    handed out longest ago (a dead node's), never one of its last _RECENT_HANDOUTS — their
    nodes may not have bound them yet.

    Ray's gRPC servers bind the wildcard address, so the check must too; ports come
    from above the kernel's ephemeral range so outgoing connections cannot take them.
    """
    latest = next(_HANDOUT_SERIAL)
    for port in sorted(ports, key=lambda p: _PORTS_HANDED_OUT.get(p, -1)):
        if _PORTS_HANDED_OUT.get(port, -_RECENT_HANDOUTS - 1) >= latest - _RECENT_HANDOUTS:
            break  # the rest were handed out even more recently
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _PORTS_HANDED_OUT[port] = latest
        return port
    raise ClusterError(f"no free TCP port left in {ports.start}-{ports.stop - 1}")


def _ray_bin() -> str:
    path = Path(sys.executable).with_name("ray")
    if not path.exists():
        found = shutil.which("ray")
        if not found:
            raise ClusterError("the `ray` command was not found next to this Python or on PATH; install ray[default]")
        return found
    return str(path)


def _node_ports_args(ports: range) -> list[str]:
    """Explicit free ports: several nodes on one machine must not share Ray's defaults."""
    return [f"--{flag}={free_port(ports)}" for flag in (
        "node-manager-port", "object-manager-port", "metrics-export-port", "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port", "runtime-env-agent-port")]


def raylet_of(proc: TrackedProcess) -> tuple[int, str] | None:
    """(pid, node id) of the raylet in a node's process tree, matched by its binary path."""
    return raylet_in(proc.members())


#: start-up boots of a node whose raylet missed Ray's wait for its dashboard agent (boot 1 is
#: the first; two more before the start fails)
AGENT_WAIT_RESTARTS = 2


def agent_wait_aborts(node_temp_dir: Path) -> int:
    """How many times a node's raylet aborted in WaitForDashboardAgentPorts: the raylet waits a
    fixed ~15 s (Ray 2.60) for its dashboard agent's port files and exits when they are late,
    which a start on a machine busy with other runs can miss."""
    count = 0
    for log_file in node_temp_dir.glob("session_latest/logs/raylet*.err"):
        try:
            count += log_file.read_text(errors="replace").count("NodeManager::WaitForDashboardAgentPorts")
        except OSError:
            continue
    return count


def raylet_in(pids) -> tuple[int, str] | None:
    for pid in pids:
        try:
            cmd = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if cmd and cmd[0].endswith("/raylet/raylet"):
            for arg in cmd:
                if arg.startswith("--node_id="):
                    return pid, arg.split("=", 1)[1]
    return None


@dataclasses.dataclass
class WorkerHost:
    """One embedded worker machine: an address, and the Ray node currently on it."""

    name: str
    ip: str = ""
    machine: "Machine | None" = None
    raylet_pid: int | None = None
    node_id: str | None = None
    boots: int = 0
    down_since: float | None = None
    last_log: Path | None = None
    boot_seen: int = 0
    history: list[str] = dataclasses.field(default_factory=list)  # node ids, oldest first

    @property
    def process(self) -> TrackedProcess | None:
        """The node's process tree on a plain host (None on a test host or while down)."""
        return self.machine.process

    @property
    def testhost(self) -> "TestHost | None":
        """The test host (namespaces mode; None on a plain host)."""
        return self.machine.testhost


class Machine(abc.ABC):
    """What a worker host's Ray node runs on.  The cluster boots it and its supervisor thread
    calls ``check`` to follow the node's raylet and bring the host back when it died."""

    process: TrackedProcess | None = None
    testhost: "TestHost | None" = None

    def __init__(self, cluster: "EmbeddedCluster", host: WorkerHost):
        self.cluster = cluster
        self.host = host

    @abc.abstractmethod
    def boot(self, argv: list[str], env: dict[str, str]) -> Path:
        """Start ``argv`` (``ray start ... --block``) as the host's node; return its log."""

    @abc.abstractmethod
    def check(self, now: float) -> None:
        """Follow the raylet (supervisor thread); recover the host when it is due."""

    @abc.abstractmethod
    def restart(self) -> None:
        """Start the host's node again now (start-up only: before the supervisor runs)."""

    @abc.abstractmethod
    def state(self) -> str:
        """A word for messages: down, booting, up..."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop everything the host runs (teardown); raise when something is left."""

    def keep_logs(self, dest: Path) -> None:
        """Copy logs that live outside the cluster's log dir to ``dest`` (teardown)."""

    def _found(self, raylet: tuple[int, str], boot: int) -> None:
        host = self.host
        with self.cluster._cond:
            host.raylet_pid, host.node_id = raylet
            if not host.history or host.history[-1] != host.node_id:
                host.history.append(host.node_id)
            host.down_since = None
            host.boot_seen = boot
            self.cluster._cond.notify_all()


class LoopbackMachine(Machine):
    """Plain mode: the node is a process tree of this machine on the host's loopback address.
    When its raylet dies the rest of the tree is stopped, and node recovery starts a new
    tree after the recovery delay."""

    def boot(self, argv: list[str], env: dict[str, str]) -> Path:
        host = self.host
        self.process = TrackedProcess(argv, self.cluster.log_dir / f"{host.name}.boot{host.boots}.log", env=env,
                                      name=host.name)
        return self.process.log_path

    def check(self, now: float) -> None:
        host, proc = self.host, self.process
        if proc is not None and host.raylet_pid is None:
            found = raylet_of(proc)
            if found:
                self._found(found, host.boots)
            elif not proc.alive():
                self._mark_down(now)
            return
        if proc is not None and (not psutil.pid_exists(host.raylet_pid) or _is_zombie(host.raylet_pid)):
            log.warning("%s: raylet pid %s (node %s) is gone", host.name, host.raylet_pid, host.node_id)
            self._mark_down(now)
            return
        config = self.cluster.config
        if proc is None and config.node_recovery and host.down_since is not None:
            if now - host.down_since >= config.recovery_delay_s:
                self.cluster._boot(host)

    def _mark_down(self, now: float) -> None:
        self.stop()  # the rest of the dead node's processes (agents, log monitor)
        with self.cluster._cond:
            self.host.raylet_pid = None
            self.host.down_since = now
            self.cluster._cond.notify_all()

    def restart(self) -> None:
        self._mark_down(time.monotonic())
        self.cluster._boot(self.host)
        self.host.down_since = None

    def state(self) -> str:
        return "down" if self.process is None else "booting"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


class TestHostMachine(Machine):
    """Namespaces mode: the node is the workload of a test host, which reboots by itself
    (a reboot over SSH); the cluster only follows its raylet.  If the raylet dies while the
    host stays up, node recovery power-cycles the host (as HyperPod reboots a node), after
    which its workload starts a new node."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, cluster: "EmbeddedCluster", host: WorkerHost, testhost: "TestHost"):
        super().__init__(cluster, host)
        self.testhost = testhost

    def boot(self, argv: list[str], env: dict[str, str]) -> Path:
        th = self.testhost
        # Torch's gloo resolves the hostname to pick an interface; a test host's name does not
        # resolve, so name the interface, as one does on real multi-NIC nodes.
        th.workload, th.env = argv, {**env, "GLOO_SOCKET_IFNAME": "eth0"}
        if not th.is_up:
            th.boot(wait=True)
        return th.workload_log

    def check(self, now: float) -> None:
        host, th, cond = self.host, self.testhost, self.cluster._cond
        if not th.is_up:
            with cond:
                host.raylet_pid = None
                host.down_since = host.down_since or now
                cond.notify_all()
            return
        if host.raylet_pid is None:
            found = raylet_in(th.namespace_pids())
            if found:
                self._found(found, th.boot_count)
            return
        if psutil.pid_exists(host.raylet_pid) and not _is_zombie(host.raylet_pid):
            return
        if host.boot_seen != th.boot_count:  # the host rebooted under us: wait for its new raylet
            host.raylet_pid = None
            return
        host.down_since = host.down_since or now
        # Give a reboot in progress time to take the host down before treating this as a dead raylet.
        config = self.cluster.config
        if config.node_recovery and now - host.down_since >= max(1.5, config.recovery_delay_s):
            log.warning("%s: raylet %s died, host still up: rebooting it (node recovery)", host.name, host.raylet_pid)
            host.raylet_pid = None
            host.boots += 1
            th.power_cycle()

    def restart(self) -> None:
        """Power the host off and on (its workload, the node, starts with the boot)."""
        th, host = self.testhost, self.host
        th.power_off()
        with self.cluster._cond:
            host.raylet_pid, host.node_id, host.down_since = None, None, None
        host.boots += 1
        th.boot(wait=True)

    def state(self) -> str:
        return self.testhost.state.value

    def stop(self) -> None:
        self.testhost.close()

    def keep_logs(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for log_file in Path(self.testhost.state_dir).glob("*.log"):
            shutil.copy2(log_file, dest / log_file.name)


class EmbeddedCluster:
    def __init__(self, config: EmbeddedConfig | None = None):
        self.config = config or EmbeddedConfig()
        self.base_dir = Path(self.config.base_dir).resolve()
        self.head: TrackedProcess | None = None  # the local head
        self.head_testhost: "TestHost | None" = None  # or the head's test host
        self.gcs_port = 0
        self.dashboard_port = 0
        self.network = None
        self.redis: "RedisServer | None" = None
        #: the head's life: {"t", "event": up|down|killed, ...}, oldest first (head faults' evidence)
        self.head_history: list[dict] = []
        self.head_boots = 0
        self._claim: SlotClaim | None = None
        self.hosts = [WorkerHost(name=f"worker-{i + 1}") for i in range(self.config.workers)]
        self._place_on_loopback()
        for host in self.hosts:
            host.machine = LoopbackMachine(self, host)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._head_supervisor: threading.Thread | None = None
        # Short on purpose: Ray puts unix sockets under it (108-byte path limit).
        self.temp_dir = Path(f"/tmp/rc-{os.getpid()}")

    # -- addresses ---------------------------------------------------------------
    @property
    def gcs_address(self) -> str:
        return f"{self.head_ip}:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.head_ip}:{self.dashboard_port}"

    @property
    def log_dir(self) -> Path:
        return self.base_dir / "logs"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.config.health.env())
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = str(self.config.drain_window_s)
        env["RAY_gcs_rpc_server_reconnect_timeout_s"] = str(int(self.config.gcs_reconnect_timeout_s))
        # Ray must only ever talk on loopback; keep proxies out of the picture.
        for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
            env.pop(k, None)
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.0/8,localhost"
        # Ray turns token auth on by itself once any local ray.init() has left ~/.ray/auth_token;
        # this cluster never leaves loopback or the test-host bridge, and its clients send no token.
        env["RAY_AUTH_MODE"] = "disabled"
        # A job's entrypoint (`python my_train.py`) is looked up on its node's PATH: make it
        # this interpreter, the one with Ray, whatever the shell that started us had first.
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)])
        if self.config.cuda_driver_dir is not None:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                [str(Path(self.config.cuda_driver_dir).resolve()), *filter(None, [env.get("LD_LIBRARY_PATH")])])
        return env

    # -- lifecycle ---------------------------------------------------------------
    def _place_on_loopback(self) -> None:
        block = self.config.loopback_block()
        self.head_ip = f"{block}.1"
        for i, host in enumerate(self.hosts):
            host.ip = f"{block}.{i + 2}"

    def up(self) -> "EmbeddedCluster":
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._claim = claim_slot(self.config.slot, bridge=self.config.hosts == "namespaces" and not self.config.bridge)
        self.config = dataclasses.replace(self.config, slot=self._claim.slot)
        self._place_on_loopback()
        try:
            with one_start_at_a_time(f"embedded cluster (slot {self._claim.slot})"):
                self._start()
        except BaseException:
            self.down()
            raise
        self._supervisor = threading.Thread(target=self._supervise, name="embedded-supervisor", daemon=True)
        self._supervisor.start()
        self._head_supervisor = threading.Thread(target=self._supervise_head, name="embedded-head", daemon=True)
        self._head_supervisor.start()
        return self

    def _start(self) -> None:
        if self.config.hosts == "namespaces":
            self._create_testhosts()
        if self.config.gcs_ft:
            from chaos.embedded.redis import RedisServer

            # On the test-host bridge's own address when the head is a test host (it cannot
            # reach this machine's loopback), else on loopback.
            self.redis = RedisServer(free_port(self.config.ports()), self.temp_dir / "redis",
                                     self.log_dir / "redis.log",
                                     host=self.network.head_address if self.head_testhost else "127.0.0.1").start()
        self._start_head()
        for host in self.hosts:
            self._boot(host)
        self.wait_workers_alive(self.config.start_timeout_s)

    def _create_testhosts(self) -> None:
        """Namespaces mode: one test host per worker on a bridge with no route out."""
        from chaos.embedded.testhost import TestHostNetwork

        bridge, subnet = free_bridge(self.config.slot, self.config.bridge, self.config.subnet)
        self.network = TestHostNetwork(state_dir=Path("/tmp") / f"rc-{os.getpid()}-hosts", bridge=bridge,
                                       subnet=subnet, boot_delay=self.config.recovery_delay_s).up()
        self.head_ip = self.network.head_address
        if self.config.head_host == "testhost":
            # Its workload is the head; when `ray start --block` exits (its GCS died) the host
            # reboots, as Kubernetes restarts a head container.
            self.head_testhost = self.network.add_host("rc-head", reboot_when_workload_exits=self.config.head_recovery)
            self.head_ip = self.head_testhost.address
        for host in self.hosts:
            host.machine = TestHostMachine(self, host, self.network.add_host(f"rc-{host.name}"))
            host.ip = host.testhost.address

    def _start_head(self) -> None:
        """Start the head (again: on the same address and ports) and wait for its dashboard."""
        ports = self.config.ports()
        if not self.gcs_port:
            self.gcs_port, self.dashboard_port, self._client_port = free_port(ports), free_port(ports), free_port(ports)
        env = self._env()
        # A restarted head container starts with an empty /tmp/ray.  Left in place, the address
        # file makes `ray start` refuse the address while this machine runs processes that name
        # it (the other nodes' raylets and workers, here on the same machine).
        (self.temp_dir / "head" / "ray_current_cluster").unlink(missing_ok=True)
        if self.redis is not None:
            env["RAY_REDIS_ADDRESS"] = self.redis.address
            # One cluster's tables in Redis; a restarted head finds them under the same namespace.
            env["RAY_external_storage_namespace"] = f"chaos-{self.temp_dir.name}"
        argv = [
            _ray_bin(), "start", "--head", "--block",
            f"--node-ip-address={self.head_ip}", f"--port={self.gcs_port}",
            "--num-cpus=0", "--num-gpus=0",
            "--include-dashboard=true", f"--dashboard-host={self.head_ip}", f"--dashboard-port={self.dashboard_port}",
            f"--ray-client-server-port={self._client_port}",
            f"--object-store-memory={self.config.object_store_mb * 1024 * 1024}",
            f"--temp-dir={self.temp_dir / 'head'}",
            *_node_ports_args(ports),
        ]
        self.head_boots += 1
        if self.head_testhost is not None:
            th = self.head_testhost
            # Every boot of the host runs this (the address file: see above).
            th.workload = ["sh", "-c", f"rm -f {self.temp_dir / 'head' / 'ray_current_cluster'}; exec "
                           + " ".join(shlex.quote(a) for a in argv)]
            th.env = env
            th.boot(wait=True)
            log_path = th.workload_log
        else:
            self.head = TrackedProcess(argv, self.log_dir / f"head.boot{self.head_boots}.log", env=env,
                                       name="ray-head")
            log_path = self.head.log_path
        deadline = time.monotonic() + self.config.start_timeout_s
        while time.monotonic() < deadline:
            if not self._head_running():
                code = f" with code {self.head.popen.returncode}" if self.head is not None else ""
                raise ClusterError(f"the Ray head exited{code} during start-up; see {log_path}:\n"
                                   + _tail_file(log_path))
            if self._head_answers():
                self._head_event("up", boot=self.head_boots, **self._head_facts())
                return
            if self._stop.wait(0.5):
                raise ClusterError("the cluster was stopped while its head was starting")
        raise ClusterError(
            f"the Ray head's dashboard at {self.dashboard_url} did not answer within {self.config.start_timeout_s:.0f}s; "
            f"see {log_path}"
        )

    def _head_running(self) -> bool:
        """Whether the head's `ray start --block` runs (on its test host: this boot's workload)."""
        if self.head_testhost is None:
            return self.head is not None and self.head.alive()
        pid = self.head_testhost.pids().get("workload") if self.head_testhost.is_up else None
        return pid is not None and psutil.pid_exists(pid) and not _is_zombie(pid)

    def _head_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def _head_facts(self) -> dict:
        """For the head's history: its PID, or its test host's boot."""
        if self.head_testhost is not None:
            th = self.head_testhost
            return {"host": th.name, "host_boot": th.boot_count, "boot_id": th.boot_id}
        return {"pid": self.head.pid if self.head else None}

    def _boot(self, host: WorkerHost) -> None:
        argv = [
            _ray_bin(), "start", "--block", f"--address={self.gcs_address}",
            f"--node-ip-address={host.ip}", f"--num-cpus={self.config.cpus_per_worker}",
            f"--num-gpus={self.config.gpus_per_worker}",
            f"--object-store-memory={self.config.object_store_mb * 1024 * 1024}",
            f"--resources={json.dumps({'chaos_' + host.name.replace('-', '_'): 1})}",
            # Own temp dir per node: concurrent starts otherwise race for socket names.
            f"--temp-dir={self.temp_dir / host.name}",
            *_node_ports_args(self.config.ports()),
        ]
        host.boots += 1
        log.info("booting %s at %s (boot %d)", host.name, host.ip, host.boots)
        with self._cond:
            host.raylet_pid = None
            host.node_id = None
        boot_log = host.machine.boot(argv, self._env())
        with self._cond:
            host.last_log = boot_log

    def down(self) -> None:
        """Stop every node by PID; idempotent."""
        self._stop.set()
        for thread in (self._supervisor, self._head_supervisor):
            if thread and thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=10)
        errors = []
        for host in self.hosts:
            try:
                host.machine.stop()
            except Exception as e:  # keep stopping the rest; report all at the end
                errors.append(f"{host.name}: {e}")
            host.machine.keep_logs(self.log_dir / "hosts" / host.name)
        if self.network is not None:
            try:
                self.network.close()
            except Exception as e:
                errors.append(f"test hosts: {e}")
            if self.head_testhost is not None:
                dest = self.log_dir / "hosts" / self.head_testhost.name
                dest.mkdir(parents=True, exist_ok=True)
                for log_file in Path(self.head_testhost.state_dir).glob("*.log"):
                    shutil.copy2(log_file, dest / log_file.name)
            shutil.rmtree(self.network.state_dir, ignore_errors=True)  # it holds the SSH private key
        if self.head is not None:
            try:
                self.head.stop()
            except RuntimeError as e:
                errors.append(str(e))
        if self.redis is not None:
            try:
                self.redis.stop()
            except RuntimeError as e:
                errors.append(str(e))
        self._keep_ray_logs()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if errors:
            raise ClusterError("embedded cluster teardown left processes behind: " + "; ".join(errors))
        if self._claim is not None:  # kept while anything of the cluster may be left on the slot
            self._claim.release()

    def _keep_ray_logs(self) -> None:
        """Copy each node's Ray session logs under base_dir before the temp dir goes."""
        for node_dir in sorted(self.temp_dir.glob("*")):
            logs = node_dir / "session_latest" / "logs"
            if logs.is_dir():
                dest = self.log_dir / "ray" / node_dir.name
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(logs, dest, ignore=shutil.ignore_patterns("*.sock", "events", "export_events"),
                                dirs_exist_ok=True)

    # -- supervision -------------------------------------------------------------
    def _supervise(self) -> None:
        while not self._stop.wait(0.2):
            for host in self.hosts:
                host.machine.check(time.monotonic())

    def _supervise_head(self) -> None:
        """Follow the head; with head recovery on, start one that exited again after the delay
        (a test host does that itself: it reboots when its workload exits)."""
        if self.head_testhost is not None:
            return self._follow_head_testhost()
        down_since = None
        while not self._stop.wait(0.2):
            if self.head.alive():
                continue
            if down_since is None:
                down_since = time.monotonic()
                self._head_event("down", pid=self.head.pid, code=self.head.popen.returncode,
                                 why=_tail_file(self.head.log_path, 3))
                self.head.stop()  # what `ray start --block` left (job drivers, workers of the head)
            if self.config.head_recovery and time.monotonic() - down_since >= self.config.recovery_delay_s:
                try:
                    self._start_head()
                except ClusterError as err:
                    self._head_event("start_failed", error=str(err))
                    log.error("the head did not come back: %s", err)
                down_since = None

    def _follow_head_testhost(self) -> None:
        """Record the head test host's downs and ups (a boot counts as up once its dashboard answers)."""
        th, down = self.head_testhost, False
        up_boot = th.boot_count  # up() saw this boot answer
        while not self._stop.wait(0.2):
            running = self._head_running()
            if not running and not down:
                down = True
                self._head_event("down", host=th.name, host_boot=th.boot_count, state=th.state.value,
                                 why=_tail_file(th.workload_log, 3))
            elif running and down and th.boot_count != up_boot and self._head_answers():
                down, up_boot = False, th.boot_count
                self.head_boots += 1
                self._head_event("up", boot=self.head_boots, **self._head_facts())

    def _head_event(self, event: str, **detail) -> None:
        with self._cond:
            self.head_history.append({"t": time.time(), "event": event, **detail})
            self._cond.notify_all()

    # -- head faults ---------------------------------------------------------------
    def head_processes(self) -> dict[str, int]:
        """The head's Ray processes by name (gcs_server, raylet, ...): PID."""
        out = {}
        if self.head_testhost is not None:
            pids = self.head_testhost.namespace_pids() if self._head_running() else []
        else:
            pids = self.head.members() if self.head and self.head.alive() else []
        for pid in pids:
            try:
                out.setdefault(psutil.Process(pid).name(), pid)
            except psutil.NoSuchProcess:
                continue
        return out

    def kill_gcs(self) -> int:
        """SIGKILL the GCS server; `ray start --block` then stops the rest of the head and exits,
        as a head container whose GCS crashed does.  Returns the PID killed."""
        pid = self.head_processes().get("gcs_server")
        if pid is None:
            raise ClusterError(f"the head ({self._head_facts()}) runs no gcs_server now")
        self._head_event("killed", what="gcs_server", pid=pid)
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill_head(self) -> list[int]:
        """Every process of the head killed at once: its test host power-cycled (a new boot id),
        or the local head's process tree SIGKILLed; head recovery brings it back after the
        delay.  Returns the PIDs killed."""
        if not self._head_running():
            raise ClusterError("the head is not running")
        if self.head_testhost is not None:
            th = self.head_testhost
            pids = th.namespace_pids()
            self._head_event("killed", what="head host", pids=pids, boot_id=th.boot_id)
            th.power_cycle() if self.config.head_recovery else th.power_off()
            return pids
        pids = self.head.members()
        self._head_event("killed", what="head", pids=pids)
        self.head.stop(sig=signal.SIGKILL)
        return pids

    def restart_redis(self) -> int:
        """SIGKILL the GCS's Redis and start it again on the same port and data (its AOF);
        returns the PID killed."""
        if self.redis is None:
            raise ClusterError("this cluster runs without GCS fault tolerance: there is no Redis to restart")
        pid = self.redis.kill()
        self._head_event("killed", what="redis", pid=pid)
        self.redis.start()
        self._head_event("redis_up", pid=self.redis.proc.pid)
        return pid

    def wait_head_up(self, after: int, timeout: float) -> dict:
        """Wait until the head has come up in a boot numbered above ``after``; return that event."""
        def up():
            return next((e for e in self.head_history if e["event"] == "up" and e["boot"] > after), None)

        with self._cond:
            if not self._cond.wait_for(up, timeout):
                raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for the head to come up after boot "
                                  f"{after}; head history: {[e['event'] for e in self.head_history]}")
            return up()

    # -- queries and waits -------------------------------------------------------
    def wait_workers_alive(self, timeout: float) -> None:
        """Wait until every worker host has a live raylet registered with the GCS."""
        deadline = time.monotonic() + timeout
        aborts_seen = {h.name: 0 for h in self.hosts}
        while True:
            for host in self.hosts:
                if self._supervisor is None:  # start-up: a node that dies now is a start-up failure
                    host.machine.check(time.monotonic())
                    if host.down_since is not None:
                        if self._start_again(host, aborts_seen):
                            continue
                        raise ClusterError(
                            f"{host.name} ({host.ip}) died during start-up; see {host.last_log} and the raylet logs "
                            f"under {self.temp_dir / host.name}:\n" + _tail_file(host.last_log)
                        )
            alive_ids = {n["node_id"] for n in self.gcs_nodes() if n["alive"]}
            missing = [h.name for h in self.hosts if h.node_id is None or h.node_id not in alive_ids]
            if not missing:
                return
            if time.monotonic() > deadline:
                logs = ", ".join(str(h.last_log) for h in self.hosts if h.last_log and h.name in missing)
                raise ClusterError(
                    f"worker nodes {missing} did not register with the Ray head within {timeout:.0f}s; logs: {logs or 'none'}"
                )
            self._stop.wait(0.3)

    def _start_again(self, host: WorkerHost, aborts_seen: dict[str, int]) -> bool:
        """Boot again a node whose raylet died at start-up because it missed Ray's fixed wait for
        its dashboard agent (a loaded machine: another session's run beside this start), at most
        AGENT_WAIT_RESTARTS times; any other death stays a start-up failure."""
        aborts = agent_wait_aborts(self.temp_dir / host.name)
        if aborts <= aborts_seen[host.name] or host.boots > AGENT_WAIT_RESTARTS:
            return False
        aborts_seen[host.name] = aborts
        log.warning("%s (%s): its raylet aborted waiting for its dashboard agent (Ray's fixed wait, "
                    "WaitForDashboardAgentPorts, missed under load): booting it again", host.name, host.ip)
        host.machine.restart()
        return True

    def gcs_nodes(self) -> list[dict]:
        """Node table straight from the dashboard (no driver connection needed)."""
        try:
            with urllib.request.urlopen(f"{self.dashboard_url}/nodes?view=summary", timeout=5) as r:
                payload = json.load(r)
        except OSError:
            return []
        out = []
        for n in payload.get("data", {}).get("summary", []):
            raylet = n.get("raylet", {})
            out.append({"node_id": raylet.get("nodeId"), "ip": n.get("ip") or raylet.get("nodeManagerAddress"),
                        "alive": raylet.get("state") == "ALIVE"})
        return out

    def wait_host_rejoined(self, host: WorkerHost, old_node_id: str, timeout: float) -> str:
        """Wait until ``host`` runs a new Ray node (a different node id) again."""
        with self._cond:
            ok = self._cond.wait_for(lambda: host.node_id is not None and host.node_id != old_node_id, timeout)
            if not ok:
                raise WaitTimeout(
                    f"timed out after {timeout:.0f}s waiting for {host.name} ({host.ip}) to rejoin with a new node id; "
                    f"it is {host.machine.state()} (node recovery "
                    f"{'on' if self.config.node_recovery else 'off'}), node history {host.history}"
                )
            return host.node_id

    def status(self) -> dict:
        return {
            "gcs_address": self.gcs_address,
            "dashboard_url": self.dashboard_url,
            "head_pid": self.head.pid if self.head else None,
            "head_host": self.head_testhost.name if self.head_testhost else None,
            "bridge": self.network.bridge.name if self.network else None,
            "node_recovery": self.config.node_recovery,
            "recovery_delay_s": self.config.recovery_delay_s,
            "health_checks": dataclasses.asdict(self.config.health),
            "hosts": [
                {"name": h.name, "ip": h.ip, "pid": h.process.pid if h.process else None,
                 "raylet_pid": h.raylet_pid, "node_id": h.node_id, "boots": h.boots, "history": h.history}
                for h in self.hosts
            ],
        }


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _tail_file(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(log unreadable)"
