"""The event channel from the recorder to the harness, with no Ray driver in between.

The recorder (inside the Train controller) appends each event as a JSON line to
``logs/chaos/<name>/events-NNNNN.jsonl`` under the Ray logs directory of the node it runs on,
``CHUNK_LINES`` events a file (chaos.train.recorder).  The harness finds that node through
the state API's log listing and reads the file it is at through the dashboard's log API —
a request that ends, each time it looks: only the dashboard's HTTP address is needed, from
anywhere, with no filesystem shared with the node.  A file holding ``CHUNK_LINES`` lines is
complete, so each look reads at most one file's worth.

Not Ray's follow-mode stream (``media_type=stream``), though it brings lines sooner: its
server side ends only when the file grows again after the client left, so every stream the
harness let go of — and the last one of every run — kept one of the state API's 100 request
slots until the dashboard restarted (seen: a stand-in cluster shared by ~40 sessions ran out
of them, "Max number of in-progress requests=100 reached", and every node listing failed).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from typing import Callable

from chaos.cluster import ClusterView
from chaos.errors import ClusterError, WaitTimeout
from chaos.timeline import Event, Timeline
from chaos.train.channel import CHUNK_LINES, EVENTS_LOG_DIR, chunk_name
from chaos.waits import poll_until

log = logging.getLogger(__name__)


#: how long a drain waits for the follower's look in flight (its requests time out at 30 s each)
FOLLOWER_STOP_S = 90.0


class UnreadableEvent(ClusterError):
    """A line of the events log that is no event: it could have been a failure decision."""


class EventLog:
    """Reads one run's events log into ``timeline`` until ``drain``."""

    def __init__(self, cluster: ClusterView, name: str, timeline: Timeline, lost_after_s: float | None = 60.0,
                 look_every_s: float = 0.2, on_found: Callable[[str], None] | None = None,
                 transform: Callable[[Event], Event] | None = None):
        """``on_found(node_id)`` runs once, when the log is first found, before any event is
        taken (the run measures that node's clock offset there).  ``lost_after_s``: how long
        the log may be out of reach once events came before the timeline is aborted (None:
        never — a fault that takes the head away).  ``transform``: each event as the timeline
        takes it (a resubmission's: as more attempts of the run it continues,
        chaos.train.run.continuation)."""
        self.cluster, self.name, self.timeline = cluster, name, timeline
        self.on_found = on_found
        self.transform = transform
        self.directory = f"{EVENTS_LOG_DIR}/{name}"
        self.lost_after_s = lost_after_s
        self.look_every_s = look_every_s
        self.node_id: str | None = None  # where the log is, once found
        self._found = False
        self._chunk = 0  # the file being read
        self._lines_in_chunk = 0  # complete lines of it taken
        self._taken = 0  # events taken in all
        self._next_seq = 0  # the recorder numbers its events: one skipped was lost (events_lost)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._drained = False
        self.unread: str | None = None  # why the drain could not read the rest
        self._cut_off = 0  # bytes of a line still being written at the end of the file being read
        self._thread = threading.Thread(target=self._run, name=f"events-{name}", daemon=True)
        self.error: Exception | None = None

    @property
    def filename(self) -> str:
        return f"{self.directory}/{chunk_name(self._chunk)}"

    def start(self) -> "EventLog":
        self._thread.start()
        return self

    def locate(self) -> str | None:
        """The node whose logs directory holds the log (None: on no alive node yet)."""
        for node in sorted(self.cluster.nodes(), key=lambda n: not n.is_head):  # the controller is usually there
            if node.alive and self.cluster.log_files(node.node_id, f"{self.directory}/*"):
                return node.node_id
        return None

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as e:  # an unreadable event, a bug: every wait must say so, never miss it
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        self.error = e
        self.timeline.abort(f"the recorder's event log {self.directory} could not be read: {e}", ClusterError)

    def _follow(self) -> None:
        out_of_reach_since = None
        while not self._stop.is_set():
            try:
                if self.node_id is None:
                    self.node_id = self._find()
                if self.node_id is not None:
                    if self._look():
                        out_of_reach_since = None
                        continue  # more may have come meanwhile: look again at once
                    out_of_reach_since = None
                elif self._found:
                    raise ClusterError(f"{self.directory} is on no alive node")
            except UnreadableEvent:
                raise
            except ClusterError as e:
                if self.node_id is not None and not self._found:
                    raise  # on_found failed
                self.node_id = None  # look for it again (a head that came back runs a new node)
                out_of_reach_since = out_of_reach_since or time.monotonic()
                if (self.lost_after_s is not None and self._taken
                        and time.monotonic() - out_of_reach_since > self.lost_after_s):
                    raise ClusterError(f"it has been out of reach for {self.lost_after_s:.0f} s: {e}") from e
            self._stop.wait(self.look_every_s)  # the next look (the log appears with the run's controller)

    def _find(self) -> str | None:
        node = self.locate()
        if node is not None and not self._found:
            if self.on_found is not None:
                try:
                    self.on_found(node)
                except Exception as e:  # every wait must say so, not time out later
                    self.node_id = node
                    raise ClusterError(f"it is on node {node[:8]}, but: {e}") from e
            self._found = True
        return node

    def _look(self) -> int:
        """Take what is new in the file being read, and move on to the next file once this one
        is complete and the next exists; how many events were taken."""
        taken = self._take(self.cluster.read_log(self.node_id, self.filename))
        if self._lines_in_chunk == CHUNK_LINES:
            following = f"{self.directory}/{chunk_name(self._chunk + 1)}"
            if following in self.cluster.log_files(self.node_id, following):
                self._chunk, self._lines_in_chunk = self._chunk + 1, 0
                return taken + 1  # look at the next file at once
        return taken

    def _take(self, data: bytes) -> int:
        """Take the complete lines of the file being read that are new."""
        *lines, partial = data.split(b"\n")  # a partial last line waits for the next look
        self._cut_off = len(partial)
        new = lines[self._lines_in_chunk:]
        with self._lock:
            for raw in new:
                where = f"line {self._lines_in_chunk + 1} of the recorder's event log {self.filename}"
                try:
                    line = json.loads(raw)
                    seq, event = line["seq"], Event.from_json(line)
                except (ValueError, KeyError, TypeError) as e:
                    raise UnreadableEvent(f"{where} is no event ({type(e).__name__}: {e}): {raw[:200]!r}") from e
                if not isinstance(seq, int) or seq < self._next_seq:
                    raise UnreadableEvent(f"{where} is event {seq!r} where event {self._next_seq} or later was due "
                                          "(two recorders writing one log?)")
                event = dataclasses.replace(event, t=self.timeline.from_head(event.t))
                event = self.transform(event) if self.transform else event
                if seq > self._next_seq:
                    self._lost(self._next_seq, seq - 1, event)
                self.timeline.add(event)
                self._next_seq = seq + 1
                self._lines_in_chunk += 1
                self._taken += 1
        return len(new)

    def _lost(self, first: int, last: int, after: Event) -> None:
        """Events the recorder numbered and could not write (its log's disk full): whatever
        they were — a committed checkpoint, an attempt's first report, a failure decision — is
        missing evidence, for the verdicts to name; ``after``: the first event read after them."""
        log.warning("the recorder could not write events %d..%d of %s", first, last, self.directory)
        self.timeline.emit("harness", "events_lost", job_id=self.name, run_id=after.data.get("run_id"),
                           seqs=[first, last], before_t=after.t,
                           why=f"the recorder could not write event(s) {first}..{last} of it (its log said why)")

    def drain(self, timeout_s: float = 10.0) -> str | None:
        """Take whatever the log holds now, then stop (idempotent); a log out of reach — or
        never found — is looked for again for up to ``timeout_s``.  Returns why the rest of the
        log could not be read (a log never found says so: none of its events was read), None
        when nothing is left unread: events the recorder wrote and nobody read (a lost job's
        last checkpoint) are missing evidence, for the caller to put on the timeline."""
        self._stop.set()
        # Never read beside the follower: its look in flight would take lines against the
        # position the drain moved on (events twice).  A look ends within its requests' timeouts.
        self._thread.join(timeout=FOLLOWER_STOP_S)
        if self.error is not None:
            return str(self.error)
        if self._drained:
            return self.unread
        self._drained = True
        if self._thread.is_alive():
            self.unread = f"its follower was still reading {FOLLOWER_STOP_S:.0f} s after it was told to stop"
            return self.unread
        if not self._found:  # looked for until now, never seen: one more search, then say so
            self.node_id = None

        def read_to_the_end() -> tuple[bool, str]:
            try:
                if self.node_id is None:  # never found, or lost with a head that came back as a new node
                    self.node_id = self._find() if not self._found else self.locate()
                    if self.node_id is None:
                        return False, f"{self.directory} is on no alive node" + (
                            "" if self._found else ": the log was never found, so none of its events was read")
                while self._look():
                    pass
                return True, ""
            except UnreadableEvent:
                raise
            except ClusterError as e:  # a head just back may not list its logs yet: look again
                self.node_id = None
                return False, str(e)

        try:
            poll_until(read_to_the_end, timeout_s, f"the rest of the recorder's event log {self.directory}",
                       interval=0.5)
            if self._cut_off:  # the recorder died writing it: that event is lost
                self.unread = f"its last line, in {self.filename}, ends after {self._cut_off} bytes without a newline"
        except UnreadableEvent as e:
            self._fail(e)
            raise
        except WaitTimeout as e:
            self.unread = str(e)
        if self.unread is not None:
            log.warning("could not read the rest of the recorder's event log %s: %s", self.directory, self.unread)
        return self.unread
