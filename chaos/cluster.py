"""The live Ray cluster, seen through Ray's own public APIs.

Node states come from the state API over the dashboard (``ray.util.state``): it carries
the GCS's own ``end_time_ms`` for a dead node, so "time to detect" is measured with the
GCS's timestamp, not with when we happened to look.  A watcher thread turns node state
changes into ``node_dead`` / ``node_alive`` timeline events.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import http.client
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

from chaos.errors import ClusterError, WaitTimeout
from chaos.timeline import Timeline
from chaos.waits import poll_until

log = logging.getLogger(__name__)


RAYLET_TABLE_LAG_S = 15.0  # how long a node may take to reach the dashboard's node table


@dataclasses.dataclass(frozen=True)
class Node:
    node_id: str
    ip: str
    alive: bool
    is_head: bool
    start_time: float | None  # unix seconds, from the GCS
    end_time: float | None
    death_reason: str | None
    resources: dict
    labels: dict = dataclasses.field(default_factory=dict)

    def short(self) -> str:
        return f"{self.node_id[:8]}@{self.ip}"


@dataclasses.dataclass(frozen=True)
class Target:
    """What a fault hits: a Ray node (and the rank/process on it), resolved from live placement."""

    node_id: str
    node_ip: str
    rank: int | None = None
    pid: int | None = None
    host: str | None = None  # the host's name, for reports

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        rank = f"rank {self.rank} on " if self.rank is not None else ""
        return f"{rank}node {self.node_id[:8]} ({self.host or self.node_ip})"


class ClusterView:
    def __init__(self, dashboard_url: str, gcs_address: str):
        self.dashboard_url = dashboard_url
        self.gcs_address = gcs_address
        self._watch_stop = threading.Event()
        self._watchers: list[threading.Thread] = []

    # -- node table --------------------------------------------------------------
    def nodes(self) -> list[Node]:
        from ray.util.state import list_nodes

        try:
            states = list_nodes(address=self.dashboard_url, detail=True, limit=10_000, raise_on_missing_output=False)
        except Exception as e:  # the state API raises several types; all mean "unreachable"
            raise ClusterError(f"could not list nodes from the Ray dashboard at {self.dashboard_url}: {e}") from e
        out = []
        for s in states:
            out.append(
                Node(
                    node_id=s.node_id,
                    ip=s.node_ip,
                    alive=s.state == "ALIVE",
                    is_head=bool(s.is_head_node),
                    start_time=(s.start_time_ms or 0) / 1000 or None,
                    end_time=(s.end_time_ms or 0) / 1000 or None,
                    death_reason=s.state_message,
                    resources=dict(s.resources_total or {}),
                    labels=dict(s.labels or {}),
                )
            )
        return out

    def node(self, node_id: str) -> Node | None:
        return next((n for n in self.nodes() if n.node_id == node_id), None)

    def raylets(self) -> dict[str, dict]:
        """node id -> the GCS's record of the node as the dashboard serves it (``GET
        /nodes?view=summary``, each entry's ``raylet``: ``nodeManagerAddress``,
        ``nodeManagerPort``, ``nodeManagerHostname``, ...): over HTTP, like ``nodes``, so no
        Ray driver is needed for it (the state API's node records carry neither the hostname
        nor the raylet's port)."""
        from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

        url = f"{self.dashboard_url.rstrip('/')}/nodes?view=summary"
        request = urllib.request.Request(url, headers=get_auth_headers_if_auth_enabled({}))
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                summary = json.load(response)["data"]["summary"]
            return {n["raylet"]["nodeId"]: n["raylet"] for n in summary if n.get("raylet", {}).get("nodeId")}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ClusterError(f"could not read the node table from the Ray dashboard at {url}: {e}") from e

    def raylet(self, node_id: str, timeout: float = RAYLET_TABLE_LAG_S) -> dict:
        """The dashboard's record of node ``node_id``, waiting out its lag behind the GCS (it
        caches its answer for 2 s and learns of a node from the GCS's events) for a node that
        just joined."""
        def check() -> tuple[dict | None, str]:
            record = self.raylets().get(node_id)
            return record, "not in the dashboard's node table yet" if record is None else "found"

        try:
            return poll_until(check, timeout, f"node {node_id[:8]} in the node table at {self.dashboard_url}")
        except WaitTimeout as e:
            raise ClusterError(f"node {node_id[:8]} is not in Ray's node table at {self.dashboard_url}: {e}") from e

    def hostname(self, node_id: str) -> str | None:
        """The node's machine hostname, as its raylet reported it."""
        return self.raylet(node_id).get("nodeManagerHostname")

    def raylet_endpoint(self, node_id: str) -> tuple[str, int]:
        """(address, node manager port) of a node's raylet, from Ray's node table."""
        raylet = self.raylet(node_id)
        return raylet["nodeManagerAddress"], int(raylet["nodeManagerPort"])

    def held_by_job(self, job_id: str) -> list[str]:
        """What Ray job ``job_id`` (hex) still holds: its actors that are not DEAD and its
        placement groups that are not REMOVED, each where it reserves CPU, GPU or a custom
        resource.  From the state API over HTTP, like ``nodes``: no driver needed."""
        from ray.util.state import list_actors, list_placement_groups

        common = dict(address=self.dashboard_url, detail=True, limit=10_000, raise_on_missing_output=False)
        try:
            actors = list_actors(filters=[("job_id", "=", job_id)], **common)
            groups = list_placement_groups(filters=[("creator_job_id", "=", job_id)], **common)
        except Exception as e:  # the state API raises several types; all mean "unreachable"
            raise ClusterError(f"could not list job {job_id}'s actors and placement groups from the Ray "
                               f"dashboard at {self.dashboard_url}: {e}") from e
        held = []
        for a in actors:
            amount = countable(a.required_resources or {})
            if a.state != "DEAD" and amount:
                held.append(f"actor {a.class_name} {a.actor_id[:8]} {a.state} with {_amounts(amount)}"
                            + (f" on node {a.node_id[:8]}" if a.node_id else ""))
        for g in groups:
            amount: dict[str, float] = {}
            for bundle in g.bundles or []:
                for k, v in countable(bundle.get("unit_resources") or {}).items():
                    amount[k] = amount.get(k, 0.0) + v
            if g.state != "REMOVED" and amount:
                held.append(f"placement group {g.name or g.placement_group_id[:8]} {g.state} with {_amounts(amount)}")
        return held

    # -- node log files (the recorder's events: chaos.train.eventlog) ------------------
    def _get(self, path: str, query: dict, timeout: float):
        from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

        url = f"{self.dashboard_url.rstrip('/')}{path}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, headers=get_auth_headers_if_auth_enabled({}))
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except (OSError, ValueError) as e:
            raise ClusterError(f"could not read {url}: {e}") from e

    def log_files(self, node_id: str, glob: str) -> list[str]:
        """Files under node ``node_id``'s Ray logs directory that match ``glob``: the state
        API's log listing over HTTP (Ray's own ``list_logs`` wants a GCS address)."""
        with self._get("/api/v0/logs", {"node_id": node_id, "glob": glob}, timeout=30) as response:
            try:
                result = json.load(response)["data"]["result"] or {}
            except (ValueError, KeyError, TypeError) as e:
                raise ClusterError(f"unexpected log listing of node {node_id[:8]} from {self.dashboard_url}: {e}") \
                    from e
        return sorted({f for files in result.values() for f in files})

    def read_log(self, node_id: str, filename: str, timeout: float = 30.0) -> bytes:
        """The whole of ``filename`` under node ``node_id``'s Ray logs directory, as its agent
        reads it now (a file request, which ends: Ray's follow-mode stream never does on the
        server once nobody reads it — its handler waits for the file to grow, holding one of
        the state API's 100 request slots until then)."""
        query = {"node_id": node_id, "filename": filename, "lines": -1, "media_type": "file", "timeout": int(timeout)}
        with self._get("/api/v0/logs/file", query, timeout=timeout) as response:
            try:
                return response.read()
            except (OSError, http.client.HTTPException) as e:
                raise ClusterError(f"reading {filename} on node {node_id[:8]} from {self.dashboard_url} broke: {e}") \
                    from e

    def unreachable(self, timeout: float = 5.0) -> str | None:
        """Why the dashboard does not answer within ``timeout`` s (None: it answers): one look,
        for a way out that must not wait on a cluster that is gone (``chaos.cleanup``)."""
        from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

        url = f"{self.dashboard_url.rstrip('/')}/api/version"
        seen: list[str | None] = []

        def look() -> None:
            try:
                request = urllib.request.Request(url, headers=get_auth_headers_if_auth_enabled({}))
                with urllib.request.urlopen(request, timeout=timeout):
                    seen.append(None)
            except urllib.error.HTTPError:  # it answered, if not as hoped: it is there
                seen.append(None)
            except Exception as e:  # noqa: BLE001 - OSError, HTTPError, ValueError...: no answer
                seen.append(f"{url} did not answer: {e}")

        looker = threading.Thread(target=look, name="dashboard-look", daemon=True)
        looker.start()
        looker.join(timeout + 1.0)  # a name lookup is not bound by urlopen's timeout
        return seen[0] if seen else f"{url} did not answer within {timeout:g} s"

    def alive_workers(self) -> list[Node]:
        return [n for n in self.nodes() if n.alive and not n.is_head]

    def table(self) -> list[dict]:
        """Node table for reports."""
        return [
            {"node_id": n.node_id, "ip": n.ip, "alive": n.alive, "head": n.is_head, "death_reason": n.death_reason}
            for n in sorted(self.nodes(), key=lambda n: (not n.is_head, n.ip, n.start_time or 0))
        ]

    # -- waits -------------------------------------------------------------------
    def wait_until(self, predicate: Callable[[list[Node]], object], timeout: float, what: str) -> object:
        def check():
            try:
                nodes = self.nodes()
            except ClusterError as e:
                return None, str(e)
            seen = ", ".join(f"{n.short()}:{'ALIVE' if n.alive else 'DEAD'}" for n in nodes) or "no nodes"
            return predicate(nodes), seen

        return poll_until(check, timeout, what)

    def wait_alive_workers(self, count: int, timeout: float) -> list[Node]:
        return self.wait_until(
            lambda ns: (lambda alive: alive if len(alive) >= count else None)([n for n in ns if n.alive and not n.is_head]),
            timeout, f"{count} alive worker nodes",
        )

    # -- watcher -----------------------------------------------------------------
    def watch(self, timeline: Timeline, interval: float = 0.25,
              on_joined: Callable[[Node], None] | None = None) -> None:
        """Emit node_dead / node_alive events into ``timeline`` until ``stop_watching``;
        ``on_joined(node)`` for each worker node that joins meanwhile (it must not block).

        The node table is the head's (its dashboard): the first look that cannot read it is
        ``head_unreachable``, the first that can again ``head_reachable`` — what the harness
        sees of a head that goes, from wherever it runs."""
        known = {n.node_id: n.alive for n in self.nodes()}
        stop = self._watch_stop  # this watcher's own stop flag, even if stop_watching replaces it

        def loop():
            reachable = True
            while not stop.wait(interval):
                try:
                    nodes = self.nodes()
                except ClusterError as e:
                    log.debug("node watcher: %s", e)
                    if reachable:
                        timeline.emit("cluster", "head_unreachable", error=str(e)[:300])  # when it was seen
                        reachable = False
                    continue
                if not reachable:
                    timeline.emit("cluster", "head_reachable")
                    reachable = True
                for n in nodes:
                    was = known.get(n.node_id)
                    if was is None and n.alive:
                        timeline.emit("cluster", "node_alive", t=timeline.from_head(n.start_time) if n.start_time else time.time(), node_id=n.node_id, node_ip=n.ip)
                        if on_joined is not None and not n.is_head:
                            on_joined(n)
                    elif was and not n.alive:
                        timeline.emit("cluster", "node_dead", t=timeline.from_head(n.end_time) if n.end_time else time.time(), node_id=n.node_id,
                                      node_ip=n.ip, death_reason=n.death_reason)
                    known[n.node_id] = n.alive

        thread = threading.Thread(target=loop, name="node-watcher", daemon=True)
        thread.start()
        self._watchers.append(thread)

    def stop_watching(self) -> None:
        self._watch_stop.set()
        for t in self._watchers:
            t.join(timeout=5)
        self._watchers.clear()
        self._watch_stop = threading.Event()


def countable(resources: dict) -> dict[str, float]:
    """Resources a run holds and must give back: CPU, GPU, custom ones — not memory (which
    Ray's own processes use) nor the per-node ``node:<ip>`` markers (node ids change)."""
    skip = ("memory", "object_store_memory")
    return {k: float(v) for k, v in resources.items()
            if k not in skip and float(v) > 0 and not k.startswith("node:") and not k.startswith("accelerator_type:")}


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(resources.items()))
