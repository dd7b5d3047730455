"""The upgrade canary: chaos.canary's behaviour-difference table, on summary.json files built
the way a chaos session writes them (summary.metrics_for over a recorded timeline, the
experiment's record keys, append_record, write_summary), and scripts/canary.sh's refusal,
reuse and exit statuses with stand-in interpreters (starts no Ray)."""

import dataclasses
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from chaos import canary, summary
from chaos.ray_support import unsupported_reason
from chaos.timeline import recovery_metrics
from chaos.verdicts import Diagnosis, Verdict
from timelines import Script

ROOT = Path(__file__).resolve().parents[2]

RAYLET = "suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity"
PREEMPT = "suites/test_preemption.py::test_preemption_with_spare_capacity_is_charged_to_the_preemption_budget"
ECC = "suites/test_cuda_faults.py::test_ecc_error_in_rank_1_after_checkpoint_2"


# -- summaries as a session writes them --------------------------------------------------
def recovered(detect=1.5, restart_after=10.0, budget_class="worker_group", limit=3, max_failures=3):
    """A run that loses rank 1's node after checkpoint 10, is charged once and resumes."""
    s = Script(max_failures=max_failures).start_attempt().steps(1, 10)
    s.fault(detect=detect).decision(budget_class=budget_class, limit=limit)
    return s.start_attempt(dt=restart_after).steps(11, 20).finish().timeline()


def exhausted():
    """The same fault with max_failures=0: Ray raises, the run ends ERRORED."""
    s = Script(max_failures=0).start_attempt().steps(1, 10)
    s.fault().decision(decision="RAISE", limit=0)
    return s.finish(state="ERRORED").timeline()


PASSED = [Verdict("resumed-from-latest (attempt 1)", "pass", "every rank resumed at step 11"),
          Verdict("within-budget", "pass", "charged 1 to max_failures=3, as the faults should"),
          Verdict("run-finished", "pass", "the run finished (FINISHED) and its job SUCCEEDED")]
EXHAUSTED = [Verdict("within-budget", "fail", "retry budget exhausted: 1 failure charged to max_failures=0",
                     "retry budget exhausted"),
             Verdict("run-finished", "fail", "run failed: ended ERRORED: boom", "run failed")]
WRONG_CLASS = [Verdict("within-budget", "fail", "charged to the wrong budget class: charged 1 to max_failures=3, "
                       "but the faults should be charged to max_preemption_failures", "charged to the wrong budget class"),
               Verdict("run-finished", "pass", "the run finished (FINISHED) and its job SUCCEEDED")]


def record(test, timeline, verdicts, outcome="passed", fault_kind="raylet-kill", backend="embedded-namespaces"):
    """What Experiment.record returns for a judged run."""
    started = timeline.first("controller_started")
    return {"test": test, "fault_kind": fault_kind, "backend": backend, "outcome": outcome,
            "verdicts": [v.to_json() for v in verdicts],
            "metrics": summary.metrics_for(timeline, started.data["failure_config"]),
            "recoveries": [dataclasses.asdict(m) for m in recovery_metrics(timeline)]}


def session(tmp_path, name, *records):
    """summary.json of a session that recorded ``records``, read back as the canary reads it."""
    for r in records:
        summary.append_record(tmp_path / name / "summary.d", r)
    path = summary.write_summary(tmp_path / name / "summary.d", tmp_path / name / "summary.json")
    return json.loads(path.read_text())


def rows_of(text, test):
    """The table's rows of one test: {row name: (default, canary, mark)}."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| `{test}`"))
    out = {}
    for line in lines[start:start + len(canary.ROWS)]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        out[cells[1]] = tuple(cells[2:5])
    return out


def test_same_behaviour_marks_nothing(tmp_path):
    a = session(tmp_path, "2.60.0", record(RAYLET, recovered(), PASSED))
    b = session(tmp_path, "2.59.0", record(RAYLET, recovered(detect=2.0, restart_after=12.0), PASSED))
    text = canary.table(a, b, ("2.60.0", "2.59.0"))
    assert "## Ray upgrade canary: 2.59.0 against 2.60.0 (default)" in text
    assert "| test | | 2.60.0 (default) | 2.59.0 (canary) | differs |" in text
    assert "1 test(s): 0 behave differently (outcome, budget charged or diagnosis), 0 recorded in one session only, " \
           "0 differ in timing only, 1 the same." in text
    rows = rows_of(text, RAYLET)
    assert rows["outcome"] == ("passed", "passed", "")
    assert rows["budget charged"] == ("1 to max_failures=3", "1 to max_failures=3", "")
    assert rows["time to detect"] == ("1.5 s", "2.0 s", "")  # within the tolerance: not marked
    assert rows["diagnosis"] == ("none", "none", "")
    assert f"| `{RAYLET}` (raylet-kill, embedded-namespaces) | outcome |" in text
    assert not canary.behaviour_differs(canary.compare(a, b))


def test_a_claim_that_did_not_arise_in_one_run_is_no_difference(tmp_path):
    # seen on 2.58.1: no step re-done in one run (state-restored n/a), one in the other — timing
    not_arising = [*PASSED, Verdict("state-restored (attempt 1)", "n/a", "not checked: attempt 1 re-did no step")]
    a = session(tmp_path, "2.60.0", record(RAYLET, recovered(), not_arising))
    b = session(tmp_path, "2.58.1", record(RAYLET, recovered(), PASSED))
    assert rows_of(canary.table(a, b, ("2.60.0", "2.58.1")), RAYLET)["diagnosis"] == ("none", "none", "")


def test_a_test_failing_in_one_version_and_passing_in_the_other_shows(tmp_path):
    a = session(tmp_path, "2.60.0", record(RAYLET, recovered(), PASSED))
    b = session(tmp_path, "2.59.0", record(RAYLET, exhausted(), EXHAUSTED, outcome="failed"))
    text = canary.table(a, b, ("2.60.0", "2.59.0"))
    rows = rows_of(text, RAYLET)
    assert rows["outcome"] == ("passed", "failed", canary.MARK)
    assert rows["budget charged"] == ("1 to max_failures=3", "1 to max_failures=0", canary.MARK)
    assert rows["time to recover"][1] == "—" and rows["time to recover"][2] == canary.MARK  # never recovered
    assert rows["diagnosis"] == (
        "none", "run-finished: fail (run failed); within-budget: fail (retry budget exhausted)", canary.MARK)
    assert "1 test(s): 1 behave differently" in text
    assert canary.behaviour_differs(canary.compare(a, b))
    # and the other way round
    back = rows_of(canary.table(b, a, ("2.59.0", "2.60.0")), RAYLET)
    assert back["outcome"] == ("failed", "passed", canary.MARK)


def test_a_test_missing_on_one_side_shows(tmp_path):
    a = session(tmp_path, "a", record(RAYLET, recovered(), PASSED), record(ECC, recovered(), PASSED, fault_kind="cuda"))
    b = session(tmp_path, "b", record(RAYLET, recovered(), PASSED))
    text = canary.table(a, b, ("2.60.0", "2.59.0"))
    rows = rows_of(text, ECC)
    assert rows["outcome"] == ("passed", "no record", f"{canary.MARK} no record in 2.59.0")
    assert rows["budget charged"] == ("1 to max_failures=3", "", "")
    assert "2 test(s): 0 behave differently (outcome, budget charged or diagnosis), 1 recorded in one session only" in text
    entries = canary.compare(a, b, ("2.60.0", "2.59.0"))
    assert [e.only_in for e in entries] == [("2.60.0"), None]  # suites/test_cuda_faults.py sorts first
    assert canary.behaviour_differs(entries)
    only_canary = rows_of(canary.table(b, a, ("2.60.0", "2.59.0")), ECC)
    assert only_canary["outcome"] == ("no record", "passed", f"{canary.MARK} no record in 2.60.0")


def test_the_budget_class_charged_shows(tmp_path):
    """The preemption that Ray charges to max_failures instead of max_preemption_failures."""
    good = recovered(budget_class="preemption", limit=2, max_failures=0)
    a = session(tmp_path, "a", record(PREEMPT, good, PASSED, fault_kind="preempt"))
    b = session(tmp_path, "b", record(PREEMPT, recovered(), WRONG_CLASS, outcome="failed", fault_kind="preempt"))
    rows = rows_of(canary.table(a, b), PREEMPT)
    assert rows["budget charged"] == ("1 to max_preemption_failures=2", "1 to max_failures=3", canary.MARK)
    assert rows["diagnosis"][1] == "within-budget: fail (charged to the wrong budget class)"


def test_times_are_marked_only_beyond_the_tolerance(tmp_path):
    a = session(tmp_path, "a", record(RAYLET, recovered(restart_after=10.0), PASSED))
    slower = session(tmp_path, "b", record(RAYLET, recovered(restart_after=30.0), PASSED))
    text = canary.table(a, slower, ("2.60.0", "2.59.0"))
    recover = rows_of(text, RAYLET)["time to recover"]
    delta = slower["records"][0]["metrics"]["time_to_recover"] - a["records"][0]["metrics"]["time_to_recover"]
    assert recover[2] == f"{canary.MARK} {delta:+.1f} s" and delta == pytest.approx(20.0)
    assert "0 behave differently (outcome, budget charged or diagnosis), 0 recorded in one session only, " \
           "1 differ in timing only" in text
    assert not canary.behaviour_differs(canary.compare(a, slower))  # timing alone is no behaviour difference
    # 20 s more is within a tolerance of 30 s, and marked again when the relative one is tight enough
    assert rows_of(canary.table(a, slower, tolerance_s=30), RAYLET)["time to recover"][2] == ""
    assert canary._time_mark(100.0, 110.0, 5.0, 0.25) == ""  # 10 s of 100: noise
    assert canary._time_mark(10.0, 16.0, 5.0, 0.25) == f"{canary.MARK} +6.0 s"


def test_unlimited_and_unmeasured_budgets(tmp_path):
    """Ray logs -1 (or inf, or nothing) for an unlimited budget; a broken test has no metrics."""
    waits = Script().start_attempt().steps(1, 10).fault().decision()
    waits.decision(budget_class="controller", limit=-1, error_types=("WorkerGroupStartupTimeoutError",))
    tl = waits.start_attempt().steps(11, 20).finish().timeline()
    broken = {"test": ECC, "fault_kind": "cuda", "backend": "embedded-namespaces", "outcome": "broken",
              "verdicts": [], "metrics": {}, "recoveries": []}
    a = session(tmp_path, "a", record(RAYLET, tl, PASSED), broken)
    rows = rows_of(canary.table(a, a), RAYLET)
    assert rows["budget charged"][0] == "1 to controller_failure_limit=unlimited, 1 to max_failures=3"
    rows = rows_of(canary.table(a, a), ECC)
    assert rows["outcome"] == ("broken", "broken", "")
    assert rows["budget charged"][0] == "not measured" and rows["time to detect"][0] == "—"
    assert rows["diagnosis"][0] == "no verdicts"


def test_backends_are_kept_apart_and_cells_escaped(tmp_path):
    pipe = [Verdict("within|budget", "fail", "x", Diagnosis.WRONG_BUDGET_CLASS)]
    a = session(tmp_path, "a", record(RAYLET, recovered(), PASSED, backend="embedded-namespaces"))
    b = session(tmp_path, "b", record(RAYLET, recovered(), pipe, backend="profile:staging"))
    entries = canary.compare(a, b)
    assert [(e.backend, e.only_in) for e in entries] == [("embedded-namespaces", "default"), ("profile:staging", "canary")]
    assert "within\\|budget: fail (charged to the wrong budget class)" in canary.table(a, b)


def test_a_file_that_is_no_session_summary_is_refused(tmp_path):
    with pytest.raises(canary.ChaosError, match="no 'records' list"):
        canary.compare({"run": {}}, {"records": []})
    with pytest.raises(canary.ChaosError, match="without a 'test'"):
        canary.compare({"records": [{"outcome": "passed"}]}, {"records": []})


# -- python -m chaos.canary compare ---------------------------------------------------------
def test_compare_command_writes_the_table_and_exits_by_behaviour(tmp_path, capsys):
    session(tmp_path, "2.60.0", record(RAYLET, recovered(), PASSED))
    session(tmp_path, "2.59.0", record(RAYLET, exhausted(), EXHAUSTED, outcome="failed"))
    session(tmp_path, "2.58.1", record(RAYLET, recovered(), PASSED))
    out = tmp_path / "canary" / "2.59.0-vs-2.60.0.md"
    rc = canary.main(["compare", str(tmp_path / "2.60.0/summary.json"), str(tmp_path / "2.59.0/summary.json"),
                      "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 1 and out.read_text() == printed
    assert "## Ray upgrade canary: 2.59.0 against 2.60.0 (default)" in printed  # labels: the directories' names
    assert re.search(r"- 2\.60\.0: `\S+2\.60\.0/summary\.json` \(generated \d{4}-", printed)
    assert canary.main(["compare", str(tmp_path / "2.60.0/summary.json"), str(tmp_path / "2.58.1/summary.json"),
                        "--labels", "default", "rc"]) == 0
    assert "| test | | default (default) | rc (canary) | differs |" in capsys.readouterr().out


def test_compare_command_refuses_unreadable_summaries(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "other.json").write_text(json.dumps({"tests": 3}))
    for name, why in (("nope.json", "summary not found"), ("bad.json", "cannot read summary"),
                      ("other.json", "no 'records' list")):
        assert canary.main(["compare", str(tmp_path / name), str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert why in err and name in err, err


def test_module_entry_point(tmp_path):
    session(tmp_path, "a", record(RAYLET, recovered(), PASSED))
    path = str(tmp_path / "a/summary.json")
    proc = subprocess.run([sys.executable, "-m", "chaos.canary", "compare", path, path], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "1 test(s): 0 behave differently" in proc.stdout


# -- the Makefile target and scripts/canary.sh ------------------------------------------
def test_default_canary_suites_exist():
    makefile = (ROOT / "Makefile").read_text()
    block = re.search(r"^CANARY_SUITES := (.*?)\n(?!  )", makefile, re.M | re.S)[1]
    ids = block.replace("\\\n", " ").split()
    assert len(ids) >= 4
    for nodeid in ids:
        path, name = nodeid.split("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), f"{nodeid} does not exist"


def test_make_canary_refuses_before_building_anything():
    """The check is the recipe's first command, ahead of make setup and the canary venv."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^canary:.*\n((?:\t.*\n)+)", makefile, re.M)[1].splitlines()
    commands = [line.strip() for line in recipe if not line.strip().startswith("@[ -n")]
    assert commands[0] == "bash scripts/canary.sh check '$(RAY)'"
    assert "setup .venv-canary/$(RAY)/.installed" in commands[1]
    assert ".venv-canary/" in (ROOT / ".gitignore").read_text().split()


@pytest.mark.parametrize("version", ["2.57.1", "2.61.0", "3.0.0.dev0", "2.58.0rc1", "nope"])
def test_canary_script_refuses_an_unsupported_ray(version):
    proc = subprocess.run(["bash", "scripts/canary.sh", "check", version], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"canary: refused: {unsupported_reason(version)}"


def test_canary_script_refuses_the_default_and_accepts_a_supported_ray():
    pinned = re.search(r"^ray==(\S+)", (ROOT / "constraints.txt").read_text(), re.M)[1]
    proc = subprocess.run(["bash", "scripts/canary.sh", "check", pinned], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and f"Ray {pinned} is the default" in proc.stderr
    other = "2.59.0" if pinned != "2.59.0" else "2.58.1"
    proc = subprocess.run(["bash", "scripts/canary.sh", "check", other], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


FAKE_PYTHON = """#!/usr/bin/env bash
# A stand-in interpreter of Ray {ray}: answers the script's version query, plays a pytest
# session from {fakes}/{ray}.json (exit status {fakes}/{ray}.rc), runs chaos.canary for real.
set -e
echo "$*" >> {fakes}/calls.log
case "$1 $2" in
  "-c "*) echo {ray} ;;
  "-m pytest")
    while [ "$1" != "--chaos-reports" ]; do shift; done
    mkdir -p "$2"
    [ ! -f {fakes}/{ray}.json ] || cp {fakes}/{ray}.json "$2/summary.json"
    exit "$(cat {fakes}/{ray}.rc 2>/dev/null || echo 0)" ;;
  "-m chaos.canary") shift 2; exec {python} -c 'import sys; sys.path.insert(0, "{root}"); \\
from chaos.canary import main; sys.exit(main(sys.argv[1:]))' "$@" ;;
esac
"""


@pytest.fixture
def canary_tree(tmp_path):
    """A copy of what scripts/canary.sh reads, with stand-in .venv (Ray 2.60.0) and
    .venv-canary/2.59.0 interpreters."""
    tree, fakes = tmp_path / "tree", tmp_path / "fakes"
    (tree / "scripts").mkdir(parents=True)
    fakes.mkdir()
    shutil.copy(ROOT / "scripts/canary.sh", tree / "scripts/canary.sh")
    for name in ("constraints.txt", "pyproject.toml", "conftest.py"):
        shutil.copy(ROOT / name, tree / name)
    for folder in ("chaos", "suites"):
        (tree / folder).mkdir()
        (tree / folder / "x.py").write_text("# harness\n")
    for venv, ray in ((".venv", "2.60.0"), (".venv-canary/2.59.0", "2.59.0")):
        py = tree / venv / "bin/python"
        py.parent.mkdir(parents=True)
        py.write_text(FAKE_PYTHON.format(ray=ray, fakes=fakes, python=sys.executable, root=ROOT))
        py.chmod(py.stat().st_mode | stat.S_IXUSR)
    return tree, fakes


def run_canary(tree, *suites, env=None):
    return subprocess.run(["bash", "scripts/canary.sh", "run", "2.59.0", *suites], cwd=tree, capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def pytest_calls(fakes):
    calls = (fakes / "calls.log").read_text().splitlines() if (fakes / "calls.log").exists() else []
    (fakes / "calls.log").unlink(missing_ok=True)
    return [c.split("--chaos-reports ")[1].split()[0] for c in calls if c.startswith("-m pytest")]


def test_canary_script_runs_both_sessions_then_reuses_the_default(canary_tree, tmp_path):
    tree, fakes = canary_tree
    (fakes / "2.60.0.json").write_text(json.dumps(session(tmp_path, "d", record(RAYLET, recovered(), PASSED))))
    (fakes / "2.59.0.json").write_text(json.dumps(session(tmp_path, "c", record(RAYLET, recovered(), PASSED))))
    proc = run_canary(tree, RAYLET, "--", "-x")
    assert proc.returncode == 0, proc.stderr
    assert pytest_calls(fakes) == ["reports/canary/2.60.0", "reports/canary/2.59.0"]
    table = (tree / "reports/canary/2.59.0-vs-2.60.0.md").read_text()
    assert table in proc.stdout and "1 the same" in table
    # again: the default's session is reused; the candidate's runs again
    proc = run_canary(tree, RAYLET, "--", "-x")
    assert proc.returncode == 0 and "reusing the default Ray 2.60.0's session" in proc.stdout
    assert pytest_calls(fakes) == ["reports/canary/2.59.0"]
    # not for another selection, a changed harness, or FRESH=1
    assert run_canary(tree, RAYLET).returncode == 0
    assert pytest_calls(fakes) == ["reports/canary/2.60.0", "reports/canary/2.59.0"]
    (tree / "chaos/x.py").write_text("# changed\n")
    assert run_canary(tree, RAYLET).returncode == 0
    assert pytest_calls(fakes) == ["reports/canary/2.60.0", "reports/canary/2.59.0"]
    assert run_canary(tree, RAYLET, env={"FRESH": "1"}).returncode == 0
    assert pytest_calls(fakes) == ["reports/canary/2.60.0", "reports/canary/2.59.0"]


def test_canary_script_exit_statuses(canary_tree, tmp_path):
    tree, fakes = canary_tree
    (fakes / "2.60.0.json").write_text(json.dumps(session(tmp_path, "d", record(RAYLET, recovered(), PASSED))))
    (fakes / "2.59.0.json").write_text(json.dumps(session(
        tmp_path, "c", record(RAYLET, exhausted(), EXHAUSTED, outcome="failed"))))
    (fakes / "2.59.0.rc").write_text("1")  # a failed test is a result to compare
    proc = run_canary(tree, RAYLET)
    assert proc.returncode == 1 and "Ray 2.59.0 behaves differently from 2.60.0" in proc.stderr
    assert "| failed |" in (tree / "reports/canary/2.59.0-vs-2.60.0.md").read_text()
    (fakes / "2.59.0.rc").write_text("3")  # an internal error: nothing to compare
    proc = run_canary(tree, RAYLET)
    assert proc.returncode == 1 and "ended with pytest exit status 3" in proc.stderr
    (fakes / "2.59.0.rc").write_text("1")
    (fakes / "2.59.0.json").unlink()  # every test ended before its run was recorded
    proc = run_canary(tree, RAYLET)
    assert proc.returncode == 1 and "wrote no summary.json" in proc.stderr
    assert not (tree / "reports/canary/2.59.0/summary.json").exists()  # the previous one was removed first
    assert run_canary(tree).returncode == 2  # no suites
