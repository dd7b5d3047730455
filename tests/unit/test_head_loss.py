"""Head faults without a cluster (chaos.faults.head): a resubmission judged as the lost run's
next attempt, the outcome from recorded facts, the head-loss verdicts, the guard and the
event log while the head is away — and the real Redis the GCS fault tolerance runs on."""

import shutil
import socket
import threading
import types

import pytest

from chaos.embedded.redis import RedisServer, ping, redis_binary
from chaos.errors import ClusterError
from chaos.faults.base import FaultContext, Injection
from chaos.faults.head import FATES, OUTCOMES, GcsKill, HeadReboot, RedisRestart
from chaos.plot import plot_data
from chaos.timeline import Timeline, recovery_metrics
from chaos.train.run import Run, RunSpec, continuation, continued_at
from chaos.verdicts import Diagnosis, Expect, judge
from chaos.verdicts.head import head_loss_outcome, workers_after_head_loss
from chaos.verdicts.recovery import recovery_time
from chaos.verdicts.resume import resumed_from_latest
from timelines import Script

DET = Expect(deterministic=True)  # the old verdict functions' default


# -- a resubmission is the lost run's next attempt -------------------------------------
UNREAD = "chaos/job-1 is on no alive node"


def resubmitted(first_step, fault_t_dt=0.2, report=True, unread=None, again_fault_after=None):
    """Attempt 0 of run1 to step 12 (checkpoints 5, 10), a head fault, and a resubmission (a
    new Train run, run2, attempts from 0) joined through ``continuation`` as the harness does.
    ``unread``: the lost job's events log could not be drained (Run.resubmit's event);
    ``again_fault_after``: the resubmission is hit at that step and restarts right after its
    latest checkpoint."""
    s = Script().start_attempt().steps(1, 12)
    lost = s.timeline()
    t = s.t + fault_t_dt
    lost.emit("fault", "fault_injected", t=t, fault="gcs-kill", ledger_id="h1", target={"node_id": "head"})
    lost.emit("cluster", "head_unreachable", t=t + 0.3)
    lost.emit("fault", "fault_detected", t=t + 0.3, ledger_id="h1", by="head_unreachable")
    lost.emit("cluster", "head_reachable", t=t + 11.0)
    lost.emit("harness", "job_abandoned", t=t + 12.0, job_id="job-1", why="gcs-kill")
    if unread:
        run_id, next_attempt = continued_at(lost)
        lost.emit("harness", "events_unread", t=t + 12.5, job_id="job-1", run_id=run_id, next_attempt=next_attempt,
                  why=unread)
    join = continuation(lost)
    again = Script().new_run("run2")
    again.t = t + 20.0
    again.events.clear()
    again.new_run("run2").start_attempt()
    if report and again_fault_after:
        again.steps(first_step, again_fault_after).fault().decision()
        again.start_attempt().steps(again_fault_after - again_fault_after % 5 + 1, 30).finish()
    elif report:
        again.steps(first_step, 20).finish()
    for e in again.events:
        lost.add(join(e))
    return lost


def test_a_resubmission_that_resumes_from_the_lost_runs_latest_checkpoint_passes():
    tl = resubmitted(11)
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass" and v.name == "resumed-from-latest (attempt 1)", v.line()
    assert v.evidence["latest_checkpoint_step"] == 10 and v.evidence["first_step_of_attempt"] == 11
    second = [e for e in tl.of("controller_started")][1]
    assert second.data["run_id"] == "run1" and second.data["train_run_id"] == "run2"
    assert {e.attempt for e in tl.of("attempt_started")} == {0, 1}


def test_twin_a_resubmission_that_starts_from_scratch_fails():
    [v] = resumed_from_latest(resubmitted(1), DET)
    assert v.status == "fail" and v.diagnosis == "restarted from scratch", v.line()


def test_a_right_looking_resume_after_a_lost_log_left_unread_is_unverifiable_never_a_pass():
    """The lost job's events log could not be read to its end: it may have committed a
    checkpoint after step 10 (CI saw checkpoint 15 so), and a resubmission that restored
    checkpoint 10 instead would look right.  Twin: the same resume with the log drained passes
    (test_a_resubmission_that_resumes_from_the_lost_runs_latest_checkpoint_passes)."""
    [v] = resumed_from_latest(resubmitted(11, unread=UNREAD), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: events unread", v.line()
    assert isinstance(v.diagnosis, Diagnosis)
    assert ("the events log of job job-1, whose driver was lost, could not be read to its end "
            f"({UNREAD}), so a checkpoint it committed after step 10 would be missing") in v.message, v.line()
    assert "attempt 1's start at step 11 cannot be judged" in v.message, v.line()
    assert v.evidence["judged_on_what_was_read"]["status"] == "pass" and v.evidence["events_unread"]["next_attempt"] == 1


def test_a_resume_past_the_seen_checkpoint_after_a_lost_log_left_unread_is_unverifiable_not_a_failure():
    """Checkpoint 15 in the unread end would make a resume at 16 right (CI's false failure)."""
    [v] = resumed_from_latest(resubmitted(16, unread=UNREAD), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: events unread", v.line()
    judged = v.evidence["judged_on_what_was_read"]
    assert judged["status"] == "fail" and judged["message"].startswith("resumed past the checkpoint"), judged
    assert "resumed past" not in v.message, v.line()  # the report files it as unverifiable, not as skipped data
    [twin] = resumed_from_latest(resubmitted(16), DET)
    assert twin.status == "fail" and twin.diagnosis == "resumed past the checkpoint", twin.line()


def test_a_restart_from_scratch_fails_whatever_the_unread_end_of_the_log_held():
    """A later checkpoint nobody read only makes a fresh start worse: still a failure."""
    [v] = resumed_from_latest(resubmitted(1, unread=UNREAD), DET)
    assert v.status == "fail" and v.diagnosis == "restarted from scratch", v.line()


def test_after_a_checkpoint_of_the_resubmission_the_unread_end_no_longer_matters():
    """A restart of the resubmission after it committed checkpoints of its own is judged
    against those: the unread end of the lost log is older than all of them."""
    tl = resubmitted(11, unread=UNREAD, again_fault_after=22)
    first, second = resumed_from_latest(tl, DET)
    assert first.status == "unverifiable" and first.diagnosis == "unverifiable: events unread", first.line()
    assert second.status == "pass" and second.evidence["latest_checkpoint_step"] == 20, second.line()
    assert second.name == "resumed-from-latest (attempt 2)"


class NoCluster:
    """A cluster whose nodes hold no events log (the resubmission's is never found)."""

    dashboard_url = "http://127.0.0.1:1"

    def nodes(self):
        return []


class Jobs:
    """The Jobs API as a resubmission uses it: submit, stop, a log stream with nothing in it."""

    def __init__(self):
        self.submitted, self.stopped = [], []

    def submit_job(self, entrypoint, submission_id, runtime_env):
        self.submitted.append(submission_id)

    def stop_job(self, job_id):
        self.stopped.append(job_id)

    async def tail_job_logs(self, job_id):
        return
        yield

    def get_job_info(self, job_id):
        return types.SimpleNamespace(status=types.SimpleNamespace(value="SUCCEEDED"), message="")


class LostLog:
    def __init__(self, unread):
        self.unread = unread

    def drain(self, timeout_s=10.0):
        return self.unread


@pytest.mark.parametrize("unread", [UNREAD, None], ids=["unread", "all-read"])
def test_a_resubmission_puts_the_lost_logs_unread_end_on_the_timeline(tmp_path, unread):
    """Run.resubmit drains the lost job's events log; what the drain could not read becomes
    ``events_unread`` with the attempt the resubmission continues at (twin: nothing unread,
    no such event)."""
    lost = Script().start_attempt().steps(1, 12).timeline()
    run = Run(RunSpec(entrypoint="python train.py", name="t"), NoCluster(), lost, tmp_path)
    run._client = Jobs()
    run.submissions[0].events = LostLog(unread)
    lost_job = run.job_id
    new_job = run.resubmit("gcs-kill: its driver was lost")
    run.current.events.drain(timeout_s=5)
    run.current.tail.join(timeout=10)
    assert run._client.stopped == [lost_job] and run._client.submitted == [new_job]
    gaps = [e.data for e in lost.of("events_unread")]
    if unread is None:
        assert gaps == []
    else:
        assert gaps == [{"job_id": lost_job, "run_id": "run1", "next_attempt": 1, "why": UNREAD}]


def test_the_resubmissions_first_report_is_the_recovery_and_one_run_is_judged():
    tl = resubmitted(11)
    [m] = recovery_metrics(tl)
    assert m.recovered_attempt == 1 and round(m.time_to_detect, 3) == 0.3 and m.time_to_recover > 20
    expect = Expect(charged={}, slo_detect_s=30, slo_recover_s=120)
    named = {v.name.split(" (")[0]: v for v in judge(tl, expect)}
    assert named["run-finished"].status == "pass" and named["within-budget"].status == "pass", named
    assert named["recovery-time"].status == "pass", named["recovery-time"].line()


def test_nothing_charged_is_unverifiable_where_the_lost_log_was_left_unread():
    """A failure decision the lost controller made in the unread end would be missing: 'charged
    nothing' is not evidence then (twin: the same run with its log read passes, above)."""
    expect = Expect(charged={}, slo_detect_s=30, slo_recover_s=120)
    named = {v.name.split(" (")[0]: v for v in judge(resubmitted(11, unread=UNREAD), expect)}
    v = named["within-budget"]
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: events unread", v.line()
    assert "a failure decision its controller made then would be missing (what was read: charged nothing" in v.message
    assert named["run-finished"].status == "pass"  # judged on the resubmission's own end, which was read


def test_twin_a_resubmission_that_never_reported_never_recovered():
    tl = resubmitted(11, report=False)
    [m] = recovery_metrics(tl)
    assert m.time_to_recover is None
    [v] = recovery_time(tl, Expect(charged={}, slo_detect_s=30, slo_recover_s=120))
    assert v.status == "fail", v.line()


# -- what became of the run, from recorded facts -----------------------------------------
class FakeJobs:
    """The Jobs API as the fault reads it: a status, or the 404 of a head that forgot the job."""

    def __init__(self, status):
        self.status = status

    def get_job_status(self, job_id):
        if self.status is None:
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")
        return types.SimpleNamespace(value=self.status)

    def get_job_info(self, job_id):
        return types.SimpleNamespace(driver_info=types.SimpleNamespace(pid=4242))


class FakeHead:
    """The ``head`` capability (chaos.backends.base.HeadControl) with a driver that is ``alive``."""

    def __init__(self, gcs_ft, alive=False, boots=("a" * 36, "b" * 36)):
        self.gcs_ft, self.alive, self.boots, self.did = gcs_ft, alive, list(boots), []

    def kill_gcs(self):
        self.did.append("gcs")
        return "gcs_server (pid 7) SIGKILLed"

    def power_cycle(self):
        self.did.append("power")
        return "12 processes of the head SIGKILLed at once"

    def restart_redis(self):
        self.did.append("redis")
        return "redis-server (pid 9) SIGKILLed and started again"

    def boot_id(self):
        return self.boots.pop(0) if len(self.boots) > 1 else self.boots[0]

    def driver_alive(self, pid):
        return self.alive

    def went_down_after(self, t):
        return t + 0.2


class FakeCluster:
    dashboard_url = "http://127.0.0.1:1"

    def __init__(self, workers_after=None):
        self.calls = 0
        self.after = workers_after

    def alive_workers(self):
        self.calls += 1
        ids = self.after if (self.after is not None and self.calls > 1) else ["w1", "w2"]
        return [types.SimpleNamespace(node_id=n, ip=f"198.18.0.{i}") for i, n in enumerate(ids, 2)]

    def nodes(self):
        return [types.SimpleNamespace(node_id="old-head", ip="198.18.0.1", is_head=True, alive=False),
                types.SimpleNamespace(node_id="head", ip="198.18.0.1", is_head=True, alive=True)]


def head_fault(fault, monkeypatch, *, status="RUNNING", gcs_ft=True, alive=False, back=True, reports_after=(),
               workers_after=None):
    """Inject ``fault`` into a fake head and run its detection and after_detect on a timeline
    fed as the watcher would: the head unreachable, then (``back``) reachable again."""
    import chaos.faults.head as head_mod

    monkeypatch.setattr(head_mod, "_jobs", lambda ctx: FakeJobs(status))
    tl = Timeline()
    tl.emit("harness", "job_submitted", job_id="job-1")
    head = FakeHead(gcs_ft, alive)
    backend = types.SimpleNamespace(head=head, head_node_id="head", label="embedded-namespaces")
    ctx = FaultContext(cluster=FakeCluster(workers_after), timeline=tl, backend=backend)
    inj = Injection(fault, fault.resolve(ctx), host=None, ledger_id="h1")
    assert inj.target.node_id == "head"  # the live head, not one from before an earlier head fault
    inj.t = tl.emit("fault", "fault_injected", fault=fault.kind, ledger_id="h1").t
    fault.inject(ctx, inj)
    tl.emit("cluster", "head_unreachable", error="connection refused")
    assert fault.detected(tl.events, inj.target, inj.t).kind == "head_unreachable"
    if back:
        tl.emit("cluster", "head_reachable")
    for step in reports_after:
        tl.emit("recorder", "report", step=step)
    fault.after_detect(ctx, inj)
    [loss] = tl.of("head_loss")
    return inj, loss.data, head


FAST = dict(back_timeout_s=0.5, settle_s=0.1, replaced_timeout_s=0.5)


def test_a_dead_driver_with_fault_tolerance_is_a_lost_driver_whatever_the_jobs_api_says(monkeypatch):
    inj, loss, head = head_fault(GcsKill(**FAST), monkeypatch)
    assert head.did == ["gcs"] and loss["outcome"] == "driver-lost" and loss["job_status_after"] == "RUNNING"
    assert "the Jobs API says RUNNING" in loss["diagnosis"] and loss["driver_pid"] == 4242
    assert loss["workers_before"] == loss["workers_after"] and loss["head_boot_ids"] == ["a" * 36, "b" * 36]
    assert GcsKill().run_fate(inj) == "resubmit"


def test_reports_after_the_head_came_back_mean_the_run_continued(monkeypatch):
    inj, loss, _ = head_fault(HeadReboot(**FAST), monkeypatch, reports_after=[7])
    assert loss["outcome"] == "continued" and "step 7 reported" in loss["diagnosis"]
    assert HeadReboot().run_fate(inj) == "continues"


def test_a_head_that_forgot_the_job_is_a_lost_cluster_and_the_workers_come_back_new(monkeypatch):
    inj, loss, _ = head_fault(HeadReboot(**FAST), monkeypatch, status=None, gcs_ft=False, workers_after=["w3", "w4"])
    assert loss["outcome"] == "cluster-lost" and loss["diagnosis"].startswith("cluster lost: no GCS fault tolerance")
    assert set(loss["workers_after"]) == {"w3", "w4"} and HeadReboot().run_fate(inj) == "lost"
    _, loss, _ = head_fault(GcsKill(**FAST), monkeypatch, status=None, gcs_ft=True)
    assert loss["outcome"] == "cluster-lost" and "although fault tolerance is on" in loss["diagnosis"]


def test_a_head_that_never_came_back(monkeypatch):
    _, loss, _ = head_fault(GcsKill(**FAST), monkeypatch, gcs_ft=False, back=False)
    assert loss["outcome"] == "cluster-lost" and "did not answer again within 0 s" in loss["diagnosis"]
    inj, loss, _ = head_fault(GcsKill(**FAST), monkeypatch, gcs_ft=True, back=False)
    assert loss["outcome"] is None and "nothing could be established" in loss["diagnosis"]
    assert GcsKill().run_fate(inj) == "lost"


def test_a_live_driver_without_reports_is_never_guessed(monkeypatch):
    _, loss, _ = head_fault(GcsKill(**FAST), monkeypatch, alive=True)
    assert loss["outcome"] is None and "driver pid 4242 alive" in loss["diagnosis"]


def test_a_redis_restart_needs_fault_tolerance(monkeypatch):
    from chaos.errors import InjectionError

    with pytest.raises(InjectionError, match="without GCS fault tolerance: there is no Redis"):
        head_fault(RedisRestart(**FAST), monkeypatch, gcs_ft=False)
    _, loss, head = head_fault(RedisRestart(**FAST), monkeypatch)
    assert head.did == ["redis"] and loss["outcome"] == "driver-lost"


def test_every_outcome_has_a_fate():
    assert set(FATES) == {*OUTCOMES, None} and set(FATES.values()) == {"continues", "resubmit", "lost"}


# -- the head-loss verdicts ------------------------------------------------------------------
def loss(outcome, diagnosis="run lost with its driver: ...", gcs_ft=True, **more):
    return {"fault": "gcs-kill", "gcs_ft": gcs_ft, "outcome": outcome, "diagnosis": diagnosis,
            "head_unreachable_s": 0.1, "head_up_s": 11.0, "head_boot_ids": [], **more}


def test_the_outcome_verdict_fails_on_another_outcome_and_never_passes_an_unknown_one():
    assert head_loss_outcome(loss("driver-lost")).status == "pass"
    wrong = head_loss_outcome(loss("continued", "the run continued: step 7"))
    assert wrong.status == "fail" and wrong.message.startswith("head loss: unexpected outcome: expected driver-lost, got continued")
    assert head_loss_outcome(loss("continued", "the run continued"), "continued").status == "pass"
    unknown = head_loss_outcome(loss(None, "no outcome within 30 s"))
    assert unknown.status == "unverifiable" and unknown.diagnosis == "unverifiable: no outcome"
    lost = head_loss_outcome(loss("cluster-lost", "cluster lost: no GCS fault tolerance — ...", gcs_ft=False))
    assert lost.status == "expected" and lost.diagnosis == "cluster lost"
    twin = head_loss_outcome(loss("cluster-lost", "cluster lost: the GCS lost its tables ...", gcs_ft=True))
    assert twin.status == "fail" and twin.diagnosis == Diagnosis.HEAD_LOSS_OUTCOME and "got cluster-lost" in twin.message


def test_a_head_reboot_must_show_a_new_boot_id_when_the_head_is_a_test_host():
    v = head_loss_outcome(loss("driver-lost", fault="head-reboot", head_boot_ids=["a" * 36, "b" * 36]))
    assert v.status == "pass" and "boot id aaaaaaaa → bbbbbbbb" in v.message
    v = head_loss_outcome(loss("driver-lost", fault="head-reboot", head_boot_ids=["a" * 36, "a" * 36]))
    assert v.status == "fail" and v.message.startswith("head loss: no reboot: expected the head's host to reboot")


def test_worker_nodes_must_all_survive_with_fault_tolerance_and_all_be_new_without():
    before = {"a" * 56: "127.0.1.2", "b" * 56: "127.0.1.3"}
    assert workers_after_head_loss(loss("driver-lost", workers_before=before, workers_after=dict(before))).status \
        == "pass"
    assert workers_after_head_loss(loss("x", gcs_ft=False, workers_before=before, workers_after=dict(before))).status \
        == "fail"
    v = workers_after_head_loss(loss("x", workers_before=before, workers_after={"a" * 56: "1", "c" * 56: "2"}))
    assert v.status == "fail" and v.message.startswith("unexpected worker node fate: lost ['bbbbbbbb']")
    renewed = {"c" * 56: "127.0.1.2", "d" * 56: "127.0.1.3"}
    assert workers_after_head_loss(loss("x", gcs_ft=False, workers_before=before, workers_after=renewed)).status \
        == "pass"
    assert workers_after_head_loss(loss("x", gcs_ft=False, workers_before=before,
                                        workers_after={"c" * 56: "1"})).status == "fail"


def test_no_worker_node_seen_before_the_head_fault_is_unverifiable_never_all_new():
    # nothing seen is not "all kept", nor "all came back as new nodes" (that passed without
    # GCS fault tolerance: no node kept its id, and none was needed to come back)
    for gcs_ft in (True, False):
        v = workers_after_head_loss(loss("x", gcs_ft=gcs_ft, workers_before={}, workers_after={}))
        assert v.status == "unverifiable" and v.diagnosis is Diagnosis.NO_WORKER_EVIDENCE, v.line()
    # the twin: nodes seen before, all back under new ids
    v = workers_after_head_loss(loss("x", gcs_ft=False, workers_before={"a" * 56: "1"}, workers_after={"c" * 56: "1"}))
    assert v.status == "pass", v.line()


def test_a_head_loss_is_judged_in_every_verdict_list_and_drawn_in_the_picture():
    tl = resubmitted(11)
    tl.emit("fault", "head_loss", **loss("driver-lost", workers_before={"w": "1"}, workers_after={"w": "1"}))
    names = [v.name for v in judge(tl, Expect(charged={}, slo_recover_s=120))]
    assert names[:2] == ["head-loss (gcs-kill, GCS fault tolerance on)", "worker nodes after head loss (gcs-kill)"]
    unfinished = [v.name for v in judge(tl, Expect(charged={}), finished=False)]
    assert unfinished[:2] == names[:2]
    labels = [m.label for m in plot_data(tl).markers]
    assert "head unreachable" in labels and "head reachable" in labels, labels
    assert {Diagnosis.HEAD_LOSS_OUTCOME, Diagnosis.CLUSTER_LOST, Diagnosis.NO_OUTCOME} <= set(Diagnosis)


# -- while the head is away ---------------------------------------------------------------------
def test_the_health_guard_holds_while_a_head_fault_has_the_head_away():
    """Its count needs the head's node table: while ``head_away`` is set it does not count the
    cluster down (the head fault's deadlines bound that); once cleared it counts again."""
    from chaos.backends.base import Backend
    from chaos.profile import SafetySettings

    class Unreachable(Backend):
        name = "unreachable-test"
        label = "test"
        storage_path = "/tmp"
        _open = _close = node_info = host_key = connect = _reach = healthy_workers = wait_healed = None

    backend = Unreachable(safety=SafetySettings(min_alive_nodes=1, unhealthy_for_s=0))
    backend.cluster = types.SimpleNamespace(alive_workers=lambda: (_ for _ in ()).throw(ClusterError("refused")))
    aborted, stop = threading.Event(), threading.Event()
    backend.head_away.set()
    backend._guard(stop, lambda reason: aborted.set())
    assert not aborted.wait(2.5)
    backend.head_away.clear()
    assert aborted.wait(5), "the guard never looked again once the head was back"
    stop.set()


# -- the real Redis ------------------------------------------------------------------
needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(port, *words):
    payload = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(payload.encode())
        return s.recv(256).decode()


@needs_redis
def test_redis_keeps_the_gcs_tables_across_a_restart(tmp_path):
    redis = RedisServer(free_port(), tmp_path / "data", tmp_path / "redis.log").start()
    try:
        assert ping(redis.port) == "+PONG"
        assert command(redis.port, "SET", "table", "nodes") == "+OK\r\n"
        command(redis.port, "CONFIG", "SET", "appendfsync", "always")
        command(redis.port, "SET", "table", "nodes")  # written with fsync on
        pid = redis.kill()
        assert not redis.proc.alive() and "no answer" in ping(redis.port)
        redis.start()
        assert redis.proc.pid != pid and redis.starts == 2
        assert command(redis.port, "GET", "table") == "$5\r\nnodes\r\n"
    finally:
        redis.stop()
    assert not redis.proc.alive()


@needs_redis
def test_redis_that_cannot_start_is_reported_with_its_log(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        redis = RedisServer(taken.getsockname()[1], tmp_path / "data", tmp_path / "redis.log", start_timeout=10)
        with pytest.raises(ClusterError, match="redis-server on 127.0.0.1:.* exited with code"):
            redis.start()
    assert not redis.proc.alive()


def test_missing_redis_names_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ClusterError, match="needs redis-server, which is not on PATH"):
        redis_binary()


