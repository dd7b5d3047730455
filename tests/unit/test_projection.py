"""ETTR projection: the Monte-Carlo simulation checked against Young/Daly, and `ray-chaos project`.

Agreement rule used throughout: the analytic ETTR lies inside the simulation's 99.9 %
confidence interval (z = 3.29) and within an absolute tolerance of 0.005.  Seeds are
fixed, so every run gives the same outcome; 99.9 % rather than 95 % so that a correct
simulation is not made to fail by one seed in twenty.  That the 95 % interval is right
(covers the analytic value about 95 % of the time) is a test of its own.
"""

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from chaos import cli, projection, summary
from chaos.errors import ChaosError
from chaos.projection import DAY, ettr_daly, ettr_first_order, simulate
from chaos.timeline import Event, Timeline, recovery_metrics

TOLERANCE = 0.005
REPO = Path(__file__).resolve().parents[2]
LLAMA3_PER_GPU_HOUR = 419 / (54 * 24 * 16384)


Z999 = 3.2905


def agrees(sim, analytic):
    low, high = sim.interval(Z999)
    return low <= analytic <= high and abs(sim.ettr - analytic) <= TOLERANCE


# -- simulation against the analytic model -------------------------------------------

CASES = {
    # name: (work, tau, C, R, M, seed)
    "Llama 3 rate at 16k GPUs, hourly checkpoints": (30 * DAY, 3600, 300, 600, 11134, 1),
    "cheap checkpoints, frequent failures": (10 * DAY, 1000, 10, 50, 5000, 2),
    "C not << M (Young's first order is poor)": (20 * DAY, 2000, 600, 300, 3600, 3),
    "partial last interval": (3 * DAY + 1234, 5000, 100, 200, 4000, 4),
    "free checkpoints and restarts": (DAY, 100, 0, 0, 1000, 5),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_simulation_agrees_with_dalys_expectation(case):
    work, tau, C, R, M, seed = CASES[case]
    sim = simulate(work, tau, C, R, M, reps=400, seed=seed)
    analytic = ettr_daly(tau, C, R, M, work)
    assert agrees(sim, analytic), (case, sim, analytic)
    assert sim.half_width < 0.005  # the interval is tight enough for the check to mean something
    assert sim.mean_failures > 10  # failures did happen: the agreement is not the no-failure case


def test_daly_expectation_written_out_for_one_case():
    """Daly's complete model by hand: M e^(R/M) (e^((tau+C)/M) - 1) per interval."""
    tau, C, R, M = 3600, 300, 600, 11134
    per_interval = M * math.exp(R / M) * (math.exp((tau + C) / M) - 1)
    assert ettr_daly(tau, C, R, M) == pytest.approx(tau / per_interval, rel=1e-12)
    assert ettr_daly(tau, C, R, M, work=30 * DAY) == pytest.approx(tau / per_interval, rel=1e-12)  # 720 whole intervals
    assert ettr_first_order(tau, C, R, M) == pytest.approx(1 - 300 / 3600 - (1800 + 600) / 11134)


def test_first_order_is_poor_where_checkpoints_are_not_cheap_relative_to_mtbf():
    work, tau, C, R, M, seed = CASES["C not << M (Young's first order is poor)"]
    sim = simulate(work, tau, C, R, M, reps=400, seed=seed)
    assert ettr_first_order(tau, C, R, M) < sim.low - 0.1  # Young: 0.339; simulated: 0.48
    assert agrees(sim, ettr_daly(tau, C, R, M, work))


def test_confidence_interval_covers_the_analytic_value_about_95_percent_of_the_time():
    tau, C, R, M, work = 600, 30, 60, 3000, DAY
    analytic = ettr_daly(tau, C, R, M, work)
    covered = [simulate(work, tau, C, R, M, reps=100, seed=seed) for seed in range(200)]
    rate = np.mean([s.low <= analytic <= s.high for s in covered])
    assert 0.90 <= rate <= 0.99, rate


def test_simulated_optimum_is_dalys_where_young_is_off():
    """C/M = 1/6: Young says 2078 s, Daly 1698 s; the simulated sweep finds Daly's."""
    C, R, M, work = 600, 300, 3600, 10 * DAY
    young, daly = projection.young_interval(C, M), projection.daly_interval(C, M)
    assert young == pytest.approx(math.sqrt(2 * 600 * 3600))
    assert daly == pytest.approx(young * (1 + math.sqrt(600 / 7200) / 3 + (600 / 7200) / 9) - 600)
    taus = np.geomspace(1000, 4000, 21)
    sims = projection.sweep(work, taus, C, R, M, reps=100, seed=11)
    best = taus[int(np.argmax([s.ettr for s in sims]))]
    assert abs(math.log(best / daly)) < 0.07 < abs(math.log(best / young)), (best, daly, young)
    at_daly = simulate(work, daly, C, R, M, reps=100, seed=11)
    at_young = simulate(work, young, C, R, M, reps=100, seed=11)
    assert at_daly.ettr - at_young.ettr > 0.002  # same random failures: the difference is the interval's


def test_simulated_optimum_is_near_both_where_they_agree():
    C, R, M, work = 60, 120, 44536, 30 * DAY
    young, daly = projection.young_interval(C, M), projection.daly_interval(C, M)
    assert abs(young / daly - 1) < 0.02
    taus = np.geomspace(daly / 3, daly * 3, 21)
    sims = projection.sweep(work, taus, C, R, M, reps=200, seed=12)
    best = taus[int(np.argmax([s.ettr for s in sims]))]
    assert abs(math.log(best / daly)) < 0.2
    assert max(s.ettr for s in sims) - simulate(work, daly, C, R, M, reps=200, seed=12).ettr < 0.002


def test_daly_interval_when_the_checkpoint_outlasts_twice_the_mtbf():
    assert projection.daly_interval(C=800, M=300) == 300


def test_ettr_tends_to_one_as_failures_vanish():
    C, R, gpus = 60.0, 300.0, 16384
    values = []
    for per_gpu_hour in (1e-4, 1e-6, 1e-8, 1e-10):
        M = projection.FailureRate(per_gpu_hour, "test").mtbf_s(gpus)
        tau = projection.daly_interval(C, M)
        sim = simulate(30 * DAY, tau, C, R, M, reps=100, seed=6)
        analytic = ettr_daly(tau, C, R, M, 30 * DAY)
        # at the rarest rate no simulated job fails at all (the interval collapses to a point),
        # so only the tolerance applies there
        assert agrees(sim, analytic) if sim.mean_failures > 1 else abs(sim.ettr - analytic) <= TOLERANCE
        values.append((analytic, sim.ettr))
    assert values == sorted(values)
    assert values[-1][0] > 0.9997 and values[-1][1] > 0.9998
    # no failures at all: the only loss left is the checkpoints' own time
    M = projection.FailureRate(0.0, "none").mtbf_s(gpus)
    assert math.isinf(M)
    assert simulate(10 * DAY, 600, C, R, M, reps=10).ettr == pytest.approx(600 / 660)
    assert simulate(10 * DAY, 600, 0.0, R, M, reps=10).ettr == 1.0
    assert ettr_daly(600, 0.0, R, M) == 1.0


def test_llama3_rate():
    assert projection.LLAMA3.per_gpu_hour == pytest.approx(LLAMA3_PER_GPU_HOUR)
    assert projection.LLAMA3.mtbf_s(16384) / 3600 == pytest.approx(54 * 24 / 419)  # 3.09 h
    assert projection.LLAMA3.mtbf_s(1024) == pytest.approx(16 * projection.LLAMA3.mtbf_s(16384))


# -- a session summary, built with the project's summary code ------------------------

STEP_S, CKPT_EXTRA_S = 2.0, 0.5


def session_timeline(recover_s: float, t0: float = 1000.0) -> Timeline:
    """A run that reports every 2 s, checkpoints every 5 steps (0.5 s extra), loses a node after
    the checkpoint at step 10 and reports step 11 ``recover_s`` after the fault."""
    events, t = [], t0

    def add(source, kind, **data):
        events.append(Event(t, source, kind, {"run_id": "r1", **data} if source == "recorder" else data))

    def reports(attempt, first, last):
        nonlocal t
        for step in range(first, last + 1):
            t += STEP_S + (CKPT_EXTRA_S if step % 5 == 0 else 0.0)
            add("recorder", "report", attempt=attempt, step=step, steps={"0": step, "1": step},
                checkpoint=f"/s/ckpt_{step}" if step % 5 == 0 else None)

    add("recorder", "controller_started", failure_config={"max_failures": 3})
    add("recorder", "attempt_started", attempt=0)
    reports(0, 1, 10)
    t += 0.25
    fault_t = t
    add("fault", "fault_injected", fault="raylet-kill", ledger_id="f1")
    t = fault_t + 3.0
    add("fault", "fault_detected", ledger_id="f1", by="node_dead")
    t = fault_t + 15.0
    add("recorder", "attempt_started", attempt=1)
    t = fault_t + recover_s - STEP_S
    reports(1, 11, 20)
    add("recorder", "run_finished", state="FINISHED")
    return Timeline(events)


def write_session(tmp_path: Path, recover=(25.0, 35.0), with_checkpointing=True) -> Path:
    """summary.json the way the plugin writes it (metrics_for, recoveries, append, merge)."""
    for i, r in enumerate(recover):
        tl = session_timeline(r)
        metrics = summary.metrics_for(tl, {"max_failures": 3})
        if not with_checkpointing:
            metrics.pop("checkpointing")  # a summary from before checkpointing was measured
        summary.append_record(tmp_path / "summary.d", {
            "test": f"suites/test_x.py::test_{i}", "fault_kind": "raylet-kill", "backend": "embedded",
            "outcome": "passed", "verdicts": [], "metrics": metrics,
            "recoveries": [dataclasses.asdict(m) for m in recovery_metrics(tl)]})
    return summary.write_summary(tmp_path / "summary.d", tmp_path / "summary.json")


def test_checkpoint_figures_measured_from_reports():
    figures = summary.checkpoint_figures(session_timeline(25.0))
    assert figures["step_time_s"] == pytest.approx(STEP_S)
    assert figures["checkpoint_cost_s"] == pytest.approx(CKPT_EXTRA_S)
    assert figures["checkpoint_every_steps"] == 5
    assert figures["checkpoint_interval_s"] == pytest.approx(5 * STEP_S)
    assert figures["checkpoints_measured"] == 4  # steps 5, 10, 15, 20


def test_inputs_from_summary(tmp_path):
    inputs = projection.load_inputs(write_session(tmp_path))
    assert inputs.restart.value == pytest.approx(30.0)  # median of 25 and 35
    assert "median of 2 fault(s), time to recover" in inputs.restart.source
    assert inputs.interval.value == pytest.approx(10.0)
    assert inputs.cost.value == pytest.approx(0.5)
    assert inputs.detect == pytest.approx(3.0)
    assert inputs.restart_attempt == pytest.approx(15.0)
    assert inputs.steps_lost == 0
    assert (inputs.faults, inputs.tests) == (2, 2)
    forced = projection.load_inputs(tmp_path / "summary.json", interval=60, cost=5, restart=100)
    assert (forced.interval, forced.cost, forced.restart) == (
        projection.Measured(60, "--checkpoint-interval"), projection.Measured(5, "--checkpoint-cost"),
        projection.Measured(100, "--restart-cost"))


def run_cli(*args, console_script=False):
    script = Path(sys.executable).parent / "ray-chaos"
    command = [str(script)] if console_script and script.exists() else [sys.executable, "-m", "chaos.cli"]
    return subprocess.run([*command, "project", *args], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def table_rows(stdout):
    """(gpus, label) -> (tau text, first-order, Daly, simulated, low, high) from the printed table."""
    rows = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 12 and parts[0].isdigit():
            label = " ".join(parts[3:5])
            rows[(int(parts[0]), label)] = (parts[5] + " " + parts[6], *map(float, parts[7:10]),
                                            float(parts[10].strip("[,")), float(parts[11].strip("]")))
    return rows


def test_cli_on_a_session_summary(tmp_path):
    path = write_session(tmp_path)
    proc = run_cli("--summary", str(path), "--gpus", "16384", console_script=True)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"restart cost R +30 s +\S*summary.json: median of 2 fault\(s\), time to recover", out)
    assert re.search(r"checkpoint interval +10 s +\S*summary.json: median of 2 test\(s\), checkpoint_interval_s", out)
    assert re.search(r"checkpoint cost C +0.5 s +\S*summary.json: median of 2 test\(s\), checkpoint_cost_s", out)
    assert "Llama 3 report: 419 unexpected interruptions in 54 days on 16,384 GPUs" in out
    assert "likely optimistic" in out
    M = 54 * 24 * 3600 / 419
    rows = table_rows(out)
    assert set(rows) == {(16384, "current interval"), (16384, "Young optimum"), (16384, "Daly optimum")}
    tau_text, first, daly, sim, low, high = rows[(16384, "current interval")]
    assert tau_text == "10 s"
    assert first == pytest.approx(1 - 0.5 / 10 - (5 + 30) / M, abs=5e-5)
    expected = 10 / (M * math.exp(30 / M) * (math.exp(10.5 / M) - 1))
    assert daly == pytest.approx(expected, abs=5e-5)
    assert low <= expected <= high and abs(sim - expected) <= TOLERANCE
    young = math.sqrt(2 * 0.5 * M)
    assert rows[(16384, "Young optimum")][0] == f"{young:.3g} s"
    for label in ("Young optimum", "Daly optimum"):
        _, _, d, s, lo, hi = rows[(16384, label)]
        assert d > daly  # the optimum beats checkpointing every 10 s
        assert lo - 5e-5 <= d <= hi + 5e-5


def test_cli_several_sizes_override_and_plot(tmp_path, capsys):
    """In-process (the subprocess test above covers the console script): matplotlib is slow to import."""
    path = write_session(tmp_path)
    png = tmp_path / "ettr.png"
    assert cli.main(["project", "--summary", str(path), "--gpus", "1024,4096", "--gpus", "16384", "--mtbf-hours",
                     "50000", "--checkpoint-cost", "120", "--reps", "50", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert {g for g, _ in rows} == {1024, 4096, 16384}
    assert re.search(r"checkpoint cost C +2.0 min +--checkpoint-cost", out)
    assert "--mtbf-hours 50000 (one GPU)" in out and f"plot: {png}" in out
    for gpus in (1024, 4096, 16384):
        M = 50000 * 3600 / gpus
        assert rows[(gpus, "current interval")][2] == pytest.approx(ettr_daly(10, 120, 30, M), abs=5e-5)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def call_main(capsys, *args):
    try:
        rc = cli.main(["project", *args])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    return rc, capsys.readouterr().err


def test_cli_errors(tmp_path, capsys):
    rc, err = call_main(capsys, "--summary", str(tmp_path / "nope.json"))
    assert rc == 2 and "summary not found" in err and "nope.json" in err

    (tmp_path / "bad.json").write_text("{not json")
    rc, err = call_main(capsys, "--summary", str(tmp_path / "bad.json"))
    assert rc == 2 and "is not JSON" in err

    (tmp_path / "other.json").write_text("[1, 2]")
    rc, err = call_main(capsys, "--summary", str(tmp_path / "other.json"))
    assert rc == 2 and "no 'records' list" in err

    # a session where nothing recovered: no time to recover measured anywhere
    (tmp_path / "empty.json").write_text(json.dumps({"run": {}, "records": [
        {"test": "t", "fault_kind": "raylet-kill", "outcome": "failed",
         "metrics": {"faults": [{"time_to_detect": 2.0, "time_to_recover": None}]}}]}))
    rc, err = call_main(capsys, "--summary", str(tmp_path / "empty.json"))
    assert rc == 2 and "nothing measured to project from" in err and "1 test record(s)" in err

    (tmp_path / "weird.json").write_text(json.dumps({"records": [
        {"test": "t", "recoveries": [{"time_to_recover": "fast"}]}]}))
    rc, err = call_main(capsys, "--summary", str(tmp_path / "weird.json"))
    assert rc == 2 and "time_to_recover = 'fast' is not a non-negative number" in err


def test_cli_summary_without_checkpoint_figures(tmp_path, capsys):
    path = write_session(tmp_path, with_checkpointing=False)
    rc, err = call_main(capsys, "--summary", str(path))
    assert rc == 2 and "no measured checkpoint_interval_s" in err and "--checkpoint-interval" in err
    assert call_main(capsys, "--summary", str(path), "--checkpoint-interval", "600", "--checkpoint-cost", "30",
                     "--reps", "50")[0] == 0


@pytest.mark.parametrize("args, message", [
    (("--gpus", "0"), "'0' must be a finite number > 0"),
    (("--gpus", "lots"), "'lots' is not an integer"),
    (("--gpus", "1024,x"), "'x' is not an integer"),
    (("--failure-rate", "-1"), "'-1' must be a finite number >= 0"),
    (("--mtbf-hours", "inf"), "'inf' must be a finite number > 0"),
    (("--checkpoint-interval", "nan"), "'nan' must be a finite number > 0"),
    (("--checkpoint-cost", "ten"), "'ten' is not a number"),
    (("--failure-rate", "1e-5", "--mtbf-hours", "10"), "not allowed with argument"),
])
def test_cli_bad_numbers(tmp_path, capsys, args, message):
    rc, err = call_main(capsys, "--summary", str(write_session(tmp_path)), *args)
    assert rc == 2 and message in err, err


# -- the report section --------------------------------------------------------------


def test_attach_to_allure_results(tmp_path):
    summary_path = write_session(tmp_path)
    results = tmp_path / "allure-results"
    first = projection.attach(results, summary_path, gpus=(1024, 16384), reps=50)
    again = projection.attach(results, summary_path, gpus=(1024, 16384), reps=50)
    assert first == again and len(list(results.glob("*-globals.json"))) == 1  # regenerating replaces it
    assert not list(results.glob("*-result.json")), "a projection is no test: no test result"
    png, table = (results / a["source"] for a in json.loads(first.read_text())["attachments"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    M = projection.LLAMA3.mtbf_s(16384)
    assert "current interval" in table.read_text() and f"{ettr_daly(10, 0.5, 30, M, 30 * DAY):.4f}" in table.read_text()


def test_attach_refuses_an_empty_session(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"run": {}, "records": []}))
    with pytest.raises(ChaosError, match="nothing measured to project from"):
        projection.attach(tmp_path / "results", tmp_path / "summary.json")
    assert not (tmp_path / "results").exists()


def test_report_generation_adds_the_projection_or_says_why_not(tmp_path, capsys):
    """What `make report` runs (chaos.allure_site with a summary) before calling Allure."""
    from chaos import allure_site

    results = tmp_path / "allure-results"
    allure_site.attach_projection(results, write_session(tmp_path))
    [globals_file] = results.glob("*-globals.json")
    assert [a["name"] for a in json.loads(globals_file.read_text())["attachments"]] == [
        "ETTR projection: ETTR vs checkpoint interval", "ETTR projection: table"]
    (tmp_path / "empty.json").write_text(json.dumps({"run": {}, "records": []}))
    allure_site.attach_projection(tmp_path / "other-results", tmp_path / "empty.json")
    assert "ETTR projection left out of the report: nothing measured to project from" in capsys.readouterr().err
