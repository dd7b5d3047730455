"""Resume shapes that the raylet-kill suite's one trigger (after checkpoint 2) cannot reach:
`examples/workloads/user_train.py` with a flag, a raylet kill where the shape needs it.
Run by test_resume_shapes.py in one session against the shared stand-in, each run taped:
they are the contract fixtures of the resume rules that only such a run exercises.

Not collected by ``pytest tests`` (no test_ prefix): it is a chaos suite, run as one.
"""

import sys
import uuid
from pathlib import Path

import pytest

from chaos.train.run import user_spec
from chaos.faults.preempt import Preempt
from chaos.triggers import AfterCheckpoint, AfterPersisted, AtStep
from chaos.timeline import steps_of

pytestmark = [pytest.mark.chaos, pytest.mark.integration]
WORKLOADS = Path(__file__).resolve().parents[2] / "examples" / "workloads"


def shape(chaos, tmp_path, flags, deterministic=False):
    name = f"{chaos.request.node.name[:40]}-{uuid.uuid4().hex[:6]}"  # unique on the shared cluster
    cmd = f"{sys.executable} user_train.py --storage {tmp_path / 'storage'} {flags}"
    return user_spec(cmd, name, working_dir=str(WORKLOADS), state_metric="auto", deterministic=deterministic)


def resume(outcome, attempt=1, run=None):
    """The resume verdict of ``attempt`` (of Train run ``run``, 1-based, where the job ran several)."""
    return outcome.verdict(f"resumed-from-latest ({f'run {run}, ' if run else ''}attempt {attempt})")


def test_fault_before_the_first_checkpoint_then_evaluate_after_restore(chaos, tmp_path):
    """Attempt 1 starts over (nothing committed yet) — right; attempt 2 restores checkpoint 10,
    reports the loss evaluated there, then trains step 11 to the value attempt 1 had.  Steps
    of 0.6 s: the kill at the first report lands well before checkpoint 5 (2.4 s later)."""
    outcome = chaos.run(shape(chaos, tmp_path, "--evaluate-after-restore --step-time 0.6"),
                        faults=[(AtStep(1), chaos.raylet_kill(rank=1)),
                                (AtStep(11, fresh=True), chaos.raylet_kill(rank=1))])
    assert resume(outcome, 1).status == "pass" and "no checkpoint existed yet" in resume(outcome, 1).message
    assert resume(outcome, 2).status == "pass" and "evaluating after loading it" in resume(outcome, 2).message


def test_weights_not_restored(chaos, tmp_path):
    outcome = chaos.run(shape(chaos, tmp_path, "--evaluate-after-restore --restore-step-only", deterministic=True),
                        faults=[(AtStep(11), chaos.raylet_kill(rank=1))])
    v = resume(outcome)
    assert v.status == "fail" and v.diagnosis == "state not restored", v.line()


def test_initial_checkpoint_without_a_step(chaos, tmp_path):
    """The initial weights committed before step 1 (no step yet), the kill right after that
    commit and well before checkpoint 5 (steps of 0.6 s): resuming at step 1 may well be
    right, but nothing says which step that checkpoint holds."""
    outcome = chaos.run(shape(chaos, tmp_path, "--initial-checkpoint --step-time 0.6"),
                        faults=[(AfterCheckpoint(1), chaos.raylet_kill(rank=1))])
    v = resume(outcome)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no step at the checkpoint", v.line()


def test_reports_only_at_checkpoints_fault_after_the_first(chaos, tmp_path):
    """Killed after the first checkpoint: nothing yet shows the stride.  Killed again after the
    third: the stride (5) is what the reports before that fault show, so attempt 2 must begin
    at the step that follows it (the healthy twin of the doubled stride below).  The first
    attempt holds 20 s after checkpoint 5: under three xdist workers the kill once came after
    checkpoint 10, whose reports showed the stride."""
    outcome = chaos.run(shape(chaos, tmp_path, "--report-at-checkpoints-only --hold-after-checkpoint 5"),
                        faults=[(AfterCheckpoint(1), chaos.raylet_kill(rank=1)),
                                (AfterCheckpoint(3), chaos.raylet_kill(rank=1))])
    first = sorted({s for r in outcome.timeline.of("report") if r.attempt == 0 for s in steps_of(r).values()})
    assert first == [5], f"attempt 0 reported steps {first} before the kill: the shape needs only checkpoint 5"
    v = resume(outcome)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no reporting stride", v.line()
    v = resume(outcome, 2)
    assert v.status == "pass", v.line()


def test_restart_that_skips_a_save_interval_under_a_doubled_stride(chaos, tmp_path):
    """Reports every 5th step (at its checkpoints); restored at 10, it goes on at 16 and reports
    every 10th: its first report, 20, is what a stride of 10 would expect — but the stride is
    the reports' before the fault (5), so steps 15..20 were skipped.  The first attempt holds
    20 s after checkpoint 10: under make integration's load the kill once came after
    checkpoint 15, and restored there the restart (21..25) reports nothing at all."""
    outcome = chaos.run(shape(chaos, tmp_path, "--report-at-checkpoints-only --double-stride-after-restore "
                                               "--hold-after-checkpoint 10"),
                        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))])
    first = sorted({s for r in outcome.timeline.of("report") if r.attempt == 0 for s in steps_of(r).values()})
    assert first == [5, 10], f"attempt 0 reported steps {first} before the kill: the shape needs checkpoints 5, 10"
    v = resume(outcome)
    assert v.status == "fail" and v.diagnosis == "resumed past the checkpoint", v.line()
    assert "steps 15..20 were skipped" in v.message and "stride 5 before the fault" in v.message, v.line()


def test_first_checkpoint_step_trained_again(chaos, tmp_path):
    """Killed after checkpoint 5 (the first attempt holds 20 s there, so the kill lands on it
    however loaded the machine), the restart trains step 5 again and commits it again."""
    outcome = chaos.run(shape(chaos, tmp_path, "--retrain-checkpoint-step --hold-after-checkpoint 5"),
                        faults=[(AfterCheckpoint(1), chaos.raylet_kill(rank=1))])
    v = resume(outcome)
    assert v.status == "fail" and v.diagnosis == "restarted from scratch", v.line()
    assert "the run's first checkpoint, was trained and committed again" in v.message, v.line()


def test_no_checkpoint_handed_to_train(chaos, tmp_path):
    outcome = chaos.run(shape(chaos, tmp_path, "--no-checkpoint"), faults=[(AtStep(8), chaos.raylet_kill(rank=1))])
    [v] = [v for v in outcome.verdicts if v.name.startswith("resumed-from-latest")]
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no checkpoint reported", v.line()


def test_warm_up_fit_then_a_correct_resume(chaos, tmp_path):
    """A short fault-free fit() first (3 steps, no checkpoint), then the run under test: the
    trigger counts the second run's checkpoints, and every verdict judges that run (which
    holds 20 s after checkpoint 10: the kill lands on it however loaded the machine)."""
    outcome = chaos.run(shape(chaos, tmp_path, "--warmup-fit --hold-after-checkpoint 10"),
                        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))])
    assert len({e.data["run_id"] for e in outcome.timeline.of("controller_started")}) == 2, "two fit() runs"
    [hit] = {e.data["run_id"] for e in outcome.timeline.of("failure_decision")}
    assert hit == outcome.timeline.of("controller_started")[1].data["run_id"], "the fault hit the second run"
    v = resume(outcome, run=2)
    assert v.status == "pass" and "attempt 1 resumed at step 11" in v.message, v.line()
    outcome.assert_verdicts()


def test_warm_up_fit_then_a_restart_from_scratch(chaos, tmp_path):
    """The same, the run under test ignoring its checkpoint: the warm-up's clean run must not
    stand in for it."""
    outcome = chaos.run(shape(chaos, tmp_path, "--warmup-fit --ignore-checkpoint"),
                        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))])
    v = resume(outcome, run=2)
    assert v.status == "fail" and v.diagnosis == "restarted from scratch", v.line()


def test_script_crash_during_a_preemption_is_an_unrelated_failure(chaos, tmp_path):
    """Rank 1's node is drained; rank 0, on another node, crashes in its notice handler.  The
    first failure decision after the preemption is not the preemption's: charging it to the
    preemption (or calling it the wrong budget class) would hide the script's bug.  The healthy
    twin is suites/test_preemption.py's per-commit preemption, charged to its budget."""
    outcome = chaos.run(shape(chaos, tmp_path, "--crash-on-preemption-notice --steps 40"),
                        faults=[(AfterCheckpoint(1), Preempt(rank=1, via="drain", deadline_s=8))])
    v = outcome.verdict("within-budget")
    assert v.status == "fail" and v.diagnosis == "unrelated failure", v.line()
    assert "failed with ValueError" in v.message and "not on the fault's node" in v.message, v.line()


def test_survivors_commit_without_the_preempted_rank_under_relaxed_collectives(chaos, tmp_path):
    """Three ranks, rank 1's node drained under relax_collectives_on_preemption: on the notice
    rank 1 stops (reclaimed before it reports), ranks 0 and 2 commit a just-in-time checkpoint
    without it.  Ray lists that round's two metrics without rank ids; they are ranks 0 and 2
    (the poll status says which rank is going), not renumbered 0 and 1; the checkpoint is rank
    1's too, so its resume is judged from the step the survivors committed it at (it used to be
    unverifiable: the commit carried no step for rank 1)."""
    outcome = chaos.run(shape(chaos, tmp_path, "--workers 3 --relax-collectives --survivors-checkpoint-on-notice "
                                               "--steps 60"),
                        faults=[(AfterCheckpoint(2), Preempt(rank=1, via="drain", deadline_s=15))])
    relaxed = [r for r in outcome.timeline.of("report") if r.data.get("without_ranks")]
    assert relaxed, [(r.attempt, r.data.get("steps")) for r in outcome.timeline.of("report")][-8:]
    for r in relaxed:
        assert sorted(steps_of(r)) == [0, 2] and r.data["without_ranks"] == [1] and r.attempt == 0, r.data
    ck = steps_of(relaxed[-1])[0]
    v = resume(outcome)
    assert v.status == "pass" and f"resumed at step {ck + 1}," in v.message, v.line()
    assert "committed by rank 0, 2 without rank 1" in v.evidence["ranks"][1]["rule"], v.evidence
    assert outcome.verdict("within-budget").status == "pass", outcome.verdict("within-budget").line()


def test_an_evaluation_at_the_checkpoint_step_is_decided_by_the_fault_free_baseline(chaos, tmp_path):
    """Killed as checkpoint 10 is committed, before step 11 is reported (the first attempt
    holds 20 s after checkpoint 10: the commit reaches the harness on the controller's next
    poll, and with 2 s steps and no hold step 11 was reported before the kill once under two
    xdist workers): the restart first reports step 10, evaluated after loading.  No earlier attempt reported step 11, so the fault-free baseline's step 11
    decides: reproduced where the weights and the optimizer were restored; not, where only
    the step was (the buggy twin)."""
    def run(flags, where):
        flags = f"--evaluate-after-restore --hold-after-checkpoint 10 --step-time 1.0 --steps 15 {flags}"
        outcome = chaos.run(shape(chaos, tmp_path / where, flags, deterministic=True),
                            faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))], expect=chaos.expect(baseline=True))
        assert not [r for r in outcome.timeline.of("report") if r.attempt == 0 and 11 in steps_of(r).values()], \
            f"{where}: step 11 was reported before the kill: the earlier attempt decides, not the baseline"
        return outcome

    good = run("", "good")
    v = resume(good)
    assert v.status == "pass" and "evaluating after loading it" in v.message, v.line()
    assert "step 11 reproduced" in v.message and "of the fault-free baseline" in v.message, v.line()
    bad = run("--restore-step-only", "bad")
    v = resume(bad)
    assert v.status == "fail" and v.diagnosis == "state not restored", v.line()
    assert "in the fault-free baseline" in v.message, v.line()


def test_restore_of_a_checkpoint_ray_never_committed_is_named(chaos, tmp_path):
    """Rank 1 uploads its shard of each checkpoint in 4 s: rank 0's part of checkpoint 15 is on
    storage while Ray waits for rank 1's, and rank 1's node goes then.  Ray's latest commit is 10; a script
    that loads the newest folder on storage resumes at 16 — named as the checkpoint Ray never
    committed.  The twin (the same timing, get_checkpoint()) resumes at 11."""
    slow = "--slow-checkpoint-report 4 --steps 20"
    bad = chaos.run(shape(chaos, tmp_path / "bad", f"{slow} --restore-newest-folder"),
                    faults=[(AfterPersisted(3), chaos.raylet_kill(rank=1))])
    v = resume(bad)
    assert v.status == "fail" and v.diagnosis == "resumed past the checkpoint", v.line()
    assert "it follows step 15, whose checkpoint rank 0 had written to storage in attempt 0" in v.message, v.line()
    assert "Ray never committed" in v.message and "the latest committed checkpoint is step 10" in v.message
    good = chaos.run(shape(chaos, tmp_path / "good", slow), faults=[(AfterPersisted(3), chaos.raylet_kill(rank=1))])
    v = resume(good)
    assert v.status == "pass" and "resumed at step 11" in v.message, v.line()


def test_checkpoint_reported_before_its_steps_metrics(chaos, tmp_path):
    """Each save hands Train the checkpoint in a report without a step, then the step's
    metrics: the checkpoint may hold the state after the step before it or after the step that
    follows; killed at step 12, the restart's first step (11, reproducing attempt 0's loss)
    tells which — a correct resume, no longer 'resumed past the checkpoint'."""
    outcome = chaos.run(shape(chaos, tmp_path, "--checkpoint-before-metrics", deterministic=True),
                        faults=[(AtStep(12), chaos.raylet_kill(rank=1))])
    commit = next(r for r in outcome.timeline.of("report") if r.data.get("checkpoint"))
    assert not steps_of(commit) and commit.data.get("checkpoint_after_step"), commit.data
    v = resume(outcome)
    assert v.status == "pass" and "attempt 1 resumed at step 11" in v.message, v.line()
    assert "reproduced" in v.message, v.line()


def before_the_next_save(outcome):
    """The shape's precondition: the kill at step 12 landed before checkpoint 15 (1 s steps)."""
    reached = max(s for r in outcome.timeline.of("report") if r.attempt == 0 for s in steps_of(r).values())
    assert reached < 15, f"attempt 0 reached step {reached} before the kill: the shape needs checkpoint 10 as the latest"


def test_saved_at_the_top_of_the_step(chaos, tmp_path):
    """Saves the state before training step 10, labelled 10; killed at step 12, the restart
    begins at 10 and saves it again at its top — a correct resume, no longer 'resumed from an
    older checkpoint' (a second commit at 10)."""
    outcome = chaos.run(shape(chaos, tmp_path, "--save-at-top --step-time 1.0", deterministic=True),
                        faults=[(AtStep(12), chaos.raylet_kill(rank=1))])
    before_the_next_save(outcome)
    v = resume(outcome)
    assert v.status == "pass" and "attempt 1 resumed at step 10" in v.message, v.line()


def test_saved_at_the_top_then_a_restart_past_it(chaos, tmp_path):
    """The buggy twin: the restart begins after the saved step, whose batch is never trained —
    no longer a pass (a same-step report after a checkpoint was taken for an evaluation)."""
    outcome = chaos.run(shape(chaos, tmp_path, "--save-at-top --skip-restored-step --step-time 1.0",
                              deterministic=True), faults=[(AtStep(12), chaos.raylet_kill(rank=1))])
    before_the_next_save(outcome)
    v = resume(outcome)
    assert v.status == "fail" and v.diagnosis == "resumed past the checkpoint", v.line()
    assert "saved at the top of step 10" in v.message, v.line()
