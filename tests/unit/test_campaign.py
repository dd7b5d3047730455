"""Seeded campaigns: deterministic draws, the spacing rule, replay files, and the triggers
they use (step, checkpoint phase, delay after the previous recovery)."""

import json
import re
import threading
import time

import pytest

from chaos.campaign import Schedule, ScheduleError, check_kinds, draw, drawn
from chaos.errors import WaitTimeout
from chaos.faults.raylet import RayletKill
from chaos.timeline import Timeline
from chaos.triggers import AfterRecovery, AtStep, CheckpointPhase

RUN = dict(ranks=2, steps=109, checkpoint_every=5, step_time=1.0)
KINDS = ["raylet-kill", "worker-kill", "preempt", "partition", "node-reboot"]


def campaign(seed=1, kinds=KINDS, faults=3, **run):
    return draw(seed, kinds, faults=faults, **{**RUN, **run})


# -- drawing -------------------------------------------------------------------------
def test_same_seed_same_schedule_and_kind_order_does_not_matter():
    assert campaign(5) == campaign(5) == campaign(5, kinds=list(reversed(KINDS)))


def test_different_seeds_draw_different_schedules():
    drawn = {json.dumps(campaign(seed).to_json()["entries"]) for seed in range(10)}
    assert len(drawn) == 10


def test_draw_uses_its_own_random_not_the_global_one():
    import random

    random.seed(1)
    a = campaign(3)
    random.seed(2)
    assert campaign(3) == a


def test_only_allowed_kinds_are_drawn():
    for seed in range(50):
        assert {e.kind for e in campaign(seed, kinds=["preempt", "worker-kill"]).entries} <= {"preempt", "worker-kill"}
    assert {e.kind for e in campaign(1, kinds=["raylet-kill"]).entries} == {"raylet-kill"}


def test_spacing_every_fault_after_the_previous_ones_reach_and_inside_the_run():
    """Every gap >= min_gap_steps (a delay: that many steps' time), every trigger fires before
    the last step, and the run has min_gap_steps left after the last fault's reach."""
    seen = set()
    for seed in range(200):
        s = campaign(seed, faults=3)
        w, reach = s.workload, 0
        for e in s.entries:
            seen.add(e.trigger["at"] + e.trigger.get("phase", ""))
            gap = e.gap(reach, w)
            if "steps" in gap:
                assert gap["steps"] >= s.min_gap_steps, (seed, e)
            else:
                assert gap["seconds"] >= s.min_gap_steps * w.step_time, (seed, e)
            assert e.fires(reach, w)[1] < w.steps, (seed, e)
            reach = e.reach(reach, w)
        assert reach <= w.steps - s.min_gap_steps, (seed, s.entries)
        assert 0 <= min(e.rank for e in s.entries) and max(e.rank for e in s.entries) < 2
    assert seen == {"step", "checkpointbefore", "checkpointduring", "checkpointafter", "after-recovery"}


def test_a_preemption_keeps_the_next_fault_past_its_deadline():
    s = campaign(0, kinds=["preempt"], faults=2)
    first, second = s.entries
    reach = first.reach(0, s.workload)
    assert reach == first.fires(0, s.workload)[1] + 5 + int(first.params["deadline_s"])
    if second.trigger["at"] != "after-recovery":
        assert second.fires(reach, s.workload)[0] >= reach + s.min_gap_steps


def test_too_many_faults_for_the_run_are_refused_with_the_numbers():
    with pytest.raises(ScheduleError, match=r"5 faults do not fit into a 109-step run: .* slot of at least 36 steps"):
        campaign(faults=5, kinds=["preempt"])


@pytest.mark.parametrize("kind, message", [
    ("meteor", r"unknown fault kind 'meteor'; known kinds: raylet-kill, worker-kill"),
    ("cuda", r"fault kind 'cuda' is not drawn into campaigns: it arms the run's environment when the run is submitted"),
    ("xid", r"fault kind 'xid' is not drawn into campaigns: it arms the run's environment"),
])
def test_kinds_a_campaign_cannot_draw_are_refused_by_name(kind, message):
    with pytest.raises(ScheduleError, match=message):
        campaign(kinds=["raylet-kill", kind])


# -- replay --------------------------------------------------------------------------
class FakeChaos:
    """The fixture's one factory, as a schedule uses it (the session's --chaos-raylet-kill
    sigkill), recording each call."""

    def __init__(self):
        self.calls = []

    def fault(self, kind, **params):
        from chaos.faults.base import FaultSettings
        from chaos.faults.registry import fault_class

        self.calls.append((kind, params))
        return fault_class(kind).build(FaultSettings(raylet_kill="sigkill"), **params)


def test_dump_load_round_trip_and_replay_builds_the_same_faults(tmp_path):
    s = campaign(11, faults=3)
    path = s.dump(tmp_path / "runs" / "t" / "schedule.json")
    again = Schedule.load(path)
    assert again == s and again.to_json() == s.to_json() == json.loads(path.read_text())
    assert [t.describe() for t in again.triggers()] == [t.describe() for t in s.triggers()]
    chaos = FakeChaos()
    built = again.to_faults(chaos)
    assert [t for t, _ in built] == s.triggers()
    assert [(f.kind, f.rank) for _, f in built] == [(e.kind, e.rank) for e in s.entries]
    assert [kind for kind, _ in chaos.calls] == [e.kind for e in s.entries]
    for (_, fault), e in zip(built, s.entries):
        if e.kind == "preempt":
            assert (fault.via, fault.deadline_s) == ("drain", e.params["deadline_s"])
        if e.kind == "raylet-kill":
            assert isinstance(fault, RayletKill) and fault.method == "sigkill"


def test_charges_count_each_budget_class():
    s = campaign(2, kinds=["raylet-kill", "preempt"], faults=3)
    kinds = [e.kind for e in s.entries]
    assert s.charges() == {c: n for c, n in (("worker_group", kinds.count("raylet-kill")),
                                             ("preemption", kinds.count("preempt"))) if n}


def test_charges_follow_the_profiles_expected_budget_as_the_suites_do():
    """A profile that expects raylet kills charged to the preemption budget (a platform that
    drains first) moves the campaign's charges too — else the campaign sizes max_failures
    for charges that go elsewhere, and judges them so."""
    from chaos.profile import profile_from_dict

    p = profile_from_dict({"name": "staging", "ray": {"dashboard_url": "http://10.0.0.1:8265",
                                                      "gcs_address": "10.0.0.1:6379"},
                           "storage": {"path": "/mnt/shared/chaos"},
                           "faults": {"raylet-kill": {"expected_budget": "preemption"}}})
    s = campaign(2, kinds=["raylet-kill", "preempt"], faults=3)
    kinds = [e.kind for e in s.entries]
    assert "raylet-kill" in kinds, kinds
    assert s.charges(p) == {"preemption": len(kinds)}
    assert s.charges() == {c: n for c, n in (("worker_group", kinds.count("raylet-kill")),
                                             ("preemption", kinds.count("preempt"))) if n}


def write(tmp_path, data) -> str:
    path = tmp_path / "schedule.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def good() -> dict:
    return {"version": 1, "seed": 4, "kinds": ["raylet-kill", "preempt"],
            "workload": {"steps": 60, "checkpoint_every": 5, "step_time": 1.0, "num_workers": 2},
            "min_gap_steps": 5,
            "entries": [{"kind": "raylet-kill", "rank": 1, "params": {}, "trigger": {"at": "step", "step": 12}},
                        {"kind": "preempt", "rank": 0, "params": {"deadline_s": 8.0},
                         "trigger": {"at": "checkpoint", "step": 25, "phase": "during", "offset_s": 0.5}},
                        {"kind": "raylet-kill", "rank": 0, "params": {},
                         "trigger": {"at": "after-recovery", "delay_s": 6}}]}


def test_a_hand_written_schedule_loads(tmp_path):
    s = Schedule.load(write(tmp_path, good()))
    assert [e.trigger["at"] for e in s.entries] == ["step", "checkpoint", "after-recovery"]
    assert s.to_json()["entries"][1]["gap"] == {"steps": 7}  # step 24 after the kill's reach, 12 + 5


def bad(edit):
    data = good()
    edit(data)
    return data


@pytest.mark.parametrize("data, message", [
    ("{\"version\": 1,", r"schedule.json: not JSON: .* line 1"),
    ([], r"schedule.json: a schedule is a JSON object, got list"),
    (bad(lambda d: d.pop("seed")), r"schedule.json: missing field seed"),
    (bad(lambda d: d["entries"][0].pop("trigger")), r"schedule.json: missing field entries\[0\].trigger$"),
    (bad(lambda d: d.update(entries=[])), r"field entries is empty: a campaign has at least one fault"),
    (bad(lambda d: d["workload"].update(steps="60")), r"field workload.steps must be int, got '60'"),
    (bad(lambda d: d.update(version=2)), r"field version is 2; this harness reads version 1"),
    (bad(lambda d: d.update(kinds=["raylet-kill", "meteor"])), r"field kinds: unknown fault kind 'meteor'; known"),
    (bad(lambda d: d["entries"][0].update(kind="worker-kill")),
     r"entries\[0\] \(worker-kill\): kind 'worker-kill' is not among the schedule's kinds"),
    (bad(lambda d: d["entries"][0].update(rank=2)), r"entries\[0\] \(raylet-kill\): rank 2 does not exist in a run of 2"),
    (bad(lambda d: d["entries"][1]["params"].update(deadline_s=99)), r"params.deadline_s=99; expected one of"),
    (bad(lambda d: d["entries"][0]["trigger"].update(step=60)),
     r"entries\[0\] \(raylet-kill\): trigger fires as late as step 60, outside the run: the last step is 60"),
    (bad(lambda d: d["entries"][2]["trigger"].update(delay_s=30)), r"entries\[2\] .* outside the run"),
    (bad(lambda d: d["entries"][1]["trigger"].update(step=15)),
     r"entries\[1\] \(preempt\): trigger can fire at step 14, but the run may have reached step 17 .* past step 17"),
    (bad(lambda d: d["entries"][1]["trigger"].update(step=24)), r"trigger.step 24 is not a checkpoint step"),
    (bad(lambda d: d["entries"][1]["trigger"].update(phase="sometime")),
     r"field entries\[1\].trigger: checkpoint phase 'sometime' unknown"),
    (bad(lambda d: d["entries"][1]["trigger"].pop("offset_s")), r"offset_s > 0 is needed for 'during'"),
    (bad(lambda d: d["entries"][0]["trigger"].update(at="whenever")), r"trigger.at is 'whenever'; expected one of"),
    (bad(lambda d: d["entries"][0].update(gap={"steps": 3})),
     r"entries\[0\].gap is \{'steps': 3\}, but its trigger and the previous fault imply \{'steps': 12\}"),
])
def test_bad_schedules_name_the_file_and_the_field(tmp_path, data, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule.load(write(tmp_path, data))


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ScheduleError, match=r"nope.json: cannot read the schedule"):
        Schedule.load(tmp_path / "nope.json")


def test_every_catalog_kind_is_drawn_or_says_why_from_the_closed_list_and_has_its_factory():
    """A kind is one catalog entry and one Fault class: the entry says how a campaign draws it or
    why it never does (one of catalog.NOT_DRAWN's reasons, which --chaos-campaign-kinds repeats),
    and the class that declares the kind is its factory (``Fault.build``); only a kind marked
    ``planned`` may have none."""
    from chaos.faults import catalog
    from chaos.faults.base import Fault
    from chaos.faults.registry import fault_class, implementations

    for name, entry in catalog.KINDS.items():
        assert (entry.draw is None) != (entry.not_drawn is None), name
        if entry.not_drawn is None:
            check_kinds([name])
        else:
            assert entry.not_drawn in catalog.NOT_DRAWN, name
            with pytest.raises(ScheduleError, match=f"fault kind '{name}' is not drawn into campaigns: "
                                                    f"{re.escape(catalog.NOT_DRAWN[entry.not_drawn])}"):
                check_kinds([name])
        if entry.not_drawn == "planned":
            assert name not in implementations(), f"{name} is marked planned but has an implementation"
            continue
        cls = fault_class(name)
        assert cls.kind == name and issubclass(cls, Fault) and callable(cls.build)
    assert drawn() == [k for k, e in catalog.KINDS.items() if e.draw is not None]


def test_a_kind_entry_without_a_draw_or_a_reason_or_with_an_unknown_one_is_refused():
    from chaos.faults import catalog

    with pytest.raises(ValueError, match="give exactly one of draw= and not_drawn="):
        catalog.FaultKind("melt", "worker_group")
    with pytest.raises(ValueError, match="not_drawn 'too-hot' is none of arms-the-run, "):
        catalog.FaultKind("melt", "worker_group", not_drawn="too-hot")
    with pytest.raises(ValueError, match="needs 'lasers', not a capability"):
        catalog.FaultKind("melt", "worker_group", needs="lasers", draw=catalog.Draw())


# -- triggers ------------------------------------------------------------------------
def report(tl, attempt, step, checkpoint=False):
    tl.emit("recorder", "report", attempt=attempt, step=step, checkpoint=f"/ck/{step}" if checkpoint else None)


def later(seconds, fn):
    threading.Timer(seconds, fn).start()


def test_fresh_step_ignores_reports_from_before_the_restart():
    tl = Timeline()
    report(tl, 0, 20)  # the previous attempt got further than the restart resumes
    tl.emit("recorder", "attempt_started", attempt=1)
    report(tl, 1, 16)
    assert AtStep(18).wait(tl, timeout=1).data["step"] == 20  # the old rule: any attempt
    later(0.05, lambda: report(tl, 1, 18))
    assert AtStep(18, fresh=True).wait(tl, timeout=5).attempt == 1


def test_checkpoint_phases_before_and_after():
    tl = Timeline()
    report(tl, 0, 1)
    later(0.05, lambda: (report(tl, 0, 9), report(tl, 0, 10, checkpoint=True)))
    assert CheckpointPhase(10, "before").wait(tl, timeout=5).data["step"] == 9
    assert CheckpointPhase(10, "after").wait(tl, timeout=5).data["checkpoint"] == "/ck/10"


def test_checkpoint_phase_during_fires_its_offset_after_the_step_before():
    tl = Timeline()
    report(tl, 0, 9)
    t0 = time.time()
    fired = CheckpointPhase(10, "during", offset_s=0.2).wait(tl, timeout=5)
    assert fired.kind == "trigger_delay_elapsed" and 0.15 < time.time() - t0 < 1.0


def test_checkpoint_phase_during_fires_at_once_when_the_commit_comes_first():
    tl = Timeline()
    report(tl, 0, 9)
    later(0.05, lambda: report(tl, 0, 10, checkpoint=True))
    t0 = time.time()
    fired = CheckpointPhase(10, "during", offset_s=3).wait(tl, timeout=5)
    assert fired.data["checkpoint"] == "/ck/10" and time.time() - t0 < 1.0


def test_after_recovery_counts_from_the_running_attempts_first_report():
    tl = Timeline()
    report(tl, 0, 5)
    tl.emit("recorder", "attempt_started", attempt=1)
    later(0.05, lambda: report(tl, 1, 3))
    t0 = time.time()
    fired = AfterRecovery(0.3).wait(tl, timeout=5)
    first = tl.of("report")[-1]
    assert fired.t >= first.t + 0.3 and time.time() - t0 < 1.5


def test_a_delay_stops_when_the_job_ends():
    tl = Timeline()
    report(tl, 0, 5)

    def job_ends():
        tl.emit("recorder", "run_finished", state="FINISHED")
        tl.emit("harness", "job_finished", status="SUCCEEDED")

    later(0.05, job_ends)
    with pytest.raises(WaitTimeout, match="the run already ended"):
        AfterRecovery(5).wait(tl, timeout=10)


def test_trigger_arguments_are_checked():
    with pytest.raises(ValueError, match="offset_s > 0 is needed for 'during' and only for it"):
        CheckpointPhase(10, "after", offset_s=1)
    with pytest.raises(ValueError, match="step >= 2"):
        CheckpointPhase(1, "before")
    with pytest.raises(ValueError, match="cannot be negative"):
        AfterRecovery(-1)
