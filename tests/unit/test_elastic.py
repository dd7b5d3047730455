"""Elastic runs' figures (chaos.summary.elastic_figures) and the fixed-vs-elastic comparison of
`ray-chaos project`, on timelines shaped as Ray 2.60 drives an elastic run (measured:
suites/test_elastic.py): a loss, a timed-out start at the old size, a group of N-1, the
node back, a resize to N with no failure decision."""

import json

import pytest

from chaos import cli, projection, summary
from chaos.errors import ChaosError
from chaos.timeline import Event
from timelines import Script

ELASTIC = {"min_workers": 2, "max_workers": 3, "resize_interval_s": 5.0}


class ElasticScript(Script):
    """A Script whose run is elastic: each attempt says its world size and why it started,
    and Train's sizing decisions are recorded (the recorder's resize_decision)."""

    def __init__(self, elastic=ELASTIC, **kw):
        self.elastic = elastic
        super().__init__(ranks=3, **kw)

    def new_run(self, run_id=None):
        super().new_run(run_id)
        self.events[-1].data["elastic"] = self.elastic
        return self

    def sized(self, workers, cause, dt=0.5):
        self.events.append(self._e("recorder", "resize_decision", dt, attempt=self.attempt, num_workers=workers,
                                   cause=cause))
        return self

    def grow(self, workers, cause, dt=1.0):
        self.ranks = workers
        self.start_attempt(dt)
        self.events[-1].data.update(world_size=workers, cause=cause)
        return self

    def node_back(self, dt=1.0):
        self.events.append(self._e("cluster", "node_alive", dt, node_id="n9", node_ip="127.0.1.3"))
        return self


def three_two_three(charge_the_resize=False):
    """3 ranks; rank 1's node lost after checkpoint 10; a start of 3 times out (a controller
    charge); 2 ranks resume at 11 (each step 0.5 s); the node comes back; Train resizes to 3,
    which restarts from checkpoint 20."""
    s = ElasticScript().sized(3, "start").grow(3, "start").steps(1, 10).fault()
    s.decision().sized(3, "restart", dt=0.1).at(s.t + 10)
    s.decision(budget_class="controller", limit=None, error_types=("ControllerError",
                                                                   "WorkerGroupStartupTimeoutError"))
    s.sized(2, "restart", dt=0.1).grow(2, "restart", dt=8.0).steps(11, 22).node_back(dt=0.2)
    s.sized(3, "resize", dt=6.0)
    if charge_the_resize:
        s.decision()
    return s.grow(3, "resize", dt=10.0).steps(21, 30).finish()


def test_an_elastic_runs_figures_name_each_size_the_loss_the_degraded_time_and_the_resize():
    s = three_two_three()
    fig = summary.elastic_figures(s.timeline())
    assert {k: fig[k] for k in ELASTIC} == ELASTIC
    assert [(a["attempt"], a["world_size"], a["cause"]) for a in fig["attempts"]] == [
        (0, 3, "start"), (1, 2, "restart"), (2, 3, "resize")]
    assert fig["step_time_s"] == {"2": pytest.approx(0.5), "3": pytest.approx(0.5)}
    [loss] = fig["losses"]
    ev = {e.kind + str(e.attempt): e for e in reversed(s.events) if e.kind in ("report", "attempt_started")}
    fault = next(e for e in s.events if e.kind == "fault_injected")
    back = next(e for e in s.events if e.kind == "node_alive")
    assert (loss["world_size_before"], loss["world_size"]) == (3, 2)
    assert loss["time_to_first_report_s"] == pytest.approx(ev["report1"].t - fault.t)
    assert loss["capacity_back_s"] == pytest.approx(back.t - fault.t)
    assert loss["degraded_s"] == pytest.approx(ev["report2"].t - ev["report1"].t)  # until the first report at 3
    [resize] = fig["resizes"]
    decided = [e for e in s.events if e.kind == "resize_decision"][-1]
    assert (resize["attempt"], resize["from"], resize["to"], resize["charged"]) == (2, 2, 3, [])
    assert resize["decided_after_capacity_back_s"] == pytest.approx(decided.t - back.t)
    assert resize["first_report_after_capacity_back_s"] == pytest.approx(ev["report2"].t - back.t)
    assert resize["restart_s"] == pytest.approx(ev["report2"].t - decided.t)


def test_a_charged_resize_shows_its_charge_and_a_fixed_run_has_no_elastic_figures():
    [resize] = summary.elastic_figures(three_two_three(charge_the_resize=True).timeline())["resizes"]
    assert resize["charged"] == [{"decision": "RETRY", "budget_class": "worker_group", "count": 2}]
    fixed = Script(ranks=3).start_attempt().steps(1, 10).fault().decision().start_attempt().steps(11, 15).finish()
    assert summary.elastic_figures(fixed.timeline()) is None
    assert summary.metrics_for(fixed.timeline(), {})["elastic"] is None


def test_a_loss_the_run_waited_out_at_full_size_is_no_degraded_time():
    """The twin of the N-1 case, measured with Ray's default 60 s start timeout: Train sized the
    restart at the old size from a stale view of the cluster and its start waited for the node:
    nothing degraded, nothing resized."""
    s = ElasticScript().sized(3, "start").grow(3, "start").steps(1, 10).fault().decision()
    s.sized(3, "restart", dt=0.1).node_back(dt=20.0).grow(3, "restart", dt=8.0).steps(11, 20).finish()
    fig = summary.elastic_figures(s.timeline())
    [loss] = fig["losses"]
    assert (loss["world_size_before"], loss["world_size"], loss["degraded_s"]) == (3, 3, 0.0)
    assert fig["resizes"] == []


# -- the comparison ----------------------------------------------------------------------

def record(test, timeline):
    return summary.test_record(test, ["raylet-kill"], "embedded", "passed", [], timeline,
                               summary.metrics_for(timeline, summary.failure_config_of(timeline)))


def fixed_run(wait=60.0):
    """3 ranks that wait ``wait`` s for the node before attempt 1 reports."""
    s = Script(ranks=3).start_attempt().steps(1, 10).fault().decision()
    return s.at(s.t + wait).start_attempt().steps(11, 20).finish()


def session(tmp_path, *timelines):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"records": [record(f"t{i}", tl) for i, tl in enumerate(timelines)]}, default=str))
    return path


def test_a_fixed_runs_restart_cost_leaves_the_elastic_runs_out(tmp_path):
    """R is what a fixed-size job pays: an elastic run's first report after a loss (at a smaller
    size) must not pull it down — the buggy case a plain median over every fault would be."""
    elastic, fixed = three_two_three().timeline(), fixed_run().timeline()
    inputs = projection.load_inputs(session(tmp_path, elastic, fixed))
    [only] = [f for r in [record("f", fixed)] for f in r["recoveries"]]
    assert inputs.restart.value == pytest.approx(only["time_to_recover"]) and inputs.faults == 1
    el = inputs.elastic
    [loss] = summary.elastic_figures(elastic)["losses"]
    [resize] = summary.elastic_figures(elastic)["resizes"]
    assert el.first_report.value == pytest.approx(loss["time_to_first_report_s"])
    assert el.degraded.value == pytest.approx(loss["degraded_s"])
    assert el.resize_restart.value == pytest.approx(resize["restart_s"])
    assert el.session_throughput == pytest.approx(2 / 3)
    # a session with no elastic run has nothing to compare
    assert projection.load_inputs(session(tmp_path, fixed)).elastic is None
    with pytest.raises(ChaosError, match="nothing to compare"):
        projection.compare(projection.load_inputs(session(tmp_path, fixed)), [1024])


def test_the_elastic_cost_per_failure_written_out():
    el = projection.ElasticInputs(projection.Measured(30, "m"), projection.Measured(100, "m"),
                                  projection.Measured(20, "m"), 1)
    # first report + (1 - kept) x (degraded - resize restart) + resize restart + tau / 2
    assert projection.elastic_restart_cost(el, tau=600, kept=0.75) == pytest.approx(30 + 0.25 * 80 + 20 + 300)
    assert projection.elastic_restart_cost(el, tau=600, kept=1.0) == pytest.approx(30 + 20 + 300)


def test_compare_projects_both_with_dalys_model_at_each_size(tmp_path):
    inputs = projection.load_inputs(session(tmp_path, three_two_three().timeline(), fixed_run().timeline()),
                                    interval=1800, cost=60)
    rows = projection.compare(inputs, [1024, 16384], gpus_per_node=8, reps=50)
    for row in rows:
        M = projection.LLAMA3.mtbf_s(row.gpus)
        assert row.kept == pytest.approx(1 - 8 / row.gpus)
        assert row.elastic_r == pytest.approx(projection.elastic_restart_cost(inputs.elastic, 1800, row.kept))
        assert row.fixed == pytest.approx(projection.ettr_daly(1800, 60, inputs.restart.value, M, 30 * projection.DAY))
        assert row.elastic == pytest.approx(projection.ettr_daly(1800, 60, row.elastic_r, M, 30 * projection.DAY))
    # the resize's rollback (tau/2 = 15 min) outweighs a one-minute wait for the node: fixed wins here
    assert all(r.fixed > r.elastic for r in rows)


def test_the_cli_prints_the_comparison_only_for_a_session_with_an_elastic_run(tmp_path, capsys):
    both = session(tmp_path, three_two_three().timeline(), fixed_run().timeline())
    assert cli.main(["project", "--summary", str(both), "--gpus", "1024", "--reps", "20",
                     "--gpus-per-node", "4"]) == 0
    out = capsys.readouterr().out
    assert "fixed vs elastic" in out and "kept = 1 - 4/GPUs" in out and "   1024 " in out.split("fixed vs")[1]
    only_fixed = tmp_path / "fixed"
    only_fixed.mkdir()
    assert cli.main(["project", "--summary", str(session(only_fixed, fixed_run().timeline())), "--reps", "20"]) == 0
    assert "fixed vs elastic" not in capsys.readouterr().out


def test_a_session_of_elastic_runs_only_has_no_fixed_restart_cost_unless_given(tmp_path, capsys):
    only = session(tmp_path, three_two_three().timeline())
    assert cli.main(["project", "--summary", str(only)]) == 2
    assert "no fault of a fixed-size run" in capsys.readouterr().err
    assert cli.main(["project", "--summary", str(only), "--restart-cost", "300", "--reps", "20"]) == 0
    assert "fixed vs elastic" in capsys.readouterr().out


def test_elastic_events_are_plain_events():
    """resize_decision and the attempts' world_size/cause survive the timeline's JSON round trip."""
    tl = three_two_three().timeline()
    again = [Event.from_json(json.loads(json.dumps(e.to_json()))) for e in tl.events]
    assert [e.data for e in again if e.kind == "resize_decision"] == [e.data for e in tl.events
                                                                      if e.kind == "resize_decision"]


# -- the workload's parameter ----------------------------------------------------------

def test_the_reference_workload_runs_elastic_with_a_range_and_a_resize_interval():
    from chaos.train.run import reference_spec

    spec = reference_spec("n", "/s", num_workers=(2, 3), resize_interval_s=5.0)
    assert " --num-workers 2-3 " in spec.entrypoint and " --resize-interval 5.0 " in spec.entrypoint
    assert spec.params["num_workers"] == [2, 3] and spec.params["resize_interval"] == 5.0
    fixed = reference_spec("n", "/s", num_workers=3)  # the twin: a fixed group says no interval
    assert " --num-workers 3 " in fixed.entrypoint and "--resize-interval" not in fixed.entrypoint


@pytest.mark.parametrize("params, message", [
    ({"num_workers": (3, 2)}, "1 <= min <= max"),
    ({"num_workers": (0, 2)}, "1 <= min <= max"),
    ({"num_workers": (1, 2, 3)}, "needs \\(min, max\\)"),
    ({"num_workers": 3, "resize_interval_s": 5.0}, "only an elastic run"),
    ({"num_workers": (2, 3), "resize_interval_s": -1.0}, ">= 0 seconds"),
])
def test_a_bad_worker_range_or_interval_is_refused_naming_it(params, message):
    from chaos.errors import WorkloadError
    from chaos.train.run import reference_spec

    with pytest.raises(WorkloadError, match=message):
        reference_spec("n", "/s", **params)


def test_the_workloads_num_workers_option_reads_n_or_min_max():
    import argparse

    from chaos.train.workloads.reference import worker_count

    assert worker_count("3") == 3 and worker_count("2-4") == (2, 4)
    for bad in ("4-2", "0", "two", "2-", "1-2-3"):
        with pytest.raises(argparse.ArgumentTypeError):
            worker_count(bad)


# -- the verdicts across world-size changes ------------------------------------------------

PARTS = ("data", "rng", "scheduler", "optimizer", "weights")


def state(after, path):
    """A state digest: the state after ``after`` steps, reached along ``path`` (an elastic run's
    attempt at another world size trains along another path from its checkpoint on)."""
    return f"{path}:{after}"


def shrink_then_grow(*, saved=True, lost_at_resize=None, lost_at_loss=None, redone_before_loss=True, loss_only=False,
                     faults=True):
    """An elastic run shaped like the reference workload's (rank 0's metrics: digest_<part> of the
    state each step began from, state_digest after it, saved_digest_<part> with a checkpoint):
    3 ranks along path a, lost after step 12 (or right after checkpoint 10); 2 ranks resume from
    checkpoint 10 along path b, committing 15 and 20; resized after step 22 to 3 ranks, which
    resume from checkpoint 20 along path c.  ``lost_at_resize``: a part the resized attempt's
    restore leaves fresh (``lost_at_loss``: the smaller attempt's).  ``loss_only``: no digests at
    all, as most user scripts.  ``faults=False``: the fault-free run, 3 ranks along path a."""
    s = ElasticScript(state_metric="loss").sized(3, "start").grow(3, "start")

    def steps(first, last, path, began_path, restored=()):
        for st in range(first, last + 1):
            began = {p: ("fresh" if p in restored and st == first else state(st - 1, began_path if st == first
                                                                                else path)) for p in PARTS}
            metrics = {} if loss_only else {**{f"digest_{p}": began[p] for p in PARTS},
                                            "state_digest": state(st, path)}
            ck = f"/storage/ck{st}" if st % 5 == 0 else None
            if ck and saved and not loss_only:
                metrics.update({f"saved_digest_{p}": state(st, path) for p in PARTS})
            loss = 1.0 / st if st == first else hash((path, st)) % 1000 / 1000 + 0.001
            s.report({r: st for r in range(s.ranks)}, ck, states={r: loss for r in range(s.ranks)}, metrics=metrics)

    if not faults:
        steps(1, 30, "a", "a")
        return s.finish().timeline()
    steps(1, 12 if redone_before_loss else 10, "a", "a")
    s.fault().decision().sized(3, "restart", dt=0.1).sized(2, "restart", dt=10.0).grow(2, "restart", dt=8.0)
    steps(11, 22, "b", "a", restored=(lost_at_loss,) if lost_at_loss else ())
    s.node_back().sized(3, "resize", dt=6.0).grow(3, "resize", dt=10.0)
    steps(21, 30, "c", "b", restored=(lost_at_resize,) if lost_at_resize else ())
    return s.finish().timeline()


def restored_verdicts(timeline, deterministic=True):
    from chaos.verdicts import Expect
    from chaos.verdicts.state import state_restored

    return state_restored(timeline, Expect(deterministic=deterministic))


def test_a_correct_resize_passes_state_restored_on_the_state_its_first_step_began_from():
    """The false failure it replaces: re-done steps after the resize, at 3 ranks where the
    earlier attempt ran 2, give other losses and whole-state digests, which the rule took for a
    state that was not restored."""
    first, grown = restored_verdicts(shrink_then_grow(saved=False))
    assert (first.status, grown.status) == ("pass", "pass"), (first.line(), grown.line())
    assert "attempt 1 ran 2 ranks, attempt 2 3" in grown.message and "digest_optimizer" in grown.message, grown.line()
    assert [c["world_sizes"] for c in grown.evidence["compared"]] == [(2, 3)], grown.evidence


def test_twin_a_resize_whose_restore_lost_the_optimizer_fails_naming_it():
    _, grown = restored_verdicts(shrink_then_grow(saved=False, lost_at_resize="optimizer"))
    assert grown.status == "fail" and grown.diagnosis.value == "state not restored", grown.line()
    assert "the optimizer's state (momentum, ...) was not restored (digest_optimizer differs)" in grown.message


def test_a_restore_right_after_a_checkpoint_is_proved_by_the_state_the_checkpoint_saved():
    """Nothing re-done (the loss came right after checkpoint 10) left a deterministic run
    unverifiable ('too few re-done steps'); the checkpoint's saved digests prove it, at any size."""
    without = restored_verdicts(shrink_then_grow(saved=False, redone_before_loss=False))[0]
    assert without.status == "unverifiable" and without.diagnosis.value == "unverifiable: too few re-done steps"
    first, grown = restored_verdicts(shrink_then_grow(redone_before_loss=False))
    assert first.status == "pass" and "step 11 began from the state checkpoint step 10 saved" in first.message, \
        first.line()
    assert grown.status == "pass" and "step 21 began from the state checkpoint step 20 saved" in grown.message, \
        grown.line()


def test_twin_a_restore_that_left_a_part_fresh_differs_from_what_the_checkpoint_saved():
    _, grown = restored_verdicts(shrink_then_grow(saved=True, lost_at_resize="data"))
    assert grown.status == "fail" and "the data position (sampler, cursor) was not restored" in grown.message, \
        grown.line()
    compared = {(c["step"], c["against_checkpoint"], tuple(c["differ"])) for c in grown.evidence["compared"]}
    assert (21, 20, ("digest_data",)) in compared, compared  # against the state checkpoint 20 saved


def test_a_loss_only_script_is_not_judged_across_a_resize():
    """Without digests nothing the resized attempt re-did compares: never 'state not restored'
    for a loss that follows the world size; unverifiable when declared deterministic, not
    checked otherwise — each saying why."""
    grown = restored_verdicts(shrink_then_grow(loss_only=True))[1]
    assert grown.status == "unverifiable" and "attempt 1 ran 2 ranks, attempt 2 3" in grown.message, grown.line()
    grown = restored_verdicts(shrink_then_grow(loss_only=True), deterministic=False)[1]
    assert grown.status == "n/a" and "across a world-size change" in grown.message, grown.line()


def budget(timeline):
    from chaos.verdicts import Expect
    from chaos.verdicts.budget import within_budget

    return within_budget(timeline, Expect(charged={"worker_group": 1}))


def test_a_resize_is_charged_to_no_budget_and_a_charged_one_is_a_finding():
    ok = budget(three_two_three().timeline())
    assert ok.status == "pass" and "charged 1 to max_failures=3" in ok.message, ok.line()
    charged = budget(three_two_three(charge_the_resize=True).timeline())
    assert charged.status == "fail", charged.line()


def trajectory(timeline):
    from chaos.verdicts import Baseline, Expect
    from chaos.verdicts.states import trajectory_of
    from chaos.verdicts.trajectory import state_trajectory

    baseline = Baseline("k", trajectory=trajectory_of(shrink_then_grow(faults=False)), job_id="b")
    return state_trajectory(timeline, baseline, Expect(deterministic=True))


def test_the_trajectory_follows_an_elastic_run_only_along_the_baselines_path():
    """The fault-free run kept 3 ranks: the 2-rank attempt is followed at its first report (the
    state it began from), not after its first update; the grown attempt, begun from a
    checkpoint the 2 ranks committed, not at all — unverifiable naming why, where before every
    step after the shrink was 'state not restored'."""
    v = trajectory(shrink_then_grow())
    assert v.status == "unverifiable" and v.diagnosis.value == "unverifiable: no step to compare", v.line()
    assert "attempt 2: it began from a checkpoint attempt 1 committed off the baseline's path" in v.message
    assert v.evidence["off_the_baselines_path"] == {1: "it ran 2 ranks, the baseline 3", 2: v.evidence[
        "off_the_baselines_path"][2]}


def test_twin_a_shrunk_attempt_that_began_from_a_lost_part_leaves_the_trajectory():
    v = trajectory(shrink_then_grow(lost_at_loss="rng"))
    assert v.status == "fail" and "the RNG state was not restored (digest_rng differs)" in v.message, v.line()
    assert "step 11 (attempt 1, rank 0)" in v.message, v.line()


def test_an_elastic_run_that_shrank_has_no_fault_free_final_state_to_match():
    """The false failure it replaces: its end, trained partly at 2 ranks, is not the fault-free
    run's (3 ranks all the way) — unverifiable, never 'final state differs'; a run that kept its
    size is still compared (the twin)."""
    from chaos.verdicts import Baseline
    from chaos.verdicts.final_state import final_state_matches
    from chaos.verdicts.states import final_states

    base = Baseline("k", final=final_states(shrink_then_grow(faults=False)), job_id="b")
    v = final_state_matches(shrink_then_grow(), base)
    assert v.status == "unverifiable" and v.diagnosis.value == "unverifiable: no baseline", v.line()
    assert "attempt 1: it ran 2 ranks, the baseline 3" in v.message, v.line()
    same = final_state_matches(shrink_then_grow(faults=False), base)
    assert same.status == "pass", same.line()


def evaluated_after_restore(size):
    """3 ranks, lost after step 12 (checkpoint 10); the restart, at ``size`` ranks, evaluates
    at step 10 after loading checkpoint 10, then trains on: its step 11's loss is attempt 0's
    at the same size (the state and the batch alike), another at another size."""
    s = ElasticScript(state_metric="loss").sized(3, "start").grow(3, "start")
    for st in range(1, 13):
        s.report({r: st for r in range(3)}, f"/storage/ck{st}" if st % 5 == 0 else None,
                 states={r: 10.0 / st for r in range(3)})
    s.fault().decision().sized(size, "restart").grow(size, "restart", dt=8.0)
    s.report({r: 10 for r in range(size)}, states={r: 99.0 for r in range(size)})
    for st in range(11, 21):
        s.report({r: st for r in range(size)}, states={r: 10.0 / st * (1 if size == 3 else 1.5) for r in range(size)})
    return s.finish().timeline()


def test_an_evaluation_after_a_restore_at_another_world_size_is_not_judged_by_the_old_sizes_loss():
    """The resume rule decides a first report at the checkpoint's own step by the next trained
    step's loss against an earlier attempt's; at another world size that loss differs rightly:
    unverifiable, not 'state not restored'.  The twin at the same size still passes."""
    from chaos.verdicts import Expect
    from chaos.verdicts.resume import resumed_from_latest

    [other] = resumed_from_latest(evaluated_after_restore(2), Expect(deterministic=True))
    assert other.status == "unverifiable" and other.diagnosis.value == "unverifiable: resumed at the checkpoint's " \
        "own step", other.line()
    [same] = resumed_from_latest(evaluated_after_restore(3), Expect(deterministic=True))
    assert same.status == "pass" and "evaluating after loading it" in same.message, same.line()
