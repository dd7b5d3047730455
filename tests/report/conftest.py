"""Synthetic timelines (shaped like what the recorder and the fault/cluster watchers emit),
and a small allure-results directory written by allure-pytest itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.errors import ChaosError
from chaos.timeline import Event, Timeline

T0 = 1_700_000_000.0


def ev(t: float, source: str, kind: str, **data) -> Event:
    return Event(t=T0 + t, source=source, kind=kind, data=data)


def reports(attempt: int, steps, t_first: float, every: float = 1.0, checkpoint_every: int = 3, step_metric=True):
    return [
        ev(
            t_first + i * every,
            "recorder",
            "report",
            attempt=attempt,
            step=step if step_metric else None,
            checkpoint=f"/ckpt/{step}" if step % checkpoint_every == 0 else None,
            metrics={"loss": 1.0 / step},
        )
        for i, step in enumerate(steps)
    ]


FAILURE_CONFIG = {"max_failures": 3, "max_preemption_failures": 2, "controller_failure_limit": -1}


def fault(t: float, node: str = "node-1") -> Event:
    return ev(t, "fault", "fault_injected", fault="raylet_kill", target={"node_id": node, "node_ip": "127.0.1.3"}, ledger_id=1)


def detected(t: float) -> Event:
    """What the experiment records when the fault's own detection predicate matched."""
    return ev(t, "fault", "fault_detected", ledger_id=1, by="node_dead")


def recovered() -> Timeline:
    """Raylet killed at step 11 (last checkpoint at 9); attempt 1 resumes at step 10."""
    return Timeline(
        [
            ev(0, "recorder", "controller_started", run_name="r", failure_config=FAILURE_CONFIG),
            ev(1, "recorder", "attempt_started", attempt=0, placement=[]),
            *reports(0, range(1, 12), t_first=2),  # steps 1..11 at t=2..12
            fault(12.5),
            ev(15, "cluster", "node_dead", node_id="node-1", node_ip="127.0.1.3", death_reason="UNEXPECTED"),
            detected(15),
            ev(15.2, "recorder", "failure_decision", attempt=0, decision="RETRY", budget_class="worker_group", count=1, limit=3),
            ev(17, "recorder", "attempt_started", attempt=1, placement=[]),
            *reports(1, range(10, 21), t_first=19),  # steps 10..20 at t=19..29
            ev(20, "cluster", "node_alive", node_id="node-9", node_ip="127.0.1.3"),
            ev(30, "recorder", "run_finished", state="FINISHED", error=None),
        ]
    )


def exhausted() -> Timeline:
    """max_failures=0: the fault is charged, the budget is spent, the run errors out."""
    return Timeline(
        [
            ev(0, "recorder", "controller_started", run_name="r", failure_config={"max_failures": 0}),
            ev(1, "recorder", "attempt_started", attempt=0, placement=[]),
            *reports(0, range(1, 6), t_first=2),
            fault(7),
            ev(9, "cluster", "node_dead", node_id="node-1", node_ip="127.0.1.3", death_reason="UNEXPECTED"),
            detected(9),
            ev(9.5, "recorder", "failure_decision", attempt=0, decision="RAISE", budget_class="worker_group", count=1, limit=0),
            ev(10, "recorder", "run_finished", state="ERRORED", error="retry budget exhausted"),
        ]
    )


def stepless() -> Timeline:
    """The training script reports no `step` metric."""
    return Timeline(
        [
            ev(1, "recorder", "attempt_started", attempt=0, placement=[]),
            *reports(0, range(1, 6), t_first=2, step_metric=False),
            fault(7),
            ev(8, "cluster", "node_dead", node_id="node-1"),
            ev(9, "recorder", "attempt_started", attempt=1, placement=[]),
            *reports(1, range(1, 6), t_first=10, step_metric=False),
        ]
    )


def many_attempts() -> Timeline:
    """A fault every few steps, twelve attempts, no node deaths observed."""
    events = []
    for attempt in range(12):
        base = attempt * 10
        events.append(ev(base, "recorder", "attempt_started", attempt=attempt, placement=[]))
        events += reports(attempt, range(attempt * 2 + 1, attempt * 2 + 6), t_first=base + 1)
        events.append(fault(base + 7))
    return Timeline(events)


@pytest.fixture
def recovered_timeline() -> Timeline:
    return recovered()


@pytest.fixture
def exhausted_timeline() -> Timeline:
    return exhausted()


@pytest.fixture
def stepless_timeline() -> Timeline:
    return stepless()


@pytest.fixture
def many_attempts_timeline() -> Timeline:
    return many_attempts()


# A chaos suite in miniature: what the harness's pytest plugin puts into Allure for a
# recovered run, a run with a failed verdict, and a harness error.
MINI_SUITE = '''
import os
import allure


@allure.feature("raylet_kill")
def test_chaos_recovery():
    allure.dynamic.parameter("time_to_detect", 2.5)
    allure.dynamic.parameter("time_to_recover", 6.5)
    allure.attach.file(os.environ["TIMELINE_PNG"], name="timeline", attachment_type=allure.attachment_type.PNG)


@allure.feature("raylet_kill")
def test_chaos_older_checkpoint():
    assert False, "resumed-from-latest: resumed from an older checkpoint (first step 5, latest committed 9)"


@allure.feature("node_reboot")
def test_chaos_harness_bug():
    raise RuntimeError("fixture exploded before any fault")
'''


@pytest.fixture(scope="session")
def allure_results(tmp_path_factory) -> Path:
    """An allure-results directory written by allure-pytest running MINI_SUITE."""
    from chaos.plot import render_timeline

    root = tmp_path_factory.mktemp("mini-suite")
    png = render_timeline(recovered(), root / "timeline.png", title="raylet_kill: recovered")
    (root / "test_mini_suite.py").write_text(MINI_SUITE)
    results = root / "allure-results"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:chaos",
         f"--alluredir={results}", "test_mini_suite.py"],
        cwd=root,
        env={**os.environ, "TIMELINE_PNG": str(png)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, f"mini suite should end with 1 passed, 2 failed:\n{proc.stdout}\n{proc.stderr}"
    assert len(list(results.glob("*-result.json"))) == 3, proc.stdout
    return results


@pytest.fixture(scope="session")
def allure_installed() -> None:
    """Skip where Node.js or the allure npm package is missing (the skip says what to run)."""
    from chaos.allure_site import allure_cli

    try:
        allure_cli()
    except ChaosError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def allure_report(allure_installed, allure_results, tmp_path_factory) -> Path:
    """The HTML report of MINI_SUITE, with the recovered run's metrics in its summary."""
    from chaos.allure_site import generate
    from chaos.summary import append_record, metrics_for, write_summary

    out = tmp_path_factory.mktemp("report")
    metrics = metrics_for(recovered(), FAILURE_CONFIG)
    append_record(out / "records", {"test": "test_mini_suite.py::test_chaos_recovery", "fault_kind": "raylet_kill",
                                    "backend": "embedded", "outcome": "passed", "verdicts": [], "metrics": metrics})
    summary = write_summary(out / "records", out / "summary.json")
    return generate(allure_results, out / "allure-report", out / "history.jsonl", summary_file=summary, name="mini chaos suite")


@pytest.fixture
def projectable_summary(tmp_path) -> Path:
    """summary.json of one recovered run, with the recoveries the ETTR projection needs."""
    import dataclasses

    from chaos.summary import append_record, metrics_for, write_summary
    from chaos.timeline import recovery_metrics

    tl = recovered()
    append_record(tmp_path / "records", {
        "test": "test_mini_suite.py::test_chaos_recovery", "fault_kind": "raylet_kill", "backend": "embedded",
        "outcome": "passed", "verdicts": [], "metrics": metrics_for(tl, FAILURE_CONFIG),
        "recoveries": [dataclasses.asdict(m) for m in recovery_metrics(tl)]})
    return write_summary(tmp_path / "records", tmp_path / "summary.json")
