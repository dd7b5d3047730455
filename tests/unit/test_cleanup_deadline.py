"""A session whose cluster is gone gets out within one deadline (chaos.cleanup): the reverts
are still tried, the steps that need the cluster are skipped once one look finds its
dashboard silent, and a step still blocked at the deadline is left behind, said so.  The
cluster here is a real black hole (a socket that accepts and never answers) and calls that
block for ever: a cleanup that waited on any of them would never end."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

import pytest

import chaos.experiment as experiment
from chaos import cleanup
from chaos.cleanup import Cleanup
from chaos.cluster import ClusterView
from chaos.errors import WaitTimeout
from chaos.experiment import Environment, Experiment
from chaos.faults.base import Injection
from chaos.ledger import Ledger
from chaos.report import Reporter
from chaos.safety import LiveFaults
from chaos.verdicts import Expect

FOREVER = threading.Event()  # never set: what a call to a gone cluster waits on


def block(*args, **kwargs):
    FOREVER.wait()


@pytest.fixture
def black_hole():
    """A dashboard address that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


GONE = threading.Event()  # set when the cluster goes, as the session is stopped


def block_once_gone(answer):
    def call(*args, **kwargs):
        if GONE.is_set():
            block()
        return answer
    return call


class GoneView(ClusterView):
    """The view of a cluster that goes away under the session: from then on every call blocks
    (its dashboard, a black hole, answers nothing either)."""

    def __init__(self, url):
        super().__init__(url, "127.0.0.1:1")

    table = nodes = block_once_gone([])
    stop_watching = held_by_job = block

    def watch(self, timeline, on_joined):
        pass


class GoneBackend:
    label, external_drains = "fake", False

    def __init__(self, url):
        self.cluster = GoneView(url)
        self.head_away, self.live_faults = threading.Event(), LiveFaults(3)
        self.looks, self.waited = 0, []

    def healthy_workers(self):
        self.looks += 1
        if self.looks > 1:
            block()
        return True, "3 of 3 worker nodes alive"

    def wait_healed(self, timeout):
        self.waited.append(timeout)
        block()


class Run:
    leave: BaseException = KeyboardInterrupt("signal 15")

    def __init__(self, *args, **kwargs):
        self.submissions = []

    def submit(self):
        pass

    def wait_training_started(self, timeout):
        GONE.set()
        raise Run.leave

    stop = block

    def ray_job_ids(self):
        block()

    def failure_policy_lines(self):
        return []


class ArmedFault:
    kind, loses_the_head = "cuda", False

    def __init__(self):
        self.reverted = []

    def describe(self):
        return "CUDA ecc in rank 1"

    def revert(self, ctx, inj):
        self.reverted.append(inj.ledger_id)
        return True


def experiment_with_an_armed_fault(tmp_path, url):
    backend, lines = GoneBackend(url), []
    ledger = Ledger(tmp_path / "ledger.jsonl")
    env = Environment(backend=backend, ledger=ledger, out_dir=tmp_path)
    exp = Experiment(env, spec=SimpleNamespace(params={}), faults=[], expect=Expect(), test_id="t::gone",
                     reporter=Reporter(echo=lines.append))
    fault = ArmedFault()
    inj = Injection(fault, target=SimpleNamespace(node_ip="10.0.0.2"), host=None)
    inj.ledger_id = ledger.record("cuda", {"node_ip": "10.0.0.2"}, {"action": "disarm-cuda-shim"})
    inj.slot = backend.live_faults.acquire(fault.describe())
    exp._armed.append(inj)
    exp._injections.append(inj)
    return exp, backend, fault, lines, ledger


def run_to_the_end(exp, within_s):
    """``exp.run()`` in a thread: what it raised, or a failure if it is still running after
    ``within_s`` (every call it could wait on blocks for ever: only the deadline ends it)."""
    done: list[BaseException | None] = []

    def go():
        try:
            exp.run()
            done.append(None)
        except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt is what we expect back
            done.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(within_s)
    assert done, f"the experiment was still cleaning up {within_s} s after it was stopped"
    return done[0]


@pytest.fixture
def short(monkeypatch):
    GONE.clear()
    monkeypatch.setattr(experiment, "Run", Run)
    monkeypatch.setattr(cleanup, "BOUND_S", 3.0)
    monkeypatch.setattr(cleanup, "PROBE_S", 1.0)
    monkeypatch.setattr(cleanup, "PATIENT_PROBE_S", 1.0)


def test_an_interrupted_session_on_a_gone_cluster_reverts_skips_the_rest_and_ends_at_its_deadline(
        tmp_path, black_hole, short):
    exp, backend, fault, lines, ledger = experiment_with_an_armed_fault(tmp_path, black_hole)
    Run.leave = KeyboardInterrupt("signal 15")
    raised = run_to_the_end(exp, within_s=60)
    assert isinstance(raised, KeyboardInterrupt)
    text = "\n".join(lines)
    assert fault.reverted and not ledger.open_entries(), "the revert is still tried, and done"
    assert f"cleanup: the cluster is unreachable ({black_hole}/api/version did not answer" in text, text
    assert "cleanup: skipped: stop the run (the cluster is unreachable)" in text
    assert "cleanup: gave up waiting for: stop the node watcher (the cleanup's 3 s deadline)" in text
    healed = next(line for line in lines if "healed" in line)
    assert "FAIL" in healed and "the cluster is unreachable" in healed, healed
    assert "could not tell what the job still holds: the cluster is unreachable" in healed, healed
    assert backend.waited == [], "no wait for a gone cluster to heal"


def test_any_other_way_out_from_a_gone_cluster_skips_the_heal_wait_instead_of_waiting_it_out(
        tmp_path, black_hole, short):
    """Not interrupted (a step timed out): no shared deadline, but a silent dashboard still
    spares the 3 min heal wait and the minute on the job's resources; the twin of the
    interrupted case above, whose reachable twin is tests/unit/test_interrupted_cleanup.py."""
    exp, backend, fault, lines, ledger = experiment_with_an_armed_fault(tmp_path, black_hole)
    GoneView.stop_watching = lambda self: None  # no deadline here: only the cluster's own calls are skipped
    try:
        Run.leave = WaitTimeout("no first report within 300 s")
        raised = run_to_the_end(exp, within_s=60)
    finally:
        GoneView.stop_watching = block
    assert isinstance(raised, WaitTimeout)
    assert backend.waited == [] and fault.reverted
    assert "cleanup: skipped: look at the cluster's nodes (the cluster is unreachable)" not in "\n".join(lines)
    healed = next(line for line in lines if "healed" in line)
    assert "FAIL" in healed and "the cluster is unreachable" in healed and "one look" not in healed, healed


def test_a_step_under_the_deadline_returns_its_value_and_a_failing_step_is_said():
    said = []
    way_out = Cleanup(said.append, bound_s=5.0)
    assert way_out.step("answer", lambda: 42) == 42
    assert way_out.step("fail", lambda: 1 / 0, default="d") == "d"
    assert said == ["cleanup: could not fail: division by zero"]
    way_out.unreachable = "refused"
    assert way_out.step("need the cluster", lambda: 1, needs_cluster=True, default=0) == 0
    assert way_out.step("need only a host", lambda: 1) == 1
    assert said[-1] == "cleanup: skipped: need the cluster (the cluster is unreachable)"


def test_a_dashboard_that_answers_is_reachable_and_a_closed_port_is_not():
    import http.server

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert ClusterView(f"http://127.0.0.1:{server.server_port}", "x:1").unreachable(2.0) is None
    finally:
        server.shutdown()
        server.server_close()
    why = ClusterView(f"http://127.0.0.1:{server.server_port}", "x:1").unreachable(2.0)
    assert why and "Connection refused" in why, why
