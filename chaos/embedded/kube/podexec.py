"""``pods/exec`` over WebSocket: the channel protocol kubectl ≥ 1.30 and the Python client speak.

Handshake: RFC 6455 (aiohttp), echoing ``v5.channel.k8s.io`` when offered, else
``v4.channel.k8s.io`` — a client that gets no echo falls back to SPDY.  Every message is
one channel byte then data: 0 stdin (client → server, TEXT or BINARY), 1 stdout, 2 stderr,
3 the final ``Status``, 4 resize (ignored: no TTY); v5 adds 255 = close, whose data byte
names the channel the peer closed (stdin → EOF for the command).  The command ends with a
channel-3 ``Status``: Success, or Failure/NonZeroExitCode with the exit code as the
``ExitCode`` cause (kubectl exits with it, the Python client's ``returncode`` reads it),
then a normal close.  SPDY is not implemented: its upgrade gets 400 saying so.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from aiohttp import WSMsgType, web

from chaos.embedded.kube.lifecycle import ExecProcess, PodLifecycle
from chaos.embedded.kube.status import bad_request

V5, V4 = "v5.channel.k8s.io", "v4.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
_TRUE = ("1", "t", "T", "true", "TRUE", "True")


def check_upgrade(request: web.Request) -> str:
    """The subprotocol to echo; 400 for SPDY or a request that is no WebSocket upgrade."""
    upgrade = request.headers.get("Upgrade", "").lower()
    if upgrade.startswith("spdy"):
        raise bad_request("Upgrade request required: SPDY/3.1 streaming is not implemented by this emulated API "
                          "server; exec works over WebSocket only (v5.channel.k8s.io or v4.channel.k8s.io, "
                          "kubectl >= 1.30)")
    if upgrade != "websocket":
        raise bad_request("Upgrade request required")
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    for protocol in (V5, V4):
        if protocol in offered:
            return protocol
    raise bad_request(f"none of the offered WebSocket subprotocols {offered} is supported: use {V5} or {V4}")


def exit_status(code: int, argv: list[str]) -> dict:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure",
            "message": f"command terminated with non-zero exit code: error executing command [{' '.join(argv)}], "
                       f"exit code {code}",
            "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


@dataclass(frozen=True)
class ExecRequest:
    argv: list[str]
    container: str
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


def parse(request: web.Request, pod: dict) -> ExecRequest:
    """The command asked for; checked before the upgrade, so a client falling back from
    WebSocket to SPDY sees the same 400 either way (as with a real apiserver)."""
    query = request.query
    argv = query.getall("command", [])
    if not argv:
        raise bad_request("you must specify at least 1 command")
    if not pod["spec"].get("nodeName"):
        raise bad_request(f"pod {pod['metadata']['name']} does not have a host assigned")
    containers = [c["name"] for c in pod["spec"]["containers"]]
    container = query.get("container") or containers[0]
    if container not in containers:
        raise bad_request(f"container {container} is not valid for pod {pod['metadata']['name']}")
    flag = {ch: query.get(ch, "") in _TRUE for ch in ("stdin", "stdout", "stderr", "tty")}
    return ExecRequest(argv, container, **flag)


async def serve(request: web.Request, pod: dict, command: ExecRequest, lifecycle: PodLifecycle,
                protocol: str) -> web.WebSocketResponse:
    argv = command.argv
    process = await lifecycle.exec(pod, command.container, argv, command.stdin, command.tty)
    ws = web.WebSocketResponse(protocols=(protocol,), autoping=True, max_msg_size=0)
    try:
        await ws.prepare(request)
    except Exception:
        process.kill()
        raise
    sending = asyncio.Lock()

    async def send(channel: int, data: bytes) -> None:
        async with sending:
            await ws.send_bytes(bytes([channel]) + data)

    async def pump(reader: asyncio.StreamReader | None, channel: int, forward: bool) -> None:
        while reader is not None and (chunk := await reader.read(65536)):
            if forward:
                await send(channel, chunk)

    pumps = [asyncio.ensure_future(pump(process.stdout, STDOUT, command.stdout)),
             asyncio.ensure_future(pump(process.stderr, STDERR, command.stderr))]
    reader = asyncio.ensure_future(_read_client(ws, process, protocol))
    try:
        code = await process.wait()
        await asyncio.gather(*pumps)
        if code < 0:  # killed by signal -code: report it as a shell and a container runtime do
            code = 128 - code
        await send(ERROR, json.dumps(exit_status(code, argv)).encode())
        await ws.close()
    except ConnectionResetError:
        pass  # the client went away
    finally:
        reader.cancel()
        for task in pumps:
            task.cancel()
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        _kill(process)  # only still running when the client left or the server is stopping
    return ws


def _kill(process: ExecProcess) -> None:
    if process.returncode is None:
        try:
            process.kill()
        except ProcessLookupError:
            pass


async def _read_client(ws: web.WebSocketResponse, process: ExecProcess, protocol: str) -> None:
    """Client → command: stdin data, v5 close of stdin; a closed socket kills the command."""
    async for message in ws:
        if message.type == WSMsgType.TEXT:
            data = message.data.encode("utf-8", "surrogateescape")
        elif message.type == WSMsgType.BINARY:
            data = message.data
        else:
            break
        if not data:
            continue
        channel, payload = data[0], data[1:]
        if channel == STDIN and process.stdin is not None and payload:
            try:
                process.stdin.write(payload)
                await process.stdin.drain()
            except ConnectionResetError:  # BrokenPipeError included: the command stopped reading
                pass
        elif channel == CLOSE and protocol == V5 and payload[:1] == bytes([STDIN]) and process.stdin is not None:
            process.stdin.close()
    _kill(process)

