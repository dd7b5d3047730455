"""A user's own script under chaos (--chaos-workload): the harness must catch the
classic mistakes and say so in the test's failure — and leave nothing on the cluster.

Each case runs a real chaos suite in its own pytest session, as a user would, against the
shared stand-in cluster (conftest.py) — but for the one that never starts training, which
starts its own embedded cluster as the README's command line does and must leave no process.
"""

import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from chaos.safety import scan_for_secrets
from sessions import run_session

load_yaml = YAML(typ="safe", pure=True).load


def run_suite(standin, tmp_path, workload_args, *extra, tape, timeout=900):
    """The session's exit code and output; its taped run becomes contract fixture ``tape``
    (tests/contract) under make integration.  ``standin`` None: its own embedded cluster."""
    profile = standin[1] if standin else None
    workload = f"{sys.executable} user_train.py --storage {tmp_path / 'storage'} {workload_args}"
    return run_session(profile, tmp_path / f"reports-{tape}", workload, *extra, tape=tape, timeout=timeout)


@pytest.mark.integration
def test_correct_user_script_passes(standin, tmp_path):
    code, out = run_suite(standin, tmp_path, "", tape="user_healthy")
    assert code == 0, out[-4000:]
    assert "resumed at step 11, right after the latest checkpoint (step 10)" in out
    assert "[        PASS] healed" in out
    # Nothing the run wrote may carry the SSH private key of the stand-in's hosts or a key-like secret.
    keys = [Path(h["ssh"]["key_file"]).read_text() for h in load_yaml(standin[1].read_text())["hosts"]["overrides"]
            if h.get("ssh", {}).get("key_file")]
    hits = scan_for_secrets([tmp_path], secrets=keys)
    assert not hits, hits


@pytest.mark.integration
def test_script_that_ignores_its_checkpoint_fails_with_restarted_from_scratch(standin, tmp_path):
    code, out = run_suite(standin, tmp_path, "--ignore-checkpoint", tape="user_ignores_checkpoint")
    assert code == 1, out[-4000:]
    assert "restarted from scratch: attempt 1 began at step 1 on every rank although checkpoint step" in out, out[-4000:]


@pytest.mark.integration
def test_a_script_slow_to_first_report_is_slow_not_stalled(standin, tmp_path):
    """Every attempt loads for 65 s before its first step — longer than the 60 s floor that
    used to be the stall limit until an attempt had two reports.  The limit is learnt from the
    run (before a restarted attempt's first report: 3x the run's own time to its first report,
    plus the recovery SLO), so the run passes — with a recovery SLO that allows for the load, as
    its owner would set it.  The twin that really hangs is the stall below."""
    code, out = run_suite(standin, tmp_path, "--slow-start 65 --steps 15", "--chaos-slo-recover", "150", tape=None)
    assert code == 0, out[-4000:]
    assert "training stalled" not in out and "resumed at step 11, right after the latest checkpoint (step 10)" in out


@pytest.mark.integration
def test_rank_that_restarts_from_scratch_is_named_and_the_hang_is_a_stall(standin, tmp_path):
    """Only rank 0 restores: rank 1 replays from step 1, and once rank 0 is done it waits in
    the all-reduce forever.  The test fails on both findings instead of hanging (a stall limit
    of 30 s, not the 60 s floor: the script reports every 0.3 s)."""
    code, out = run_suite(standin, tmp_path, "--restore-rank0-only", "--chaos-stall-limit", "30",
                          tape="user_restores_rank0_only")
    assert code == 1, out[-4000:]
    assert "restarted from scratch: rank 1 began attempt 1 at step 1" in out, out[-4000:]
    assert "while rank 0 resumed at 11" in out, out[-4000:]
    assert "training stalled: no rank reported for" in out, out[-4000:]
    assert "WaitTimeout" not in out  # a finding about the run, not the harness timing out


@pytest.mark.integration
def test_default_failure_config_fails_with_budget_exhausted(standin, tmp_path):
    code, out = run_suite(standin, tmp_path, "--default-failure-config", tape="user_default_failure_config")
    assert code == 1, out[-4000:]
    assert "retry budget exhausted: 1 failure charged to max_failures=0" in out, out[-4000:]
    assert "timed out" not in out.split("short test summary")[-1]


@pytest.mark.integration
def test_unknown_step_metric_is_unverifiable_until_named(standin, tmp_path):
    """A step counter under a name ``auto`` does not know: unverifiable, which fails the test
    by default; named with --chaos-step-metric, the restart is judged."""
    code, out = run_suite(standin, tmp_path, "--metric samples_seen", tape="user_unknown_step_metric")
    assert "unverifiable: no step metric 'step', 'global_step'" in out, out[-4000:]
    assert code == 1, out[-4000:]
    code, out = run_suite(standin, tmp_path, "--metric samples_seen", "--chaos-step-metric", "samples_seen",
                          tape="user_named_step_metric")
    assert "right after the latest checkpoint (step 10)" in out, out[-4000:]
    assert code == 0, out[-4000:]


@pytest.mark.integration
def test_workload_that_fails_before_training_is_a_clear_error(tmp_path):
    code, out = run_suite(None, tmp_path, "--crash-before-training", tape=None, timeout=600)
    assert code == 1, out[-4000:]
    assert "the workload did not start training" in out
    assert "could not open the training data" in out  # the job's own error, from its log


@pytest.mark.integration
def test_restore_of_the_previous_checkpoint_fails_as_an_older_checkpoint(standin, tmp_path):
    """The script scans its storage and loads the checkpoint before the latest (step 5, not 10)."""
    code, out = run_suite(standin, tmp_path, "--restore-previous-checkpoint", tape="user_restores_previous_checkpoint")
    assert code == 1, out[-4000:]
    assert "resumed from an older checkpoint" in out, out[-4000:]


@pytest.mark.integration
def test_restore_that_crashes_is_a_failure_the_fault_did_not_cause(standin, tmp_path):
    """Every restart raises while loading its checkpoint: the kill is charged once, the crash
    again — a failure no injected fault explains — and the budget (max_failures=1) runs out."""
    code, out = run_suite(standin, tmp_path, "--crash-on-restore --max-failures 1", tape="user_crashes_on_restore")
    assert code == 1, out[-4000:]
    assert "unrelated failure: attempt 1 failed with" in out, out[-4000:]
    assert "could not load the checkpoint" in out, out[-4000:]


@pytest.mark.integration
def test_script_that_trains_the_checkpoint_step_again_fails_as_work_done_twice(standin, tmp_path):
    """``range(step, N)`` after restoring: the first report is the checkpoint's own step —
    what an evaluation after loading also reports — but its checkpoint is committed again."""
    code, out = run_suite(standin, tmp_path, "--retrain-checkpoint-step", tape="user_retrains_checkpoint_step")
    assert code == 1, out[-4000:]
    assert "resumed from an older checkpoint" in out and "step 10 had been committed before" in out, out[-4000:]


@pytest.mark.integration
def test_step_counter_that_resets_every_epoch_is_unverifiable(standin, tmp_path):
    """The step within the epoch (0..4, checkpoint at its end): a restart from scratch and a
    correct resume would both report 0 next, so the resume cannot be judged by it."""
    code, out = run_suite(standin, tmp_path, "--epoch-steps 5", tape="user_epoch_local_step")
    assert code == 1, out[-4000:]
    assert "unverifiable: step metric 'step' goes back: rank 0 reported step 4, then 0" in out, out[-4000:]


@pytest.mark.integration
def test_restored_attempt_that_reports_no_step_is_unverifiable(standin, tmp_path):
    code, out = run_suite(standin, tmp_path, "--no-step-after-restore", tape="user_no_step_after_restore")
    assert code == 1, out[-4000:]
    assert "unverifiable: attempt 1 reported" in out and "without the step metric 'step' (it reported 'loss')" in out, \
        out[-4000:]


@pytest.mark.integration
def test_run_too_short_for_its_fault_is_a_finding(standin, tmp_path):
    """7 steps: one checkpoint (step 5), so the suite's trigger (after checkpoint 2) never
    fires — a failed test saying so, not a harness error."""
    code, out = run_suite(standin, tmp_path, "--steps 7", tape=None)
    assert code == 1, out[-4000:]
    assert "run ended before the fault: fault 1 waited after checkpoint 2 is committed" in out, out[-4000:]
    assert "WaitTimeout" not in out, out[-4000:]


@pytest.mark.integration
def test_run_that_does_not_finish_in_time_is_a_finding(standin, tmp_path):
    """400 steps (about 2 min after the fault) against a 20 s finish timeout: a failed test
    that says the run did not finish and still judges the resume it saw, not a harness
    error.  The healthy twin is every suite whose run ends within the default 600 s."""
    code, out = run_suite(standin, tmp_path, "--steps 400", "--chaos-finish-timeout", "20", tape=None)
    assert code == 1, out[-4000:]
    assert "run did not finish within 20 s after the last fault (job RUNNING" in out, out[-4000:]
    assert "resumed at step 11, right after the latest checkpoint (step 10)" in out, out[-4000:]
    assert "[        PASS] healed" in out and "WaitTimeout" not in out, out[-4000:]


@pytest.mark.integration
def test_driver_that_hangs_after_fit_is_a_finding(standin, tmp_path):
    """fit() returns, the script then waits forever: Train's run FINISHED, its job never ends.
    The finding names the driver, not the run, and the job is stopped (healed).  The healthy
    twin is test_correct_user_script_passes: the same script, whose driver exits."""
    code, out = run_suite(standin, tmp_path, "--hang-after-fit", "--chaos-finish-timeout", "45", tape=None)
    assert code == 1, out[-4000:]
    assert "driver did not exit: Train's run ended FINISHED, but 45 s later its job was still RUNNING" in out, \
        out[-4000:]
    assert "resumed at step 11, right after the latest checkpoint (step 10)" in out, out[-4000:]
    assert "[        PASS] healed" in out and "WaitTimeout" not in out, out[-4000:]


@pytest.mark.integration
def test_an_actor_the_run_leaves_holding_resources_fails_healed(standin, tmp_path):
    """After fit() the script starts a detached actor with 0.5 CPU and leaves it: the job's
    own actors are asked after it ended (state API over HTTP), and healed fails naming the
    actor.  The healthy twin is test_correct_user_script_passes (healed passes).  The test
    then removes the actor through a job of its own, as its owner would."""
    try:
        code, out = run_suite(standin, tmp_path, "--leak-actor", tape=None)
        assert code == 1, out[-4000:]
        assert "resumed at step 11, right after the latest checkpoint (step 10)" in out, out[-4000:]
        assert "[        FAIL] healed" in out and "still held: actor Leaked" in out, out[-4000:]
        assert "ALIVE with 0.5 CPU" in out, out[-4000:]
    finally:
        remove_leaked_actor(standin)


def remove_leaked_actor(standin) -> None:
    from ray.job_submission import JobSubmissionClient

    from chaos.waits import poll_until

    client = JobSubmissionClient(load_yaml(standin[1].read_text())["ray"]["dashboard_url"])
    job = client.submit_job(entrypoint="python -c \"import ray; ray.init(); "
                            "ray.kill(ray.get_actor('leaked', namespace='user-train'))\"")
    status = poll_until(lambda: (lambda st: (st if st in ("SUCCEEDED", "FAILED", "STOPPED") else None, st))(
        str(client.get_job_status(job).value)), 120, "the job that removes the leaked actor")
    assert status == "SUCCEEDED", client.get_job_logs(job)


@pytest.mark.integration
def test_crash_loop_under_an_unlimited_budget_is_a_finding(standin, tmp_path):
    """Every restart raises loading its checkpoint and FailureConfig(max_failures=-1) retries
    forever: after 3 failures in a row without a new step the test fails as a crash loop,
    instead of waiting for a recovery that cannot come."""
    code, out = run_suite(standin, tmp_path, "--crash-on-restore --max-failures -1", tape=None)
    assert code == 1, out[-4000:]
    assert "crash loop: 3 failures in a row without a step beyond" in out, out[-4000:]
    assert "could not load the checkpoint" in out, out[-4000:]


def run_without_shared_fs(no_shared_fs, tmp_path, workload_args, *extra):
    """The raylet-kill suite through the stand-in that shares no filesystem, its checkpoints on
    S3 (``--storage`` the profile's bucket): the script runs with the nodes' own Python, and the
    session gets the S3 credentials the profile names in its environment.  No tape: the
    controller writes it on the head node, which shares no file with this machine."""
    _, profile, storage, env = no_shared_fs
    workload = f"python user_train.py --storage {storage} {workload_args}"
    return run_session(profile, tmp_path / "reports", workload, "--chaos-raylet-kill", "sigkill", *extra,
                       tape=None, env=env)


@pytest.mark.integration
def test_optimizer_kept_on_a_node_passes_on_a_shared_filesystem(standin, tmp_path):
    """The optimizer's state in rank 0's node's /tmp, outside the checkpoint: on the shared
    stand-in every node sees this machine's /tmp, so the restart finds it whatever node it lands
    on — the bug is hidden there, as on a cluster with a shared home directory."""
    code, out = run_suite(standin, tmp_path, "--optimizer-in-tmp", "--chaos-deterministic", tape=None)
    assert code == 0, out[-4000:]
    assert "resumed at step 11, right after the latest checkpoint (step 10)" in out, out[-4000:]


@pytest.mark.integration
def test_optimizer_kept_on_a_node_fails_without_a_shared_filesystem(no_shared_fs, tmp_path):
    """The same script where nodes share nothing: the restart runs its ranks on two nodes and at
    most one of them holds the file, so a rank's optimizer starts afresh — state not restored."""
    code, out = run_without_shared_fs(no_shared_fs, tmp_path, "--optimizer-in-tmp", "--chaos-deterministic")
    assert code == 1, out[-4000:]
    assert "state not restored" in out, out[-4000:]
    assert "storage: " in out and "S3 requests of the run" in out, "the checkpoints did not go to S3"


@pytest.mark.integration
def test_optimizer_in_the_checkpoint_passes_without_a_shared_filesystem(no_shared_fs, tmp_path):
    """The healthy twin: the optimizer in the checkpoint, on S3, restored on any node."""
    code, out = run_without_shared_fs(no_shared_fs, tmp_path, "--learn", "--chaos-deterministic")
    assert code == 0, out[-4000:]
    assert "resumed at step 11, right after the latest checkpoint (step 10)" in out, out[-4000:]
