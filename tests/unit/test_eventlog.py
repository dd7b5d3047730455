"""The recorder's event channel without a driver (chaos.train.eventlog): found on whichever
node holds it, followed, reopened without duplicates, lost loudly; and ClusterView's log
listing and stream against an HTTP server that answers as the dashboard does."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from chaos.cluster import ClusterView, Node
from chaos.errors import ClusterError
from chaos.timeline import Timeline
from chaos.train.eventlog import EventLog
from chaos.train.recorder import events_log_path

FILE = "chaos/run-1.jsonl"


def line(i: int, t: float = 1000.0) -> bytes:
    return (json.dumps({"t": t + i, "source": "recorder", "kind": "report", "data": {"step": i}}) + "\n").encode()


class FakeCluster:
    """Node n2 holds the file; each stream is the next list in ``streams`` (then nothing)."""

    def __init__(self, streams, holder="n2", alive=True):
        self.streams, self.holder, self.alive = list(streams), holder, alive
        self.opened = threading.Semaphore(0)

    def nodes(self):
        return [Node(node_id=n, ip=f"127.0.1.{i}", alive=self.alive, is_head=n == "n1", start_time=None,
                     end_time=None, death_reason=None, resources={})
                for i, n in enumerate(("n1", "n2"), 2)]

    def log_files(self, node_id, glob):
        assert glob == FILE
        return [FILE] if node_id == self.holder and self.streams else []

    def follow_log(self, node_id, filename, interval_s=0.1, idle_timeout_s=5.0):
        assert (node_id, filename) == (self.holder, FILE)
        self.opened.release()
        return iter(self.streams.pop(0) if self.streams else [])


def steps(timeline):
    return [e.data["step"] for e in timeline.of("report")]


def follow(cluster, timeline, until, **kw):
    log = EventLog(cluster, "run-1", timeline, look_every_s=0.01, **kw).start()
    timeline.wait_for(lambda ev: until(ev) or None, 10, "the events")
    log.drain(timeout_s=5)
    return log


def test_events_reach_the_timeline_in_order_on_the_harness_clock():
    tl = Timeline()
    tl.set_clock_offset(2.0, 0.001)  # the node's clock is 2 s ahead
    log = follow(FakeCluster([[line(1), line(2), line(3)]]), tl, lambda ev: len(steps(tl)) == 3)
    assert steps(tl) == [1, 2, 3] and log.node_id == "n2"
    assert [e.t for e in tl.of("report")] == [999.0, 1000.0, 1001.0]


def test_a_reopened_stream_skips_what_was_taken_and_a_partial_line_waits_for_its_end():
    tl = Timeline()
    first = [line(1), line(2), line(3)[:-9]]  # the stream ended inside line 3
    follow(FakeCluster([first, [line(1), line(2), line(3), line(4)]]), tl, lambda ev: len(steps(tl)) == 4)
    assert steps(tl) == [1, 2, 3, 4]


def test_a_file_out_of_reach_after_events_came_aborts_the_timeline_loudly():
    tl = Timeline()
    cluster = FakeCluster([[line(1)]])
    log = EventLog(cluster, "run-1", tl, lost_after_s=0.2, look_every_s=0.01).start()
    with pytest.raises(ClusterError, match=r"event log chaos/run-1.jsonl could not be read: it has been out of reach "
                                           r"for 0 s: chaos/run-1.jsonl is on no alive node"):
        tl.wait_for(lambda ev: None, 10, "anything")
    log.drain(timeout_s=5)
    assert steps(tl) == [1] and isinstance(log.error, ClusterError)


def test_twin_a_file_not_there_yet_is_waited_for_not_an_error():
    tl = Timeline()
    cluster = FakeCluster([[line(1)]], holder="n2")
    cluster.holder = "nobody"
    log = EventLog(cluster, "run-1", tl, lost_after_s=0.05, look_every_s=0.01).start()
    assert not cluster.opened.acquire(timeout=0.3)  # looked for, never opened, never aborted
    cluster.holder = "n2"
    tl.wait_for(lambda ev: steps(tl) or None, 10, "the first event")
    log.drain(timeout_s=5)
    assert log.error is None and steps(tl) == [1]


def test_the_recorder_refuses_an_events_log_name_that_is_a_path():
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="a plain file name is needed"):
            events_log_path(bad)


# -- ClusterView against an HTTP server answering as Ray 2.60's dashboard ---------------
class Dashboard(http.server.BaseHTTPRequestHandler):
    lines: list[bytes] = []

    def do_GET(self):
        if self.path.startswith("/api/v0/logs/stream?"):
            assert "node_id=n2" in self.path and "filename=chaos%2Frun-1.jsonl" in self.path and "lines=-1" in self.path
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in self.lines:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path.startswith("/api/v0/logs?"):
            body = json.dumps({"result": True, "msg": "", "data": {"result": {"internal": [FILE]}}}).encode()
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


def test_cluster_view_lists_and_streams_a_nodes_log_file(dashboard):
    Dashboard.lines = [line(1) + line(2)[:10], line(2)[10:] + line(3)]  # chunks cut mid-line
    assert dashboard.log_files("n2", FILE) == [FILE]
    assert list(dashboard.follow_log("n2", FILE)) == [line(1), line(2), line(3)]


def test_cluster_view_names_the_url_when_the_dashboard_refuses(dashboard):
    with pytest.raises(ClusterError, match=r"could not read http://127\.0\.0\.1:\d+/nothing"):
        dashboard._get("/nothing", {}, timeout=5)


def test_an_unreadable_event_line_aborts_the_timeline_never_skipped():
    """A line that is not an event could be a failure decision: missing it could pass a run."""
    tl = Timeline()
    log = EventLog(FakeCluster([[line(1), b"{not json\n", line(3)]]), "run-1", tl, look_every_s=0.01).start()
    with pytest.raises(ClusterError, match=r"event log chaos/run-1.jsonl could not be read: line 2 of the "
                                           r"recorder's event log chaos/run-1.jsonl is no event \(JSONDecodeError"):
        tl.wait_for(lambda ev: None, 10, "anything")
    log.drain(timeout_s=5)
    assert steps(tl) == [1]


def test_a_clock_that_cannot_be_measured_aborts_before_any_event_is_taken():
    def clock(node_id):
        raise ClusterError(f"no transport to {node_id}")

    tl = Timeline()
    log = EventLog(FakeCluster([[line(1)]]), "run-1", tl, look_every_s=0.01, on_found=clock).start()
    with pytest.raises(ClusterError, match=r"could not be read: it is on node n2, but: no transport to n2"):
        tl.wait_for(lambda ev: None, 10, "anything")
    log.drain(timeout_s=5)
    assert steps(tl) == []
