"""Head loss without a cluster: the resubmission verdict, the outcome verdict, head fault
names, its reports — and the real Redis the GCS fault tolerance runs on."""

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import types

import psutil
import pytest

from chaos import summary
from chaos.embedded.redis import RedisServer, ping, redis_binary
from chaos.errors import ClusterError, VerificationError
from chaos.head_loss import OUTCOMES, HeadLoss, HeadLossExperiment, _namespace_pid, head_fault
from chaos.plot import plot_data
from chaos.report import Reporter
from chaos.timeline import Timeline
from chaos.verify import Verdict, head_loss_outcome, reports_resumed, resumed_after_resubmission, workers_after_head_loss
from timelines import Script


def resubmitted(first_step_after):
    """A run lost after checkpoint 10 (steps to 12), resubmitted as a new run starting at ``first_step_after``."""
    s = Script().start_attempt().steps(1, 12)
    s.new_run().start_attempt().steps(first_step_after, 20).finish()
    return s.timeline()


def test_a_resubmission_that_resumes_from_the_lost_runs_latest_checkpoint_passes():
    [v] = resumed_after_resubmission(resubmitted(11), "run1", "run2")
    assert v.status == "pass", v.line()
    assert v.evidence["latest_checkpoint_step"] == 10 and v.evidence["first_step_of_attempt"] == 11
    assert v.evidence["lost_run"] == "run1" and v.evidence["new_run"] == "run2"


def test_a_resubmission_that_starts_from_scratch_fails():
    [v] = resumed_after_resubmission(resubmitted(1), "run1", "run2")
    assert v.status == "fail" and v.diagnosis == "restarted from scratch", v.line()


def test_a_resubmission_that_was_never_recorded_is_unverifiable():
    [v] = resumed_after_resubmission(Script().start_attempt().steps(1, 12).timeline(), "run1", "run2")
    assert v.status == "unverifiable" and "run2" in v.message


def lost_then_resubmitted(started):
    """A run lost after checkpoint 10 (steps to 12), resubmitted as a new run that errored
    before its worker group started (``started`` False) or started one attempt resuming at 11."""
    s = Script().start_attempt().steps(1, 12).new_run()
    return (s.start_attempt().steps(11, 20).finish() if started else s.finish("ERRORED")).timeline()


def test_a_restart_inside_the_lost_run_is_not_the_resubmission_resume():
    # the lost run restarted once on its own (resumed right), then lost its driver; the
    # resubmission started an attempt and never reported: nothing says how it resumed
    s = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 14)
         .new_run().start_attempt())
    [v] = resumed_after_resubmission(s.finish("ERRORED").timeline(), "run1", "run2")
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no attempt after resubmission", v.line()
    assert v.message == "unverifiable: the resubmitted run started an attempt but never reported"


def test_a_resubmission_that_never_started_an_attempt_is_unverifiable():
    [v] = resumed_after_resubmission(lost_then_resubmitted(started=False), "run1", "run2")
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no attempt after resubmission", v.line()
    assert v.message == "unverifiable: the resubmitted run never started an attempt"
    assert v.evidence == {"new_run": "run2"}


def test_a_resubmission_with_one_attempt_is_judged_as_the_lost_runs_next_attempt():
    [v] = resumed_after_resubmission(lost_then_resubmitted(started=True), "run1", "run2")
    assert v.status == "pass" and v.name == "resumed-from-latest (resubmission, attempt 1)", v.line()
    assert v.evidence["attempt_offset"] == 1 and v.evidence["latest_checkpoint_step"] == 10


def loss(outcome, diagnosis="run lost with its driver: ...", gcs_ft=True):
    return HeadLoss(fault="gcs-kill", gcs_ft=gcs_ft, outcome=outcome, diagnosis=diagnosis, t_fault=0.0,
                    head_down_s=0.1, head_up_s=11.0, job_id="j", job_status_after="RUNNING", driver_pid=1,
                    driver_alive_after=False, workers_before={}, workers_after={}, head_boot_ids=[], head_history=[])


def test_the_outcome_verdict_fails_on_another_outcome_and_never_passes_an_unknown_one():
    assert head_loss_outcome(loss("driver-lost"), "driver-lost").status == "pass"
    wrong = head_loss_outcome(loss("continued", "the run continued: step 7"), "driver-lost")
    assert wrong.status == "fail" and wrong.message.startswith("head loss: expected driver-lost, got continued")
    unknown = head_loss_outcome(loss(None, "no outcome within 30 s"), "driver-lost")
    assert unknown.status == "unverifiable"
    lost = head_loss_outcome(loss("cluster-lost", "cluster lost: no GCS fault tolerance — ...", gcs_ft=False),
                             "cluster-lost")
    assert lost.status == "expected" and lost.diagnosis == "cluster lost"
    assert set(OUTCOMES) == {"continued", "driver-lost", "cluster-lost"}


def test_a_head_reboot_must_show_a_new_boot_id_when_the_head_is_a_test_host():
    rebooted = dataclasses.replace(loss("driver-lost"), fault="head-reboot", head_boot_ids=["a" * 36, "b" * 36])
    v = head_loss_outcome(rebooted, "driver-lost")
    assert v.status == "pass" and "boot id aaaaaaaa → bbbbbbbb" in v.message
    same = dataclasses.replace(rebooted, head_boot_ids=["a" * 36, "a" * 36])
    v = head_loss_outcome(same, "driver-lost")
    assert v.status == "fail" and v.message.startswith("head loss: expected the head's host to reboot")


def test_unknown_head_fault_names_the_known_ones():
    with pytest.raises(ValueError, match="known: gcs-kill, head-reboot, redis-restart"):
        head_fault("head-explode")


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


def test_worker_nodes_must_all_survive_with_fault_tolerance_and_all_be_new_without():
    before = {"a" * 56: "127.0.1.2", "b" * 56: "127.0.1.3"}
    kept = dataclasses.replace(loss("driver-lost"), workers_before=before, workers_after=dict(before))
    assert workers_after_head_loss(kept, kept=True).status == "pass"
    assert workers_after_head_loss(kept, kept=False).status == "fail"
    one_lost = dataclasses.replace(kept, workers_after={"a" * 56: "127.0.1.2", "c" * 56: "127.0.1.3"})
    v = workers_after_head_loss(one_lost, kept=True)
    assert v.status == "fail" and v.message.startswith("worker nodes after head loss: lost ['bbbbbbbb']")
    renewed = dataclasses.replace(kept, workers_after={"c" * 56: "127.0.1.2", "d" * 56: "127.0.1.3"})
    assert workers_after_head_loss(renewed, kept=False).status == "pass"
    half_back = dataclasses.replace(kept, workers_after={"c" * 56: "127.0.1.2"})
    assert workers_after_head_loss(half_back, kept=False).status == "fail"
    nobody = dataclasses.replace(kept, workers_before={}, workers_after={})
    assert workers_after_head_loss(nobody, kept=True).status == "fail"  # nothing seen is not "all kept"


class FakeJobs:
    """The Jobs API as the judge reads it: a status, or the 404 of a head that forgot the job."""

    def __init__(self, status):
        self.status = status

    def get_job_status(self, job_id):
        if self.status is None:
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")
        return types.SimpleNamespace(value=self.status)


def judge(status, *, gcs_ft, reports_after=(), head_down_s=1.0, head_up_s=10.0, driver_alive=False):
    """HeadLossExperiment._judge on recorded facts (no cluster: the experiment's parts are fakes)."""
    exp = object.__new__(HeadLossExperiment)
    exp.cluster = types.SimpleNamespace(redis=object() if gcs_ft else None,
                                        config=types.SimpleNamespace(head_recovery=True))
    exp.client, exp.timeline = FakeJobs(status), Timeline()
    for dt, step in reports_after:
        exp.timeline.emit("recorder", "report", t=1000.0 + dt, step=step)
    driver = subprocess.Popen(["sleep", "30"])
    proc = psutil.Process(driver.pid)
    if not driver_alive:
        driver.kill()
        driver.wait()
    try:
        return exp._judge("job-1", proc, 1000.0, head_down_s, head_up_s, settle_s=0.1, timeout=1.0)
    finally:
        driver.kill()
        driver.wait()


def test_judge_reports_after_the_head_came_back_mean_the_run_continued():
    outcome, diagnosis, _ = judge("RUNNING", gcs_ft=True, reports_after=[(5.0, 7), (12.0, 8)])
    assert outcome == "continued" and "step 8 reported 12.0 s after the fault" in diagnosis


def test_judge_a_dead_driver_with_fault_tolerance_is_a_lost_driver_whatever_the_jobs_api_says():
    outcome, diagnosis, status = judge("RUNNING", gcs_ft=True)
    assert outcome == "driver-lost" and status == "RUNNING" and "the Jobs API says RUNNING" in diagnosis


def test_judge_a_head_that_forgot_the_job_is_a_lost_cluster():
    outcome, diagnosis, _ = judge(None, gcs_ft=False)
    assert outcome == "cluster-lost" and diagnosis.startswith("cluster lost: no GCS fault tolerance")
    outcome, diagnosis, _ = judge(None, gcs_ft=True)
    assert outcome == "cluster-lost" and "although fault tolerance is on" in diagnosis


def test_judge_a_head_that_never_came_back():
    assert judge("RUNNING", gcs_ft=False, head_up_s=None)[0] == "cluster-lost"
    outcome, diagnosis, _ = judge("RUNNING", gcs_ft=True, head_up_s=None)
    assert outcome is None and "the head did not come back" in diagnosis


def test_judge_never_guesses_a_live_driver_without_reports():
    outcome, diagnosis, _ = judge("RUNNING", gcs_ft=True, driver_alive=True)
    assert outcome is None and "driver pid" in diagnosis and "alive" in diagnosis


def test_a_driver_pid_from_inside_a_pid_namespace_is_mapped_back():
    me = os.getpid()
    assert _namespace_pid(me) == me  # this process lives in the machine's own PID namespace
    assert _namespace_pid(2 ** 22 + 1) is None


def test_reports_resumed_times_the_first_report_after_the_head_came_back():
    tl = Timeline()
    lost = dataclasses.replace(loss("driver-lost"), t_fault=1000.0, head_up_s=12.0)
    tl.emit("recorder", "report", t=1004.0, step=12)  # the lost run, before the head went
    assert reports_resumed(tl, lost, 120).status == "unverifiable"
    tl.emit("harness", "job_submitted", t=1022.0, job_id="again")
    tl.emit("recorder", "report", t=1050.0, step=11)
    v = reports_resumed(tl, lost, 120)
    assert v.status == "pass" and v.evidence["first_report_s"] == 50.0 and v.evidence["resubmitted_at_s"] == 22.0
    slow = reports_resumed(tl, lost, 30)
    assert slow.status == "fail" and slow.message.startswith("recovery too slow: reports resumed 50.0 s")


def judged_head_loss(tmp_path, verdicts):
    """A judged HeadLossExperiment on a recorded head loss (no cluster): GCS killed after
    checkpoint 10, the head down 1 s later and back 10 s later, the run resubmitted."""
    s = Script().start_attempt().steps(1, 12)
    t = s.t + 0.5
    s.new_run().start_attempt(dt=20.0).steps(11, 20).finish()
    tl = s.timeline()
    tl.emit("harness", "fault_injected", t=t, fault="gcs-kill", target="head", job_id="j1", ledger_id="h1")
    tl.emit("fault", "fault_detected", t=t + 1.0, ledger_id="h1", by="head_down")
    tl.emit("cluster", "head_back", t=t + 10.0, boot=2)
    exp = object.__new__(HeadLossExperiment)
    exp.timeline, exp.run_dir, exp.spec = tl, tmp_path, types.SimpleNamespace(name="headloss-x")
    exp.reporter, exp.unverifiable, exp.test_id = Reporter(echo=lambda line: None), "fail", "suites/x.py::test_x"
    exp.verdicts, exp.metrics = [], {}
    exp.judge(verdicts)
    return exp


def test_a_judged_head_loss_leaves_its_timeline_picture_and_a_summary_record(tmp_path):
    """Head-loss suites reach reports/summary.json and the report as every experiment does."""
    passed = Verdict("head-loss outcome (gcs-kill)", "pass", "run lost with its driver")
    exp = judged_head_loss(tmp_path, [passed])
    assert (tmp_path / "timeline.png").stat().st_size > 0 and (tmp_path / "timeline.json").exists()
    record = exp.record("passed")
    assert (record["test"], record["fault_kind"], record["backend"], record["outcome"]) == \
           ("suites/x.py::test_x", "gcs-kill", "embedded", "passed")
    assert [v["name"] for v in record["verdicts"]] == ["head-loss outcome (gcs-kill)"]
    assert [round(r["time_to_detect"], 3) for r in record["recoveries"]] == [1.0]
    assert record["metrics"]["charged"]["worker_group"]["count"] == 0
    summary.append_record(tmp_path / "summary.d", record)
    assert summary.load_records(tmp_path / "summary.d")[0]["test"] == "suites/x.py::test_x"
    assert "head back" in [m.label for m in plot_data(exp.timeline).markers]


def test_twin_a_failing_head_loss_verdict_still_fails_the_test_after_its_artefacts(tmp_path):
    failed = Verdict("head-loss outcome (gcs-kill)", "fail", "the run continued", "wrong outcome")
    with pytest.raises(VerificationError, match="the run continued"):
        judged_head_loss(tmp_path, [failed])
    assert (tmp_path / "timeline.png").exists()
