"""The SSH transport (paramiko): commands on a host, with its host key verified.

Staging clusters are real machines, so nothing here auto-accepts a host key: keys come
from a known_hosts file, and trust-on-first-use must be asked for (a *changed* key is
refused even then). Only connecting is retried; a command runs at most once.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import fcntl
import hashlib
import logging
import os
import select
import socket
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

import paramiko
import tenacity

from chaos.errors import ChaosError, TransportError
from chaos.privileges import escalate
from chaos.transport.base import CommandResult, Transport, as_shell

log = logging.getLogger(__name__)

_TRANSCRIPT_CHARS = 200


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint, as `ssh-keygen -lf` prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


@dataclasses.dataclass(frozen=True)
class TranscriptEntry:
    """One command as reports show it: outputs shortened, nothing else recorded."""

    time: float  # time.time() when issued
    host: str
    command: str
    exit_code: int | None  # None: launched without waiting, or failed before an exit status
    stdout: str
    stderr: str
    duration_s: float
    error: str | None = None
    note: str = ""  # e.g. how a launched command was left


def _short(data: str) -> str:
    return data if len(data) <= _TRANSCRIPT_CHARS else "…" + data[-_TRANSCRIPT_CHARS:]


class _KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko for a host with no key in the file: refuse, or trust on first use."""

    def __init__(self, path: Path, trust_on_first_use: bool):
        self.path = path
        self.trust_on_first_use = trust_on_first_use

    def missing_host_key(self, client, hostname, key):
        if not self.trust_on_first_use:
            raise TransportError(
                f"{hostname}: unknown host key {key.get_name()} {fingerprint(key)}: not in {self.path}. "
                "Verify it out of band and add it, or enable trust_on_first_use")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # other transports may be trusting other hosts now
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning("%s: trusted new host key %s %s on first use; added to %s",
                    hostname, key.get_name(), fingerprint(key), self.path)


class SSHTransport:
    """Transport over SSH to one host (see chaos.transport.base.Transport).

    Authentication uses ``key_filename`` and/or the ssh-agent (``use_agent``); keys in
    ~/.ssh are never picked up implicitly. ``connect_timeout`` bounds connecting as a
    whole, retries included. ``jump_host`` is another SSHTransport to tunnel through.
    A command run with ``privileged=True`` runs as root: as it is when ``user`` is root, else
    through ``become`` (chaos.privileges.escalate), or as ``user`` when that is None (and
    then fails without root's rights, which chaos.privileges.probe tells beforehand).
    """

    def __init__(self, host: str, port: int = 22, user: str = "root", key_filename: str | os.PathLike | None = None,
                 known_hosts: str | os.PathLike = "~/.ssh/known_hosts", trust_on_first_use: bool = False,
                 connect_timeout: float = 5.0, command_timeout: float = 30.0, use_agent: bool = True,
                 jump_host: "SSHTransport | None" = None, become: str | None = None):
        self.host = host
        self.port = port
        self.user = user
        self.key_filename = Path(key_filename).expanduser() if key_filename else None
        self.known_hosts = Path(known_hosts).expanduser()
        self.trust_on_first_use = trust_on_first_use
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.use_agent = use_agent
        self.jump_host = jump_host
        self.become = become  # how a privileged command gets root when the login user is not root
        self.transcript: list[TranscriptEntry] = []
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SSHTransport({self.user}@{self.host}:{self.port})"

    @property
    def _where(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    # --- connecting ----------------------------------------------------------------------

    def _load_key(self) -> paramiko.PKey | None:
        if self.key_filename is None:
            return None
        try:
            return paramiko.PKey.from_path(self.key_filename)
        except paramiko.PasswordRequiredException as e:
            raise TransportError(f"SSH key file {self.key_filename} is passphrase-protected; "
                                 "load it into an ssh-agent and use use_agent=True") from e
        except (OSError, paramiko.SSHException, ValueError) as e:
            raise TransportError(f"SSH key file {self.key_filename} cannot be used as a private key: "
                                 f"{type(e).__name__}: {e}") from e

    def _connect_once(self, pkey: paramiko.PKey | None, deadline: float) -> paramiko.SSHClient:
        remaining = max(0.1, deadline - time.monotonic())
        client = paramiko.SSHClient()
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_KnownHostsPolicy(self.known_hosts, self.trust_on_first_use))
        sock = None
        try:
            if self.jump_host is not None:
                sock = self.jump_host._open_tunnel(self.host, self.port, remaining)
            client.connect(self.host, self.port, username=self.user, pkey=pkey, allow_agent=self.use_agent,
                           look_for_keys=False, timeout=remaining, banner_timeout=remaining,
                           auth_timeout=remaining, channel_timeout=remaining, sock=sock)
        except paramiko.BadHostKeyException as e:
            client.close()
            raise TransportError(
                f"{e.hostname}: host key CHANGED: server offered {e.key.get_name()} {fingerprint(e.key)}, "
                f"but {self.known_hosts} has {e.expected_key.get_name()} {fingerprint(e.expected_key)}. "
                "Refusing (reinstalled host or man-in-the-middle); fix the file only after verifying") from e
        except paramiko.AuthenticationException as e:
            client.close()
            tried = [f"key file {self.key_filename}"] if self.key_filename else []
            tried += ["ssh-agent"] if self.use_agent else []
            raise TransportError(f"{self._where}: authentication failed (tried: {', '.join(tried) or 'nothing'}): {e}") from e
        except BaseException:
            client.close()
            raise
        raw = client.get_transport().sock
        if isinstance(raw, socket.socket):  # not through a jump host's channel
            # Commands are a few small packets each way: with Nagle on, a channel opened
            # right after another's close waits ~40 ms for the peer's delayed ACK (measured).
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return client

    def _connect(self) -> paramiko.SSHClient:
        pkey = self._load_key()
        deadline = time.monotonic() + self.connect_timeout

        def log_retry(state: tenacity.RetryCallState) -> None:
            log.warning("%s: connect attempt %d failed (%s); retrying", self._where, state.attempt_number,
                        state.outcome.exception())

        retrying = tenacity.Retrying(
            # Network-level failures only: host key and authentication errors are final.
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, (OSError, EOFError, paramiko.SSHException))
                and not isinstance(e, (paramiko.AuthenticationException, paramiko.BadHostKeyException))),
            stop=tenacity.stop_after_delay(self.connect_timeout),
            wait=tenacity.wait_exponential(multiplier=0.1, max=1.0),
            before_sleep=log_retry, reraise=True)
        try:
            return retrying(self._connect_once, pkey, deadline)
        except TransportError:
            raise
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise TransportError(f"{self._where}: cannot connect within {self.connect_timeout:.1f}s: "
                                 f"{type(e).__name__}: {e}") from e

    def _connected(self) -> paramiko.SSHClient:
        with self._lock:
            transport = self._client.get_transport() if self._client else None
            if transport is None or not transport.is_active():
                if self._client is not None:
                    log.info("%s: connection lost; reconnecting", self._where)
                    self._client.close()
                self._client = None
                self._client = self._connect()
            return self._client

    def connect(self) -> None:
        """Open the connection now rather than at the first command, so that command does
        not pay the handshake (a correlated fault's members connect before their barrier)."""
        self._connected()

    def _drop(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _open_tunnel(self, host: str, port: int, timeout: float) -> paramiko.Channel:
        """A direct-tcpip channel to host:port through this (jump) host."""
        try:
            return self._connected().get_transport().open_channel(
                "direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise TransportError(f"{self._where}: cannot open a tunnel to {host}:{port}: {e}") from e

    def _open_session(self, cmd: str) -> paramiko.Channel:
        client = self._connected()
        try:
            chan = client.get_transport().open_session(timeout=self.connect_timeout)
            chan.exec_command(cmd)
            return chan
        except (OSError, EOFError, paramiko.SSHException) as e:
            self._drop()
            raise TransportError(f"{self.host}: could not start `{cmd}`: {type(e).__name__}: {e}") from e

    # --- Transport -----------------------------------------------------------------------

    def as_root(self, command: str | Sequence[str]) -> str:
        """``command`` as this host runs it with root's rights (the one place that decides)."""
        return as_shell(command) if self.user == "root" else escalate(as_shell(command), self.become)

    def run(self, command: str | Sequence[str], timeout: float | None = None, privileged: bool = False) -> CommandResult:
        """Run once and wait (``timeout`` default: command_timeout); never retried."""
        cmd = self.as_root(command) if privileged else as_shell(command)
        timeout = self.command_timeout if timeout is None else timeout
        started, t0 = time.time(), time.monotonic()
        out, err = bytearray(), bytearray()
        try:
            chan = self._open_session(cmd)
            try:
                code = self._collect(chan, cmd, timeout, t0 + timeout, out, err)
            finally:
                _close_channel(chan)
        except TransportError as e:
            self._record(started, cmd, None, out, err, t0, str(e))
            raise
        result = CommandResult(self.host, cmd, code, out.decode(errors="replace"), err.decode(errors="replace"))
        self._record(started, cmd, code, out, err, t0)
        return result

    def _collect(self, chan: paramiko.Channel, cmd: str, timeout: float, deadline: float,
                 out: bytearray, err: bytearray) -> int:
        """Read stdout/stderr as they come (so the remote never blocks) until the exit status."""
        while True:
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            # sshd may send the exit status before the last output; EOF follows all output.
            if chan.closed or (chan.eof_received and chan.exit_status_ready()):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransportError(
                    f"{self.host}: `{cmd}` did not finish within {timeout:.1f}s (command timeout); "
                    f"stdout so far: {_short(out.decode(errors='replace')).strip() or '(none)'}; "
                    f"stderr so far: {_short(err.decode(errors='replace')).strip() or '(none)'}")
            if chan.eof_received:
                chan.status_event.wait(remaining)  # all output is in; only the status is due
            else:
                select.select([chan], [], [], remaining)  # paramiko's pipe: readable on data/EOF/close
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        status = chan.recv_exit_status()
        if status == -1:  # paramiko's value for "closed without an exit status"
            self._drop()
            raise TransportError(f"{self.host}: connection lost while running `{cmd}` (no exit status)")
        return status

    def launch(self, command: str | Sequence[str], grace: float = 1.0, privileged: bool = False) -> None:
        """Start a command and return without waiting for it to finish.

        Waits at most ``grace`` seconds to catch a command that fails at once (e.g. not
        found). A dropped connection is the expected outcome of a reboot, not an error.
        """
        cmd = self.as_root(command) if privileged else as_shell(command)
        started, t0 = time.time(), time.monotonic()
        chan = self._open_session(cmd)
        try:
            chan.status_event.wait(grace)
            err = chan.recv_stderr(65536) if chan.recv_stderr_ready() else b""
            code = chan.recv_exit_status() if chan.exit_status_ready() else None
        finally:
            dropped = not _close_channel(chan)
        if code is not None and code > 0:
            message = f"{self.host}: launched `{cmd}` exited {code} at once: {err.decode(errors='replace').strip() or '(no stderr)'}"
            self._record(started, cmd, code, b"", err, t0, message)
            raise TransportError(message)
        note = "connection dropped" if code == -1 or dropped else "exited 0" if code == 0 else "still running"
        self._record(started, cmd, None if code == -1 else code, b"", err, t0, None, f"launched; {note}")

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> "SSHTransport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _record(self, started: float, cmd: str, code: int | None, out: bytes, err: bytes, t0: float,
                error: str | None = None, note: str | None = None) -> None:
        entry = TranscriptEntry(started, self.host, cmd, code, _short(bytes(out).decode(errors="replace")),
                                _short(bytes(err).decode(errors="replace")), round(time.monotonic() - t0, 3),
                                error, note or "")
        with self._lock:
            self.transcript.append(entry)
        log.debug("%s: `%s` -> %s in %.2fs%s", self.host, cmd, code, entry.duration_s, f" ({error})" if error else "")


def _close_channel(chan: paramiko.Channel) -> bool:
    """Close ``chan``; False when its connection had dropped already (paramiko then raises
    EOFError or OSError: measured when a host rebooted between a launch's status check and
    its close, which made the reboot's injection fail)."""
    try:
        chan.close()
    except (EOFError, OSError):
        return False
    return True


def fan_out(transports: Sequence[Transport], command: str | Sequence[str], timeout: float = 30.0,
            max_workers: int = 16) -> Mapping[str, CommandResult | ChaosError]:
    """Run one command on many hosts at once; per host its result or the error it raised."""
    hosts = [t.host for t in transports]
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"fan_out needs one transport per host, got {hosts}")
    if not transports:
        return {}
    results: dict[str, CommandResult | ChaosError] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(max_workers, len(transports))) as pool:
        futures = {t.host: pool.submit(t.run, command, timeout) for t in transports}
        for host, future in futures.items():
            try:
                results[host] = future.result()
            except ChaosError as e:
                results[host] = e
    return results
