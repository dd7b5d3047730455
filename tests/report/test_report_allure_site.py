"""Feeding Allure: categories, executor, environment, metrics, and the generated report."""

import json
import re
import shutil
import subprocess

import pytest

from chaos import allure_site
from chaos.allure_site import (CATEGORIES, allure_cli, executor_info, generate, strip_analytics, write_environment,
                               write_metrics)
from chaos.errors import ChaosError


def first_category(message: str, status: str, full_match: bool) -> str | None:
    """Which category Allure files a test under: the first rule that matches.

    Allure 3 searches messageRegex in the message; Allure 2 requires a full match.
    """
    for rule in CATEGORIES:
        if status not in rule["matchedStatuses"]:
            continue
        regex = rule.get("messageRegex")
        if regex is None or (re.fullmatch if full_match else re.search)(regex, message):
            return rule["name"]
    return None


@pytest.mark.parametrize("full_match", [False, True], ids=["allure3", "allure2"])
@pytest.mark.parametrize(
    "message, status, category",
    [
        ("resumed-from-latest: restarted from scratch (first step 1, latest committed 9)", "failed",
         "restarted from scratch"),
        ("restarted from scratch: rank 1 began attempt 1 at step 1 while rank 0 resumed at 11", "failed",
         "restarted from scratch"),
        ("resumed past the checkpoint: attempt 1 began at step 14 on every rank", "failed",
         "resumed past the checkpoint (skipped data)"),
        ("resumed at an unexpected step: attempt 1 began at step 3", "failed", "resumed at an unexpected step"),
        ("ranks disagree: after the restart attempt 1 began with rank 0 at step 11, rank 1 at step 10", "failed",
         "ranks disagree"),
        ("state not restored: rank 0 reported loss 0.5 at re-done step 11", "failed", "state not restored"),
        ("final state differs: rank 0 at step 20: state_digest 85bf but 1c2d in the baseline", "failed",
         "final state differs"),
        ("head loss: unexpected outcome: expected driver-lost, got continued: the run continued: step 7", "failed",
         "head loss: unexpected outcome"),
        ("unexpected worker node fate: lost ['4a3b2c1d'], expected all kept", "failed",
         "head loss: unexpected outcome"),
        ("training stalled: no rank reported for 75 s", "failed", "training stalled"),
        ("unrelated failure: attempt 1 failed with ValueError", "failed", "unrelated failure"),
        ("charged to the wrong budget class: Ray charged preemption", "failed", "wrong budget charge"),
        ("unexpected number of charged failures: 2", "failed", "wrong budget charge"),
        ("run failed: training FINISHED but the job ended FAILED", "failed", "run failed"),
        ("unverifiable: the run reported no checkpoint to Ray Train", "failed", "unverifiable (missing evidence)"),
        ("inconclusive: the fault landed after the run had already ended", "failed", "unverifiable (missing evidence)"),
        ("WorkloadError: the workload did not start training: job ended FAILED", "broken", "workload did not start"),
        ("attempt 1 did not resume: no report after restart", "failed", "did not resume"),
        ("resumed-from-latest: resumed from an older checkpoint (step 5, latest 9)", "failed", "resumed from an older checkpoint"),
        ("within-budget: retry budget exhausted after 3 failures", "failed", "retry budget exhausted"),
        ("recovery-time: recovery too slow: 95.2 s > SLO 60 s", "failed", "recovery too slow"),
        ("InjectionError: injection failed: raylet on 127.0.1.3 did not die", "broken", "injection failed"),
        ("healed: cleanup failed: node 127.0.1.3 still dead", "failed", "cleanup failed"),
        ("verdicts failed:\nhealed: ok\nwithin-budget: retry budget exhausted\n", "failed", "retry budget exhausted"),
        ("KeyError: 'placement'", "broken", "harness error"),
        ("AssertionError: something else", "failed", None),
    ],
)
def test_categories_match_diagnoses(message, status, category, full_match):
    assert first_category(message, status, full_match) == category


def test_category_files_are_written(tmp_path):
    allure_site.write_categories(tmp_path)
    assert json.loads((tmp_path / "categories.json").read_text()) == CATEGORIES
    config = allure_site.allure_config("r", tmp_path / "h.jsonl", 10)
    assert config["categories"] == CATEGORIES and config["historyPath"].endswith("h.jsonl")


def test_executor_from_github_env():
    env = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "acme/train",
        "GITHUB_RUN_ID": "123456",
        "GITHUB_RUN_NUMBER": "42",
        "GITHUB_WORKFLOW": "nightly-chaos",
    }
    assert executor_info(env) == {
        "name": "GitHub Actions",
        "type": "github",
        "url": "https://github.com/acme/train",
        "buildOrder": 42,
        "buildName": "nightly-chaos #42",
        "buildUrl": "https://github.com/acme/train/actions/runs/123456",
    }


def test_executor_from_gitlab_jenkins_and_local():
    gitlab = executor_info({"GITLAB_CI": "true", "CI_PIPELINE_IID": "7", "CI_JOB_NAME": "chaos",
                            "CI_JOB_URL": "https://gl/j/1", "CI_PROJECT_URL": "https://gl/p"})
    assert (gitlab["type"], gitlab["buildOrder"], gitlab["buildName"], gitlab["buildUrl"]) == ("gitlab", 7, "chaos #7", "https://gl/j/1")
    jenkins = executor_info({"JENKINS_URL": "https://j/", "BUILD_NUMBER": "9", "JOB_NAME": "chaos", "BUILD_URL": "https://j/b/9"})
    assert (jenkins["type"], jenkins["buildOrder"], jenkins["buildName"]) == ("jenkins", 9, "chaos #9")
    local = executor_info({"USER": "sre"})
    assert local["type"] == "local" and local["buildName"].startswith("sre@")


def test_environment_properties_escaping(tmp_path):
    path = write_environment(tmp_path, {"ray.version": "2.60.0", "health check": "period=500ms\ntimeout=1s"})
    assert path.read_text() == "ray.version=2.60.0\nhealth\\ check=period=500ms\\ntimeout=1s\n"


def test_metrics_from_run_summary(tmp_path):
    run = {"by_fault_kind": {"raylet_kill": {"median_time_to_detect": 2.5, "median_time_to_recover": None,
                                             "median_steps_lost": 1, "median_ettr": 0.9}}}
    samples = json.loads(write_metrics(tmp_path, run).read_text())
    assert {s["key"]: (s["value"], s["better"]) for s in samples} == {
        "raylet_kill.median_time_to_detect": (2.5, "lower"),
        "raylet_kill.median_steps_lost": (1, "lower"),
        "raylet_kill.median_ettr": (0.9, "higher"),
    }


def test_missing_node_says_what_to_install(monkeypatch):
    monkeypatch.setattr(allure_site.shutil, "which", lambda name: None)
    with pytest.raises(ChaosError, match="node is not installed.*Node.js >= 20.19 with npm"):
        allure_cli()


def test_old_node_is_refused(monkeypatch):
    monkeypatch.setattr(allure_site.shutil, "which", lambda name: "/usr/bin/node")
    monkeypatch.setattr(allure_site.subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(a, 0, "v18.20.4\n", ""))
    with pytest.raises(ChaosError, match="node v18.20.4 is too old"):
        allure_cli()


def test_missing_or_another_allure_says_where_it_looked_and_how_to_get_it(tmp_path):
    if allure_site.shutil.which("node") is None:
        pytest.skip("node is not installed")
    with pytest.raises(allure_site.AllureMissing, match=rf"allure@3.18.0\) is not installed: looked in {tmp_path}"
                                                         r"/node_modules\. `ray-chaos report` installs it into"):
        allure_cli(search=(tmp_path,))
    package = tmp_path / "node_modules" / "allure" / "package.json"
    package.parent.mkdir(parents=True)
    package.write_text(json.dumps({"version": "3.10.0"}))
    with pytest.raises(allure_site.AllureMissing, match="not the pinned version: allure 3.10.0 in"):
        allure_cli(search=(tmp_path,))
    package.write_text(json.dumps({"version": allure_site.ALLURE_VERSION}))
    assert allure_cli(search=(tmp_path,)) == ["node", str(package.parent / "cli.js")]


def test_no_results_is_a_clear_error(tmp_path):
    with pytest.raises(ChaosError, match="no Allure results.*run the chaos tests first"):
        generate(tmp_path / "nothing", tmp_path / "report", tmp_path / "h.jsonl")


def test_refuses_to_replace_a_directory_that_is_not_a_report(allure_results, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ChaosError, match="not an Allure report"):
        generate(allure_results, precious, tmp_path / "h.jsonl")
    assert (precious / "notes.txt").exists()


def test_generated_report_has_tests_categories_environment(allure_report):
    assert (allure_report / "index.html").is_file()
    results = [json.loads(p.read_text()) for p in (allure_report / "data" / "test-results").glob("*.json")]
    assert sorted(r["name"] for r in results) == ["test_chaos_harness_bug", "test_chaos_older_checkpoint", "test_chaos_recovery"]
    categories = json.loads((allure_report / "widgets" / "categories.json").read_text())
    names = {node["name"] for node in categories["nodes"].values() if node["type"] == "category"}
    assert names == {"resumed from an older checkpoint", "harness error"}


def test_the_report_calls_nobody_when_opened(allure_report):
    """Allure's pages load Google Tag Manager with the report's id; the harness takes it out,
    and every script the page loads is the report's own."""
    page = (allure_report / "index.html").read_text()
    assert "googletagmanager" not in page and "gtag(" not in page
    sources = re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", page)
    assert sources and all(not re.match(r"[a-z]+://", src) for src in sources), sources
    assert "window.allure" in page  # the rest of the page is kept


def test_a_changed_analytics_template_is_refused_loudly(tmp_path):
    """Twin: a page whose analytics the pattern no longer matches is not served as stripped."""
    (tmp_path / "index.html").write_text('<script src="https://www.googletagmanager.com/gtm.js?id=X"></script>')
    with pytest.raises(ChaosError, match=r"index.html still loads Google Tag Manager .*template changed"):
        strip_analytics(tmp_path)


def test_history_accumulates_across_runs(allure_installed, allure_results, tmp_path):
    results = shutil.copytree(allure_results, tmp_path / "allure-results")
    history = tmp_path / "history.jsonl"
    summary = tmp_path / "summary.json"
    run = {"by_fault_kind": {"raylet_kill": {"median_time_to_recover": 6.5}}}
    summary.write_text(json.dumps({"run": run, "records": []}))
    for _ in range(2):
        report = generate(results, tmp_path / "report", history, summary_file=summary)
    assert len(history.read_text().splitlines()) == 2
    charts = json.loads((report / "widgets" / "charts.json").read_text())
    [dynamics] = [c for c in charts["general"].values() if c["type"] == "statusDynamics"]
    assert len(dynamics["data"]) == 2, "the second report should show the first one in its trend"
    metrics = json.loads((report / "widgets" / "metrics.json").read_text())
    assert metrics["history"][0]["metrics"] == {"raylet_kill.median_time_to_recover": 6.5}


def test_the_projection_is_a_global_attachment_not_a_test(allure_installed, allure_results, projectable_summary,
                                                         tmp_path):
    """`make report` adds the ETTR projection: on the session-wide page (Allure 3's globals),
    never as a test result — one would count in the success rate."""
    results = shutil.copytree(allure_results, tmp_path / "allure-results")
    report = generate(results, tmp_path / "report", tmp_path / "h.jsonl", summary_file=projectable_summary,
                      projection=True)
    names = sorted(json.loads(p.read_text())["name"] for p in (report / "data" / "test-results").glob("*.json"))
    assert names == ["test_chaos_harness_bug", "test_chaos_older_checkpoint", "test_chaos_recovery"], names
    attached = json.loads((report / "widgets" / "globals.json").read_text())["attachments"]
    assert [a["name"] for a in attached] == ["ETTR projection: ETTR vs checkpoint interval", "ETTR projection: table"]
