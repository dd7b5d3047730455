"""preemption-window: the notice, its deadline and the checkpoint made because of it."""


from chaos.verdicts import Expect
from chaos.verdicts.budget import within_budget
from chaos.verdicts.preemption import preemption_window
from chaos.verdicts.resume import resumed_from_latest
from timelines import Script

DET = Expect(deterministic=True)


# -- preemption-window -----------------------------------------------------------------
def preempted_run(jit_step=None):
    """Checkpoints every 10 steps; the notice comes after step 12, the node goes after step 16."""
    s = Script().start_attempt().steps(1, 12, every=10).preemption(window_s=8.0)
    for step in range(13, 17):
        s.report({0: step, 1: step}, f"/storage/checkpoint_{step}" if step == jit_step else None)
    return s.gone().decision(budget_class="preemption")


def test_preemption_window_reports_notice_deadline_and_the_checkpoint_inside():
    tl = preempted_run(jit_step=14).start_attempt().steps(15, 20, every=10).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=True))
    assert v.status == "pass", v.line()
    assert v.evidence["checkpoint_steps"] == [14] and v.evidence["window_s"] == 8.0
    assert "deadline +8.0 s" in v.message and "inside the window at step 14" in v.message
    assert v.evidence["death_reason"].startswith("Terminated due to preemption")
    [resume] = resumed_from_latest(tl, DET)
    assert resume.status == "pass" and resume.evidence["latest_checkpoint_step"] == 14


def test_missing_just_in_time_checkpoint_is_a_finding():
    tl = preempted_run().start_attempt().steps(11, 20, every=10).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=True))
    assert v.status == "fail" and v.diagnosis == "no just-in-time checkpoint", v.line()
    assert "no checkpoint committed inside the window" in v.message


def test_checkpoint_inside_a_window_that_must_have_none_is_a_finding():
    tl = preempted_run(jit_step=14).start_attempt().steps(15, 20, every=10).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=False))
    assert v.status == "fail" and v.diagnosis == "checkpoint inside the preemption window", v.line()
    assert v.message.startswith("checkpoint inside the preemption window: notice at +0 s (drain), deadline +8.0 s")
    assert "checkpoint committed inside the window at step 14" in v.message
    assert v.evidence["checkpoint_steps"] == [14]


def test_checkpoints_only_before_the_notice_and_after_the_node_went_are_outside_the_window():
    # checkpoint 10 before the notice, checkpoint 20 in the attempt after the node went
    tl = preempted_run().start_attempt().steps(11, 20, every=10).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=False))
    assert v.status == "pass" and v.diagnosis is None, v.line()
    assert "no checkpoint committed inside the window" in v.message and v.evidence["checkpoint_steps"] == []


def test_preemption_window_without_expectation_reports_without_passing():
    tl = preempted_run(jit_step=14).start_attempt().steps(15, 20, every=10).finish().timeline()
    [v] = preemption_window(tl, Expect())
    assert v.status == "n/a" and "not required either way" in v.message


def test_preemption_charged_to_the_preemption_budget_is_within_budget():
    tl = preempted_run().start_attempt().steps(11, 20, every=10).finish().timeline()
    v = within_budget(tl, Expect(charged={"preemption": 1}))
    assert v.status == "pass" and "charged 1 to max_preemption_failures" in v.message, v.line()
    v = within_budget(tl, Expect(charged={"worker_group": 1}))
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class", v.line()


def windowed(every, window_checkpoint):
    """Checkpoints every ``every`` steps (None: none) up to step 12, the notice, steps 13..16
    with a checkpoint at ``window_checkpoint``, the node gone, the restart."""
    s = Script().start_attempt().steps(1, 12, every=every).preemption(window_s=8.0)
    for step in range(13, 17):
        s.report({0: step, 1: step}, f"/storage/checkpoint_{step}" if step == window_checkpoint else None)
    return s.gone().decision(budget_class="preemption").start_attempt().steps(window_checkpoint + 1, 20,
                                                                              every=None).finish().timeline()


def test_a_periodic_checkpoint_that_lands_in_the_window_is_no_just_in_time_checkpoint():
    [v] = preemption_window(windowed(5, 15), Expect(checkpoint_in_window=True))
    assert v.status == "fail" and v.diagnosis == "no just-in-time checkpoint", v.line()
    assert "step 15 falls on the script's periodic cadence (every 5 steps from 10)" in v.message
    # the twin: off the cadence, made because of the notice
    [v] = preemption_window(windowed(5, 13), Expect(checkpoint_in_window=True))
    assert v.status == "pass" and "off the periodic cadence (every 5 steps from 10)" in v.message, v.line()


def test_a_window_checkpoint_with_no_cadence_before_the_notice_is_unverifiable():
    [v] = preemption_window(windowed(None, 14), Expect(checkpoint_in_window=True))
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no checkpoint cadence", v.line()


def two_preemptions(second_checkpoint_step):
    """Checkpoints every 5 steps; preemption 1 gets a just-in-time checkpoint at 17 (off the
    cadence); preemption 2's window holds a checkpoint at ``second_checkpoint_step``."""
    s = Script().start_attempt().steps(1, 16, every=5).preemption(window_s=8.0)
    s.report({0: 17, 1: 17}, "/storage/checkpoint_17")
    s.gone().decision(budget_class="preemption").start_attempt().steps(18, 19, every=None)
    s.preemption(node_id="n0", window_s=8.0)
    step = second_checkpoint_step
    s.report({0: step, 1: step}, f"/storage/checkpoint_{step}").report({0: step + 1, 1: step + 1})
    s.gone(node_id="n0").decision(budget_class="preemption").start_attempt()
    return s.steps(step + 1, step + 5, every=None).finish().timeline()


def test_an_earlier_preemptions_just_in_time_checkpoint_does_not_shift_the_cadence():
    # step 20 is the periodic checkpoint (every 5): anchored on preemption 1's just-in-time 17
    # it looked off the cadence and passed as preemption 2's just-in-time checkpoint
    first, second = preemption_window(two_preemptions(20), Expect(checkpoint_in_window=True))
    assert first.status == "pass", first.line()
    assert second.status == "fail" and second.diagnosis == "no just-in-time checkpoint", second.line()
    assert "(every 5 steps from 15)" in second.message and second.evidence["periodic_checkpoint_steps"] == [5, 10, 15]
    # twin: preemption 2's checkpoint at 21 is off the cadence, made for the notice
    first, second = preemption_window(two_preemptions(21), Expect(checkpoint_in_window=True))
    assert second.status == "pass" and "off the periodic cadence (every 5 steps from 15)" in second.message, \
        second.line()


def persisted_early(before_notice: bool):
    """Checkpoints every 10 steps; rank 0 persists an off-cadence checkpoint at step 13 (a
    report Ray commits only once rank 1 reports it too) before or after the notice; the
    commit lands inside the window either way."""
    s = Script().start_attempt().steps(1, 12, every=10)
    if before_notice:
        s.persist("/storage/checkpoint_13", 13).preemption(window_s=8.0)
    else:
        s.preemption(window_s=8.0).persist("/storage/checkpoint_13", 13)
    s.report({0: 13, 1: 13}, "/storage/checkpoint_13", persisted=False).report({0: 14, 1: 14})
    return s.gone().decision(budget_class="preemption").start_attempt().steps(14, 20, every=None).finish().timeline()


def test_a_checkpoint_persisted_before_the_notice_and_committed_after_it_is_no_just_in_time_checkpoint():
    [v] = preemption_window(persisted_early(before_notice=True), Expect(checkpoint_in_window=True))
    assert v.status == "fail" and v.diagnosis == "no just-in-time checkpoint", v.line()
    assert "the checkpoint at step 13 was already on storage 0.5 s before the notice" in v.message
    assert v.evidence["persisted_before_notice"] == [13]
    # the twin: persisted after the notice, off the cadence: made because of it
    [v] = preemption_window(persisted_early(before_notice=False), Expect(checkpoint_in_window=True))
    assert v.status == "pass" and "off the periodic cadence" in v.message, v.line()


def test_a_checkpoint_persisted_after_the_notice_passes_even_when_train_reports_the_notice_later():
    # Train's watcher passes the notice on, and the controller sees a rank's echo of it, after the
    # harness's notice — often in the same poll as the rank's just-in-time checkpoint: the notice
    # itself is the line, so a healthy just-in-time checkpoint is not failed for that order
    s = Script().start_attempt().steps(1, 12, every=10).preemption(window_s=8.0).persist("/storage/checkpoint_13", 13)
    s.events.append(s._e("recorder", "train_preemption_notice", 0.0, attempt=s.attempt, preempted_ranks=[1]))
    s.report({0: 13, 1: 13}, "/storage/checkpoint_13", persisted=False).report({0: 14, 1: 14})
    tl = s.gone().decision(budget_class="preemption").start_attempt().steps(14, 20, every=None).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=True))
    assert v.status == "pass", v.line()


def test_a_window_checkpoint_nobody_was_seen_persisting_is_unverifiable():
    s = Script().start_attempt().steps(1, 12, every=10).preemption(window_s=8.0)
    s.report({0: 13, 1: 13}, "/storage/checkpoint_13", persisted=False)
    tl = s.gone().decision(budget_class="preemption").start_attempt().steps(14, 20, every=None).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=True))
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no persist record", v.line()
