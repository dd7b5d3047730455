"""The state-trajectory verdict: a faulted run followed step by step against a fault-free
baseline of the same workload, each false pass (a restore that lost a part of the state)
beside its healthy twin."""

import json

import pytest

from chaos.baseline import from_run
from chaos.verdicts.states import DIGEST_PARTS, trajectory_of
from chaos.verdicts import Baseline, Expect, judge, Verdict
from chaos.verdicts.trajectory import state_trajectory
from timelines import Script

DET = Expect(deterministic=True)  # the old verdict functions' default


def loss(rank, step):
    return round(1.0 / step + rank * 1e-3, 9)


def digests(step, lost=None, lost_from=11):
    """digest_<part> of the state step ``step`` began from; ``lost`` differs from ``lost_from`` on
    (and, as training goes on from there, the weights and optimizer with it)."""
    out = {f"digest_{p}": f"{p[:4]}{step:012d}" for p in DIGEST_PARTS}
    if lost and step >= lost_from:
        out[f"digest_{lost}"] = "x" * 16
        if step > lost_from:
            out["digest_weights"] = out["digest_optimizer"] = "y" * 16
    return out


def reports(script, first, last, state=loss, lost=None, every=5):
    for s in range(first, last + 1):
        script.report({0: s, 1: s}, f"/storage/checkpoint_{s}" if s % every == 0 else None,
                      {r: state(r, s) for r in (0, 1)}, metrics={"step": s, "loss": state(0, s), **digests(s, lost)})
    return script


def fault_free():
    return reports(Script(state_metric="loss").start_attempt(), 1, 20).finish()


def faulted(state=loss, lost=None, before=loss):
    s = reports(Script(state_metric="loss").start_attempt(), 1, 10, state=before).fault().decision().start_attempt()
    return reports(s, 11, 20, state=state, lost=lost).finish()


def baseline(**kw):
    return Baseline("k1", trajectory=trajectory_of(fault_free().timeline()), job_id="chaos-base-1",
                    made_at="2026-12-03T08:00:00", run_name="base", storage_path="/storage", **kw)


def test_the_trajectory_is_every_ranks_state_at_every_step():
    t = trajectory_of(fault_free().timeline())
    assert sorted(t) == [0, 1] and [row[0] for row in t[0]] == list(range(1, 21))
    assert t[0][10] == [11, {"loss": loss(0, 11), **digests(11)}]
    assert t[1][10] == [11, {"loss": loss(1, 11)}]  # the recorder keeps whole metrics of the first rank only


def test_a_restore_that_brought_everything_back_follows_the_baseline():
    v = state_trajectory(faulted().timeline(), baseline(), DET)
    assert v.status == "pass", v.line()
    assert v.message.startswith("20 report(s) of the restarted attempt(s) at steps 11..20 followed the fault-free "
                                "trajectory (digest_data, digest_optimizer")
    assert "chaos-base-1" in v.message


@pytest.mark.parametrize("part", DIGEST_PARTS)
def test_each_lost_part_fails_naming_the_part_and_the_first_step(part):
    # The step counter came back (resumed-from-latest passes: attempt 1 began at 11), the part did not.
    tl = faulted(lost=part, state=lambda r, s: loss(r, s) * (1.01 if s > 11 else 1)).timeline()
    v = state_trajectory(tl, baseline(), DET)
    assert v.status == "fail" and v.diagnosis == "state not restored", v.line()
    assert v.message.startswith(f"state not restored: step 11 (attempt 1, rank 0) left the fault-free trajectory: "
                                f"digest_{part} {'x' * 16} but ")
    assert v.message.endswith(f"(digest_{part} differs)")
    assert v.evidence["first_divergence"]["step"] == 11


def test_the_first_cause_is_named_where_several_parts_differ_at_once():
    def lost_late(step, lost=None):
        out = digests(step)
        if step >= 11:
            out["digest_weights"] = out["digest_optimizer"] = out["digest_scheduler"] = "z" * 16
        return out

    s = reports(Script(state_metric="loss").start_attempt(), 1, 10).fault().decision().start_attempt()
    for step in range(11, 21):
        s.report({0: step, 1: step}, None, {0: loss(0, step), 1: loss(1, step)},
                 metrics={"step": step, "loss": loss(0, step), **lost_late(step)})
    v = state_trajectory(s.finish().timeline(), baseline(), DET)
    assert "the LR scheduler's state was not restored (digest_scheduler differs; so does digest_optimizer, " \
           "digest_weights)" in v.message


def test_a_loss_only_script_names_the_step_and_the_usual_causes_and_warns_unless_deterministic():
    plain = Baseline("k1", trajectory={r: [[s, {"loss": loss(r, s)}] for s in range(1, 21)] for r in (0, 1)},
                     job_id="j", made_at="now")
    tl = faulted(state=lambda r, s: loss(r, s) * (1.01 if s >= 13 else 1)).timeline()
    v = state_trajectory(tl, plain, Expect(deterministic=False))
    assert v.status == "warning" and v.diagnosis == "state differs", v.line()
    assert v.message.startswith("state differs: step 13 (attempt 1, rank 0) left the fault-free trajectory: loss ")
    assert "usually the optimizer's or LR scheduler's state, the RNG or the data position was not restored" in v.message
    assert state_trajectory(tl, plain, DET).status == "fail"


def test_the_tolerance_decides_what_reproduces():
    tl = faulted(state=lambda r, s: loss(r, s) * 1.001, before=lambda r, s: loss(r, s)).timeline()
    assert state_trajectory(tl, baseline(), DET).status == "fail"
    assert state_trajectory(tl, baseline(), Expect(deterministic=True, state_rtol=1e-2)).status == "pass"


def test_a_run_that_left_the_baseline_before_the_fault_is_unverifiable_not_blamed_on_the_restore():
    tl = faulted(before=lambda r, s: loss(r, s) * 1.01).timeline()
    v = state_trajectory(tl, baseline(), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: baseline not reproduced", v.line()
    assert "step 1 (attempt 0, rank 0) left the fault-free trajectory: loss 1.01 but 1 in the baseline" in v.message
    assert "--chaos-state-rtol" in v.message


def test_no_restart_is_not_applicable_and_steps_the_baseline_never_had_are_unverifiable():
    one = reports(Script(state_metric="loss").start_attempt(), 1, 20).finish().timeline()
    assert state_trajectory(one, baseline(), DET).status == "n/a"
    short = Baseline("k1", trajectory=trajectory_of(reports(Script(state_metric="loss").start_attempt(), 1, 10)
                                                    .finish().timeline()), job_id="j", made_at="now")
    v = state_trajectory(faulted().timeline(), short, DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no step to compare", v.line()


def test_no_baseline_and_no_state_are_unverifiable():
    v = state_trajectory(faulted().timeline(), Baseline("k1", error="the fault-free run broke"), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no baseline"
    plain = Script().start_attempt().steps(1, 10).fault().decision().start_attempt().steps(11, 20).finish()
    v = state_trajectory(plain.timeline(), baseline(), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no state metric", v.line()


def test_a_baseline_that_shared_the_train_run_is_unverifiable():
    shared = Baseline("k1", trajectory=baseline().trajectory, run_name="r", storage_path="/storage")
    script = faulted()
    next(e for e in script.events if e.kind == "controller_started").data["storage_path"] = "/storage"
    v = state_trajectory(script.timeline(), shared, DET)
    assert v.status == "unverifiable" and "same Train run (/storage/r)" in v.message, v.line()


def test_the_verdict_is_opt_in_and_uses_the_expectations_tolerance():
    expect = Expect(charged={"worker_group": 1}, slo_detect_s=10, slo_recover_s=60)
    assert not [v for v in judge(faulted().timeline(), expect) if v.name == "state-trajectory"]
    tl = faulted(state=lambda r, s: loss(r, s) * 1.001).timeline()
    for rtol, status in ((1e-4, "fail"), (1e-2, "pass")):
        expect = Expect(charged={"worker_group": 1}, slo_detect_s=10, slo_recover_s=60, baseline=True, reference=baseline(),
                             deterministic=True, state_rtol=rtol)
        [v] = [v for v in judge(tl, expect) if v.name == "state-trajectory"]
        assert v.status == status, v.line()


def test_a_baseline_keeps_its_trajectory_through_json():
    b = from_run("k", "job1", fault_free().timeline(), [Verdict("run-finished", "pass", "ok")])
    again = Baseline.from_json(json.loads(json.dumps(b.to_json())))
    assert again.trajectory == b.trajectory and again.trajectory[1][19] == [20, {"loss": loss(1, 20)}]
    again.run_name = "base"  # Script names every run "r": the baseline is its own run
    assert state_trajectory(faulted().timeline(), again, DET).status == "pass"


def test_a_restarted_attempt_with_nothing_to_compare_is_not_vouched_for_by_an_earlier_one():
    # two faults: attempt 1 follows the baseline, attempt 2 reports no state value at all
    s = reports(Script(state_metric="loss").start_attempt(), 1, 10).fault().decision().start_attempt()
    s = reports(s, 11, 14).fault().decision().start_attempt()
    s = reports(s, 11, 20, state=lambda r, step: None)
    for e in s.events:
        if e.kind == "report" and e.attempt == 2:
            e.data["metrics"] = {"step": e.data["steps"]["0"]}
    v = state_trajectory(s.finish().timeline(), baseline(), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no step to compare", v.line()
    assert "no step to compare in attempt(s) 2" in v.message, v.line()
    # twin: attempt 2 follows the baseline too
    s = reports(Script(state_metric="loss").start_attempt(), 1, 10).fault().decision().start_attempt()
    s = reports(reports(s, 11, 14).fault().decision().start_attempt(), 11, 20)
    v = state_trajectory(s.finish().timeline(), baseline(), DET)
    assert v.status == "pass", v.line()


def restarted_for(last, state=loss):
    """Steps 1..19 (a checkpoint at 19 only), the fault, then the restart's steps 20..``last``
    (loss only: no digests) by ``state``; the baseline runs to step 21."""
    s = Script(state_metric="loss").start_attempt()
    for st in range(1, 20):
        s.report({0: st, 1: st}, "/storage/ck19" if st == 19 else None, {r: loss(r, st) for r in (0, 1)})
    s.fault().decision().start_attempt()
    for st in range(20, last + 1):
        s.report({0: st, 1: st}, None, {r: state(r, st) for r in (0, 1)})
    return s.finish().timeline()


def base_to_21():
    return Baseline("k21", trajectory={r: [[st, {"loss": loss(r, st)}] for st in range(1, 22)] for r in (0, 1)},
                    job_id="chaos-base-21", made_at="2026-12-03T08:00:00")


def test_a_restart_followed_at_its_first_step_only_shows_the_weights_alone():
    # the restart's one report (step 20) has its loss from before any update: the weights;
    # an optimizer that was not restored shows from the second step, which never came
    v = state_trajectory(restarted_for(20), base_to_21(), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: too few steps followed", v.line()
    assert "attempt(s) 1 reported one step" in v.message, v.line()


def test_twin_a_restart_followed_at_two_steps_is_judged():
    assert state_trajectory(restarted_for(21), base_to_21(), DET).status == "pass"
    # and a second step that left the trajectory fails
    v = state_trajectory(restarted_for(21, state=lambda r, st: loss(r, st) * (1.5 if st == 21 else 1)), base_to_21(),
                         DET)
    assert v.status == "fail" and v.diagnosis == "state not restored", v.line()
