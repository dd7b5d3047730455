"""Turn reports/allure-results into the HTML chaos report, with trends across runs.

Allure 3 (the npm package ``allure``, pinned as ``ALLURE_VERSION`` and in package.json) does
the rendering: no Java.  A checkout has it from ``npm ci``; an installed harness finds it in
the user's cache, or ``ray-chaos report`` installs the pin there once (``install_allure_cli``).  This module adds what
makes the report about chaos rather than about pytest:

* categories: a failed verdict's diagnosis (e.g. "resumed from an older checkpoint")
  files the test under its report category (chaos.verdicts.Diagnosis), so the Categories tab answers "what went wrong, how often";
* executor.json: which CI build produced the report, from the CI's standard env vars;
* environment.properties: the cluster and Ray settings the run used;
* metrics: the per-fault-kind medians of reports/summary.json become Allure 3 metrics
  (a ``-perf.json`` results file), so the report's Metrics section shows them;
* ETTR projection: the summary's recovery figures projected to large jobs
  (chaos.projection), a plot and a table as the session's global attachments;
* history: Allure 3 appends one JSON line per generated report to ``history_file``
  (its ``historyPath``), metrics included; keeping that one file between nightly runs is
  what makes the trend charts (pass/fail and recovery times) grow.

Allure 3 takes categories from its config file, Allure 2 from categories.json in the
results; both are written from the same rules so either generator shows them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping

from chaos.errors import ChaosError
from chaos.verdicts.diagnosis import ReportCategory, report_phrases

CHECKOUT = Path(__file__).resolve().parents[1]  # a repository checkout when it holds package.json
DEFAULT_RESULTS = Path("reports/allure-results")
DEFAULT_REPORT = Path("reports/allure-report")
DEFAULT_HISTORY = Path("reports/history.jsonl")
DEFAULT_SUMMARY = Path("reports/summary.json")
GENERATE_TIMEOUT_S = 600
MIN_NODE = (20, 19)  # allure 3.18 uses Array.prototype.toSorted; its dependencies ask for 20.19
ALLURE_VERSION = "3.18.0"  # package.json pins the same (tests/unit/test_packaging.py)
NPM_TIMEOUT_S = 600


def _containing(*phrases: str) -> str:
    """A message regex that matches anywhere in a multi-line message.

    Allure 2 (Java) full-matches messageRegex while Allure 3 (JavaScript) searches, and
    neither shares a syntax for inline flags; ``[\\s\\S]*`` around an alternation means
    "contains" in both, and in Python's ``re`` too.
    """
    return "[\\s\\S]*(" + "|".join(phrases) + ")[\\s\\S]*"


def _literal(phrase: str) -> str:
    """``phrase`` as a regex that Java, JavaScript and Python read alike."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", phrase)


# The report's categories are the diagnoses' (chaos.verdicts.Diagnosis, in ReportCategory's
# order: Allure puts a test in the first category that matches), then the harness's own
# errors a test can break with.  Diagnoses match failed and broken tests alike (a fault that
# could not be injected usually surfaces as an exception); whatever is broken and
# undiagnosed is a harness error.
HARNESS_ERRORS: dict[str, tuple[str, ...]] = {
    "workload did not start": ("the workload did not start training",),
    "injection failed": ("injection failed",),
}
DIAGNOSES: dict[str, tuple[str, ...]] = {
    category.value: report_phrases(category) for category in ReportCategory} | HARNESS_ERRORS
CATEGORIES: list[dict] = [
    {"name": name, "messageRegex": _containing(*map(_literal, phrases)), "matchedStatuses": ["failed", "broken"]}
    for name, phrases in DIAGNOSES.items() if phrases
]
CATEGORIES.append({"name": "harness error", "matchedStatuses": ["broken"]})


def executor_info(env: Mapping[str, str] | None = None) -> dict:
    """Describe the build that ran the tests, for the report's header and history links."""
    env = os.environ if env is None else env
    if env.get("GITHUB_ACTIONS") == "true" or env.get("GITHUB_RUN_ID"):
        repo_url = f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/{env.get('GITHUB_REPOSITORY', '')}"
        number = env.get("GITHUB_RUN_NUMBER", "")
        return _executor(
            name="GitHub Actions",
            type="github",
            url=repo_url,
            buildOrder=number,
            buildName=f"{env.get('GITHUB_WORKFLOW', 'workflow')} #{number}",
            buildUrl=f"{repo_url}/actions/runs/{env.get('GITHUB_RUN_ID', '')}",
        )
    if env.get("GITLAB_CI") or env.get("CI_PIPELINE_ID"):
        return _executor(
            name="GitLab CI",
            type="gitlab",
            url=env.get("CI_PROJECT_URL", ""),
            buildOrder=env.get("CI_PIPELINE_IID") or env.get("CI_PIPELINE_ID", ""),
            buildName=f"{env.get('CI_JOB_NAME', 'job')} #{env.get('CI_PIPELINE_IID') or env.get('CI_PIPELINE_ID', '')}",
            buildUrl=env.get("CI_JOB_URL") or env.get("CI_PIPELINE_URL", ""),
        )
    if env.get("JENKINS_URL") or env.get("BUILD_URL"):
        return _executor(
            name="Jenkins",
            type="jenkins",
            url=env.get("JENKINS_URL", ""),
            buildOrder=env.get("BUILD_NUMBER", ""),
            buildName=f"{env.get('JOB_NAME', 'job')} #{env.get('BUILD_NUMBER', '')}",
            buildUrl=env.get("BUILD_URL", ""),
        )
    user = env.get("USER") or env.get("USERNAME") or "user"
    return _executor(
        name="local",
        type="local",
        buildOrder=str(int(time.time())),
        buildName=f"{user}@{socket.gethostname()}",
    )


def _executor(buildOrder: str, **fields: str) -> dict:
    """Drop empty fields; buildOrder must be an integer or Allure ignores it."""
    out = {k: v for k, v in fields.items() if v}
    if str(buildOrder).isdigit():
        out["buildOrder"] = int(buildOrder)
    return out


def write_categories(results_dir: str | os.PathLike) -> Path:
    """categories.json, for Allure 2 and other readers of the results directory."""
    path = Path(results_dir) / "categories.json"
    path.write_text(json.dumps(CATEGORIES, indent=1))
    return path


def write_executor(results_dir: str | os.PathLike, env: Mapping[str, str] | None = None) -> Path:
    """executor.json: links the report to the CI build that produced it."""
    path = Path(results_dir) / "executor.json"
    path.write_text(json.dumps(executor_info(env), indent=1))
    return path


def write_environment(results_dir: str | os.PathLike, props: Mapping[str, object]) -> Path:
    """Write environment.properties (the report's Environment widget).

    Never pass secrets: the report is meant to be shared.
    """
    Path(results_dir).mkdir(parents=True, exist_ok=True)
    path = Path(results_dir) / "environment.properties"
    lines = [f"{_escape(str(k), key=True)}={_escape(str(v))}" for k, v in props.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _escape(text: str, key: bool = False) -> str:
    """Java .properties escaping, so a value with '=' or a newline survives."""
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if key:
        out = out.replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")
    return out


# summary.json median -> (title, unit, which direction is better)
METRICS = {
    "median_time_to_detect": ("median time to detect", "s", "lower"),
    "median_time_to_recover": ("median time to recover", "s", "lower"),
    "median_steps_lost": ("median steps lost", "steps", "lower"),
    "median_ettr": ("median ETTR", "ratio", "higher"),
}


def write_metrics(results_dir: str | os.PathLike, run_summary: Mapping) -> Path:
    """Write the run summary's per-fault-kind medians as Allure 3 metrics (chaos-perf.json)."""
    now = int(time.time() * 1000)
    samples = []
    for kind, figures in run_summary.get("by_fault_kind", {}).items():
        for field, (title, unit, better) in METRICS.items():
            if figures.get(field) is None:
                continue
            key = f"{kind}.{field}"
            samples.append({
                "id": key, "key": key, "value": figures[field], "start": now, "stop": now,
                "title": f"{kind}: {title}", "unit": unit, "better": better, "group": kind, "groupTitle": kind,
            })
    path = Path(results_dir) / "chaos-perf.json"
    path.write_text(json.dumps(samples, indent=1))
    return path


def attach_projection(results: Path, summary_file: str | os.PathLike) -> None:
    """The ETTR projection (chaos.projection) as global attachments; a summary with nothing
    to project from (no recovered fault, no checkpoint figures) leaves it out, and says so."""
    from chaos import projection

    try:
        projection.attach(results, summary_file)
    except ChaosError as e:
        print(f"ETTR projection left out of the report: {e}", file=sys.stderr)
    except Exception as e:  # a bug in the projection must not cost the night's report
        print(f"ETTR projection left out of the report (a bug in chaos.projection): {e!r}", file=sys.stderr)


class AllureMissing(ChaosError):
    """The pinned Allure CLI is nowhere it is looked for (``install_allure_cli`` can put it there)."""


def allure_cache() -> Path:
    """Where ``ray-chaos report`` installs the pinned Allure CLI: the user's cache, one directory per version."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ray-chaos" / "allure" / ALLURE_VERSION


def check_node() -> None:
    """Node.js is there and new enough for Allure 3, or a ChaosError saying what to install."""
    if shutil.which("node") is None:
        raise ChaosError(f"node is not installed: the HTML report needs Node.js >= {MIN_NODE[0]}.{MIN_NODE[1]} with npm "
                         "(https://nodejs.org, or your distribution's nodejs and npm packages)")
    version = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    if tuple(int(part) for part in version.lstrip("v").split(".")[:2]) < MIN_NODE:
        raise ChaosError(
            f"node {version} is too old: Allure 3 needs Node.js >= {MIN_NODE[0]}.{MIN_NODE[1]} "
            "(Debian 12's nodejs package is 18; Debian 13's is new enough)"
        )


def allure_cli(search: tuple[Path, ...] | None = None) -> list[str]:
    """The command that runs the pinned Allure CLI, from the first of ``search`` (default: the
    current directory, a checkout, the user's cache) whose node_modules holds it, else an
    ``allure`` on PATH of that version; ``AllureMissing`` says where it looked."""
    check_node()
    roots = search or (Path.cwd(), *([CHECKOUT] if (CHECKOUT / "package.json").is_file() else []), allure_cache())
    other = []
    for root in dict.fromkeys(roots):
        package = root / "node_modules" / "allure" / "package.json"
        if package.is_file():
            version = json.loads(package.read_text()).get("version", "")
            if version == ALLURE_VERSION:
                return ["node", str(package.parent / "cli.js")]
            other.append(f"allure {version} in {root / 'node_modules'}")
    on_path = shutil.which("allure")
    if search is None and on_path:
        version = subprocess.run([on_path, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
        if version == ALLURE_VERSION:
            return [on_path]
        other.append(f"allure {version or '(no version)'} at {on_path}")
    where = ", ".join(str(r / "node_modules") for r in dict.fromkeys(roots))
    raise AllureMissing(f"the Allure CLI (npm package allure@{ALLURE_VERSION}) is not installed: looked in {where}"
                        f"{' and on PATH' if search is None else ''}"
                        + (f"; not the pinned version: {'; '.join(other)}" if other else "")
                        + f". `ray-chaos report` installs it into {allure_cache()} (needs npm); in a checkout, "
                          "`npm ci` in its root")


def install_allure_cli(say=print) -> list[str]:
    """``npm install`` the pinned Allure CLI into the user's cache (``allure_cache``), saying so
    first; built beside it and moved in whole, so an interrupted install is never found."""
    check_node()
    npm = shutil.which("npm")
    if npm is None:
        raise ChaosError(f"npm is not installed: the HTML report needs the Allure CLI (npm package allure@{ALLURE_VERSION}), "
                         f"installed with npm (it comes with Node.js >= {MIN_NODE[0]}.{MIN_NODE[1]})")
    cache = allure_cache()
    say(f"report: installing the Allure CLI once (npm install allure@{ALLURE_VERSION} into {cache}); "
        "later reports reuse it")
    cache.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{cache.name}-", dir=cache.parent))
    try:
        proc = subprocess.run([npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--loglevel=error",
                               f"allure@{ALLURE_VERSION}"], capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
        if proc.returncode != 0:
            raise ChaosError(f"npm install allure@{ALLURE_VERSION} failed (exit {proc.returncode}; npm reaches its "
                             f"registry through `npm config` registry/proxy settings):\n"
                             f"{(proc.stdout + proc.stderr).strip()[-2000:]}")
        shutil.rmtree(cache, ignore_errors=True)
        staging.rename(cache)
    except subprocess.TimeoutExpired as e:
        raise ChaosError(f"npm install allure@{ALLURE_VERSION} did not finish within {NPM_TIMEOUT_S}s") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return allure_cli(search=(cache,))


def allure_config(name: str, history_file: Path, history_limit: int | None) -> dict:
    """Allure 3 config: the awesome report only, categories, and the history file."""
    config = {
        "name": name,
        "historyPath": str(history_file),
        "categories": CATEGORIES,
        "plugins": {"awesome": {"options": {"reportName": name}}, "agent": {"enabled": False}},
    }
    if history_limit is not None:
        config["historyLimit"] = history_limit
    return config


# Allure 3's report pages load Google Tag Manager and send it the report's id and Allure's
# version whenever they are opened (hard-coded on in the awesome plugin 3.18; the
# ALLURE_NO_ANALYTICS switch reaches only its allure2 plugin).  A nightly report of a staging
# cluster is opened inside a company's network: it calls nobody.
ANALYTICS = re.compile(r"\s*<script async src=\"https://www\.googletagmanager\.com/gtag/js[^\"]*\"></script>"
                       r"\s*<script>(?:(?!</script>).)*?gtag\('config'(?:(?!</script>).)*?</script>", re.S)


def strip_analytics(report: Path) -> None:
    """Take the analytics scripts out of the report's pages (the report works without them)."""
    for page in report.glob("*.html"):
        text = page.read_text(encoding="utf-8")
        stripped = ANALYTICS.sub("", text)
        if "googletagmanager" in stripped:
            raise ChaosError(f"{page} still loads Google Tag Manager after stripping its analytics: the Allure "
                             "report's page template changed (chaos.allure_site.ANALYTICS)")
        if stripped != text:
            page.write_text(stripped, encoding="utf-8")


def generate(
    results_dir: str | os.PathLike = DEFAULT_RESULTS,
    report_dir: str | os.PathLike = DEFAULT_REPORT,
    history_file: str | os.PathLike = DEFAULT_HISTORY,
    summary_file: str | os.PathLike | None = None,
    name: str = "Ray chaos report",
    history_limit: int | None = 100,
    projection: bool = False,
    allure: list[str] | None = None,
) -> Path:
    """Generate the report; return ``report_dir`` (open its index.html over HTTP).

    ``summary_file`` (reports/summary.json from chaos.summary.write_summary), when given,
    feeds the recovery-time metrics and their trends, and with ``projection`` the ETTR
    projection (what `make report` / `ray-chaos report` add).  ``allure``: the command that
    runs the Allure CLI (default: ``allure_cli()``'s).

    The new report is built beside ``report_dir`` and swapped in only when complete, so a
    failed generation leaves the previous report in place.
    """
    results = Path(results_dir).resolve()
    report = Path(report_dir).resolve()
    history = Path(history_file).resolve()
    if not results.is_dir() or not any(results.glob("*-result.json")):
        raise ChaosError(f"no Allure results in {results}: run the chaos tests first (pytest -m chaos --alluredir {results_dir})")
    if report.exists() and any(report.iterdir()) and not (report / "index.html").is_file():
        raise ChaosError(f"{report} exists and is not an Allure report; refusing to replace it")
    command = allure or allure_cli()
    write_categories(results)
    write_executor(results)
    if summary_file is not None:
        write_metrics(results, json.loads(Path(summary_file).read_text())["run"])
        if projection:
            attach_projection(results, summary_file)
    history.parent.mkdir(parents=True, exist_ok=True)
    report.parent.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix=".allure-", dir=report.parent) as tmp:
        config = Path(tmp) / "allurerc.json"
        config.write_text(json.dumps(allure_config(name, history, history_limit), indent=1))
        staging = Path(tmp) / "report"
        try:
            proc = subprocess.run(
                [*command, "generate", "--config", str(config), "--output", str(staging), str(results)],
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=GENERATE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as e:
            raise ChaosError(f"allure generate did not finish within {GENERATE_TIMEOUT_S}s for {results}") from e
        if proc.returncode != 0 or not (staging / "index.html").is_file():
            output = (proc.stdout + proc.stderr).strip()[-3000:]
            raise ChaosError(f"allure generate failed (exit {proc.returncode}) for {results}:\n{output}")
        strip_analytics(staging)
        if report.exists():
            shutil.rmtree(report)
        staging.rename(report)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The report command's options (``ray-chaos report``, ``python -m chaos.allure_site``)."""
    parser.add_argument("--results", default=str(DEFAULT_RESULTS), help="allure-results directory (default: %(default)s)")
    parser.add_argument("--report", default=str(DEFAULT_REPORT),
                        help="output directory of the HTML report (default: %(default)s)")
    parser.add_argument("--history", default=str(DEFAULT_HISTORY),
                        help="Allure history file (JSONL) kept between runs for the trends (default: %(default)s)")
    parser.add_argument("--summary", default=str(DEFAULT_SUMMARY),
                        help="summary.json for the metrics, used when present (default: %(default)s)")
    parser.add_argument("--name", default="Ray chaos report", help="the report's title")
    parser.add_argument("--no-projection", action="store_true",
                        help="leave out the ETTR projection (chaos.projection) made from the summary")


def report(args: argparse.Namespace) -> int:
    """Generate the report as ``args`` say, installing the pinned Allure CLI first if it is missing."""
    summary = args.summary if Path(args.summary).is_file() else None
    try:
        try:
            command = allure_cli()
        except AllureMissing:
            command = install_allure_cli(say=lambda line: print(line, file=sys.stderr))
        out = generate(args.results, args.report, args.history, summary_file=summary, name=args.name,
                       projection=not args.no_projection, allure=command)
    except ChaosError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {out / 'index.html'} (serve it: {' '.join(command)} open {out})")
    return 0


DESCRIPTION = (f"Generate the HTML chaos report (Allure {ALLURE_VERSION}, with history) from the Allure results a "
               "chaos session wrote. Needs Node.js >= 20.19; the pinned Allure CLI is looked for in ./node_modules, "
               "a checkout, the user's cache (~/.cache/ray-chaos/allure, or under $XDG_CACHE_HOME) and on PATH, and "
               "installed into that cache with npm when missing.")


def main(argv: list[str] | None = None) -> int:
    """``python -m chaos.allure_site``: what `make report` runs."""
    parser = argparse.ArgumentParser(prog="python -m chaos.allure_site", description=DESCRIPTION)
    add_arguments(parser)
    return report(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
