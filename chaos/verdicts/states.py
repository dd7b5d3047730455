"""What a run's reports say about its state: each rank's state at every report and at its
end, and the fault-free baseline (chaos.baseline makes it) the state verdicts compare with."""

from __future__ import annotations

import dataclasses
from typing import Any

from chaos.timeline import Event, Timeline, faulted_runs, runs, steps_of
from chaos.verdicts.tolerance import finite

# Metrics a workload reports to name its whole state (the reference workload's digest of its
# weights and optimizer), read from the reports' metrics besides the state metric.
STATE_DIGEST_METRICS = ("state_digest",)
# The parts of a workload's state a restore can lose, each with what losing it means: a
# workload that reports digest_<part> of the state each step *began* from (the reference
# workload does) lets the state verdicts name the part.  Causes first: the weights follow
# from every other part, the optimizer's state from the weights and the schedule, so where
# several differ at once the first of this order is named.
DIGEST_PARTS = ("data", "rng", "scheduler", "optimizer", "weights")
PART_CAUSES = {
    "data": "the data position (sampler, cursor) was not restored",
    "rng": "the RNG state was not restored",
    "scheduler": "the LR scheduler's state was not restored",
    "optimizer": "the optimizer's state (momentum, ...) was not restored",
    "weights": "the model's weights were not restored",
}
TRAJECTORY_METRICS = (*STATE_DIGEST_METRICS, *(f"digest_{p}" for p in DIGEST_PARTS))
# Digests of the float state a step's update changes.  After a restart they are exact only for
# the state the restart restored (the first step's began digests): its first update sums the
# ranks' gradients in another order than an uninterrupted run's (DDP buckets a new group's first
# allreduce by parameter order, later ones by the order gradients became ready), and beyond two
# ranks a sum's order shows in the last bits (sums_reorder).  Measured on a 3-rank run: the first re-done step
# reproduced its loss and every began digest bit for bit, its state after the update did not.
# The data position, RNG and scheduler hold no such sums and compare exactly at every step.
UPDATED_DIGESTS = ("state_digest", "digest_weights", "digest_optimizer")


def sums_reorder(world_size: int | None) -> bool:
    """Whether a restart can change the bits of an update (UPDATED_DIGESTS): a sum of two
    gradients is the same in either order, of three or more it is not.  An unknown size
    keeps the digests exact."""
    return world_size is not None and world_size > 2
# What a loss alone cannot tell apart: the state parts a step's loss depends on after the first
# update from a restored state (the first re-done step's loss is computed before any update).
AFTER_THE_FIRST_STEP = "the optimizer's or LR scheduler's state, the data position or the RNG"


@dataclasses.dataclass
class Baseline:
    """A fault-free run of the same workload and seed: each rank's final state and its state
    at every report, or why there is none (``error``).  chaos.baseline makes and caches it."""

    key: str
    final: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)  # rank -> {"step", "state"}
    # rank -> [[step, {metric: value}], ...] in the order reported (trajectory_of)
    trajectory: dict[int, list[Any]] = dataclasses.field(default_factory=dict)
    job_id: str | None = None
    made_at: str | None = None
    run_name: str | None = None
    storage_path: str | None = None
    cached: bool = False
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Baseline:
        fields = {f.name for f in dataclasses.fields(cls)}
        b = cls(**{k: v for k, v in data.items() if k in fields})
        b.final = {int(rank): v for rank, v in (b.final or {}).items()}
        b.trajectory = {int(rank): v for rank, v in (b.trajectory or {}).items()}
        return b

    def origin(self) -> str:
        return f"fault-free baseline job {self.job_id} of {self.made_at}" + (", cached" if self.cached else "")


def faulted_run_events(timeline: Timeline) -> list[Event]:
    """The recorder events of the (last) Train run the faults hit."""
    hit = faulted_runs(timeline)
    return dict(runs(timeline)).get(hit[-1], []) if hit else []


def faulted_run_reports(timeline: Timeline) -> tuple[list[Event], str | None]:
    """The reports of the (last) Train run the faults hit, and its state metric."""
    events = faulted_run_events(timeline)
    started = next((e for e in events if e.kind == "controller_started"), None)
    metric = started.data.get("state_metric") if started else None
    return [e for e in events if e.kind == "report"], metric


def rank_states(report: Event, metric: str | None, digests: tuple[str, ...]) -> dict[int, tuple[Any, dict[str, Any]]]:
    """rank -> (step, state) of one report.  The state is the recorded state metric (per rank)
    and, for the rank whose whole metrics the recorder keeps (the report's first rank), the
    ``digests`` and the state metric as reported (a hex hash the recorder's numeric view drops)."""
    kept = next(iter(report.data.get("steps") or {}), None)
    out = {}
    for rank, step in steps_of(report).items():
        state: dict[str, Any] = {}
        value = (report.data.get("states") or {}).get(str(rank))
        if metric and comparable(value):
            state[metric] = value
        if str(rank) == str(kept):
            reported = report.data.get("metrics") or {}
            for name in (*([metric] if metric else []), *digests):
                if name not in state and comparable(reported.get(name)):
                    state[name] = reported[name]
        out[rank] = (step, state)
    return out


def comparable(value: Any) -> bool:
    """A state value that can be compared: a digest, or a finite number (a NaN or infinite loss
    is none — two runs that both diverged to inf are not shown to be in one state)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return finite(value)
    return value is not None


def final_states(timeline: Timeline) -> dict[int, dict[str, Any]]:
    """Each rank's last report in the (last) Train run the faults hit: {"step": s, "state": {...}}."""
    reports, metric = faulted_run_reports(timeline)
    out: dict[int, dict[str, Any]] = {}
    for r in reports:
        for rank, (step, state) in rank_states(r, metric, STATE_DIGEST_METRICS).items():
            out[rank] = {"step": step, "state": state}
    return out


def trajectory_of(timeline: Timeline) -> dict[int, list[Any]]:
    """Each rank's (step, state) at every report of the run the faults hit, in report order
    (a fault-free run's is the baseline the state-trajectory verdict follows)."""
    reports, metric = faulted_run_reports(timeline)
    out: dict[int, list[Any]] = {}
    for r in reports:
        for rank, (step, state) in rank_states(r, metric, TRAJECTORY_METRICS).items():
            out.setdefault(rank, []).append([step, state])
    return out


def fmt(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def baseline_unusable(timeline: Timeline, baseline: Baseline) -> str | None:
    """Why ``baseline`` cannot be compared with this run (no baseline made, or one that shared
    the run's Train run and so resumed from its checkpoints or gave it its own), else None."""
    if baseline.error:
        return f"unverifiable: no baseline could be made: {baseline.error}"
    started = next((e for e in faulted_run_events(timeline) if e.kind == "controller_started"), None)
    if started is not None and baseline.run_name and (started.data.get("run_name"), started.data.get(
            "storage_path")) == (baseline.run_name, baseline.storage_path):
        return (f"unverifiable: no baseline could be made: the fault-free run used the same Train run "
                f"({baseline.storage_path}/{baseline.run_name}), so one resumed from the other's checkpoints; give "
                "each run of the script its own name")
    return None


def baseline_path(timeline: Timeline) -> dict[int, tuple[str, str]]:
    """Per attempt of an elastic run the faults hit, what of it a fault-free baseline can follow:
    ``whole``; ``first`` (an attempt at another size than the run's first, begun from a state on
    the baseline's path: its first report's began digests); ``none`` (begun from a checkpoint
    committed off that path) — and why not all of it ('' where all).  The baseline ran at the
    size the run began with: both started on the healthy cluster.  {} where no size changed."""
    events = faulted_run_events(timeline)
    sizes = {e.attempt: len(e.data.get("placement") or []) for e in events
             if e.kind == "attempt_started" and e.attempt is not None}
    if len(set(sizes.values())) < 2:
        return {}
    size = sizes[min(sizes)]
    out: dict[int, tuple[str, str]] = {}
    on: dict[int, bool] = {}  # attempt -> its commits are on the path
    commits: list[Event] = []
    for e in events:
        if e.kind == "report" and e.data.get("checkpoint"):
            commits.append(e)
        if e.kind != "attempt_started" or e.attempt is None or e.attempt not in sizes:
            continue
        start = commits[-1].attempt if commits else None
        from_path = on.get(start, True) if start is not None else True
        on[e.attempt] = from_path and sizes[e.attempt] == size
        why = "" if on[e.attempt] else (
            f"it ran {sizes[e.attempt]} ranks, the baseline {size}" if from_path else
            f"it began from a checkpoint attempt {start} committed off the baseline's path (world size)")
        out[e.attempt] = ("whole" if on[e.attempt] else "first" if from_path else "none", why)
    return out
