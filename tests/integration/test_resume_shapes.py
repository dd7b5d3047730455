"""The resume shapes of resume_shapes.py, in chaos sessions of their own through the shared stand-in's
profile (each test there asserts its run's resume verdict) — several, so make integration's two
xdist workers share them out — and under make integration each taped run becomes the contract
fixture named here."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from sessions import ROOT, assert_reverted, record_contract

SUITE = Path(__file__).with_name("resume_shapes.py")
# the heaviest group (two runs and fault-free baselines) takes ~10 min alone on 2 cores
TIMEOUT_S = 1800
GROUPS = {  # group -> {test in resume_shapes.py -> contract fixture (None: none taped)}
    "evaluation-and-baseline": {
        "test_fault_before_the_first_checkpoint_then_evaluate_after_restore":
            "user_fault_before_checkpoints_then_evaluates",
        "test_weights_not_restored": "user_restores_step_only",
        "test_initial_checkpoint_without_a_step": "user_initial_checkpoint_without_step",
        "test_an_evaluation_at_the_checkpoint_step_is_decided_by_the_fault_free_baseline": None,  # two runs
    },
    "strides-and-commits": {
        "test_reports_only_at_checkpoints_fault_after_the_first": "user_reports_at_checkpoints_only",
        "test_restart_that_skips_a_save_interval_under_a_doubled_stride": "user_doubled_stride_after_restore",
        "test_restore_of_a_checkpoint_ray_never_committed_is_named": None,  # two runs, no fixture
        "test_first_checkpoint_step_trained_again": "user_retrains_first_checkpoint_step",
        "test_no_checkpoint_handed_to_train": "user_no_checkpoint",
    },
    "reporting-orders": {  # a checkpoint reported before its step's metrics, or saved at the top of its step
        "test_checkpoint_reported_before_its_steps_metrics": "user_checkpoint_before_metrics",
        "test_saved_at_the_top_of_the_step": "user_saved_at_top",
        "test_saved_at_the_top_then_a_restart_past_it": "user_saved_at_top_skips_the_step",
    },
    "runs-and-preemptions": {
        "test_warm_up_fit_then_a_correct_resume": "user_warmup_fit_healthy",
        "test_warm_up_fit_then_a_restart_from_scratch": "user_warmup_fit_ignores_checkpoint",
        "test_script_crash_during_a_preemption_is_an_unrelated_failure": "user_crash_on_preemption_notice",
        "test_survivors_commit_without_the_preempted_rank_under_relaxed_collectives":
            "user_relaxed_survivors_commit",
    },
}


def test_every_shape_is_in_one_group():
    """A shape added to resume_shapes.py and to no group would never run."""
    tests = [n.name for n in ast.parse(SUITE.read_text()).body
             if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    grouped = [t for group in GROUPS.values() for t in group]
    assert sorted(grouped) == sorted(tests), set(grouped) ^ set(tests)


@pytest.mark.integration
@pytest.mark.parametrize("group", list(GROUPS))
def test_resume_shapes(standin, tmp_path, group):
    shapes = GROUPS[group]
    reports = tmp_path / "reports"
    cmd = [sys.executable, "-m", "pytest", "-m", "chaos", *(f"{SUITE}::{t}" for t in shapes), "-p", "no:cacheprovider",
           "-q", "-s", "-rA", "--chaos-profile", str(standin[1]), "--chaos-reports", str(reports), "--chaos-tape"]
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        pytest.fail(f"the resume shapes ({group}) ran past {TIMEOUT_S} s; their output so far:\n{out[-8000:]}")
    assert_reverted(reports / "ledger.jsonl")
    assert p.returncode == 0, p.stdout[-8000:] + p.stderr[-2000:]
    assert f"{len(shapes)} passed" in p.stdout, p.stdout[-3000:]
    for test, fixture in shapes.items():
        record_contract(fixture, reports, cmd, test=test)
