"""Watch streams: newline-delimited JSON events over a chunked HTTP/1.1 response.

A watch starts from the client's ``resourceVersion`` (replaying the store's history after
it) or, without one (or with "0"), from the current objects as ADDED events.  The stream
applies the request's namespace and selectors to each event the way the apiserver's watch
cache does: an object that stops matching is sent as DELETED, one that starts matching as
ADDED.  A version older than the history answers 200 with one ERROR event carrying a 410
Expired ``Status`` — the in-stream form clients (client-go reflectors, the Python
``Watch``) handle by re-listing.  ``timeoutSeconds`` ends the stream cleanly;
``allowWatchBookmarks`` adds BOOKMARK events that carry only the version reached so far.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Callable

from aiohttp import web

from chaos.embedded.kube.resources import Resource
from chaos.embedded.kube.status import ApiError
from chaos.embedded.kube.store import Event, Store


@dataclass(frozen=True)
class WatchRequest:
    resource: Resource
    matches: Callable[[dict], bool]  # namespace, label and field selectors together
    since: int | None
    timeout_s: float
    bookmarks: bool


def _visible(event: Event, matches: Callable[[dict], bool]) -> dict | None:
    now = matches(event.obj)
    before = event.old is not None and matches(event.old)
    if event.type == "MODIFIED":
        kind = "MODIFIED" if now and before else "ADDED" if now else "DELETED" if before else None
    else:
        kind = event.type if now else None
    return {"type": kind, "object": event.obj} if kind else None


async def stream(request: web.Request, store: Store, watch: WatchRequest,
                 bookmark_interval_s: float) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    response = web.StreamResponse(headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"})
    response.enable_chunked_encoding()
    try:
        watcher, backlog, reached = store.watch(watch.resource.plural, watch.since, loop)
    except ApiError as err:
        await response.prepare(request)
        await _send(response, {"type": "ERROR", "object": err.body()})
        await response.write_eof()
        return response
    try:
        await response.prepare(request)
        for event in backlog:
            if (line := _visible(event, watch.matches)) is not None:
                await _send(response, line)
        deadline = time.monotonic() + watch.timeout_s
        next_bookmark = time.monotonic() + bookmark_interval_s
        while (left := deadline - time.monotonic()) > 0:
            wait = min(left, next_bookmark - time.monotonic()) if watch.bookmarks else left
            try:
                event = await asyncio.wait_for(watcher.queue.get(), timeout=max(wait, 0))
            except asyncio.TimeoutError:
                if watch.bookmarks and time.monotonic() >= next_bookmark:
                    await _send(response, {"type": "BOOKMARK", "object": {
                        "kind": watch.resource.kind, "apiVersion": watch.resource.api_version,
                        "metadata": {"resourceVersion": str(reached)}}})
                    next_bookmark = time.monotonic() + bookmark_interval_s
                continue
            if event is None:  # server shutting down
                break
            reached = max(reached, event.rv)
            if (line := _visible(event, watch.matches)) is not None:
                await _send(response, line)
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away
    finally:
        store.unwatch(watcher)
    return response


async def _send(response: web.StreamResponse, event: dict) -> None:
    await response.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")
