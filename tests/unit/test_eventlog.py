"""The recorder's event channel without a driver (chaos.train.eventlog, the recorder's
EventsLogWriter): found on whichever node holds it, read in bounded files, each event once,
lost loudly; and ClusterView's log listing and file read against an HTTP server that answers
as the dashboard does."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from chaos.cluster import ClusterView, Node
from chaos.errors import ClusterError, WaitTimeout
from chaos.timeline import Timeline
from chaos.train import recorder
from chaos.train import eventlog
from chaos.train.eventlog import EventLog
from chaos.train.channel import CHUNK_LINES, chunk_name
from chaos.train.recorder import EventsLogWriter, events_log_dir

DIR = "chaos/run-1"


def event(i: int, t: float = 1000.0) -> dict:
    return {"t": t + i, "source": "recorder", "kind": "report", "data": {"step": i}}


def line(i: int, seq: int | None = None) -> bytes:
    """Event ``i`` as the recorder writes it: the log's event ``i - 1`` unless ``seq`` says."""
    return (json.dumps({"seq": i - 1 if seq is None else seq, **event(i)}) + "\n").encode()


class FakeCluster:
    """Node n2's logs directory holds ``files`` (name -> bytes, changed by the test as the
    recorder would); ``alive`` False: every node is gone."""

    def __init__(self, files=None, holder="n2"):
        self.files, self.holder, self.alive, self.reads = dict(files or {}), holder, True, 0

    def nodes(self):
        return [Node(node_id=n, ip=f"127.0.1.{i}", alive=self.alive, is_head=n == "n1", start_time=None,
                     end_time=None, death_reason=None, resources={})
                for i, n in enumerate(("n1", "n2"), 2)]

    def log_files(self, node_id, glob):
        if node_id != self.holder:
            return []
        prefix = glob.rstrip("*")
        return sorted(f for f in self.files if (f.startswith(prefix) if glob.endswith("*") else f == glob))

    def read_log(self, node_id, filename, timeout=30.0):
        assert node_id == self.holder
        self.reads += 1
        if not self.alive or filename not in self.files:
            raise ClusterError(f"could not read {filename}")
        return self.files[filename]


def chunk(i):
    return f"{DIR}/{chunk_name(i)}"


def steps(timeline):
    return [e.data["step"] for e in timeline.of("report")]


def reader(cluster, timeline, **kw):
    return EventLog(cluster, "run-1", timeline, look_every_s=0.01, **kw).start()


def test_events_reach_the_timeline_in_order_on_the_harness_clock():
    tl = Timeline()
    tl.set_clock_offset(2.0, 0.001)  # the node's clock is 2 s ahead
    log = reader(FakeCluster({chunk(0): line(1) + line(2) + line(3)}), tl)
    tl.wait_for(lambda ev: len(steps(tl)) == 3 or None, 10, "three events")
    log.drain(timeout_s=5)
    assert steps(tl) == [1, 2, 3] and log.node_id == "n2"
    assert [e.t for e in tl.of("report")] == [999.0, 1000.0, 1001.0]


def test_each_event_is_taken_once_a_partial_line_waits_and_a_full_file_leads_to_the_next():
    tl, c = Timeline(), FakeCluster({chunk(0): line(1) + line(2)[:9]})  # the recorder is writing line 2
    log = reader(c, tl)
    tl.wait_for(lambda ev: steps(tl) == [1] or None, 10, "the first event")
    c.files[chunk(0)] = b"".join(line(i) for i in range(1, CHUNK_LINES + 1))
    tl.wait_for(lambda ev: len(steps(tl)) == CHUNK_LINES or None, 10, "the first file")
    c.files[chunk(1)] = line(CHUNK_LINES + 1)
    tl.wait_for(lambda ev: len(steps(tl)) == CHUNK_LINES + 1 or None, 10, "the second file")
    log.drain(timeout_s=5)
    assert steps(tl) == list(range(1, CHUNK_LINES + 2)) and not tl.of("events_lost")


def test_a_log_out_of_reach_after_events_came_aborts_the_timeline_loudly():
    tl, c = Timeline(), FakeCluster({chunk(0): line(1)})
    log = EventLog(c, "run-1", tl, lost_after_s=0.2, look_every_s=0.01).start()
    tl.wait_for(lambda ev: steps(tl) or None, 10, "the first event")
    c.alive = False
    with pytest.raises(ClusterError, match=r"event log chaos/run-1 could not be read: it has been out of reach "
                                           r"for 0 s: chaos/run-1 is on no alive node"):
        tl.wait_for(lambda ev: None, 10, "anything")
    log.drain(timeout_s=5)
    assert steps(tl) == [1] and isinstance(log.error, ClusterError)


def test_twin_a_log_not_there_yet_is_waited_for_not_an_error():
    tl, c = Timeline(), FakeCluster({})
    log = EventLog(c, "run-1", tl, lost_after_s=0.05, look_every_s=0.01).start()
    with pytest.raises(WaitTimeout):  # many looks, well past lost_after_s
        tl.wait_for(lambda ev: None, 0.3, "nothing")
    assert c.reads == 0 and log.error is None  # looked for, never read, never aborted
    c.files[chunk(0)] = line(1)
    tl.wait_for(lambda ev: steps(tl) or None, 10, "the first event")
    log.drain(timeout_s=5)
    assert log.error is None and steps(tl) == [1]


def test_a_drain_of_a_log_never_found_says_none_of_it_was_read():
    """A log no node ever held (a lost job's, whose controller never wrote it, or on a node
    gone before it was found): the drain must not answer "nothing unread"."""
    tl, c = Timeline(), FakeCluster({})
    log = reader(c, tl)
    unread = log.drain(timeout_s=0.5)
    assert unread is not None and "was never found, so none of its events was read" in unread, unread
    assert log.drain(timeout_s=0.5) == unread  # idempotent


def test_twin_a_log_found_only_at_the_drain_is_read_whole():
    tl, c = Timeline(), FakeCluster({})
    log = EventLog(c, "run-1", tl)
    log._stop.set()  # the follower ends before its first look: only the drain's own search finds it
    log.start()
    c.files[chunk(0)] = line(1) + line(2)
    assert log.drain(timeout_s=5) is None and steps(tl) == [1, 2]


def test_twin_losing_the_log_is_no_error_where_the_head_may_go():
    """A head fault: the log out of reach while the head is away, found again when it is back."""
    tl, c = Timeline(), FakeCluster({chunk(0): line(1)})
    log = EventLog(c, "run-1", tl, lost_after_s=None, look_every_s=0.01).start()
    tl.wait_for(lambda ev: steps(tl) or None, 10, "the first event")
    c.alive = False
    with pytest.raises(WaitTimeout):  # many looks while it is away, well past the default lost_after_s
        tl.wait_for(lambda ev: None, 0.3, "nothing")
    assert log.error is None
    c.alive = True
    c.files[chunk(0)] = line(1) + line(2)
    tl.wait_for(lambda ev: steps(tl) == [1, 2] or None, 10, "the event after the head came back")
    log.drain(timeout_s=5)
    assert log.error is None


def test_an_unreadable_event_line_aborts_the_timeline_never_skipped():
    """A line that is not an event could be a failure decision: missing it could pass a run."""
    tl = Timeline()
    log = reader(FakeCluster({chunk(0): line(1) + b"{not json\n" + line(3)}), tl)
    with pytest.raises(ClusterError, match=r"event log chaos/run-1 could not be read: line 2 of the recorder's "
                                           r"event log chaos/run-1/events-00000.jsonl is no event \(JSONDecodeError"):
        tl.wait_for(lambda ev: None, 10, "anything")
    log.drain(timeout_s=5)
    assert steps(tl) == [1]


def test_a_clock_that_cannot_be_measured_aborts_before_any_event_is_taken():
    def clock(node_id):
        raise ClusterError(f"no transport to {node_id}")

    tl = Timeline()
    log = reader(FakeCluster({chunk(0): line(1)}), tl, on_found=clock)
    with pytest.raises(ClusterError, match=r"could not be read: it is on node n2, but: no transport to n2"):
        tl.wait_for(lambda ev: None, 10, "anything")
    log.drain(timeout_s=5)
    assert steps(tl) == []


# -- the recorder's side -----------------------------------------------------------------------
def test_the_writer_fills_each_file_with_chunk_lines_whole_lines(tmp_path):
    writer = EventsLogWriter(str(tmp_path))
    for i in range(CHUNK_LINES + 3):
        writer.append(event(i))
    first, second = (tmp_path / chunk_name(0)).read_text(), (tmp_path / chunk_name(1)).read_text()
    assert len(first.splitlines()) == CHUNK_LINES and first.endswith("\n")
    assert [json.loads(x)["data"]["step"] for x in second.splitlines()] == [CHUNK_LINES, CHUNK_LINES + 1,
                                                                            CHUNK_LINES + 2]


def test_each_event_is_on_disk_before_the_next_is_written(tmp_path, monkeypatch):
    """A power-cycled head keeps only what reached its disk: each line is fsynced, whole."""
    synced = []

    def fsync(fd):  # how many whole lines the file holds when it is synced
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            synced.append(f.read().count(b"\n"))

    monkeypatch.setattr(recorder.os, "fsync", fsync)
    writer = EventsLogWriter(str(tmp_path))
    for i in range(3):
        writer.append(event(i))
    assert synced == [1, 2, 3]  # each sync saw every line written so far, complete


def test_the_recorder_refuses_an_events_log_name_that_is_a_path(monkeypatch, tmp_path):
    monkeypatch.setattr(recorder, "node_logs_dir", lambda: str(tmp_path))
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="a plain file name is needed"):
            events_log_dir(bad)
    assert events_log_dir("job-1") == str(tmp_path / "chaos" / "job-1")


# -- ClusterView against an HTTP server answering as Ray 2.60's dashboard ---------------
class Dashboard(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        if self.path.startswith("/api/v0/logs/file?"):
            assert "node_id=n2" in self.path and "filename=chaos%2Frun-1%2Fevents-00000.jsonl" in self.path
            assert "lines=-1" in self.path and "media_type=file" in self.path
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (self.body[:10], self.body[10:]):  # chunks cut mid-line
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path.startswith("/api/v0/logs?"):
            body = json.dumps({"result": True, "msg": "", "data": {"result": {"internal": [chunk(0)]}}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(500, "Agent for node id: nobody doesn't exist.")

    def log_message(self, *args):
        pass


@pytest.fixture
def dashboard():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dashboard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield ClusterView(f"http://127.0.0.1:{server.server_address[1]}", "127.0.0.1:1")
    server.shutdown()
    server.server_close()


def test_cluster_view_lists_and_reads_a_nodes_log_file(dashboard):
    Dashboard.body = line(1) + line(2)
    assert dashboard.log_files("n2", f"{DIR}/*") == [chunk(0)]
    assert dashboard.read_log("n2", chunk(0)) == line(1) + line(2)


def test_cluster_view_names_the_url_when_the_dashboard_refuses(dashboard):
    with pytest.raises(ClusterError, match=r"could not read http://127\.0\.0\.1:\d+/nothing"):
        dashboard._get("/nothing", {}, timeout=5)


def lost_with_the_head():
    """A log followed until its first event, then every node gone with the head (a head fault);
    returns once the follower has let go of the node."""
    tl, c = Timeline(), FakeCluster({chunk(0): line(1)})
    log = EventLog(c, "run-1", tl, lost_after_s=None, look_every_s=0.01).start()
    tl.wait_for(lambda ev: steps(tl) or None, 10, "the first event")
    c.alive = False
    poll = time.monotonic() + 10
    while log.node_id is not None and time.monotonic() < poll:
        log._stop.wait(0.01)
    assert log.node_id is None, "the follower kept the node of a head that is gone"
    return tl, c, log


def test_a_drain_after_the_head_came_back_as_a_new_node_reads_the_log_there():
    """The run resubmitted after a head fault drains the lost job's log; the follower had let go
    of the old head's node, and the restarted head (a new node id) holds the same logs
    directory with the events the lost controller wrote before it died (seen in CI: its
    checkpoint 15, missed, made a right resume at 16 look like one past checkpoint 10)."""
    tl, c, log = lost_with_the_head()
    c.files[chunk(0)] = line(1) + line(2) + line(3)  # written before the old controller died
    c.holder, c.alive = "n1", True  # the head, back under a new node id, holds the directory
    log._stop.set()  # the follower stops before it looks again: only the drain can find them
    log._thread.join(timeout=5)
    assert log.drain(timeout_s=5) is None  # nothing left unread
    assert steps(tl) == [1, 2, 3] and log.error is None


def test_a_drain_that_cannot_reach_the_log_says_what_it_left_unread():
    """The head holding the lost job's log is not back (or came back without it): the drain
    says why, for the run to put on the timeline — a checkpoint may be among what was left."""
    tl, c, log = lost_with_the_head()
    why = log.drain(timeout_s=0.5)
    assert why == ("timed out after 0s waiting for the rest of the recorder's event log chaos/run-1; saw: "
                   "chaos/run-1 is on no alive node"), why
    assert log.drain(timeout_s=0.5) == why  # asked again: the same answer
    assert steps(tl) == [1] and log.error is None  # missing evidence, not a broken channel


class HeadComingBack(FakeCluster):
    """The head is back (node n1) but lists no logs for its first ``misses`` listings."""

    def __init__(self, files, misses):
        super().__init__(files, holder="n1")
        self.misses = misses

    def log_files(self, node_id, glob):
        if self.misses > 0:
            self.misses -= 1
            raise ClusterError("Agent for node id: n1 doesn't exist.")
        return super().log_files(node_id, glob)


def test_a_drain_waits_for_a_head_that_does_not_list_its_logs_yet():
    """Right after the head is back its log agent may not answer: the drain looks again
    (twin of the one above, whose head never comes back)."""
    tl = Timeline()
    c = HeadComingBack({chunk(0): line(1) + line(2)}, misses=2)
    log = EventLog(c, "run-1", tl, lost_after_s=None, look_every_s=0.01)
    log._found = True  # found before the head went; the follower has let go of the node and ended
    log._stop.set()
    log.start()
    assert log.drain(timeout_s=10) is None
    assert steps(tl) == [1, 2] and c.misses == 0


def test_a_line_cut_off_at_the_drain_is_left_unread():
    """The recorder died in the middle of a line: that event (a checkpoint, maybe) is lost, and
    the drain says so instead of calling the log read (twin: whole lines only, nothing unread)."""
    tl = Timeline()
    log = reader(FakeCluster({chunk(0): line(1) + line(2)[:9]}), tl)
    tl.wait_for(lambda ev: steps(tl) == [1] or None, 10, "the first event")
    assert log.drain(timeout_s=5) == f"its last line, in {chunk(0)}, ends after 9 bytes without a newline"
    twin = reader(FakeCluster({chunk(0): line(1) + line(2)}), Timeline())
    assert twin.drain(timeout_s=5) is None


class SlowAgent(FakeCluster):
    """A node agent whose every read after the first hangs until ``release`` is set."""

    def __init__(self, files):
        super().__init__(files)
        self.release, self.waiting = threading.Event(), threading.Event()

    def read_log(self, node_id, filename, timeout=30.0):
        if self.reads >= 1:
            self.waiting.set()
            self.release.wait(10)
        return super().read_log(node_id, filename, timeout)


def test_the_drain_never_reads_beside_a_follower_still_reading(monkeypatch):
    """A follower's look still in flight would take its lines against the position a drain
    moved on (seen in review: 99 of 200 events twice); the drain waits for it, and past its
    bound says the rest is unread rather than read beside it."""
    monkeypatch.setattr(eventlog, "FOLLOWER_STOP_S", 0.2)
    tl, c = Timeline(), SlowAgent({chunk(0): line(1)})
    log = reader(c, tl)
    tl.wait_for(lambda ev: steps(tl) == [1] or None, 10, "the first event")
    c.files[chunk(0)] = line(1) + line(2)
    assert c.waiting.wait(10), "the follower never looked again"
    assert log.drain(timeout_s=5) == "its follower was still reading 0 s after it was told to stop"
    c.release.set()
    log._thread.join(timeout=10)
    assert steps(tl) == [1, 2]  # the follower's own look, each event once
