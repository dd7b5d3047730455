"""The final-state verdict and its fault-free baselines, on recorded timelines."""

import dataclasses
import json
import sys

import pytest

from chaos.baseline import BaselineCache, baseline_spec, cache_key, from_run
from chaos.errors import VerificationError
from chaos.train.run import reference_spec, user_spec
from chaos.verdicts import Baseline, check, Expect, judge, Verdict
from chaos.verdicts.final_state import final_state_matches
from chaos.verdicts.states import final_states
from timelines import Script

EXPECT_ONE = Expect(charged={"worker_group": 1}, slo_detect_s=10, slo_recover_s=60)


def loss(rank, step):
    return round(1.0 / step + rank * 1e-3, 9)


def digest(lineage, step):
    return f"{lineage}{step:014d}"[-16:]


def with_digests(script, lineage_of_attempt):
    """Rank 0's metrics carry the reference workload's state_digest, as the recorder keeps them."""
    for e in script.events:
        if e.kind == "report":
            e.data["metrics"]["state_digest"] = digest(lineage_of_attempt(e.attempt), e.data["steps"]["0"])
    return script


def fault_free():
    return with_digests(Script(state_metric="loss").start_attempt().steps(1, 20, state=loss).finish(), lambda a: "a")


def faulted(lineage_after_restart="a", state_after_restart=loss):
    s = (Script(state_metric="loss").start_attempt().steps(1, 12, state=loss).fault().decision()
         .start_attempt().steps(11, 20, state=state_after_restart).finish())
    return with_digests(s, lambda a: "a" if a == 0 else lineage_after_restart)


def baseline_of(script, **kw) -> Baseline:
    return Baseline("k1", final=final_states(script.timeline()), job_id="chaos-base-1", made_at="2026-12-01T12:00:00",
                    run_name="base", storage_path="/storage", **kw)


def test_final_state_is_each_ranks_last_report_with_state_and_digest():
    final = final_states(faulted().timeline())
    assert final == {0: {"step": 20, "state": {"loss": loss(0, 20), "state_digest": digest("a", 20)}},
                     1: {"step": 20, "state": {"loss": loss(1, 20)}}}


def test_equal_final_state_passes():
    v = final_state_matches(faulted().timeline(), baseline_of(fault_free()))
    assert v.status == "pass", v.line()
    assert "rank 0 at step 20" in v.message and "state_digest a00000000000020" in v.message
    assert "rank 1 at step 20 (loss" in v.message and "chaos-base-1" in v.message


def test_restart_that_restored_the_step_but_not_the_optimizer_fails_naming_rank_step_and_values():
    # The resume verdict passes (attempt 1 began at step 11), but the state went another way.
    tl = faulted(lineage_after_restart="b").timeline()
    verdicts = judge(tl, dataclasses.replace(EXPECT_ONE, final_state=True, reference=baseline_of(fault_free())))
    resume = next(v for v in verdicts if v.name.startswith("resumed-from-latest"))
    assert resume.status == "pass"
    [v] = [v for v in verdicts if v.name == "final-state"]
    assert v.status == "fail" and v.diagnosis == "final state differs"
    assert v.message.startswith("final state differs from the fault-free run's: rank 0 at step 20: state_digest "
                                f"{digest('b', 20)} but {digest('a', 20)} in the baseline")
    assert "rank 1" not in v.message  # rank 1's loss matched
    with pytest.raises(VerificationError, match="final state differs"):
        check(verdicts)


def test_a_numeric_state_beyond_the_tolerance_fails_within_it_passes():
    base = baseline_of(fault_free())
    v = final_state_matches(faulted(state_after_restart=lambda r, s: loss(r, s) * (1 + 1e-6)).timeline(), base)
    assert v.status == "pass", v.line()
    v = final_state_matches(faulted(state_after_restart=lambda r, s: loss(r, s) * 1.01).timeline(), base)
    assert v.status == "fail" and "rank 0 at step 20: loss 0.0505 but 0.05 in the baseline" in v.message
    assert "rank 1 at step 20: loss 0.05151 but 0.051 in the baseline" in v.message


def test_a_different_final_step_fails_naming_both_steps():
    base = baseline_of(fault_free())
    short = with_digests(Script(state_metric="loss").start_attempt().steps(1, 18, state=loss).finish(), lambda a: "a")
    v = final_state_matches(short.timeline(), base)
    assert v.status == "fail"
    assert "rank 0 finished at step 18, the baseline at step 20" in v.message


def test_no_state_metric_is_unverifiable_never_a_pass():
    plain = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20).finish()
    v = final_state_matches(plain.timeline(), baseline_of(fault_free()))
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no state metric"
    with pytest.raises(VerificationError, match="unverifiable: no state metric"):
        check([v])


def test_an_unfinished_run_is_unverifiable():
    errored = with_digests(Script(state_metric="loss").start_attempt().steps(1, 12, state=loss)
                           .finish(state="ERRORED"), lambda a: "a")
    v = final_state_matches(errored.timeline(), baseline_of(fault_free()))
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: run did not finish"
    assert "it ended ERRORED" in v.message
    stopped = with_digests(Script(state_metric="loss").start_attempt().steps(1, 12, state=loss), lambda a: "a")
    verdicts = judge(stopped.timeline(), Expect(final_state=True, reference=baseline_of(fault_free())), finished=False)
    [v] = [v for v in verdicts if v.name == "final-state"]
    assert v.status == "unverifiable" and "no final controller state was recorded" in v.message


def test_no_baseline_is_unverifiable_with_the_reason():
    v = final_state_matches(faulted().timeline(), Baseline("k1", error="the fault-free run broke: cluster gone"))
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no baseline"
    assert v.message == "unverifiable: no baseline could be made: the fault-free run broke: cluster gone"


def test_a_baseline_that_shared_the_runs_train_run_is_no_baseline():
    tl = faulted().timeline()
    started = tl.first("controller_started")
    started.data["storage_path"] = "/storage"
    base = baseline_of(fault_free())
    base.run_name = started.data["run_name"]
    v = final_state_matches(tl, base)
    assert v.status == "unverifiable" and "same Train run (/storage/r)" in v.message


def test_the_verdict_is_opt_in():
    assert not [v for v in judge(faulted().timeline(), EXPECT_ONE) if v.name == "final-state"]


# -- the baseline cache ----------------------------------------------------------------
def test_cache_key_ignores_run_name_and_storage_but_not_seed_or_parameters():
    def key(name="a", storage="/s1", **params):
        return cache_key(reference_spec(name, storage, **{"steps": 20, "num_workers": 2, "seed": 0, **params}))[0]

    assert key() == key(name="test_x-1f2e3d", storage="/elsewhere/storage")
    assert key(seed=1) != key()
    assert key(steps=21) != key()
    assert key(num_workers=3) != key()
    material = cache_key(reference_spec("a", "/s1"))[1]
    assert "/s1" not in json.dumps(material) and '"a"' not in json.dumps(material)
    assert material["ray"] and material["code"]


def test_user_script_key_ignores_its_storage_option_and_follows_its_code(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")

    def key(cmd):
        return cache_key(user_spec(cmd, "t-abc123", working_dir=str(tmp_path), state_metric="weights_hash"))[0]

    same = key("python train.py --storage=/b --name y --seed 1")
    assert key("python train.py --storage /a --name x --seed 1") == same
    before = key("python train.py --seed 1")
    assert key("python train.py --seed 2") != before
    script.write_text("print(2)\n")
    assert key("python train.py --seed 1") != before
    # the interpreter by its absolute path (sys.executable), a config file named by the command
    (tmp_path / "cfg.yaml").write_text("lr: 1\n")
    absolute = key(f"{sys.executable} train.py --config cfg.yaml --seed 1")
    (tmp_path / "cfg.yaml").write_text("lr: 2\n")
    assert key(f"{sys.executable} train.py --config cfg.yaml --seed 1") != absolute


def test_cached_baseline_is_reused_and_refresh_makes_a_new_one(tmp_path):
    spec = reference_spec("a", "/s", steps=20, seed=0)
    made = []

    def make(key):
        made.append(key)
        return Baseline(key, final={0: {"step": 20, "state": {"state_digest": "x"}}}, job_id=f"job{len(made)}")

    cache = BaselineCache(tmp_path)
    first = cache.get(spec, make)
    again = cache.get(reference_spec("b", "/other", steps=20, seed=0), make)
    assert len(made) == 1 and not first.cached and again.cached
    assert again.final == first.final and again.job_id == "job1"
    saved = json.loads(cache.path(first.key).read_text())
    assert saved["key_material"]["seed"] == 0 and saved["baseline"]["job_id"] == "job1"
    assert cache.get(spec, make, refresh=True).job_id == "job2" and len(made) == 2
    assert cache.get(spec, make).job_id == "job2"


def test_a_failed_baseline_is_not_cached(tmp_path):
    calls = []

    def make(key):
        calls.append(key)
        return Baseline(key, error="the fault-free run broke")

    cache = BaselineCache(tmp_path)
    spec = reference_spec("a", "/s")
    assert cache.get(spec, make).error and cache.get(spec, make).error
    assert len(calls) == 2 and not list(tmp_path.iterdir())


def test_baseline_from_a_run_takes_its_final_state_or_says_why_not():
    tl = fault_free().timeline()
    ok = from_run("k", "job1", tl, [Verdict("run-finished", "pass", "ok")])
    assert ok.error is None and ok.final[0]["state"]["state_digest"] == digest("a", 20)
    assert ok.run_name == "r"
    bad = from_run("k", "job1", tl, [Verdict("run-finished", "fail", "run failed: ended ERRORED: boom")])
    assert bad.error == "the fault-free run (job job1) failed: run failed: ended ERRORED: boom"
    plain = Script().start_attempt().steps(1, 5).finish().timeline()
    assert from_run("k", "job1", plain, []).error == "the fault-free run (job job1) reported no state value"


def test_baseline_spec_is_its_own_run_with_the_same_parameters():
    spec = reference_spec("t-1", "/s", steps=20, seed=3, checkpoint_on_preemption=True)
    base = baseline_spec(spec, "/s", {})
    assert base.name == "t-1-baseline" and "--name t-1-baseline" in base.entrypoint
    assert base.params == spec.params and cache_key(base)[0] == cache_key(spec)[0]
    # the faults' run environment comes along (nothing armed), so both runs start alike
    assert baseline_spec(spec, "/s", {"LD_PRELOAD": "/shim.so"}).env_vars == {"LD_PRELOAD": "/shim.so"}
    user = user_spec("python train.py", "t-2")
    assert baseline_spec(user, "/s", {}).entrypoint == "python train.py"


def test_baseline_json_round_trip_keeps_integer_ranks():
    b = baseline_of(fault_free())
    again = Baseline.from_json(json.loads(json.dumps(b.to_json())))
    assert again.final == b.final and again.final[1]["step"] == 20


def test_state_digest_sees_the_optimizer_and_survives_a_checkpoint_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    from chaos.train.workloads.reference import state_digest

    def build(momentum):
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 1)
        return m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=momentum)

    m, opt = build(0.9)
    m(torch.ones(2, 4)).sum().backward()
    opt.step()
    torch.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "state.pt")
    restored, ropt = build(0.9)
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    restored.load_state_dict(state["model"])
    ropt.load_state_dict(state["optimizer"])
    assert state_digest(restored, ropt) == state_digest(m, opt)
    weights_only, fresh_opt = build(0.9)
    weights_only.load_state_dict(state["model"])  # the optimizer's momentum was not restored
    assert state_digest(weights_only, fresh_opt) != state_digest(m, opt)
    assert len(state_digest(m, opt)) == 16


def test_the_baseline_run_gets_the_faults_environment_after_what_it_names_is_on_the_hosts(tmp_path, monkeypatch):
    """A CUDA fault's shim is put on the cluster's hosts before the baseline runs, so the
    baseline's LD_PRELOAD names that copy, not one on the harness's machine."""
    import types

    from chaos import baseline, experiment
    from chaos.errors import ChaosError
    from chaos.faults import cuda
    from chaos.report import Reporter

    monkeypatch.setattr(cuda, "deliver_to_workers", lambda ctx: ("/var/tmp/ray-chaos/shim/h/libchaos_cuda.so", 3))
    seen = {}

    class Stop(experiment.Experiment):
        def __init__(self, env, spec, *args, **kwargs):
            seen["env_vars"] = spec.env_vars

        def run(self):
            raise ChaosError("stopped here: the test only looks at the spec")

    monkeypatch.setattr(experiment, "Experiment", Stop)
    env = types.SimpleNamespace(rehearsal=False, out_dir=tmp_path, cluster=None,
                                backend=types.SimpleNamespace(storage_path="/s"))
    said = []
    reporter = Reporter()
    reporter.say = said.append
    result = baseline.baseline_for(env, reference_spec("t-1", "/s", steps=20), [(None, cuda.CudaFault("ecc"))],
                                   "t", reporter, judging=None)
    assert result.error == "the fault-free run broke: stopped here: the test only looks at the spec"
    assert seen["env_vars"]["LD_PRELOAD"] == "/var/tmp/ray-chaos/shim/h/libchaos_cuda.so", seen
    assert "prepare: the CUDA shim at /var/tmp/ray-chaos/shim/h/libchaos_cuda.so on 3 worker hosts" in said


def test_a_rank_whose_state_the_baseline_has_and_the_run_does_not_is_not_passed():
    # rank 1's last report carries no state value, the baseline's does: rank 1 is not compared,
    # so the run is unverifiable, never "every rank ended in the fault-free run's state"
    run = faulted()
    for e in run.events:
        if e.kind == "report" and e.attempt == 1:
            e.data["states"]["1"] = None
    v = final_state_matches(run.timeline(), baseline_of(fault_free()))
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no state metric", v.line()
    assert "rank 1 at step 20 reported no state value in the faulted run but loss in the baseline" in v.message
    # twin: neither run has rank 1's state (a script that reports its loss on rank 0 only)
    base = fault_free()
    for script in (run, base):
        for e in script.events:
            if e.kind == "report":
                e.data["states"]["1"] = None
    v = final_state_matches(run.timeline(), baseline_of(base))
    assert v.status == "pass" and "rank(s) 1 reported no state value in either run, their steps alike" in v.message


def diverged(last):
    """A run whose loss is ``last(step)`` from step 15 on, as the recorder's events log carries a
    NaN or infinite number (the kept rank's metrics; its state value is left out)."""
    s = Script(state_metric="loss").start_attempt().steps(1, 12, state=loss).fault().decision().start_attempt()
    s.steps(11, 20, state=lambda r, st: last(st) if st >= 15 else loss(r, st))
    for e in s.events:
        if e.kind == "report" and e.data["states"]:
            e.data["metrics"]["loss"] = e.data["states"]["0"]
            e.data["states"] = {r: v if v != float("inf") else None for r, v in e.data["states"].items()}
    return s.finish().timeline()


def test_two_runs_that_both_diverged_to_inf_are_not_shown_in_one_state():
    # the faulted run and its baseline both end at an infinite loss: no state value to compare
    base = Baseline("k1", final={0: {"step": 20, "state": {"loss": float("inf")}}, 1: {"step": 20, "state": {}}},
                    job_id="b", made_at="t")
    v = final_state_matches(diverged(lambda st: float("inf")), base)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no state metric", v.line()
    # the twin: both end at the same finite loss
    base = Baseline("k1", final={0: {"step": 20, "state": {"loss": 0.5}}, 1: {"step": 20, "state": {"loss": 0.5}}},
                    job_id="b", made_at="t")
    assert final_state_matches(diverged(lambda st: 0.5), base).status == "pass"
