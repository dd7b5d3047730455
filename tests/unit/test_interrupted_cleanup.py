"""An interrupted session (Ctrl-C, a cancelled CI job's SIGTERM) still reverts, stops its run and
says whether the cluster is healed, but looks once instead of waiting: a session whose cluster
had vanished under it waited 222 s on its way out.  Every other way out keeps the waits."""

import threading
from types import SimpleNamespace

import pytest

import chaos.experiment as experiment
from chaos.errors import WaitTimeout
from chaos.experiment import Environment, Experiment
from chaos.ledger import Ledger
from chaos.report import Reporter
from chaos.safety import LiveFaults
from chaos.verdicts import Expect
from quiet_view import QuietView


class FakeBackend:
    """Healthy when the experiment starts; then a node is down, and healing would take as long
    as it is given."""

    label = "fake"
    external_drains = False

    def __init__(self):
        self.cluster = QuietView(["actor TrainController (1 CPU)"])
        self.head_away = threading.Event()
        self.live_faults = LiveFaults(3)
        self.waited: list[float] = []
        self.looks = 0

    def healthy_workers(self):
        self.looks += 1
        return (True, "3 of 3 worker nodes alive") if self.looks == 1 else (False, "2 of 3 worker nodes alive")

    def wait_healed(self, timeout):
        self.waited.append(timeout)
        raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for every worker host; saw: 2 of 3")


class FakeRun:
    """Submitted, then left by ``leave`` while waiting for training to start."""

    stops: list[bool] = []
    leave: BaseException = KeyboardInterrupt("signal 15")

    def __init__(self, *args, **kwargs):
        self.submissions = []

    def submit(self):
        pass

    def wait_training_started(self, timeout):
        raise FakeRun.leave

    def stop(self, wait=True):
        FakeRun.stops.append(wait)

    def ray_job_ids(self):
        return ["02000000"]

    def failure_policy_lines(self):
        return []


@pytest.fixture
def session(tmp_path, monkeypatch):
    polls = []

    def poll_once(check, timeout, what, interval=0.25):  # the wait, without its time
        polls.append(what)
        value, seen = check()
        if value:
            return value
        raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; saw: {seen}")

    monkeypatch.setattr(experiment, "Run", FakeRun)
    monkeypatch.setattr(experiment, "poll_until", poll_once)
    FakeRun.stops = []
    backend, lines = FakeBackend(), []
    env = Environment(backend=backend, ledger=Ledger(tmp_path / "ledger.jsonl"), out_dir=tmp_path)
    exp = Experiment(env, spec=SimpleNamespace(params={}), faults=[], expect=Expect(), test_id="t::interrupted",
                     reporter=Reporter(echo=lines.append))
    return exp, backend, lines, polls


def healed_line(lines):
    return next(line for line in lines if "healed" in line)


def test_an_interrupted_session_looks_once_and_still_says_what_is_not_healed(session):
    exp, backend, lines, polls = session
    FakeRun.leave = KeyboardInterrupt("signal 15")
    with pytest.raises(KeyboardInterrupt):
        exp.run()
    assert backend.waited == [] and polls == [], "no wait for the cluster to heal after an interrupt"
    assert FakeRun.stops == [False], "the run is still stopped, without waiting out its log stream"
    line = healed_line(lines)
    assert "FAIL" in line and "2 of 3 worker nodes alive (one look: the session was interrupted)" in line, line
    assert "leaked resources: still held: actor TrainController (1 CPU) (one look" in line, line


def test_any_other_way_out_waits_for_the_cluster_to_heal(session):
    exp, backend, lines, polls = session
    FakeRun.leave = WaitTimeout("no first report within 60 s")
    with pytest.raises(WaitTimeout):
        exp.run()
    assert backend.waited == [exp.env.timeouts.heal_s]
    assert polls == ["job 02000000's actors and placement groups to give back their resources"]
    assert FakeRun.stops == [True]
    line = healed_line(lines)
    assert "FAIL" in line and "one look" not in line and "timed out after 60s waiting for job 02000000's actors" in line, line


class GoneClient:
    """The Jobs API of a cluster that is gone."""

    def get_job_status(self, job_id):
        raise ConnectionError("Failed to connect to API server")


class Drain:
    def __init__(self):
        self.timeouts = []

    def drain(self, timeout_s=10.0):
        self.timeouts.append(timeout_s)
        return f"timed out after {timeout_s:.0f}s waiting for the rest of the recorder's event log"


@pytest.mark.parametrize("wait, joined, drained", [(False, 3, 1.0), (True, 30, 10.0)])
def test_stopping_a_run_on_a_gone_cluster_waits_for_its_logs_only_when_asked(tmp_path, wait, joined, drained):
    from chaos.train.run import Run

    run = Run(SimpleNamespace(name="t"), SimpleNamespace(dashboard_url="http://198.18.9.1:1"), None, tmp_path)
    run._client = GoneClient()
    sub = run.current
    joins = []
    sub.events, sub.tail = Drain(), SimpleNamespace(join=lambda timeout: joins.append(timeout))  # never ends
    run.stop(wait=wait)
    assert joins == [joined] and sub.events.timeouts == [drained]

