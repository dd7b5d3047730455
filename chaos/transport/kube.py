"""Commands in a pod over the API server's exec (WebSocket), through the official client.

The client's ``kubernetes.stream.stream`` opens ``pods/<pod>/exec`` as a WebSocket whose
messages carry one channel byte: 1 stdout, 2 stderr, 3 the final ``Status`` (Success, or
NonZeroExitCode with the exit code as its ``ExitCode`` cause).  The subprotocol offered
first is ``v5.channel.k8s.io`` (Kubernetes >= 1.30); a server that refuses it (no echo, or
a failed upgrade) is asked again with ``v4.channel.k8s.io``, and that answer is remembered
for the API server (``KubeAccess.exec_protocol``).  The handshake itself — which waits for
the kubelet, so it hangs while a node is down — and the command both count against the
command's deadline.  A command runs at most once.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from typing import TYPE_CHECKING, Callable, Sequence

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import ERROR_CHANNEL, STDERR_CHANNEL, STDOUT_CHANNEL, WSClient
from websocket import WebSocketBadStatusException, WebSocketException

from chaos.errors import ChaosError, TransportError
from chaos.transport.base import CommandResult, as_shell
from chaos.transport.kube_access import CONNECTION_ERRORS, api_error
from chaos.transport.ssh import TranscriptEntry, _short

if TYPE_CHECKING:
    from chaos.transport.kube_access import KubeAccess

V5, V4 = "v5.channel.k8s.io", "v4.channel.k8s.io"


class HandshakeRefused(Exception):
    """The server did not accept the WebSocket upgrade with the offered subprotocol."""

    def __init__(self, protocol: str, status: int | None, body: str, reason: str):
        super().__init__(f"{protocol}: {reason}")
        self.protocol, self.status, self.body, self.reason = protocol, status, body, reason


def negotiate(connect: Callable[[str], WSClient], known: str | None = None) -> tuple[WSClient, str]:
    """Open an exec stream, v5 first and v4 when the server refuses v5 (``known``: the
    protocol this server settled on before).  Raises the last HandshakeRefused."""
    order = [known] if known else [V5, V4]
    refused: HandshakeRefused | None = None
    for protocol in order:
        try:
            ws = connect(protocol)
        except HandshakeRefused as e:
            if e.status not in (400, 403):  # the refusals of an unsupported subprotocol; others are final
                raise
            refused = e
            continue
        if ws.subprotocol == protocol:
            return ws, protocol
        ws.close()  # a server that does not echo the subprotocol does not speak it (as kubectl decides)
        refused = HandshakeRefused(protocol, 101, "", f"the server did not echo the subprotocol "
                                                     f"(answered {ws.subprotocol or 'none'})")
    raise refused


def exit_code(status_text: str) -> int:
    """The exit code in a channel-3 Status; ValueError when it carries none (the command
    could not be run at all: the Status message says why)."""
    status = json.loads(status_text)
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                return int(cause["message"])
    raise ValueError(status.get("message") or status_text)


class KubeExecTransport:
    """Transport into one pod's container (see chaos.transport.base.Transport); ``host`` is
    the pod's name.  Each command is its own exec stream, so nothing is shared to go stale.
    Commands run as the container's user, the one Ray runs as there: ``privileged`` changes
    nothing (the catalog's privileges are what hosts over SSH need)."""

    def __init__(self, access: "KubeAccess", pod_name: str, container: str | None = None,
                 command_timeout: float = 60.0):
        self.access, self.pod_name, self.container = access, pod_name, container
        self.host = pod_name
        self.command_timeout = command_timeout
        self.transcript: list[TranscriptEntry] = []
        self._lock = threading.Lock()
        self._streams: set[WSClient] = set()  # open now, closed by close()

    def __repr__(self) -> str:
        return f"KubeExecTransport({self.where})"

    @property
    def where(self) -> str:
        container = f" container {self.container}" if self.container else ""
        return f"pod {self.access.namespace}/{self.pod_name}{container}"

    # --- opening a stream ------------------------------------------------------------------------
    def _connect(self, argv: list[str], protocol: str) -> WSClient:
        # The client's stream() swaps its ApiClient's call_api for a WebSocket one while it
        # opens the stream: on the shared client, calls from other threads meanwhile (a
        # delivery on another host, the node checks) went out as WebSocket handshakes and the
        # swap could stick.  Each exec opens on an ApiClient of its own.
        own = client.ApiClient(self.access.api_client.configuration)
        try:
            return stream(client.CoreV1Api(own).connect_get_namespaced_pod_exec, self.pod_name,
                          self.access.namespace, command=argv, container=self.container, stderr=True, stdin=False,
                          stdout=True, tty=False, binary=True, _preload_content=False,
                          _headers={"sec-websocket-protocol": protocol})
        except ApiException as e:
            cause = e.__context__
            if isinstance(cause, WebSocketBadStatusException):
                body = cause.resp_body.decode(errors="replace") if isinstance(cause.resp_body, bytes) else \
                    str(cause.resp_body or "")
                raise HandshakeRefused(protocol, cause.status_code, body,
                                       cause.status_message or f"HTTP {cause.status_code}") from e
            raise
        finally:
            own.close()  # its connection pool; the WebSocket is the stream's own

    def _open(self, argv: list[str], cmd: str, deadline: float, timeout: float) -> WSClient:
        """The exec stream, opened on a helper thread so the deadline bounds the handshake."""
        box: dict = {}
        done = threading.Event()
        abandoned = threading.Event()

        def open_stream():
            try:
                ws, protocol = negotiate(lambda p: self._connect(argv, p), self.access.exec_protocol)
                box["ws"] = ws
                if protocol != V5:
                    self.access.exec_protocol = protocol
            except BaseException as e:  # handed to the caller below
                box["error"] = e
            with self._lock:
                done.set()
                if abandoned.is_set() and "ws" in box:
                    box["ws"].close()  # the caller gave up on it
                elif "ws" in box:
                    self._streams.add(box["ws"])

        threading.Thread(target=open_stream, name=f"exec-open:{self.pod_name}", daemon=True).start()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            with self._lock:
                if not done.is_set():
                    abandoned.set()
                    raise TransportError(f"{self.where}: `{cmd}` did not start within {timeout:.1f}s: the exec "
                                         f"handshake through {self.access.server} did not complete (kubelet or "
                                         f"node unreachable?)")
        if "error" in box:
            raise self._open_error(box["error"], cmd) from box["error"]
        return box["ws"]

    def _open_error(self, e: BaseException, cmd: str) -> TransportError:
        if isinstance(e, HandshakeRefused):
            if e.status and e.status >= 400:
                api = ApiException(status=e.status, reason=e.reason, body=e.body)
                why = api_error(api, "create", "pods/exec", name=self.pod_name, namespace=self.access.namespace,
                                identity=self.access.identity, server=self.access.server)
                return TransportError(f"{self.where}: cannot run `{cmd}`: {why}")
            return TransportError(f"{self.where}: cannot run `{cmd}`: the exec WebSocket was refused with "
                                  f"{V5} and {V4}: {e.reason}")
        if isinstance(e, ApiException):
            return TransportError(f"{self.where}: cannot run `{cmd}`: cannot reach the API server at "
                                  f"{self.access.server}: {e.reason}")
        if isinstance(e, (*CONNECTION_ERRORS, WebSocketException, ChaosError)):
            return TransportError(f"{self.where}: cannot run `{cmd}`: {type(e).__name__}: {e}")
        return TransportError(f"{self.where}: cannot run `{cmd}`: unexpected {type(e).__name__}: {e}")

    def _forget(self, ws: WSClient) -> None:
        with self._lock:
            self._streams.discard(ws)
        ws.close()

    # --- Transport ---------------------------------------------------------------------------------
    def run(self, command: str | Sequence[str], timeout: float | None = None, privileged: bool = False) -> CommandResult:
        """Run once and wait, handshake included, at most ``timeout`` (default: command_timeout)."""
        cmd = as_shell(command)
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        timeout = self.command_timeout if timeout is None else timeout
        started, t0 = time.time(), time.monotonic()
        deadline = t0 + timeout
        out, err = bytearray(), bytearray()
        try:
            ws = self._open(argv, cmd, deadline, timeout)
            try:
                code = self._collect(ws, cmd, timeout, deadline, out, err)
            finally:
                self._forget(ws)
        except TransportError as e:
            self._record(started, cmd, None, out, err, t0, str(e))
            raise
        result = CommandResult(self.host, cmd, code, out.decode(errors="replace"), err.decode(errors="replace"))
        self._record(started, cmd, code, out, err, t0)
        return result

    def _collect(self, ws: WSClient, cmd: str, timeout: float, deadline: float, out: bytearray,
                 err: bytearray) -> int:
        """Read stdout/stderr until the server closes the stream; then the exit code from channel 3."""
        status = b""

        def late() -> TransportError:
            return TransportError(f"{self.where}: `{cmd}` did not finish within {timeout:.1f}s (command timeout); "
                                  f"stdout so far: {_short(out.decode(errors='replace')).strip() or '(none)'}; "
                                  f"stderr so far: {_short(err.decode(errors='replace')).strip() or '(none)'}")
        try:
            while ws.is_open():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise late()
                ws.sock.settimeout(remaining)  # bounds reading a frame that has begun to arrive
                ws.update(timeout=remaining)
                out += ws.read_channel(STDOUT_CHANNEL)
                err += ws.read_channel(STDERR_CHANNEL)
                status += ws.read_channel(ERROR_CHANNEL)
        except (WebSocketException, OSError) as e:
            if time.monotonic() >= deadline:
                raise late() from e
            raise TransportError(f"{self.where}: connection lost while running `{cmd}` "
                                 f"({type(e).__name__}: {e}); no exit status") from e
        if not status:
            raise TransportError(f"{self.where}: `{cmd}`: the exec stream closed without an exit status "
                                 "(pod deleted, container restarted or node lost?)")
        try:
            return exit_code(status.decode(errors="replace"))
        except ValueError as e:
            raise TransportError(f"{self.where}: could not run `{cmd}`: {e}") from e

    def launch(self, command: str | Sequence[str], privileged: bool = False) -> None:
        """Start ``command`` in the background in the pod and return once it is started; its
        output is discarded and its exit status is not known (only failing to start the
        shell that starts it is an error).  Detached from the exec stream on purpose: a
        command that kills the container would otherwise take its own stream with it."""
        cmd = as_shell(command)
        detached = f"sh -c {shlex.quote(cmd)} </dev/null >/dev/null 2>&1 &"
        result = self.run(["sh", "-c", detached], timeout=min(self.command_timeout, 30.0))
        if not result.ok:
            raise TransportError(f"{self.where}: could not launch `{cmd}`: exited {result.exit_code}: "
                                 f"{result.stderr.strip() or result.stdout.strip() or '(no output)'}")

    def close(self) -> None:
        """Close every stream still open (a command still running ends with its stream)."""
        with self._lock:
            streams, self._streams = list(self._streams), set()
        for ws in streams:
            ws.close()

    def _record(self, started: float, cmd: str, code: int | None, out: bytes, err: bytes, t0: float,
                error: str | None = None) -> None:
        self.transcript.append(TranscriptEntry(started, self.pod_name, cmd, code, _short(bytes(out).decode(
            errors="replace")), _short(bytes(err).decode(errors="replace")), time.monotonic() - t0, error))
