"""The harness's overhead per experiment: a chaos test's wall time against its run's own.

Reads what a `make chaos` session leaves (runs nothing): each test's Allure result in
reports/allure-results (start/stop of the test's call, fixtures such as the cluster
start excluded) and the run timeline attached to it (the same JSON as
reports/runs/*/timeline.json).  The run's own wall time is its job's, from the
``job_submitted`` to the ``job_finished`` event.  Per test it prints both, the overhead
before the job was submitted and after it finished, and the ratio test/run; then the
median ratio.  A test run several times (several sessions' results) counts with its
latest result.  Tests without a run timeline (e.g. dry runs) are left out.
Run: .venv/bin/python bench/bench_overhead.py [--results reports/allure-results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Iterable, Mapping, Sequence

DEFAULT_RESULTS = Path("reports/allure-results")
HOW_TO_PRODUCE = "run `make chaos` (or `make chaos ARGS=\"-k raylet_kill\"` for a few tests) to produce them"


@dataclasses.dataclass(frozen=True)
class Overhead:
    """One test: its call's wall time and its run's (job submitted -> job finished), seconds."""

    test: str
    test_s: float
    run_s: float
    before_s: float  # test start -> job submitted
    after_s: float  # job finished -> test end

    @property
    def ratio(self) -> float:
        return self.test_s / self.run_s


def overhead(test: str, start_s: float, stop_s: float, timeline: Mapping) -> Overhead:
    """The overhead of one test whose call ran from ``start_s`` to ``stop_s`` (unix seconds)
    with ``timeline`` (a Timeline's JSON) as its run; ValueError when the run has no job
    submitted and finished in it."""
    times = {kind: [e["t"] for e in timeline.get("events", []) if e.get("kind") == kind]
             for kind in ("job_submitted", "job_finished")}
    missing = [kind for kind, ts in times.items() if not ts]
    if missing:
        raise ValueError(f"{test}: its timeline has no {' or '.join(missing)} event")
    submitted, finished = min(times["job_submitted"]), max(times["job_finished"])
    if not start_s <= submitted <= finished <= stop_s:
        raise ValueError(f"{test}: its run ({submitted:.3f}-{finished:.3f}) is not inside the test's call "
                         f"({start_s:.3f}-{stop_s:.3f})")
    return Overhead(test, stop_s - start_s, finished - submitted, submitted - start_s, stop_s - finished)


def from_allure(results_dir: Path) -> tuple[list[Overhead], list[str]]:
    """Per test (its latest result) the overhead, and why tests were left out."""
    latest: dict[str, dict] = {}
    for path in sorted(results_dir.glob("*-result.json")):
        result = json.loads(path.read_text())
        name = result.get("fullName") or result.get("name") or path.name
        if name not in latest or result.get("start", 0) > latest[name].get("start", 0):
            latest[name] = result
    rows, skipped = [], []
    for name, result in sorted(latest.items()):
        attached = [a for a in result.get("attachments", []) if a.get("name") == "timeline.json"]
        if not attached:
            skipped.append(f"{name}: no run timeline attached")
            continue
        try:
            timeline = json.loads((results_dir / attached[-1]["source"]).read_text())
            rows.append(overhead(name, result["start"] / 1000, result["stop"] / 1000, timeline))
        except (OSError, KeyError, ValueError) as e:
            skipped.append(f"{name}: {type(e).__name__}: {e}")
    return rows, skipped


def table(rows: Iterable[Overhead]) -> str:
    rows = list(rows)
    if not rows:
        return "(no tests)"
    width = max(len("test"), *(len(r.test) for r in rows))
    lines = [f"{'test':{width}} {'test s':>8} {'run s':>8} {'before s':>9} {'after s':>8} {'ratio':>6}"]
    for r in rows:
        lines.append(f"{r.test:{width}} {r.test_s:8.1f} {r.run_s:8.1f} {r.before_s:9.1f} {r.after_s:8.1f} "
                     f"{r.ratio:6.2f}")
    lines.append(f"{'median':{width}} {statistics.median(r.test_s for r in rows):8.1f} "
                 f"{statistics.median(r.run_s for r in rows):8.1f} {statistics.median(r.before_s for r in rows):9.1f} "
                 f"{statistics.median(r.after_s for r in rows):8.1f} {statistics.median(r.ratio for r in rows):6.2f}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                   help=f"Allure results of a chaos session (default {DEFAULT_RESULTS})")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.results.is_dir():
        print(f"bench_overhead: no results at {args.results}; {HOW_TO_PRODUCE}", file=sys.stderr)
        return 1
    rows, skipped = from_allure(args.results)
    if not rows:
        print(f"bench_overhead: no chaos test with a run timeline in {args.results}"
              + (f" ({len(skipped)} left out: {'; '.join(skipped)})" if skipped else "") + f"; {HOW_TO_PRODUCE}",
              file=sys.stderr)
        return 1
    print(f"harness overhead per experiment: the test's call vs its job (submitted -> finished), "
          f"{len(rows)} tests from {args.results}")
    print(table(rows))
    for why in skipped:
        print(f"left out: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
