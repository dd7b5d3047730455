"""A user's own script under chaos (--chaos-workload): the harness must catch the
classic mistakes and say so in the test's failure — and leave nothing running.

Each case runs a real chaos suite in a separate pytest session on its own embedded
cluster, exactly as a user would.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sessions import assert_nothing_left

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "tests" / "workloads"
SUITE = "suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity"


def run_suite(tmp_path, workload_args, *extra, timeout=900):
    cmd = [sys.executable, "-m", "pytest", "-m", "chaos", SUITE, "-p", "no:cacheprovider", "-q", "-s",
           "--chaos-workload", f"{sys.executable} user_train.py --storage {tmp_path / 'storage'} {workload_args}",
           "--chaos-workload-dir", str(WORKLOADS), "--chaos-reports", str(tmp_path / "reports"), *extra]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=timeout)
    assert_nothing_left(p.pid)
    return p.returncode, out


@pytest.mark.integration
def test_correct_user_script_passes(tmp_path):
    code, out = run_suite(tmp_path, "")
    assert code == 0, out[-4000:]
    assert "resumed at step 11, right after the latest checkpoint (step 10)" in out


@pytest.mark.integration
def test_script_that_ignores_its_checkpoint_fails_with_restarted_from_scratch(tmp_path):
    code, out = run_suite(tmp_path, "--ignore-checkpoint")
    assert code == 1, out[-4000:]
    assert "restarted from scratch: attempt 1 began at step 1 on every rank although checkpoint step" in out, out[-4000:]


@pytest.mark.integration
def test_rank_that_restarts_from_scratch_is_named_and_the_hang_is_a_stall(tmp_path):
    """Only rank 0 restores: rank 1 replays from step 1, and once rank 0 is done it waits in
    the all-reduce forever.  The test fails on both findings instead of hanging."""
    code, out = run_suite(tmp_path, "--restore-rank0-only")
    assert code == 1, out[-4000:]
    assert "restarted from scratch: rank 1 began attempt 1 at step 1" in out, out[-4000:]
    assert "while rank 0 resumed at 11" in out, out[-4000:]
    assert "training stalled: no rank reported for" in out, out[-4000:]
    assert "WaitTimeout" not in out  # a finding about the run, not the harness timing out


@pytest.mark.integration
def test_default_failure_config_fails_with_budget_exhausted(tmp_path):
    code, out = run_suite(tmp_path, "--default-failure-config")
    assert code == 1, out[-4000:]
    assert "retry budget exhausted: 1 failure charged to max_failures=0" in out, out[-4000:]
    assert "timed out" not in out.split("short test summary")[-1]


@pytest.mark.integration
def test_unknown_step_metric_is_unverifiable_until_named(tmp_path):
    """A step counter under a name ``auto`` does not know: unverifiable, which fails the test
    by default; named with --chaos-step-metric, the restart is judged."""
    code, out = run_suite(tmp_path, "--metric samples_seen")
    assert "unverifiable: no step metric 'step', 'global_step'" in out, out[-4000:]
    assert code == 1, out[-4000:]
    code, out = run_suite(tmp_path, "--metric samples_seen", "--chaos-step-metric", "samples_seen")
    assert "right after the latest checkpoint (step 10)" in out, out[-4000:]
    assert code == 0, out[-4000:]


@pytest.mark.integration
def test_workload_that_fails_before_training_is_a_clear_error(tmp_path):
    code, out = run_suite(tmp_path, "--crash-before-training", timeout=600)
    assert code == 1, out[-4000:]
    assert "the workload did not start training" in out
    assert "could not open the training data" in out  # the job's own error, from its log


@pytest.mark.parametrize("args, message", [
    (["--chaos-workers", "0"], "--chaos-workers=0: must be >= 1"),
    (["--chaos-node-recovery", "sometimes"], "invalid choice: 'sometimes'"),
    (["--chaos-raylet-kill", "pkill"], "invalid choice: 'pkill'"),
    (["--chaos-workload", " "], "--chaos-workload is empty"),
    (["--chaos-workload-dir", "/nonexistent/dir"], "--chaos-workload-dir /nonexistent/dir: not a directory"),
    (["--chaos-workload", "HF_TOKEN=hf_abc python train.py"], "--chaos-workload contains HF_TOKEN=…"),
    (["--chaos-workload", "python train.py --api-key abc"], "--chaos-workload contains --api-key …"),
    (["--chaos-unverifiable", "ignore"], "invalid choice: 'ignore'"),
    (["--chaos-stall-limit", "0"], "--chaos-stall-limit=0.0: must be >= 1"),
    (["--chaos-step-metric", " , "], "--chaos-step-metric is empty"),
])
def test_bad_option_values_are_clear_usage_errors(args, message):
    p = subprocess.run([sys.executable, "-m", "pytest", "-m", "chaos", "suites", "-p", "no:cacheprovider", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 4, p.stdout + p.stderr
    assert message in p.stdout + p.stderr


@pytest.mark.integration
def test_readme_command_with_plain_python_and_no_venv_on_path(tmp_path):
    """The README's literal `--chaos-workload "python my_train.py"`, run from a shell whose
    PATH lacks the venv (`make chaos ARGS=...` on a fresh clone): the job's `python` must be
    the cluster's own interpreter, the one with Ray, not whatever the shell has first."""
    venv_bin = Path(sys.executable).parent  # not resolved: the venv's python links out of it
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and Path(d).resolve() != venv_bin.resolve())
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PATH": path}
    workload = f"python user_train.py --storage {tmp_path / 'storage'}"
    p = subprocess.Popen([sys.executable, "-m", "pytest", "-m", "chaos", SUITE, "-p", "no:cacheprovider", "-q",
                          "-s", "--chaos-workload", workload, "--chaos-workload-dir", str(WORKLOADS),
                          "--chaos-reports", str(tmp_path / "reports")],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=900)
    assert_nothing_left(p.pid)
    assert "No module named 'ray'" not in out, out[-4000:]
    assert p.returncode == 0, out[-4000:]
