"""Machine-readable results: one record per chaos test, merged into reports/summary.json.

The Allure report is for people; summary.json is for dashboards, alerts and diffs between
nightly runs.  Each test writes its own record file (one file per test, written
atomically), so parallel pytest sessions (xdist workers, several profiles) never contend
for one file; `write_summary` merges whatever records the directory holds.

A record::

    {"test": nodeid, "fault_kind": "raylet-kill", "backend": "embedded",
     "outcome": "passed" | "failed" | "broken",
     "verdicts": [{"name", "status", "diagnosis", "message", "evidence"}],
     "metrics": metrics_for(timeline, failure_config)}

``metrics.checkpointing`` (step time, checkpoint interval and cost) is what
chaos.projection needs besides the recovery times to project ETTR to a large job;
``metrics.elastic`` (None for a fixed-size run) what it needs to compare an elastic run with
a fixed one: the world size each loss left, how long the run trained below its maximum,
and what growing back cost (``elastic_figures``).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from chaos.errors import ChaosError
from chaos.faults.catalog import BUDGET_LIMIT_FIELDS
from chaos.timeline import Timeline, ettr, faulted_runs, median, recovery_metrics, runs
from chaos.verdicts.budget import charged as charged_by_the_faults

DEFAULT_RECORDS = Path("reports/summary.d")
DEFAULT_SUMMARY = Path("reports/summary.json")

MEDIAN_METRICS = ("time_to_detect", "time_to_recover", "steps_lost", "ettr")


def metrics_for(timeline: Timeline, failure_config: Mapping[str, Any]) -> dict:
    """The metrics of one test's run.

    With several faults in one test, time_to_detect / time_to_recover are the worst
    (largest) over the faults -- the figure an SLO is about -- and steps_lost is the sum;
    the per-fault figures are kept under ``faults``.  ``charged`` holds, per budget
    class, the count and limit of the last failure decision Ray took for that class, or
    0 and the configured limit when Ray charged nothing to it.
    """
    per_fault = recovery_metrics(timeline)
    charged = {cls: {"count": 0, "limit": failure_config.get(field)} for cls, field in BUDGET_LIMIT_FIELDS.items()}
    for cls, last in charged_by_the_faults(timeline).items():  # the runs the faults hit, as within-budget counts
        charged[cls] = {"count": last["count"], "limit": last["limit"]}
    lost = [m.steps_lost for m in per_fault if m.steps_lost is not None]
    return {
        "time_to_detect": _worst(m.time_to_detect for m in per_fault),
        "time_to_recover": _worst(m.time_to_recover for m in per_fault),
        "steps_lost": sum(lost) if lost else None,
        "ettr": ettr(timeline),
        "checkpointing": checkpoint_figures(timeline),
        "elastic": elastic_figures(timeline),
        "charged": charged,
        "faults": [
            {
                "time_to_detect": m.time_to_detect,
                "time_to_restart": m.time_to_restart,
                "time_to_recover": m.time_to_recover,
                "steps_lost": m.steps_lost,
            }
            for m in per_fault
        ],
    }


def checkpoint_figures(timeline: Timeline) -> dict:
    """How long a step took, how often the run committed a checkpoint and what one cost.

    Measured from consecutive reports of one attempt: ``step_time_s`` is the median time
    per step of reports that committed no checkpoint; ``checkpoint_cost_s`` the median
    extra time a checkpointing report took over that (clamped at 0: saving is never
    faster than not saving); ``checkpoint_every_steps`` the median step distance between
    consecutive committed checkpoints; ``checkpoint_interval_s`` that distance in compute
    seconds (every_steps x step_time), the interval a projection starts from.  None where
    the run did not show it (no steps, fewer than two checkpoints).
    """
    per_step, extra, distances = [], [], []
    for _, events in runs(timeline):
        reports = [e for e in events if e.kind == "report" and e.data.get("step") is not None]
        gaps = [(prev, r) for prev, r in zip(reports, reports[1:])
                if prev.attempt == r.attempt and r.data["step"] > prev.data["step"]]
        per_step += [(r.t - prev.t) / (r.data["step"] - prev.data["step"]) for prev, r in gaps if not r.data.get("checkpoint")]
        committed = sorted({r.data["step"] for r in reports if r.data.get("checkpoint")})
        distances += [b - a for a, b in zip(committed, committed[1:])]
        extra += [(r.t - prev.t, r.data["step"] - prev.data["step"]) for prev, r in gaps if r.data.get("checkpoint")]
    step_time = median(per_step)
    every = median(distances)
    cost = median(max(0.0, gap - steps * step_time) for gap, steps in extra) if step_time is not None else None
    return {
        "step_time_s": step_time,
        "checkpoint_every_steps": every,
        "checkpoint_interval_s": every * step_time if every is not None and step_time is not None else None,
        "checkpoint_cost_s": cost,
        "checkpoints_measured": len(extra),
    }


def elastic_figures(timeline: Timeline) -> dict | None:
    """An elastic run's figures (None for a fixed-size one), from the run the faults hit.

    ``step_time_s``: median time per step at each world size (throughput is world size over
    it).  Per loss (``losses``): the world size of the attempt that recovered, its time to the
    first report, the size of the attempt the fault hit, when the lost capacity was back (the
    first node that joined after the fault), and ``degraded_s``: from that first report to the
    first report at full size again (or the run's end).  Per resize (``resizes``): sizes, the time
    from the capacity's return (the last node that joined before Train decided) to the
    decision and to the grown attempt's first report, the restart it cost (decision to first
    report), and every failure decision charged in between (``charged``: Ray charges none)."""
    hit = faulted_runs(timeline)
    events = [e for e in timeline.events if e.source != "recorder" or (hit and e.data.get("run_id") == hit[-1])]
    started = next((e for e in events if e.kind == "controller_started"), None)
    if started is None or not started.data.get("elastic"):
        return None
    attempts = {e.attempt: e for e in events if e.kind == "attempt_started"}
    firsts = {}
    for r in (e for e in events if e.kind == "report"):
        firsts.setdefault(r.attempt, r)
    return {**started.data["elastic"],
            "attempts": [{"attempt": a, "world_size": e.data.get("world_size"), "cause": e.data.get("cause")}
                         for a, e in sorted(attempts.items())],
            "step_time_s": _step_time_by_size(events, attempts),
            "losses": _losses(timeline, events, attempts, firsts, started.data["elastic"]["max_workers"]),
            "resizes": _resizes(events, attempts, firsts)}


def _step_time_by_size(events: list, attempts: dict) -> dict[str, float | None]:
    gaps: dict[str, list[float]] = collections.defaultdict(list)
    reports = [e for e in events if e.kind == "report" and e.data.get("step") is not None]
    for prev, r in zip(reports, reports[1:]):
        if prev.attempt == r.attempt in attempts and r.data["step"] > prev.data["step"]:
            size = str(attempts[r.attempt].data.get("world_size"))
            gaps[size].append((r.t - prev.t) / (r.data["step"] - prev.data["step"]))
    return {size: median(values) for size, values in sorted(gaps.items())}


def _losses(timeline: Timeline, events: list, attempts: dict, firsts: dict, full: int) -> list[dict]:
    out = []
    ended = next((e for e in events if e.kind == "run_finished"), None)
    for m in recovery_metrics(timeline):
        if m.recovered_attempt not in attempts or m.recovered_attempt not in firsts:
            continue
        attempt, first = attempts[m.recovered_attempt], firsts[m.recovered_attempt]
        hit = max((a for a, e in attempts.items() if e.t <= m.fault_t), default=None)
        back = next((e for e in events if e.kind == "node_alive" and e.t > m.fault_t), None)
        whole = next((firsts[a] for a in sorted(firsts) if a > m.recovered_attempt
                      and attempts.get(a) is not None and attempts[a].data.get("world_size") == full), None)
        size = attempt.data.get("world_size")
        degraded = 0.0 if size == full else ((whole or ended).t - first.t if (whole or ended) else None)
        out.append({"world_size": size, "world_size_before": attempts[hit].data.get("world_size") if hit is not None
                    else None, "time_to_first_report_s": m.time_to_recover,
                    "capacity_back_s": back.t - m.fault_t if back else None, "degraded_s": degraded})
    return out


def _resizes(events: list, attempts: dict, firsts: dict) -> list[dict]:
    out = []
    for a, attempt in sorted(attempts.items()):
        if attempt.data.get("cause") != "resize":
            continue
        decided = next((d for d in reversed(events) if d.kind == "resize_decision" and d.t <= attempt.t), None)
        before = attempts.get(a - 1)
        back = next((e for e in reversed(events) if e.kind == "node_alive" and decided and e.t <= decided.t), None)
        first = firsts.get(a)
        charged = [d.data for d in events if d.kind == "failure_decision" and decided is not None
                   and decided.t <= d.t <= (first.t if first else float("inf"))]
        out.append({"attempt": a, "from": before.data.get("world_size") if before else None,
                    "to": attempt.data.get("world_size"),
                    "decided_after_capacity_back_s": decided.t - back.t if decided and back else None,
                    "first_report_after_capacity_back_s": first.t - back.t if first and back else None,
                    "restart_s": first.t - decided.t if first and decided else None,
                    "charged": [{k: c.get(k) for k in ("decision", "budget_class", "count")} for c in charged]})
    return out


def _worst(values: Iterable[float | None]) -> float | None:
    seen = [v for v in values if v is not None]
    return max(seen) if seen else None


def test_record(test: str, fault_kinds: Iterable[str], backend: str, outcome: str, verdicts: Iterable[Any],
                timeline: Timeline, metrics: Mapping[str, Any] | None) -> dict:
    """The per-test record (the module docstring's shape), for every kind of experiment."""
    return {"test": test, "fault_kind": ",".join(sorted(set(fault_kinds))), "backend": backend, "outcome": outcome,
            "verdicts": [v.to_json() for v in verdicts], "metrics": dict(metrics or {}),
            "recoveries": [dataclasses.asdict(m) for m in recovery_metrics(timeline)]}


def failure_config_of(timeline: Timeline) -> dict:
    """The FailureConfig the run's controller reported (empty before it started)."""
    started = timeline.first("controller_started")
    return started.data.get("failure_config", {}) if started else {}


def record_path(records_dir: str | os.PathLike, record: Mapping[str, Any]) -> Path:
    """One file per (test, backend): a rerun of a test replaces its own record only."""
    key = f"{record['test']}|{record.get('backend', '')}"
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", record["test"])[-80:]
    return Path(records_dir) / f"{readable}-{hashlib.sha1(key.encode()).hexdigest()[:10]}.json"


def append_record(records_dir: str | os.PathLike, record: Mapping[str, Any]) -> Path:
    """Store one test's record; safe when many sessions write to the same directory."""
    for field in ("test", "fault_kind", "outcome"):
        if field not in record:
            raise ChaosError(f"summary record lacks {field!r}: {dict(record)!r:.200}")
    path = record_path(records_dir, record)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".record-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, default=str)
        os.replace(tmp, path)  # atomic: a reader sees the old record or the new, never half
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_records(records_dir: str | os.PathLike) -> list[dict]:
    records = []
    for path in sorted(Path(records_dir).glob("*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ChaosError(f"corrupt summary record {path}: {e}") from e
    return records


def summarize(records: list[dict]) -> dict:
    """Run-level view: outcomes, diagnoses and per-fault-kind medians."""
    by_kind: dict[str, list[dict]] = collections.defaultdict(list)
    for r in records:
        by_kind[r["fault_kind"]].append(r)
    return {
        "tests": len(records),
        "outcomes": dict(collections.Counter(r["outcome"] for r in records)),
        "diagnoses": dict(
            collections.Counter(v["diagnosis"] for r in records for v in r.get("verdicts", []) if v.get("diagnosis"))
        ),
        "by_fault_kind": {kind: _kind_summary(rs) for kind, rs in sorted(by_kind.items())},
    }


def _kind_summary(records: list[dict]) -> dict:
    out: dict[str, Any] = {
        "tests": len(records),
        "outcomes": dict(collections.Counter(r["outcome"] for r in records)),
    }
    for name in MEDIAN_METRICS:
        out[f"median_{name}"] = median((r.get("metrics") or {}).get(name) for r in records)
    return out


def write_summary(records_dir: str | os.PathLike = DEFAULT_RECORDS, out_path: str | os.PathLike = DEFAULT_SUMMARY) -> Path:
    """Merge every record in ``records_dir`` into ``out_path`` (run summary + per-test records)."""
    records = load_records(records_dir)
    summary = {
        "generated_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "run": summarize(records),
        "records": records,
    }
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(summary, indent=1, default=str))
    os.replace(tmp, out)
    return out
