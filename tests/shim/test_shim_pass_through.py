"""Calls the current plan cannot fire on pass straight through (decided when the plan or its
state changes, not per call); every such change must show at the very next call."""

from __future__ import annotations

from chaos.shim.control import arm, read_log
from chaos.shim.plan import Plan


def test_rearming_for_this_symbol_takes_effect_on_the_next_call(shim_env, interactive):
    env = shim_env(Plan(symbols=("cuLaunchKernel",), plan_id="other"))
    drv = interactive("gpa2", "squery", "wait", "squery", "squery", "wait", "squery", "squery", env=env)
    drv.expect("squery 0")  # a plan for another symbol
    drv.expect("waiting")
    this = Plan(symbols=("cuStreamQuery",), error=999, plan_id="this")
    arm(shim_env.control, this)
    drv.resume()
    drv.expect("squery 999")
    drv.expect("squery 0")  # its one shot is spent
    drv.expect("waiting")
    arm(shim_env.control, this)  # re-arming gives the shot back
    drv.resume()
    drv.expect("squery 999")
    drv.expect("squery 0")
    drv.finish()
    assert [(e["event"], e["plan_id"]) for e in read_log(shim_env.log)] == [
        ("arm", "other"), ("arm", "this"), ("inject", "this"), ("arm", "this"), ("inject", "this")]


def test_a_forked_child_gets_back_the_shots_its_parent_spent(run_driver):
    run = run_driver("gpa2", "launch", "launch", "fork", "launch", "launch", plan=Plan(symbols=("cuLaunchKernel",)))
    assert run.results() == [("launch", 719), ("launch", 0), ("child launch", 719), ("child launch", 0)]
    assert [e["call"] for e in run.injections()] == [1, 1]


def test_a_spent_deferred_fault_still_surfaces_at_the_next_sync(run_driver):
    # the first esync resolves the exported wrapper's real pointer, so later ones may take the fast path
    run = run_driver("export", "esync", "launch", "launch", "esync", "esync",
                     plan=Plan(symbols=("cuLaunchKernel",), mode="deferred", error=214))
    assert run.results() == [("esync", 0), ("launch", 0), ("launch", 0), ("esync", 214), ("esync", 0)]

