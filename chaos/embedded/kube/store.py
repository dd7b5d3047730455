"""Objects with resource versions, and the bounded event history that lists and watches share.

Every change takes the next resource version (one counter for all resources, as etcd's
revision is) and is appended to a history of fixed length.  A watch that starts from a
version still in the history replays what followed it; one that starts from a version
older than the history gets 410 Expired, exactly the case a client must handle by
re-listing.  The store is thread-safe: the HTTP handlers run on the server's event loop,
an in-process kubelet or reconciler may call it from its own thread, and watchers are
fed through their own loop's ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import threading
from dataclasses import dataclass
from typing import Callable

from chaos.embedded.kube.status import already_exists, expired, not_found


REMOVE: dict = {}  # returned by an update's ``change`` to remove the object instead (compared by identity)


@dataclass(frozen=True)
class Event:
    rv: int
    resource: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict
    old: dict | None  # the object before a MODIFIED, so a selector watch can turn it into ADDED/DELETED


class Watcher:
    """One open watch: events of one resource arrive on ``queue`` (None = the store closed it)."""

    def __init__(self, resource: str, loop: asyncio.AbstractEventLoop):
        self.resource, self.loop = resource, loop
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()

    def offer(self, event: Event | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the watcher's loop is closed: the stream is gone already
            pass


def _key(obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


class Store:
    def __init__(self, history: int = 1000):
        self._lock = threading.RLock()
        self._rv = 0
        self._objects: dict[str, dict[tuple[str, str], dict]] = collections.defaultdict(dict)
        self._history: collections.deque[Event] = collections.deque(maxlen=history)
        self._compacted = 0  # the newest version no longer in the history
        self._watchers: set[Watcher] = set()
        self._changed = threading.Condition(self._lock)

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def get(self, resource: str, namespace: str | None, name: str) -> dict | None:
        with self._lock:
            obj = self._objects[resource].get((namespace or "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def require(self, resource: str, namespace: str | None, name: str) -> dict:
        obj = self.get(resource, namespace, name)
        if obj is None:
            raise not_found(resource, name)
        return obj

    def list(self, resource: str, namespace: str | None = None) -> tuple[list[dict], int]:
        with self._lock:
            items = [copy.deepcopy(o) for (ns, _), o in sorted(self._objects[resource].items())
                     if namespace is None or ns == namespace]
            return items, self._rv

    def _record(self, resource: str, kind: str, obj: dict, old: dict | None) -> Event:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].rv
        event = Event(self._rv, resource, kind, copy.deepcopy(obj), old)
        self._history.append(event)
        for watcher in list(self._watchers):
            if watcher.resource == resource:
                watcher.offer(event)
        self._changed.notify_all()
        return event

    def create(self, resource: str, obj: dict) -> dict:
        with self._lock:
            key = _key(obj)
            if key in self._objects[resource]:
                raise already_exists(resource, key[1])
            obj = copy.deepcopy(obj)
            self._record(resource, "ADDED", obj, None)
            self._objects[resource][key] = obj
            return copy.deepcopy(obj)

    def update(self, resource: str, namespace: str | None, name: str,
               change: Callable[[dict], dict | None]) -> dict:
        """Atomically replace an object with ``change(copy)``: None means no change, ``REMOVE``
        removes the object (DELETED; the removed object is returned)."""
        with self._lock:
            old = self._objects[resource].get((namespace or "", name))
            if old is None:
                raise not_found(resource, name)
            new = change(copy.deepcopy(old))
            if new is None:
                return copy.deepcopy(old)
            if new is REMOVE:
                return self.remove(resource, namespace, name)
            self._record(resource, "MODIFIED", new, old)
            self._objects[resource][(namespace or "", name)] = new
            return copy.deepcopy(new)

    def remove(self, resource: str, namespace: str | None, name: str) -> dict:
        with self._lock:
            obj = self._objects[resource].pop((namespace or "", name), None)
            if obj is None:
                raise not_found(resource, name)
            obj = copy.deepcopy(obj)
            self._record(resource, "DELETED", obj, None)
            return obj

    def watch(self, resource: str, since: int | None,
              loop: asyncio.AbstractEventLoop) -> tuple[Watcher, list[Event], int]:
        """Register a watcher; the events it must see first — the current objects as ADDED
        (``since`` None) or the history after ``since`` — and the version they bring it to.
        410 Expired when that history is gone."""
        with self._lock:
            if since is None:
                backlog = [Event(int(o["metadata"]["resourceVersion"]), resource, "ADDED", copy.deepcopy(o), None)
                           for _, o in sorted(self._objects[resource].items())]
            else:
                if since < self._compacted:
                    raise expired(f"too old resource version: {since} ({self._compacted + 1})")
                backlog = [e for e in self._history if e.rv > since and e.resource == resource]
            watcher = Watcher(resource, loop)
            self._watchers.add(watcher)
            self._changed.notify_all()
            return watcher, backlog, self._rv

    def events(self, resource: str, after: int = 0) -> list[Event]:
        """The retained history of ``resource`` after version ``after`` (oldest first)."""
        with self._lock:
            return [e for e in self._history if e.resource == resource and e.rv > after]

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` (re-checked after every change) holds, or ``timeout`` passes."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def unwatch(self, watcher: Watcher) -> None:
        with self._lock:
            self._watchers.discard(watcher)
            self._changed.notify_all()

    def watching(self, resource: str) -> int:
        """How many watches of ``resource`` are open (``wait`` also wakes when this changes)."""
        with self._lock:
            return sum(1 for w in self._watchers if w.resource == resource)

    def close_watches(self) -> None:
        """End every open watch (server shutdown)."""
        with self._lock:
            for watcher in self._watchers:
                watcher.offer(None)
            self._watchers.clear()
