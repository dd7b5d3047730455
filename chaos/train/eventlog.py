"""The event channel from the recorder to the harness, with no Ray driver in between.

The recorder (inside the Train controller) appends each event as a JSON line to
``logs/chaos/<name>.jsonl`` under the Ray logs directory of the node it runs on
(``chaos.train.recorder.ENV_EVENTS_LOG``).  The harness finds that node through the state
API's log listing and follows the file through the dashboard's log stream: only the
dashboard's HTTP address is needed, from anywhere, with no filesystem shared with the
node.  Measured on Ray 2.60: events arrive a median 0.05 s after they were written
(docs/profiles.md).  If the stream ends while the run goes on (the node's agent restarted,
the head came back), the file is opened again and the lines already taken are skipped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from typing import Callable

from chaos.cluster import ClusterView
from chaos.errors import ClusterError
from chaos.timeline import Event, Timeline
from chaos.train.recorder import EVENTS_LOG_DIR

log = logging.getLogger(__name__)


class UnreadableEvent(ClusterError):
    """A line of the events log that is no event: it could have been a failure decision."""


class EventLog:
    """Follows one run's events file into ``timeline`` until ``drain``."""

    def __init__(self, cluster: ClusterView, name: str, timeline: Timeline, lost_after_s: float | None = 60.0,
                 look_every_s: float = 0.5, on_found: Callable[[str], None] | None = None,
                 transform: Callable[[Event], Event] | None = None):
        """``on_found(node_id)`` runs once, when the file is first found, before any event is
        taken (the run measures that node's clock offset there).  ``lost_after_s``: how long
        the file may be out of reach once events came before the timeline is aborted.
        ``transform``: each event as the timeline takes it (a resubmission's: as more attempts
        of the run it continues, chaos.train.run.continuation)."""
        self.cluster, self.name, self.timeline = cluster, name, timeline
        self.on_found = on_found
        self.transform = transform
        self.filename = f"{EVENTS_LOG_DIR}/{name}.jsonl"
        self.lost_after_s = lost_after_s
        self.look_every_s = look_every_s
        self.node_id: str | None = None  # where the file is, once found
        self._taken = 0  # lines taken into the timeline; a reopened stream skips them
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._drained = False
        self._thread = threading.Thread(target=self._run, name=f"events-{name}", daemon=True)
        self.error: Exception | None = None

    def start(self) -> "EventLog":
        self._thread.start()
        return self

    def locate(self) -> str | None:
        """The node whose logs directory holds the file (None: on no alive node yet)."""
        for node in sorted(self.cluster.nodes(), key=lambda n: not n.is_head):  # the controller is usually there
            if node.alive and self.filename in self.cluster.log_files(node.node_id, self.filename):
                return node.node_id
        return None

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as e:  # an unreadable event, a bug: every wait must say so, never miss it
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        self.error = e
        self.timeline.abort(f"the recorder's event log {self.filename} could not be read: {e}", ClusterError)

    def _follow(self) -> None:
        out_of_reach_since = None
        while not self._stop.is_set():
            node = None
            try:
                node = self.locate()
                if node is not None:
                    if self.node_id is None and self.on_found is not None:
                        try:
                            self.on_found(node)
                        except Exception as e:  # every wait must say so, not time out later
                            raise ClusterError(f"it is on node {node[:8]}, but: {e}") from e
                    self.node_id = node
                    before = self._taken
                    self._take(self.cluster.follow_log(node, self.filename))
                    out_of_reach_since = None
                    if self._taken == before:  # a stream that brought nothing: not again at once
                        self._stop.wait(self.look_every_s)
                    continue  # the stream ended or idled: open it again
                why = f"{self.filename} is on no alive node"
            except UnreadableEvent:
                raise
            except ClusterError as e:
                if node is not None and self.node_id is None:
                    raise  # on_found failed
                why = str(e)
            out_of_reach_since = out_of_reach_since or time.monotonic()
            if (self.lost_after_s is not None and self._taken
                    and time.monotonic() - out_of_reach_since > self.lost_after_s):
                raise ClusterError(f"it has been out of reach for {self.lost_after_s:.0f} s: {why}")
            self._stop.wait(self.look_every_s)  # the next look (the file appears with the run's controller)

    def _take(self, lines, until_stopped: bool = True) -> None:
        """Take the lines of one stream of the file (from its first line) that are new."""
        seen = 0
        for raw in lines:
            if until_stopped and self._stop.is_set():
                return
            if not raw.endswith(b"\n"):
                return  # a partial line at the stream's end: read again from the next stream
            seen += 1
            with self._lock:
                if seen <= self._taken:
                    continue
                try:
                    event = Event.from_json(json.loads(raw))
                except (ValueError, KeyError, TypeError) as e:
                    raise UnreadableEvent(f"line {seen} of the recorder's event log {self.filename} is no event "
                                       f"({type(e).__name__}: {e}): {raw[:200]!r}") from e
                event = dataclasses.replace(event, t=self.timeline.from_head(event.t))
                self.timeline.add(self.transform(event) if self.transform else event)
                self._taken += 1

    def drain(self, timeout_s: float = 10.0) -> None:
        """Take whatever the file holds now, then stop (idempotent)."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        if self.node_id is None or self._drained:
            return
        self._drained = True
        try:
            self._take(self.cluster.follow_log(self.node_id, self.filename, idle_timeout_s=1.0), until_stopped=False)
        except UnreadableEvent as e:
            self._fail(e)
            raise
        except ClusterError as e:
            log.warning("could not read the rest of the recorder's event log %s: %s", self.filename, e)
