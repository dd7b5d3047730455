"""An emulated kubelet: pods as real process trees on the machines that back Kubernetes nodes.

Each node is backed by a ``NodeMachine``: a ``HostMachine`` (a test host, whose containers run
inside its PID/mount/UTS/IPC/network namespaces through ``nsenter``) or ``ThisMachine`` (the root
namespace — the Ray head pod runs there, which no fault here takes, so it needs no
test host of its own).  What a real kubelet does and this one does too:

* registers each node's ``Node`` (labels, InternalIP + Hostname addresses, ``nodeInfo.bootID``,
  capacity/allocatable, conditions) and keeps ``Ready`` and ``bootID`` true to the machine: host
  down → every condition ``Unknown`` (what the node lifecycle controller writes, here at once
  instead of after 40 s without heartbeats), new boot → new ``bootID`` and ``Ready=True``;
* starts the first container of each pod bound to its nodes (``command`` + ``args`` with ``env``
  values and ``fieldRef``s) as its own session, output to a per-pod log file; the pod is
  Running and Ready at once (probes are not run), with ``podIP = hostIP`` = the node's address
  (one Ray pod per node, host-network-like);
* graceful delete: SIGTERM to the container's main process only (the runtime signals PID 1;
  ``ray start --block`` drains on SIGTERM), SIGKILL to every process of the container when the
  grace runs out (a later, shorter grace moves that moment earlier), then
  ``pods.containers_stopped``; forced delete: the same with the kubelet's 2 s minimum grace;
* a container that exits — by itself, or because its host went down — leaves its pod
  ``Succeeded`` (exit 0) or ``Failed`` with ``containerStatuses[].state.terminated``.

Restarts are not emulated: every pod has ``restartPolicy: Never`` semantics, as KubeRay's Ray
pods have with autoscaler v2 (``pod.go`` sets ``RestartPolicyNever``) — with ``Always`` a real
kubelet would restart the container in place.  KubeRay deletes a finished Ray pod and creates a
new one (``shouldDeletePod`` in KubeRay v1.7.0's raycluster_controller.go), which is what the KubeRay-like reconciler
does.  Only the first container runs (no sidecars, init containers or images: the command runs
on the machine's own filesystem).

A container is tracked by PID: its main process (the kernel reports its PID over a unix socket
with SO_PASSCRED, translated into our namespace), its session and the descendants of both;
signals go through pidfds, so a recycled PID is never signalled.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import datetime
import logging
import os
import platform
import secrets
import select
import signal
import socket
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import psutil

from chaos.embedded.kube import discovery
from chaos.embedded.kube.lifecycle import ExecProcess, PodLifecycle
from chaos.embedded.kube.resources import NODES, PODS, prepare_new
from chaos.embedded.kube.status import ApiError, bad_request
from chaos.embedded.testhost_init import DEFAULT_PATH
from chaos.errors import ClusterError, WaitTimeout
from chaos.procs import session_members

if TYPE_CHECKING:
    from chaos.embedded.kube.pods import Pods
    from chaos.embedded.testhost import HostEvent, TestHost

KUBELET_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")  # the types a kubelet owns
log = logging.getLogger(__name__)

KUBELET_MIN_GRACE_S = 2  # kuberuntime's minimumGracePeriodInSeconds
START_WARNING_S = 10.0  # a container not started by then is worth a warning
REAP_TIMEOUT_S = 10.0  # SIGKILLed processes must be gone by then
DEFAULT_ENV = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
RUNTIME_VERSION = "chaos-emulated://1"
_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# The container's first instruction: report our PID on fd 0 (a unix datagram socket whose other
# end has SO_PASSCRED, so the kernel attaches the PID), then become the container's command.
_REPORT_PID = 'printf x >&0 && exec "$@" </dev/null'


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime(_FORMAT)


class NodeMachine(abc.ABC):
    """What backs a node: where its containers run, its address, and its boots."""

    hostname: str
    address: str

    @abc.abstractmethod
    def enter(self, argv: Sequence[str]) -> list[str]:
        """argv that runs ``argv`` on this machine (ClusterError when it is down)."""

    @property
    @abc.abstractmethod
    def is_up(self) -> bool: ...

    @property
    @abc.abstractmethod
    def boot_id(self) -> str: ...

    @property
    @abc.abstractmethod
    def boot_number(self) -> int: ...

    def boot_ended(self, boot_number: int, timeout: float) -> bool:
        """Whether boot ``boot_number`` ends within ``timeout`` (it may have already)."""
        return False

    def on_power_change(self, callback: Callable[[bool, str], None]) -> None:
        """Call ``callback(up, boot_id)`` when the machine goes down or comes up."""


class ThisMachine(NodeMachine):
    """The harness's own machine (root namespaces), reached from test hosts at ``address``
    (``TestHostNetwork.head_address``).  It never reboots under the harness."""

    def __init__(self, address: str, hostname: str | None = None):
        self.address = address
        self.hostname = hostname or socket.gethostname()
        self._boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()

    def enter(self, argv: Sequence[str]) -> list[str]:
        return list(argv)

    @property
    def is_up(self) -> bool:
        return True

    @property
    def boot_id(self) -> str:
        return self._boot_id

    @property
    def boot_number(self) -> int:
        return 1


class HostMachine(NodeMachine):
    """A test host (booted with no workload): containers enter its namespaces through the init's PID."""

    def __init__(self, host: "TestHost"):
        self.host = host
        self.hostname = host.name
        self.address = host.address

    def enter(self, argv: Sequence[str]) -> list[str]:
        init = self.host.pids().get("init")
        if not self.host.is_up or init is None:
            raise ClusterError(f"test host {self.host.name} is {self.host.state.value}: cannot start {argv[0]} in it")
        return ["nsenter", "-t", str(init), "-p", "-m", "-u", "-i", "-n", "--", *argv]

    @property
    def is_up(self) -> bool:
        return self.host.is_up

    @property
    def boot_id(self) -> str:
        return self.host.boot_id

    @property
    def boot_number(self) -> int:
        return self.host.boot_count

    def boot_ended(self, boot_number: int, timeout: float) -> bool:
        try:
            self.host.wait_down(boot=boot_number, timeout=timeout)
            return True
        except WaitTimeout:
            return False

    def on_power_change(self, callback: Callable[[bool, str], None]) -> None:
        from chaos.embedded.testhost import HostState

        def listener(event: "HostEvent") -> None:
            if event.state is not HostState.BOOTING:
                callback(event.state is HostState.UP, event.boot_id)

        self.host.add_listener(listener)


@dataclasses.dataclass(eq=False)
class _Node:
    name: str
    machine: NodeMachine
    labels: dict[str, str]
    capacity: dict[str, str]
    register: bool  # False: another party creates the Node object
    pending: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)  # uid -> (ns, name)
    removed: bool = False


@dataclasses.dataclass(eq=False)
class _Container:
    namespace: str
    pod: str
    uid: str
    name: str
    image: str
    node: _Node
    env: dict[str, str]
    log_path: Path
    boot_number: int
    container_id: str = dataclasses.field(default_factory=lambda: "chaos://" + secrets.token_hex(32))
    proc: subprocess.Popen | None = None
    main_fd: int | None = None  # pidfd of the main process
    main_pid: int | None = None
    started_at: str = ""
    terminating: bool = False
    kill_at: float | None = None  # time.monotonic() of the SIGKILL
    timer: threading.Timer | None = None
    killed: bool = False  # we sent SIGKILL
    done: bool = False  # reported terminated
    thread: threading.Thread | None = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class _Exec:
    """An exec'd command; ``kill`` stops its process group (nsenter and the command inside)."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self._proc = proc
        self.stdin, self.stdout, self.stderr = proc.stdin, proc.stdout, proc.stderr
        self.pid = proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def wait(self) -> int:
        return await self._proc.wait()

    def kill(self) -> None:
        if self._proc.returncode is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)  # the group is ours until reaped
            except ProcessLookupError:
                pass


class Kubelet(PodLifecycle):
    """The kubelet of a set of nodes: ``Kubelet(log_dir)``, ``add_node(name, machine, labels)``,
    then ``ApiServer(lifecycle=kubelet)``.  ``env`` is every container's base environment
    (PATH must find what the pods run)."""

    def __init__(self, log_dir: str | os.PathLike, env: Mapping[str, str] | None = None):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = {**DEFAULT_ENV, **(env or {})}
        self._lock = threading.RLock()
        self._nodes: dict[str, _Node] = {}
        self._containers: dict[str, _Container] = {}  # pod uid -> container
        self._execs: set[_Exec] = set()
        self._closed = threading.Event()

    # ---- nodes -------------------------------------------------------------------------
    def attach(self, pods: "Pods") -> None:
        super().attach(pods)
        with self._lock:
            nodes = list(self._nodes.values())
        for node in nodes:
            self._announce(node)

    def add_node(self, name: str, machine: NodeMachine, labels: Mapping[str, str] | None = None,
                 capacity: Mapping[str, str] | None = None, register: bool = True) -> None:
        """Run the pods bound to node ``name`` on ``machine``.  ``register``: create the Node object
        (or take over an existing one); False: someone else creates it (the HyperPod agent does for
        a replacement host) and this kubelet fills in its status once it exists."""
        node = _Node(name, machine, dict(labels or {}), {**_machine_capacity(), **(capacity or {})}, register)
        with self._lock:
            if name in self._nodes:
                raise ValueError(f"node {name} already has a machine ({self._nodes[name].machine.hostname})")
            self._nodes[name] = node
        machine.on_power_change(lambda up, boot_id: self._power_changed(node, up, boot_id))
        if hasattr(self, "pods"):  # else attach() announces it
            self._announce(node)

    def remove_node(self, name: str) -> None:
        """Forget node ``name``: SIGKILL its containers and wait for them.  The Node object stays
        (removing it is the cloud's or the HyperPod agent's business, not the kubelet's)."""
        with self._lock:
            node = self._nodes.pop(name, None)
            if node is None:
                raise KeyError(f"node {name} is not run by this kubelet")
            node.removed = True
            node.pending.clear()
            containers = [c for c in self._containers.values() if c.node is node]
        for c in containers:
            self._kill(c)
        for c in containers:
            if c.thread is not None:
                c.thread.join(2 * REAP_TIMEOUT_S)

    def machine(self, name: str) -> NodeMachine:
        with self._lock:
            if name not in self._nodes:
                raise KeyError(f"node {name} is not run by this kubelet (nodes: {sorted(self._nodes)})")
            return self._nodes[name].machine

    def processes(self, namespace: str, name: str) -> tuple[int | None, list[int]]:
        """The running container of pod ``namespace/name``: its main PID and every live PID of it
        (for faults and tests); (None, []) when none runs."""
        with self._lock:
            c = next((c for c in self._containers.values() if (c.namespace, c.pod) == (namespace, name)), None)
        if c is None or c.proc is None:
            return None, []
        return c.main_pid, self._members(c)

    def node_names(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def _announce(self, node: _Node) -> None:
        if node.register:
            self._register(node)
        else:  # its thread ends once the Node appears, or at the first change after close(), or in 60 s
            threading.Thread(target=self._adopt, args=(node,), name=f"kubelet-adopt:{node.name}", daemon=True).start()

    def _register(self, node: _Node) -> None:
        """Create the Node, or take over one of that name (as a restarted kubelet does)."""
        meta = {"name": node.name, "labels": {**self._node_labels(node), **node.labels}}
        try:
            self.pods.store.create(NODES.plural, prepare_new(NODES, {
                "metadata": meta, "spec": {}, "status": self._node_status(node, None)}, None))
        except ApiError as err:
            if err.code != 409:
                raise
            self._update_node(node, labels=meta["labels"])
        self._start_bound(node)

    def _adopt(self, node: _Node) -> None:
        store = self.pods.store
        if not store.wait(lambda: self._closed.is_set() or node.removed
                          or store.get(NODES.plural, None, node.name) is not None, 60.0):
            log.warning("node %s: no Node object appeared within 60 s; its status is not posted", node.name)
            return
        if not (self._closed.is_set() or node.removed):
            self._update_node(node, labels=self._node_labels(node))
            self._start_bound(node)

    def _node_labels(self, node: _Node) -> dict[str, str]:
        return {"kubernetes.io/hostname": node.machine.hostname, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": _arch()}

    def _node_status(self, node: _Node, old: dict | None) -> dict:
        machine = node.machine
        now = _now()
        old_conditions = {c.get("type"): c for c in (old or {}).get("conditions") or []}

        def condition(kind: str, status: str, reason: str, message: str) -> dict:
            before = old_conditions.get(kind) or {}
            since = before.get("lastTransitionTime") if before.get("status") == status else None
            return {"type": kind, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": now, "lastTransitionTime": since or now}

        if machine.is_up:
            conditions = [condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                                    "kubelet has sufficient memory available"),
                          condition("DiskPressure", "False", "KubeletHasNoDiskPressure",
                                    "kubelet has no disk pressure"),
                          condition("PIDPressure", "False", "KubeletHasSufficientPID",
                                    "kubelet has sufficient PID available"),
                          condition("Ready", "True", "KubeletReady", "kubelet is posting ready status")]
        else:
            conditions = [condition(kind, "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
                          for kind in KUBELET_CONDITIONS]
        # Conditions other agents set (a node problem detector, HyperPod's health agent) are theirs:
        # a kubelet updates its own types only.
        conditions += [c for kind, c in old_conditions.items() if kind not in KUBELET_CONDITIONS]
        version = discovery.version()["gitVersion"]
        system_uuid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node.name}.{machine.hostname}"))
        return {
            "capacity": dict(node.capacity), "allocatable": dict(node.capacity), "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": machine.address},
                          {"type": "Hostname", "address": machine.hostname}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"bootID": machine.boot_id, "machineID": system_uuid.replace("-", ""),
                         "systemUUID": system_uuid, "kernelVersion": platform.release(), "osImage": _os_image(),
                         "containerRuntimeVersion": RUNTIME_VERSION, "kubeletVersion": version,
                         "kubeProxyVersion": version, "operatingSystem": "linux", "architecture": _arch()},
        }

    def _update_node(self, node: _Node, labels: Mapping[str, str] | None = None) -> None:
        """Post the node's status (as the kubelet's status loop does); a Node that is gone stays gone."""
        def change(obj: dict) -> dict:
            if labels:
                obj["metadata"]["labels"] = {**labels, **(obj["metadata"].get("labels") or {})}
            obj["status"] = {**(obj.get("status") or {}), **self._node_status(node, obj.get("status"))}
            return obj

        try:
            self.pods.store.update(NODES.plural, None, node.name, change)
        except ApiError as err:
            if err.code != 404:
                raise
            log.info("node %s: no Node object to post status to", node.name)

    def _power_changed(self, node: _Node, up: bool, boot_id: str) -> None:
        """A machine went down or came up (its supervisor thread): status, then pods waiting for it."""
        if self._closed.is_set() or node.removed or not hasattr(self, "pods"):
            return
        log.info("node %s: machine %s (boot id %s)", node.name, "up" if up else "down", boot_id)
        self._update_node(node)
        if up:
            self._start_bound(node)

    def _start_bound(self, node: _Node) -> None:
        """Start the pods bound to ``node`` that are not running (a kubelet's sync after (re)start)."""
        if not node.machine.is_up:
            return
        with self._lock:
            pending = dict(node.pending)
            node.pending.clear()
        for pod in self.pods.store.list(PODS.plural)[0]:
            if pod["spec"].get("nodeName") == node.name and pod["status"].get("phase") == "Pending" \
                    and not pod["metadata"].get("deletionTimestamp"):
                pending.setdefault(pod["metadata"]["uid"], (pod["metadata"]["namespace"], pod["metadata"]["name"]))
        for uid, (namespace, name) in pending.items():
            pod = self.pods.store.get(PODS.plural, namespace, name)
            if pod is not None and pod["metadata"]["uid"] == uid:
                self.pod_added(pod)

    # ---- pods --------------------------------------------------------------------------
    def pod_added(self, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        if self._closed.is_set() or meta.get("deletionTimestamp") or pod["status"].get("phase") in (
                "Succeeded", "Failed"):
            return
        with self._lock:
            node = self._nodes.get(spec.get("nodeName") or "")
            if node is None or meta["uid"] in self._containers:
                return
            if not node.machine.is_up:
                node.pending[meta["uid"]] = (meta["namespace"], meta["name"])
                return
            node.pending.pop(meta["uid"], None)
        container = spec["containers"][0]
        try:
            env = self._container_env(pod, container, node)
            argv = list(container.get("command") or []) + list(container.get("args") or [])
            if not argv:
                raise ValueError("no command: images are not emulated, so the container needs a command")
        except ValueError as err:
            self._status(meta["namespace"], meta["name"], meta["uid"], {"phase": "Pending", "containerStatuses": [
                {"name": container["name"], "image": container.get("image", ""), "imageID": "", "ready": False,
                 "started": False, "restartCount": 0, "lastState": {},
                 "state": {"waiting": {"reason": "CreateContainerConfigError", "message": str(err)}}}]})
            return
        c = _Container(meta["namespace"], meta["name"], meta["uid"], container["name"], container.get("image", ""),
                       node, env, self._log_path(meta, container["name"]), node.machine.boot_number)
        c.log_path.parent.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            try:
                command = node.machine.enter(["/bin/sh", "-c", _REPORT_PID, "sh", *argv])
            except ClusterError:  # the host went down since is_up: start it after the next boot
                with self._lock:
                    node.pending[meta["uid"]] = (meta["namespace"], meta["name"])
                return
            with open(c.log_path, "ab") as out:
                out.write(f"==== {_now()} node {node.name} ({node.machine.hostname}) boot {node.machine.boot_id}: "
                          f"{argv}\n".encode())
                out.flush()
                c.proc = subprocess.Popen(command, stdin=theirs, stdout=out, stderr=subprocess.STDOUT, env=env,
                                          cwd=container.get("workingDir") or "/", start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        c.started_at = _now()
        c.thread = threading.Thread(target=self._supervise, args=(c, ours), name=f"kubelet:{meta['name']}",
                                    daemon=True)
        with self._lock:
            self._containers[c.uid] = c
        c.thread.start()

    def _container_env(self, pod: dict, container: dict, node: _Node) -> dict[str, str]:
        fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
                  "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": node.name,
                  "status.podIP": node.machine.address, "status.hostIP": node.machine.address}
        env = {**self.env, "HOSTNAME": node.machine.hostname}
        for item in container.get("env") or []:
            if "value" in item or "valueFrom" not in item:
                env[item["name"]] = str(item.get("value", ""))
                continue
            path = ((item["valueFrom"] or {}).get("fieldRef") or {}).get("fieldPath")
            if path not in fields:
                raise ValueError(f"env {item['name']}: only fieldRef {sorted(fields)} is emulated, got "
                                 f"{item['valueFrom']}")
            env[item["name"]] = fields[path]
        return env

    def _supervise(self, c: _Container, report: socket.socket) -> None:
        """The container's life: learn the main PID, Running, wait for the exit, clear the rest, report."""
        proc = c.proc
        exit_fd = os.pidfd_open(proc.pid)
        try:
            with report:
                readable = select.select([report, exit_fd], [], [], START_WARNING_S)[0]
                if not readable:  # no deadline: a slow start is no failure (a delete still kills it)
                    log.warning("pod %s/%s: container (PID %d) has not started its command after %.0fs; waiting",
                                c.namespace, c.pod, proc.pid, START_WARNING_S)
                    readable = select.select([report, exit_fd], [], [])[0]
                if report in readable:
                    self._main_started(c, _sender_pid(report))
            select.select([exit_fd], [], [])  # exited (a zombie until reaped: its PID stays ours)
            self._clear(c)
        finally:
            os.close(exit_fd)
        code = proc.wait()
        with c.lock:
            if c.timer is not None:
                c.timer.cancel()
            if c.main_fd is not None:
                os.close(c.main_fd)
                c.main_fd = None
            c.done = True
            terminating, killed = c.terminating, c.killed
        with self._lock:
            self._containers.pop(c.uid, None)
        self._finished(c, code, terminating, killed)

    def _log_path(self, meta: dict, container: str) -> Path:
        return self.log_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / f"{container}.log"

    def logs(self, pod: dict, container: str | None) -> bytes | None:
        """The container's output (stdout and stderr together, as the runtime's log is), without
        the kubelet's own ``==== <time> node … boot …: <argv>`` line before each start."""
        containers = pod.get("spec", {}).get("containers") or [{}]
        path = self._log_path(pod["metadata"], container or containers[0].get("name", ""))
        if not path.exists():
            return b""
        return b"".join(line for line in path.read_bytes().splitlines(keepends=True) if not line.startswith(b"==== "))

    def _main_started(self, c: _Container, pid: int) -> None:
        """The container's command runs as ``pid``: Running and Ready; SIGTERM if a delete came first."""
        with c.lock:
            c.main_pid = pid
            try:
                c.main_fd = os.pidfd_open(pid)
            except ProcessLookupError:
                return  # already gone: the exit says how it went
            if c.terminating:
                _pidfd_signal(c.main_fd, signal.SIGTERM)
        log.info("pod %s/%s: container %s started on node %s, main PID %d", c.namespace, c.pod, c.name, c.node.name,
                 pid)
        address = c.node.machine.address
        self._status(c.namespace, c.pod, c.uid, {
            "phase": "Running", "hostIP": address, "hostIPs": [{"ip": address}], "podIP": address,
            "podIPs": [{"ip": address}], "startTime": c.started_at,
            "containerStatuses": [self._container_status(c, {"running": {"startedAt": c.started_at}}, True)]},
            ready=True)

    def _finished(self, c: _Container, code: int, terminating: bool, killed: bool) -> None:
        exit_code = 128 - code if code < 0 else code
        reason, message = ("Completed" if exit_code == 0 else "Error"), None
        if c.main_pid is None and not terminating:
            reason, message = "StartError", f"the container did not start (exit {exit_code}); see {c.log_path}"
        elif code == -signal.SIGKILL and not killed and c.node.machine.boot_ended(c.boot_number, 2.0):
            message = f"node {c.node.name}: host {c.node.machine.hostname} went down (boot {c.boot_number} ended)"
        terminated = {"exitCode": exit_code, "reason": reason, "startedAt": c.started_at, "finishedAt": _now(),
                      "containerID": c.container_id}
        if message:
            terminated["message"] = message
        log.info("pod %s/%s: container %s terminated (%s, exit %d)%s", c.namespace, c.pod, c.name, reason, exit_code,
                 f": {message}" if message else "")
        self._status(c.namespace, c.pod, c.uid, {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [self._container_status(c, {"terminated": terminated}, False)]}, ready=False)
        if terminating:
            self.pods.containers_stopped(c.namespace, c.pod, c.uid)

    @staticmethod
    def _container_status(c: _Container, state: dict, ready: bool) -> dict:
        return {"name": c.name, "image": c.image, "imageID": "", "containerID": c.container_id, "ready": ready,
                "started": "running" in state, "restartCount": 0, "state": state, "lastState": {}}

    def _status(self, namespace: str, name: str, uid: str, status: dict, ready: bool | None = None) -> None:
        """Merge ``status``; ``ready`` also sets the Ready/ContainersReady conditions (others are kept)."""
        if ready is not None:
            pod = self.pods.store.get(PODS.plural, namespace, name)
            if pod is None or pod["metadata"]["uid"] != uid:
                return
            value, now = ("True" if ready else "False"), _now()
            kinds = ("Initialized", "ContainersReady", "Ready")
            conditions = [c for c in pod["status"].get("conditions") or [] if c.get("type") not in kinds]
            status["conditions"] = conditions + [
                {"type": kind, "status": "True" if kind == "Initialized" else value, "lastTransitionTime": now,
                 **({} if ready or kind == "Initialized" else {"reason": "PodCompleted"})} for kind in kinds]
        self.pods.set_status(namespace, name, status, uid=uid)

    def pod_terminating(self, pod: dict, grace_seconds: int) -> None:
        self._stop(pod, grace_seconds)

    def pod_removed(self, pod: dict) -> None:
        self._stop(pod, max(KUBELET_MIN_GRACE_S, pod["metadata"].get("deletionGracePeriodSeconds") or 0),
                   gone=True)

    def _stop(self, pod: dict, grace: float, gone: bool = False) -> None:
        """SIGTERM the main process now, SIGKILL the container at ``now + grace`` (or earlier if set)."""
        meta = pod["metadata"]
        with self._lock:
            c = self._containers.get(meta["uid"])
            node = self._nodes.get(pod["spec"].get("nodeName") or "")
            if c is None:
                if node is not None:
                    node.pending.pop(meta["uid"], None)
        if c is None:
            if node is not None and not gone:  # never started here: nothing to wait for
                self.pods.containers_stopped(meta["namespace"], meta["name"], meta["uid"])
            return
        kill_at = time.monotonic() + grace
        with c.lock:
            if c.done:
                stopped_already = True
            else:
                stopped_already = False
                if not c.terminating:
                    c.terminating = True
                    log.info("pod %s/%s: SIGTERM to main PID %s, SIGKILL in %.0fs", c.namespace, c.pod, c.main_pid,
                             grace)
                    if c.main_fd is not None:  # else it goes as soon as the PID is known
                        _pidfd_signal(c.main_fd, signal.SIGTERM)
                if c.kill_at is None or kill_at < c.kill_at:
                    c.kill_at = kill_at
                    if c.timer is not None:
                        c.timer.cancel()
                    c.timer = threading.Timer(grace, self._kill, args=(c,))
                    c.timer.daemon = True
                    c.timer.start()
        if stopped_already and not gone:
            self.pods.containers_stopped(c.namespace, c.pod, c.uid)

    def _kill(self, c: _Container) -> None:
        """SIGKILL every process of the container (grace over, close, node removed)."""
        with c.lock:
            if c.done:
                return
            c.killed = True
        log.info("pod %s/%s: SIGKILL to the container's processes", c.namespace, c.pod)
        _kill_tree(self._members(c), f"pod {c.namespace}/{c.pod}")

    def _members(self, c: _Container) -> list[int]:
        """The container's live processes: its session, and the descendants of the main process.
        nsenter (the session leader, outside the host) is left to exit with its child, so that its
        exit status is the container's."""
        roots = {c.main_pid} if c.main_pid is not None else {c.proc.pid}
        skip = {c.proc.pid} if c.main_pid not in (None, c.proc.pid) else set()
        return [pid for pid in _tree(c.proc.pid, roots) if pid not in skip]

    def _clear(self, c: _Container) -> None:
        """The main process has exited: as a runtime does when PID 1 of a container ends, kill
        what is left of it (daemons, orphans), until nothing is."""
        for _ in range(10):
            members = _tree(c.proc.pid, {c.proc.pid})
            members = [pid for pid in members if pid != c.proc.pid]
            if not members:
                return
            log.info("pod %s/%s: main process exited; SIGKILL to %d leftover processes %s", c.namespace, c.pod,
                     len(members), members)
            _kill_tree(members, f"pod {c.namespace}/{c.pod}")
        log.warning("pod %s/%s: processes kept appearing after 10 rounds of SIGKILL", c.namespace, c.pod)

    # ---- exec --------------------------------------------------------------------------
    async def exec(self, pod: dict, container: str, argv: Sequence[str], stdin: bool, tty: bool) -> ExecProcess:
        meta = pod["metadata"]
        with self._lock:
            c = self._containers.get(meta["uid"])
            node = self._nodes.get(pod["spec"].get("nodeName") or "")
        if node is None:
            raise bad_request(f"node {pod['spec'].get('nodeName')} of pod {meta['name']} has no kubelet here: "
                              f"cannot exec")
        if c is None or c.main_pid is None or c.done or c.name != container:
            raise ApiError(400, "BadRequest", f'container "{container}" in pod "{meta["name"]}" is not running '
                                              f'(phase {pod["status"].get("phase")})')
        try:
            command = node.machine.enter(argv)
        except ClusterError as err:
            raise ApiError(500, "InternalError", f"cannot exec in pod {meta['name']}: {err}") from err
        proc = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=c.env, start_new_session=True)
        process = _Exec(proc)
        with self._lock:
            self._execs = {e for e in self._execs if e.returncode is None} | {process}
        return process

    # ---- teardown ----------------------------------------------------------------------
    def close(self) -> None:
        """SIGKILL every container and exec this kubelet started (by PID) and wait for them."""
        self._closed.set()
        with self._lock:
            containers = list(self._containers.values())
            execs = list(self._execs)
        errors = []
        for c in containers:
            with c.lock:
                if c.timer is not None:
                    c.timer.cancel()
            try:
                self._kill(c)
            except WaitTimeout as err:
                errors.append(str(err))
        for c in containers:
            if c.thread is not None:
                c.thread.join(2 * REAP_TIMEOUT_S)
                if c.thread.is_alive():
                    errors.append(f"pod {c.namespace}/{c.pod} (PID {c.main_pid})")
        for e in execs:
            try:
                fd = os.pidfd_open(e.pid)
            except ProcessLookupError:
                continue
            try:
                e.kill()
                if not select.select([fd], [], [], REAP_TIMEOUT_S)[0]:
                    errors.append(f"exec PID {e.pid}")
            finally:
                os.close(fd)
        if errors:
            raise WaitTimeout(f"kubelet close: still running after SIGKILL: {', '.join(errors)}")


def _pidfd_signal(fd: int, signum: int) -> None:
    try:
        signal.pidfd_send_signal(fd, signum)
    except ProcessLookupError:
        pass  # exited already


def _sender_pid(sock: socket.socket) -> int:
    _, ancillary, _, _ = sock.recvmsg(16, socket.CMSG_SPACE(struct.calcsize("iII")))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return struct.unpack("iII", data[:struct.calcsize("iII")])[0]
    raise ClusterError("the container's PID report carried no credentials")


def _tree(session: int, roots: set[int]) -> list[int]:
    """Live PIDs in session ``session`` or descending from ``roots`` (zombies are dead already)."""
    found = set(session_members(session))
    for pid in roots:
        try:
            root = psutil.Process(pid)
            found |= {pid} | {c.pid for c in root.children(recursive=True)}
        except psutil.NoSuchProcess:
            continue
    return sorted(pid for pid in found if _alive(pid))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def _kill_tree(pids: Sequence[int], what: str) -> None:
    """SIGKILL ``pids`` through pidfds and wait until each has exited."""
    fds = []
    try:
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            fds.append(fd)
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass  # exited since /proc was read
        for fd in fds:
            if not select.select([fd], [], [], REAP_TIMEOUT_S)[0]:
                raise WaitTimeout(f"{what}: awaited the exit of SIGKILLed processes {list(pids)} for "
                                  f"{REAP_TIMEOUT_S:.0f}s; one is still running")
    finally:
        for fd in fds:
            os.close(fd)


def _machine_capacity() -> dict[str, str]:
    return {"cpu": str(os.cpu_count() or 1), "memory": f"{psutil.virtual_memory().total // 1024}Ki", "pods": "110"}


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _os_image() -> str:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME", "Linux")
    except OSError:
        return "Linux"
