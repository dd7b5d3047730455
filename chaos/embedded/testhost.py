"""Embedded test hosts: simulated machines for Ray worker nodes.

A ``TestHost`` is a network + PID + mount + UTS + IPC namespace set on a bridge owned by a
``TestHostNetwork``: its own address, hostname, sshd with its own host key, a boot id
that changes at every boot, and a workload (e.g. ``ray start ... --block``). Power is cut
the way a real machine loses it: the PID namespace's init dies and the kernel kills every
process in it at once. A harness-side supervisor thread per host watches each boot and
boots the host again after a reboot.

This is the supervisor (harness side); the init, PID 1 inside the host, is
chaos.embedded.testhost_init. The init reports to the supervisor over a unix datagram
socket with SO_PASSCRED, so the supervisor learns host-side PIDs and sshd readiness
(sshd's own ``sd_notify``) without polling and without the network, which may be
partitioned.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import ipaddress
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Mapping, Sequence

import chaos
from chaos.embedded import netns
from chaos.embedded.testhost_init import DEFAULT_PATH, INIT_MARKER, POWER_COMMANDS, POWER_SCRIPT, SSHD
from chaos.errors import ClusterError, WaitTimeout

log = logging.getLogger(__name__)

DEFAULT_BRIDGE = "rcbr0"
DEFAULT_SUBNET = "198.18.0.0/24"
REBOOT_COMMAND = "systemctl reboot"
_REBOOT_CAUSES = ("reboot", "power-cycle")  # boot ends after which the host boots again

_HOSTNAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_REQUIRED_TOOLS = {"ip": "iproute2", "iptables": "iptables", "nsenter": "util-linux",
                   "unshare": "util-linux", "setpriv": "util-linux", SSHD: "openssh-server"}


#: where an isolated host's binds may go: each of these becomes its own (a tmpfs over this machine's)
BIND_TOPS = ("opt", "mnt", "srv")
#: where an isolated host sees its own state dir (its real path may lie under a /tmp it does not share)
STATE_VIEW = "/run/testhost"


@dataclasses.dataclass(frozen=True)
class Isolation:
    """What a test host does *not* share with this machine's filesystem (the foreign-cluster
    stand-in, chaos.embedded.foreign): its own empty ``private`` directories (a machine's own
    /tmp, /var/tmp, /dev/shm), this machine's ``hide`` paths covered by an empty read-only
    tmpfs (the harness's checkout, venv, reports), and ``binds`` (path here, path inside)
    mounted first — a node's own install of Python and Ray, its disk, a shared filesystem.
    A bind's target lies under /opt, /mnt or /srv, which become the host's own (a tmpfs over
    this machine's), so nothing is created on this machine's disk.  ``users``: login users of the
    host's own besides root, (name, whether sudo gives them root without a password), who log in
    with root's key — in the host's own copies of /etc/passwd, group, shadow and sudoers.d,
    homes in its /run: this machine's user database is never written."""

    binds: tuple[tuple[str, str], ...] = ()
    hide: tuple[str, ...] = ()
    private: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm")
    users: tuple[tuple[str, bool], ...] = ()

    def __post_init__(self):
        for name, _ in self.users:
            if not _USER_RE.match(name) or name == "root":
                raise ValueError(f"login user {name!r}: a lower-case user name other than root")
        for source, target in self.binds:
            parts = Path(target).parts
            if not Path(target).is_absolute() or len(parts) < 3 or parts[1] not in BIND_TOPS:
                raise ValueError(f"bind target {target!r}: an absolute path at least two levels deep under "
                                 f"{', '.join('/' + t for t in BIND_TOPS)} (the host's own there)")
            if not Path(source).exists():
                raise ValueError(f"bind source {source!r} does not exist")

    def to_json(self) -> dict:
        return {"binds": [list(b) for b in self.binds], "hide": list(self.hide), "private": list(self.private),
                "users": [[name, sudo] for name, sudo in self.users]}


class TestHostUnsupported(ClusterError):
    """This machine cannot run test hosts (not root, no namespaces, a tool missing)."""


@functools.lru_cache(maxsize=1)
def testhosts_supported() -> tuple[bool, str]:
    """(True, "") when test hosts can run here, else (False, reason) for a skip message."""
    if os.geteuid() != 0:
        return False, f"test hosts need root (namespaces, bridge, iptables); running as uid {os.geteuid()}"
    missing = [f"{tool} (apt package {pkg})" for tool, pkg in _REQUIRED_TOOLS.items()
               if not shutil.which(tool)]
    if missing:
        return False, "test hosts need " + ", ".join(missing)
    probe = ["unshare", "--net", "--pid", "--mount", "--uts", "--ipc", "--fork", "--mount-proc", "true"]
    p = subprocess.run(probe, capture_output=True, text=True, timeout=10)
    if p.returncode != 0:
        return False, f"cannot create namespaces (`{' '.join(probe)}`: {p.stderr.strip()})"
    return True, ""


def require_testhosts() -> None:
    ok, reason = testhosts_supported()
    if not ok:
        raise TestHostUnsupported(reason)


class HostState(enum.Enum):
    OFF = "off"
    BOOTING = "booting"
    UP = "up"  # sshd is accepting connections


@dataclasses.dataclass(frozen=True)
class HostEvent:
    """One power-state change of a host, for timelines and reports."""

    time: float  # time.time()
    host: str
    state: HostState
    boot_count: int
    boot_id: str
    detail: str


def ensure_ed25519_key(path: Path, comment: str) -> str:
    """Create an OpenSSH ed25519 key pair at ``path`` once; return the public key line."""
    pub = path.with_name(path.name + ".pub")
    if path.exists() and pub.exists():
        return pub.read_text().strip()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode() + f" {comment}"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    pub.write_text(public + "\n")
    return public


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


class TestHost(netns.Console):  # partition / heal / is_partitioned through its netns
    """One simulated machine. Create through ``TestHostNetwork.add_host``.

    ``workload`` (argv) and ``env`` are read at every boot, so they may be set after the
    host's address is known. State changes are published through ``events``, listeners
    and a condition variable behind ``wait_up``/``wait_down``.
    """

    __test__ = False  # not a pytest test class despite the name

    reboot_command = REBOOT_COMMAND

    def __init__(self, network: "TestHostNetwork", name: str, link: netns.HostLink, state_dir: Path,
                 workload: Sequence[str] | None, env: Mapping[str, str] | None, boot_delay: float,
                 boot_timeout: float, reboot_when_workload_exits: bool, isolation: Isolation | None = None):
        self.network = network
        self.name = name
        self.link = link
        self.state_dir = state_dir
        self.workload = list(workload) if workload else None
        self.env = dict(env or {})
        self.boot_delay = boot_delay
        self.boot_timeout = boot_timeout
        self.reboot_when_workload_exits = reboot_when_workload_exits
        self.isolation = isolation
        self.events: list[HostEvent] = []
        self._listeners: list[Callable[[HostEvent], None]] = []
        self._cv = threading.Condition()
        self._state = HostState.OFF
        self._boot_count = 0
        self._ended_boot = 0  # number of the last boot that has ended
        self._last_up_boot = 0  # number of the last boot whose sshd answered
        self._boot_id = ""
        self._last_detail = "never booted"
        self._want_on = False
        self._closing = False
        self._pending_cause: str | None = None  # set by the harness before it cuts power
        self._proc: subprocess.Popen | None = None
        self._pids: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self.host_key = ensure_ed25519_key(self.state_dir / "ssh_host_ed25519_key", f"root@{name}")

    # --- what callers read -------------------------------------------------------------

    @property
    def address(self) -> str:
        return str(self.link.address)

    @property
    def netns(self) -> str:
        return self.link.netns

    @property
    def state(self) -> HostState:
        return self._state

    @property
    def is_up(self) -> bool:
        return self._state is HostState.UP

    @property
    def boot_count(self) -> int:
        return self._boot_count

    @property
    def boot_id(self) -> str:
        """The current (or last) boot's id, as /proc/sys/kernel/random/boot_id shows inside."""
        return self._boot_id

    @property
    def workload_log(self) -> Path:
        return self.state_dir / "workload.log"

    def pids(self) -> dict[str, int]:
        """Host-side PIDs of this boot: unshare, init, sshd, workload (those that exist)."""
        with self._cv:
            return dict(self._pids)

    def namespace_pids(self) -> list[int]:
        """Host-side PIDs of every process in this boot's PID namespace (init included)."""
        init = self.pids().get("init")
        if init is None:
            return []
        try:
            st = os.stat(f"/proc/{init}/ns/pid")
        except FileNotFoundError:
            return []
        return netns.processes_in_namespace("pid", (st.st_dev, st.st_ino))

    def add_listener(self, callback: Callable[[HostEvent], None]) -> None:
        """Call ``callback(event)`` on every state change (from the supervisor thread)."""
        self._listeners.append(callback)

    # --- power ---------------------------------------------------------------------------

    def boot(self, wait: bool = True, timeout: float | None = None) -> None:
        """Power on; with ``wait``, return once sshd answers (WaitTimeout otherwise)."""
        with self._cv:
            if self._closing:
                raise ClusterError(f"{self.name}: host is closed")
            self._want_on = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._supervise, name=f"testhost-{self.name}", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        if wait:
            self.wait_up(timeout=timeout or self.boot_timeout + 5)

    def power_off(self, timeout: float = 10.0) -> None:
        """Cut power from the harness side and stay off. Idempotent."""
        self._cut_power("power-off", want_on=False, timeout=timeout)

    def power_cycle(self, timeout: float = 10.0) -> None:
        """Cut power from the harness side; the host boots again after ``boot_delay``."""
        self._cut_power("power-cycle", want_on=True, timeout=timeout)

    def reboot_from_inside(self, command: str | None = None, timeout: float = 10.0) -> None:
        """Run the reboot command (default ``systemctl reboot``) inside the host, like an
        operator would, and return once this boot is down (the next boot follows)."""
        command = command or self.reboot_command
        with self._cv:
            if self._state is not HostState.UP:
                raise ClusterError(f"{self.name}: cannot run `{command}` inside: host is {self._state.value}")
            boot, init = self._boot_count, self._pids["init"]
        argv = ["nsenter", "-t", str(init), "-p", "-m", "-u", "-i", "-n", "--", "sh", "-c", command]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env={"PATH": self._session_path()})
        if p.returncode > 0:  # < 0: killed with the namespace, which is the point
            raise ClusterError(f"{self.name}: `{command}` inside the host exited {p.returncode}: "
                               f"{p.stderr.strip() or p.stdout.strip()}")
        self.wait_down(boot=boot, timeout=timeout)

    def _cut_power(self, cause: str, want_on: bool, timeout: float) -> None:
        with self._cv:
            self._want_on = want_on
            proc = self._proc
            if proc is None:
                if want_on:
                    raise ClusterError(f"{self.name}: cannot power-cycle: host is {self._state.value}")
                self._cv.notify_all()  # e.g. cancel a pending reboot's boot delay
                return
            boot = self._boot_count
            self._pending_cause = cause
            # The init is what must die (the kernel then kills its whole namespace); it
            # reports in within milliseconds of starting, or its unshare parent exits.
            self._wait_locked(lambda: "init" in self._pids or proc.poll() is not None,
                              timeout, "init to report its PID")
            init = self._pids.get("init")
        if init is not None:
            try:
                os.kill(init, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.wait_down(boot=boot, timeout=timeout)

    # --- waits ---------------------------------------------------------------------------

    def wait_up(self, after_boot: int | None = None, timeout: float = 20.0) -> int:
        """Wait until sshd has answered in a boot numbered above ``after_boot`` (default:
        the current boot, or the next one when off); return that boot's number.

        Counts a boot that came up even if it has ended since (no missed short boots);
        fails early (ClusterError) when the host went off for good first."""
        with self._cv:
            floor = self._ended_boot if after_boot is None else after_boot
            self._wait_locked(
                lambda: self._last_up_boot > floor or (self._state is HostState.OFF and not self._want_on),
                timeout, f"up in a boot after #{floor}")
            if self._last_up_boot <= floor:
                raise ClusterError(f"{self.name}: powered off while awaiting boot #{floor + 1}: {self._last_detail}")
            return self._last_up_boot

    def wait_down(self, boot: int | None = None, timeout: float = 10.0) -> None:
        """Wait until boot number ``boot`` (default: the current one) has ended."""
        with self._cv:
            target = self._boot_count if boot is None else boot
            self._wait_locked(lambda: self._ended_boot >= target, timeout, f"boot #{target} to end")

    def _wait_locked(self, predicate: Callable[[], bool], timeout: float, awaited: str) -> None:
        if not self._cv.wait_for(predicate, timeout):
            raise WaitTimeout(f"{self.name}: awaited {awaited} for {timeout:.1f}s; saw state "
                              f"{self._state.value}, boot #{self._boot_count} ({self._last_detail})")

    # --- lifecycle -----------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Power off for good and stop the supervisor thread."""
        self.power_off(timeout=timeout)
        with self._cv:
            self._closing = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise WaitTimeout(f"{self.name}: supervisor thread still running {timeout:.1f}s after close")

    def _publish(self, state: HostState, detail: str) -> None:
        """Record a state change, tell listeners, then release waiters (so a caller that
        waited for an event knows every listener has seen it)."""
        with self._cv:
            self._state = state
            self._last_detail = detail
            event = HostEvent(time.time(), self.name, state, self._boot_count, self._boot_id, detail)
            self.events.append(event)
        log.info("%s: %s (boot #%d, %s)", self.name, state.value, event.boot_count, detail)
        for callback in list(self._listeners):
            try:
                callback(event)
            except Exception:  # a broken listener must not stop the supervisor
                log.exception("%s: listener %r failed on %s", self.name, callback, event)
        with self._cv:
            if state is HostState.OFF:
                self._ended_boot = event.boot_count
            elif state is HostState.UP:
                self._last_up_boot = event.boot_count
            self._cv.notify_all()

    def _supervise(self) -> None:
        """One thread per host: boot whenever power is wanted, reboot after a reboot."""
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._want_on or self._closing)
                if self._closing:
                    return
            if self._run_boot() in _REBOOT_CAUSES:
                with self._cv:  # the boot delay; ends early on power-off or close
                    self._cv.wait_for(lambda: self._closing or not self._want_on, self.boot_delay)

    def _inside(self, path: Path) -> str:
        """``path`` (in the state dir) as the host sees it."""
        return f"{STATE_VIEW}/{path.relative_to(self.state_dir)}" if self.isolation else str(path)

    def _session_path(self) -> str:
        return f"{self._inside(self.state_dir / 'bin')}:{self.env.get('PATH', DEFAULT_PATH)}"

    def _prepare_boot(self, notify_path: str) -> Path:
        """Write this boot's files; return the init's config path."""
        sd = self.state_dir
        bin_dir = sd / "bin"
        bin_dir.mkdir(exist_ok=True)
        power = bin_dir / "rc-power"
        power.write_text(POWER_SCRIPT)
        power.chmod(0o755)
        for name in POWER_COMMANDS:
            link = bin_dir / name
            if not link.is_symlink():
                link.symlink_to("rc-power")
        (sd / "authorized_keys").write_text(self.network.client_public_key + "\n")
        (sd / "sshd_config").write_text(
            f"# Generated by {INIT_MARKER} for {self.name}; rewritten at every boot.\n"
            f"ListenAddress {self.address}:22\n"
            f"HostKey {self._inside(sd / 'ssh_host_ed25519_key')}\n"
            f"AuthorizedKeysFile {self._inside(sd / 'authorized_keys')}\n"
            "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            # No PAM (no login stack to configure); StrictModes off because the state dir
            # may sit under a world-writable /tmp (pytest's tmp_path).
            "UsePAM no\nStrictModes no\nUseDNS no\nPidFile none\nPrintMotd no\nPrintLastLog no\n"
            f"SetEnv PATH={self._session_path()}\n"
            "Subsystem sftp internal-sftp\n")
        boot_id_file = sd / "boot_id"
        if boot_id_file.exists():
            boot_id_file.chmod(0o644)
        boot_id_file.write_text(self._boot_id + "\n")
        boot_id_file.chmod(0o444)
        with open(self.workload_log, "a") as f:
            f.write(f"==== {self.name} boot #{self._boot_count} boot_id={self._boot_id} "
                    f"at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} ====\n")
        config = {
            "name": self.name, "notify_socket": notify_path, "sshd_config": self._inside(sd / "sshd_config"),
            "sshd_notify_socket": self._inside(Path(notify_path)),
            "sshd_log": self._inside(sd / "sshd.log"), "boot_id_file": self._inside(boot_id_file),
            "power_script": self._inside(power), "workload": self.workload,
            "workload_log": self._inside(self.workload_log),
            "state_dir": str(sd), "isolation": self.isolation.to_json() if self.isolation else None,
            "env": {"HOME": "/root", "LANG": "C.UTF-8", "HOSTNAME": self.name, **self.env,
                    "PATH": self._session_path()},
            "reboot_when_workload_exits": self.reboot_when_workload_exits,
        }
        path = sd / "boot.json"
        path.write_text(json.dumps(config, indent=1))
        return path

    def _run_boot(self) -> str:
        """Boot once and supervise until that boot ends; return why it ended."""
        notify_path = str(self.state_dir / "notify")
        with self._cv:
            self._boot_count += 1
            self._boot_id = str(uuid.uuid4())
            self._pids = {}
            self._pending_cause = None
        started = time.monotonic()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            config = self._prepare_boot(notify_path)
            self.link.set_power(True)
            if os.path.exists(notify_path):
                os.unlink(notify_path)
            sock.bind(notify_path)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            argv = ["setpriv", "--pdeathsig", "KILL",  # harness dies -> unshare dies ->
                    *netns.in_netns(self.netns,        # --kill-child kills the init -> host off
                                    "unshare", "--pid", "--mount", "--uts", "--ipc", "--fork",
                                    "--kill-child=SIGKILL", "--mount-proc", "--",
                                    sys.executable, "-m", INIT_MARKER, str(config))]
            init_env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8",
                        "PYTHONPATH": str(Path(chaos.__file__).resolve().parent.parent)}
            with open(self.state_dir / "init.log", "ab") as init_log:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=init_log, stderr=init_log,
                                        env=init_env, start_new_session=True)
        except (OSError, ClusterError) as e:
            sock.close()
            with self._cv:
                self._want_on = False
            self._publish(HostState.OFF, f"boot failed before start: {e}")
            return "failed"
        with self._cv:
            self._proc = proc
            self._pids["unshare"] = proc.pid
        self._publish(HostState.BOOTING, f"boot_id {self._boot_id}")
        pidfd = os.pidfd_open(proc.pid)
        try:
            self._watch_boot(sock, pidfd, started)
        finally:
            os.close(pidfd)
            sock.close()
        with self._cv:
            proc.wait()
            cause = self._pending_cause or {-signal.SIGHUP: "reboot", -signal.SIGINT: "poweroff"}.get(
                proc.returncode, f"init died (status {proc.returncode}); init.log: {_tail(self.state_dir / 'init.log', 3)}")
            self._proc = None
            if cause not in _REBOOT_CAUSES:
                self._want_on = False  # before publishing: waiters must not see "off, coming back"
        try:
            self.link.set_power(False)
        except ClusterError as e:
            log.warning("%s: could not take eth0 down after power loss: %s", self.name, e)
        self._publish(HostState.OFF, cause)
        return cause

    def _watch_boot(self, sock: socket.socket, pidfd: int, started: float) -> None:
        """Read the init's and sshd's reports until the boot's unshare process exits."""
        deadline = started + self.boot_timeout
        ready = timed_out = False
        while True:
            timeout = None if ready or timed_out else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([sock, pidfd], [], [], timeout)
            if sock in readable:
                msg, pid = _recv_with_pid(sock)
                for line in msg.splitlines():
                    key = line.partition("=")[0]
                    with self._cv:
                        if key == "INIT":
                            self._pids["init"] = pid
                        elif key == "WORKLOAD":
                            self._pids["workload"] = pid
                        elif key == "READY":
                            self._pids["sshd"] = pid
                        self._cv.notify_all()
                    if key == "READY" and not ready:
                        ready = True
                        self._publish(HostState.UP, f"sshd ready {time.monotonic() - started:.2f}s after power-on")
                    elif key == "ERROR":
                        log.error("%s: init failed: %s", self.name, line[6:])
                continue
            if pidfd in readable:
                return
            if not readable:  # boot deadline passed with sshd silent
                with self._cv:
                    init = self._pids.get("init")
                    self._want_on = False
                    self._pending_cause = (f"boot timeout: sshd not ready {self.boot_timeout:.1f}s after power-on; "
                                           f"sshd.log: {_tail(self.state_dir / 'sshd.log', 3)}; "
                                           f"init.log: {_tail(self.state_dir / 'init.log', 3)}")
                os.kill(init if init else self._pids["unshare"], signal.SIGKILL)
                timed_out = True  # now wait for the exit


def _recv_with_pid(sock: socket.socket) -> tuple[str, int]:
    """One datagram and the sender's PID as the kernel translates it into our namespace."""
    data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(struct.calcsize("iII")))
    pid = 0
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = struct.unpack("iII", payload[:struct.calcsize("iII")])[0]
    return data.decode(errors="replace"), pid


class TestHostNetwork:
    """The bridge, addresses, SSH keys and known_hosts file shared by a set of test hosts.

    The head (or anything in the root namespace) reaches hosts at the bridge address
    ``head_address``; hosts get the following addresses in ``subnet`` and have no route out.
    ``ssh_key_path`` (default: in state_dir) is the private key that logs in as root on
    every host: keep it out of published report artefacts.
    """

    __test__ = False

    def __init__(self, state_dir: str | os.PathLike = "reports/hosts", bridge: str = DEFAULT_BRIDGE,
                 subnet: str = DEFAULT_SUBNET, boot_delay: float = 1.0, boot_timeout: float = 15.0,
                 ssh_key_path: str | os.PathLike | None = None):
        if not re.fullmatch(r"[a-zA-Z0-9_-]{1,9}", bridge):
            raise ValueError(f"bridge name {bridge!r}: use 1-9 letters, digits, '-' or '_' (veth names derive from it)")
        self.bridge = netns.Bridge(bridge, *self._split(subnet))
        self.subnet = ipaddress.IPv4Network(subnet)
        self.state_dir = Path(state_dir).resolve()
        self.ssh_key_path = Path(ssh_key_path).resolve() if ssh_key_path else self.state_dir / "id_ed25519"
        self.boot_delay = boot_delay
        self.boot_timeout = boot_timeout
        self.hosts: dict[str, TestHost] = {}
        self._lock = threading.Lock()
        self.client_public_key = ""

    @staticmethod
    def _split(subnet: str) -> tuple[ipaddress.IPv4Address, int]:
        net = ipaddress.IPv4Network(subnet)
        if net.num_addresses < 4:
            raise ValueError(f"subnet {subnet} is too small for a bridge address and a host")
        return next(net.hosts()), net.prefixlen

    @property
    def head_address(self) -> str:
        return str(self.bridge.address)

    @property
    def known_hosts_path(self) -> Path:
        return self.state_dir / "known_hosts"

    def up(self) -> "TestHostNetwork":
        """Create bridge and client key. Idempotent; TestHostUnsupported if not possible here."""
        require_testhosts()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.client_public_key = ensure_ed25519_key(self.ssh_key_path, "ray-chaos-harness")
        self.bridge.up()
        return self

    def add_host(self, name: str, workload: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                 *, boot_delay: float | None = None, reboot_when_workload_exits: bool = False,
                 isolation: Isolation | None = None) -> TestHost:
        """Create a host's network and state (not booted). ``name`` is its hostname;
        ``isolation``: what of this machine's filesystem it does not see."""
        if not _HOSTNAME_RE.match(name):
            raise ValueError(f"host name {name!r}: use 1-32 lowercase letters, digits and '-'")
        if not self.client_public_key:
            raise ClusterError("TestHostNetwork.up() must run before add_host()")
        with self._lock:
            if name in self.hosts:
                raise ValueError(f"host {name!r} already exists on {self.bridge.name}")
            used = {h.link.address for h in self.hosts.values()} | {self.bridge.address}
            free = (a for a in self.subnet.hosts() if a not in used)
            address = next(free, None)
            if address is None:
                raise ClusterError(f"no free address left in {self.subnet} for host {name}")
            state_dir = self.state_dir / name
            if len(str(state_dir / "notify")) > 107:  # sun_path limit for the notify socket
                raise ValueError(f"state dir {state_dir} is too long for a unix socket path; use a shorter state_dir")
            index = int(address) - int(self.subnet.network_address)
            link = netns.HostLink(netns=f"{self.bridge.name}-{name}", veth=f"{self.bridge.name}v{index}",
                                  address=address, prefixlen=self.subnet.prefixlen, bridge=self.bridge.name)
            link.create()
            link.set_power(False)
            state_dir.mkdir(parents=True, exist_ok=True)
            host = TestHost(self, name, link, state_dir, workload, env,
                            self.boot_delay if boot_delay is None else boot_delay, self.boot_timeout,
                            reboot_when_workload_exits, isolation)
            self.hosts[name] = host
            self._write_known_hosts()
            return host

    def remove_host(self, name: str, timeout: float = 10.0) -> None:
        """Power a host off and remove its network (its state dir, host key included, stays)."""
        with self._lock:
            host = self.hosts.pop(name)
            self._write_known_hosts()
        try:
            host.close(timeout)
        finally:
            _kill_and_wait(netns.netns_pids(host.netns), timeout, f"processes left in netns {host.netns}")
            host.link.destroy()

    def _write_known_hosts(self) -> None:
        lines = [f"{h.address} {' '.join(h.host_key.split()[:2])}" for h in self.hosts.values()]
        self.known_hosts_path.write_text("".join(line + "\n" for line in lines))

    def close(self, timeout: float = 10.0) -> None:
        """Power off every host and remove veths, netns and bridge; files stay in state_dir."""
        errors = []
        for name in list(self.hosts):
            try:
                self.remove_host(name, timeout)
            except Exception as e:  # keep tearing down the rest; report all at the end
                errors.append(f"{name}: {e}")
        self.bridge.down()
        if errors:
            raise ClusterError("test host teardown incomplete: " + "; ".join(errors))

    def __enter__(self) -> "TestHostNetwork":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def sweep(bridge: str = DEFAULT_BRIDGE, timeout: float = 10.0) -> list[str]:
        """Remove what a crashed session left of network ``bridge``: processes in its
        hosts' netns (by PID), partition rules, veths, netns and the bridge. Returns what went."""
        removed = []
        # veths first: a deleted netns takes its veth along only asynchronously.
        for port in sorted(os.listdir(f"/sys/class/net/{bridge}/brif")) if netns.link_exists(bridge) else []:
            netns.run_cmd(["ip", "link", "del", port])
            removed.append(f"veth {port}")
        for ns in netns.netns_names(f"{bridge}-"):
            pids = netns.netns_pids(ns)
            _kill_and_wait(pids, timeout, f"processes in netns {ns}")
            netns.run_cmd(["ip", "netns", "del", ns])
            removed.append(f"netns {ns}" + (f" (killed PIDs {pids})" if pids else ""))
        if netns.link_exists(bridge):
            netns.run_cmd(["ip", "link", "del", bridge])
            removed.append(f"bridge {bridge}")
        return removed


def _kill_and_wait(pids: Sequence[int], timeout: float, what: str) -> None:
    """SIGKILL ``pids`` and wait (pidfd, no polling) until each is gone."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            if not select.select([fd], [], [], timeout)[0]:
                raise WaitTimeout(f"awaited exit of {what} (PID {pid}) for {timeout:.1f}s; still running")
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)
