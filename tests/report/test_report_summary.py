"""Per-test records and the run summary built from them."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import chaos
from chaos.errors import ChaosError
from chaos.summary import append_record, load_records, metrics_for, summarize, write_summary


def record(test, kind, outcome="passed", ttd=None, ttr=None, lost=None, diagnosis=None, backend="embedded"):
    verdicts = [{"name": "resumed-from-latest", "status": "fail" if diagnosis else "pass", "diagnosis": diagnosis,
                 "message": diagnosis or "ok", "evidence": {}}]
    metrics = {"time_to_detect": ttd, "time_to_recover": ttr, "steps_lost": lost, "ettr": None, "charged": {}}
    return {"test": test, "fault_kind": kind, "backend": backend, "outcome": outcome, "verdicts": verdicts, "metrics": metrics}


def failure_config(timeline):
    return timeline.first("controller_started").data["failure_config"]


def test_metrics_for_recovered_run(recovered_timeline):
    m = metrics_for(recovered_timeline, failure_config(recovered_timeline))
    assert m["time_to_detect"] == pytest.approx(2.5)
    assert m["time_to_recover"] == pytest.approx(6.5)
    assert m["steps_lost"] == 2
    assert 0 < m["ettr"] < 1
    assert m["charged"] == {
        "worker_group": {"count": 1, "limit": 3},
        "preemption": {"count": 0, "limit": 2},
        "controller": {"count": 0, "limit": -1},
    }
    assert len(m["faults"]) == 1
    json.dumps(m)  # goes into summary.json as is


def test_metrics_for_exhausted_run_takes_last_decision(exhausted_timeline):
    m = metrics_for(exhausted_timeline, failure_config(exhausted_timeline))
    assert m["time_to_recover"] is None and m["steps_lost"] is None
    assert m["charged"]["worker_group"] == {"count": 1, "limit": 0}
    assert m["charged"]["preemption"] == {"count": 0, "limit": None}


def test_charged_counts_the_run_the_faults_hit_as_within_budget_does():
    """A later run's own failure (an evaluation fit() after the faulted one) is that run's
    budget: the summary's charged figures and the within-budget verdict read the runs the
    faults hit, not whichever decision came last."""
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parents[1] / "unit"))
    from timelines import Script

    from chaos.verdicts.budget import charged

    s = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 22)
    s.fault().decision().start_attempt().steps(21, 30).finish()
    s.new_run().start_attempt().steps(1, 3).decision().start_attempt().steps(1, 4).finish()
    tl = s.timeline()
    assert [(e.data["run_id"], e.data["count"]) for e in tl.of("failure_decision")] == [
        ("run1", 1), ("run1", 2), ("run2", 1)]
    m = metrics_for(tl, {"max_failures": 3})
    assert m["charged"]["worker_group"] == {"count": 2, "limit": 3} and charged(tl)["worker_group"]["count"] == 2


def test_metrics_for_worst_of_several_faults(many_attempts_timeline):
    m = metrics_for(many_attempts_timeline, {"max_failures": 20})
    assert m["time_to_detect"] is None  # no node death was observed
    assert m["time_to_recover"] == pytest.approx(4.0)
    assert m["steps_lost"] == 11 * 3
    assert len(m["faults"]) == 12


def test_summary_medians_per_fault_kind(tmp_path):
    records = tmp_path / "records"
    append_record(records, record("s/test_a.py::t[1]", "raylet_kill", ttd=1.0, ttr=10.0, lost=2))
    append_record(records, record("s/test_a.py::t[2]", "raylet_kill", ttd=3.0, ttr=30.0, lost=0))
    append_record(records, record("s/test_a.py::t[3]", "raylet_kill", "failed", ttd=2.0, ttr=None, lost=None,
                                  diagnosis="resumed from an older checkpoint"))
    append_record(records, record("s/test_b.py::t", "drain", ttd=None, ttr=5.0))
    out = write_summary(records, tmp_path / "summary.json")
    summary = json.loads(out.read_text())
    run = summary["run"]
    assert run["tests"] == 4
    assert run["outcomes"] == {"passed": 3, "failed": 1}
    assert run["diagnoses"] == {"resumed from an older checkpoint": 1}
    raylet = run["by_fault_kind"]["raylet_kill"]
    assert raylet["tests"] == 3
    assert raylet["median_time_to_detect"] == 2.0
    assert raylet["median_time_to_recover"] == 20.0  # missing values are left out, not zero
    assert raylet["median_steps_lost"] == 1.0
    assert raylet["median_ettr"] is None
    assert run["by_fault_kind"]["drain"]["median_time_to_detect"] is None
    assert len(summary["records"]) == 4


def test_rerun_replaces_its_own_record_only(tmp_path):
    append_record(tmp_path, record("t::x", "raylet_kill", "failed"))
    append_record(tmp_path, record("t::x", "raylet_kill", "passed"))
    append_record(tmp_path, record("t::x", "raylet_kill", "passed", backend="staging"))
    assert sorted(r["outcome"] + "/" + r["backend"] for r in load_records(tmp_path)) == ["passed/embedded", "passed/staging"]


APPENDER = textwrap.dedent(
    """
    import sys
    from chaos.summary import append_record
    directory, worker = sys.argv[1], sys.argv[2]
    for i in range(20):
        append_record(directory, {"test": f"t.py::test[{worker}-{i}]", "fault_kind": "raylet_kill",
                                  "outcome": "passed", "metrics": {"time_to_detect": float(i)}})
    """
)


def test_parallel_sessions_append_safely(tmp_path):
    repo = Path(chaos.__file__).resolve().parents[1]
    workers = [subprocess.Popen([sys.executable, "-c", APPENDER, str(tmp_path), str(w)], cwd=repo) for w in range(4)]
    assert [w.wait(timeout=60) for w in workers] == [0] * 4
    assert summarize(load_records(tmp_path))["tests"] == 80
    assert not list(tmp_path.glob(".record-*")), "temporary files were left behind"


def test_bad_records_are_refused(tmp_path):
    with pytest.raises(ChaosError, match="fault_kind"):
        append_record(tmp_path, {"test": "t", "outcome": "passed"})
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ChaosError, match="corrupt summary record"):
        load_records(tmp_path)
