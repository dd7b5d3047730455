"""Project the effective training time ratio (ETTR) of a large job from one session.

A chaos session measures, on a small cluster, what one failure costs: how long Ray took
to get training going again (restart cost R), how often the run committed a checkpoint
(interval tau, in compute seconds) and what a checkpoint cost (C).  A large job fails
more often -- at a rate that grows with its size -- and ETTR = productive time / wall time
is what that costs it.  This module turns the measured R, tau and C plus a published
failure rate into the ETTR of a job of N GPUs, two ways that check each other:

* analytic: Young's first-order model (waste = C/tau + (tau/2 + R)/M, optimum
  sqrt(2CM)) and Daly's complete exponential model (expected wall time per interval
  M e^(R/M) (e^((tau+C)/M) - 1), with his higher-order optimum), M the job's MTBF;
* Monte-Carlo: jobs of fixed productive work under Poisson failures, each failure losing
  the work since the last committed checkpoint and paying R.

Assumptions (docs/projection.md says them at length): failures are a Poisson process,
independent of each other and of the job's phase; the rate scales linearly with the
number of GPUs; every failure interrupts the whole (synchronous) job; R and C do not
grow with scale -- they were measured on a small cluster, so the projection is
optimistic.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from chaos.errors import ChaosError

HOUR = 3600.0
DAY = 24 * HOUR
Z95 = 1.959963984540054  # two-sided 95 % normal quantile


@dataclasses.dataclass(frozen=True)
class FailureRate:
    """Interruptions per GPU-hour, and where that figure comes from."""

    per_gpu_hour: float
    source: str

    @classmethod
    def published(cls, interruptions: float, days: float, gpus: int, source: str) -> "FailureRate":
        return cls(interruptions / (days * 24 * gpus), source)

    def mtbf_s(self, gpus: int) -> float:
        """The job's mean time between failures: the per-GPU rate scaled linearly with size."""
        return math.inf if self.per_gpu_hour == 0 else HOUR / (self.per_gpu_hour * gpus)


# Llama 3 report (Dubey et al., "The Llama 3 Herd of Models", 2024, section 3.3.4): 419
# unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs.
LLAMA3 = FailureRate.published(
    419, 54, 16384, "Llama 3 report: 419 unexpected interruptions in 54 days on 16,384 GPUs")


# -- analytic ------------------------------------------------------------------------


def young_interval(C: float, M: float) -> float:
    """Young (1974): the first-order optimum interval, sqrt(2 C M)."""
    return math.sqrt(2 * C * M)


def daly_interval(C: float, M: float) -> float:
    """Daly (2006): the higher-order optimum, better than Young's when C is not << M."""
    if C >= 2 * M:
        return M
    x = C / (2 * M)
    return math.sqrt(2 * C * M) * (1 + math.sqrt(x) / 3 + x / 9) - C


def ettr_first_order(tau: float, C: float, R: float, M: float) -> float:
    """Young's first-order ETTR, 1 - C/tau - (tau/2 + R)/M: fine while tau + C + R << M.

    Can go below 0 far outside that regime (the expansion breaks down); not clipped, so
    the breakdown shows.
    """
    return 1 - C / tau - (tau / 2 + R) / M


def _segment_wall(length: float, C: float, R: float, M: float) -> float:
    """Daly's expected wall time to get ``length`` of work and its checkpoint committed.

    M e^(R/M) (e^((length+C)/M) - 1): the first try pays no restart, each retry pays R;
    a failure during the checkpoint or the restart loses that try too.
    """
    if math.isinf(M):
        return length + C
    return M * math.exp(R / M) * math.expm1((length + C) / M)


def expected_wall(work: float, tau: float, C: float, R: float, M: float) -> float:
    """Expected wall time of a job of ``work`` productive seconds, checkpointing every tau."""
    full, rest = _segments(work, tau)
    return full * _segment_wall(tau, C, R, M) + (_segment_wall(rest, C, R, M) if rest else 0.0)


def ettr_daly(tau: float, C: float, R: float, M: float, work: float | None = None) -> float:
    """Daly's complete-model ETTR; for ``work`` None, the long-job limit tau / wall(tau)."""
    if work is None:
        return tau / _segment_wall(tau, C, R, M)
    return work / expected_wall(work, tau, C, R, M)


def _segments(work: float, tau: float) -> tuple[int, float]:
    full = math.floor(work / tau + 1e-9)
    rest = work - full * tau
    return full, (rest if rest > 1e-9 * tau else 0.0)


# -- Monte-Carlo ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Simulated:
    """ETTR of ``reps`` simulated jobs: total productive / mean wall, with its 95 % CI."""

    ettr: float
    low: float
    high: float
    reps: int
    mean_failures: float
    work: float = 0.0
    mean_wall: float = 0.0
    sd_wall: float = 0.0

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def interval(self, z: float) -> tuple[float, float]:
        """The interval at another confidence (z: the normal quantile, 1.96 for 95 %)."""
        half = z * self.sd_wall / math.sqrt(self.reps) if self.reps > 1 else 0.0
        return self.work / (self.mean_wall + half), self.work / max(self.mean_wall - half, 1e-300)


def simulate(work: float, tau: float, C: float, R: float, M: float, reps: int = 400,
             seed: int | np.random.Generator = 0, max_failures: int = 1_000_000) -> Simulated:
    """Run ``reps`` jobs of ``work`` productive seconds under Poisson failures of mean gap M.

    Walks each job from failure to failure (vectorised over the jobs): the time to the
    next failure is an exponential draw; in it the job first pays R (after a failure),
    then commits whole intervals of tau + C; the failure throws away the interval it hit.
    The estimate is work / mean(wall) -- the job's long-run productive fraction, the same
    quantity the analytic model gives -- with a 95 % interval from the spread of the walls.
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    full, rest = _segments(work, tau)
    seg = tau + C
    walls = np.zeros(reps)
    failures = np.zeros(reps, dtype=np.int64)
    done = np.zeros(reps, dtype=np.int64)  # full intervals committed
    restarting = np.zeros(reps, dtype=bool)  # the job must pay R before working again
    active = np.ones(reps, dtype=bool)
    while active.any():
        idx = np.flatnonzero(active)
        gap = rng.exponential(M, size=idx.size) if not math.isinf(M) else np.full(idx.size, math.inf)
        restart = np.where(restarting[idx], R, 0.0)
        left_full = full - done[idx]
        to_finish = restart + left_full * seg + (rest + C if rest else 0.0)
        finished = gap >= to_finish
        walls[idx[finished]] += to_finish[finished]
        active[idx[finished]] = False
        hit = idx[~finished]
        g, r = gap[~finished], restart[~finished]
        usable = np.maximum(g - r, 0.0)
        committed = np.minimum(np.floor(usable / seg).astype(np.int64), left_full[~finished])
        done[hit] += committed
        walls[hit] += g
        failures[hit] += 1
        restarting[hit] = True
        if failures.max(initial=0) > max_failures:
            raise ChaosError(f"a simulated job passed {max_failures} failures without finishing: MTBF {M:.0f} s "
                             f"is too short for an interval of {tau:.0f} s + checkpoint {C:.0f} s + restart {R:.0f} s")
    mean = float(walls.mean())
    sd = float(walls.std(ddof=1)) if reps > 1 else 0.0
    half = Z95 * sd / math.sqrt(reps) if reps > 1 else 0.0
    return Simulated(work / mean, work / (mean + half), work / max(mean - half, 1e-300), reps,
                     float(failures.mean()), work, mean, sd)


def sweep(work: float, taus: Sequence[float], C: float, R: float, M: float, reps: int = 400,
          seed: int = 0) -> list[Simulated]:
    """Simulated ETTR at each interval, with the same seed for each (common random numbers:
    the differences between intervals are not drowned by noise)."""
    return [simulate(work, tau, C, R, M, reps=reps, seed=seed) for tau in taus]


# -- inputs from a session -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Measured:
    """One input figure and where it came from (summary.json or an option)."""

    value: float
    source: str


@dataclasses.dataclass(frozen=True)
class Inputs:
    restart: Measured  # R: fault -> first report of the attempt that recovered
    interval: Measured  # tau: compute seconds between checkpoints
    cost: Measured  # C: what one checkpoint adds to the step it is taken at
    faults: int
    tests: int
    detect: float | None = None
    restart_attempt: float | None = None
    steps_lost: float | None = None
    step_time: float | None = None
    every_steps: float | None = None
    elastic: "ElasticInputs | None" = None  # from the session's elastic runs, if any


def load_inputs(path: str | os.PathLike, interval: float | None = None, cost: float | None = None,
                restart: float | None = None) -> Inputs:
    """The model's inputs from a summary.json (chaos.summary.write_summary), options winning.

    R is the median time to recover over every fault that recovered (fault -> the first
    report of the attempt that recovered: detection, restart, and the first step); tau and C
    are the medians over the tests of ``metrics.checkpointing``.  A summary with no
    recovered fault is an error: nothing was measured, and nothing is made up.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ChaosError(f"summary not found: {path} (the chaos suites write reports/summary.json)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ChaosError(f"cannot read summary {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise ChaosError(f"summary {path} is not JSON: {e}") from None
    records = data.get("records") if isinstance(data, dict) else None
    if not isinstance(records, list):
        raise ChaosError(f"{path} has no 'records' list: not a summary written by chaos.summary")

    # R is a fixed-size job's: an elastic run's first report after a loss comes at a smaller size
    fixed = [r for r in records if not _elastic(r)]
    faults = [f for r in fixed for f in _faults(r)]
    recover = _numbers(path, "time_to_recover", (f.get("time_to_recover") for f in faults))
    if not recover and restart is None:
        raise ChaosError(f"nothing measured to project from: {path} holds {len(records)} test record(s) and no fault "
                         "of a fixed-size run with a measured time to recover")
    steps = [(r.get("metrics") or {}).get("checkpointing") or {} for r in records]
    step_time = _median(_numbers(path, "step_time_s", (s.get("step_time_s") for s in steps)))
    every = _median(_numbers(path, "checkpoint_every_steps", (s.get("checkpoint_every_steps") for s in steps)))
    tests = len({r.get("test") for r in fixed if _faults(r)})
    tau = _figure(path, steps, "checkpoint_interval_s", interval, "--checkpoint-interval")
    if tau.value <= 0:
        raise ChaosError(f"{tau.source}: a checkpoint interval of {tau.value!r} s leaves no time to train")
    where = f"{path}: median of"
    return Inputs(
        restart=(Measured(restart, "--restart-cost") if restart is not None else
                 Measured(statistics.median(recover), f"{where} {len(recover)} fault(s), time to recover")),
        interval=tau,
        cost=_figure(path, steps, "checkpoint_cost_s", cost, "--checkpoint-cost"),
        faults=len(recover),
        tests=tests,
        detect=_median(_numbers(path, "time_to_detect", (f.get("time_to_detect") for f in faults))),
        restart_attempt=_median(_numbers(path, "time_to_restart", (f.get("time_to_restart") for f in faults))),
        steps_lost=_median(_numbers(path, "steps_lost", (f.get("steps_lost") for f in faults))),
        step_time=step_time,
        every_steps=every,
        elastic=load_elastic(path, records),
    )


def _elastic(record: Any) -> dict | None:
    return ((record.get("metrics") or {}).get("elastic") or None) if isinstance(record, dict) else None


def _faults(record: dict) -> list[dict]:
    """A record's per-fault figures; faults injected after the run had ended cost nothing."""
    if not isinstance(record, dict):
        return []
    faults = record.get("recoveries")
    if faults is None:
        faults = (record.get("metrics") or {}).get("faults") or []
    return [f for f in faults if isinstance(f, dict) and not f.get("after_run_end")]


def _numbers(path: Path, name: str, values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ChaosError(f"{path}: {name} = {v!r} is not a non-negative number")
        out.append(float(v))
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _figure(path: Path, steps: list[dict], key: str, override: float | None, option: str) -> Measured:
    if override is not None:
        return Measured(override, option)
    values = _numbers(path, key, (s.get(key) for s in steps))
    if not values:
        raise ChaosError(f"{path} has no measured {key} (metrics.checkpointing, written by chaos.summary from runs "
                         f"that committed two or more checkpoints): re-run the suites, or pass {option} SECONDS")
    return Measured(statistics.median(values), f"{path}: median of {len(values)} test(s), {key}")


# -- the projection ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    """ETTR of one job size at one interval, both ways."""

    gpus: int
    label: str
    tau: float
    mtbf: float
    first_order: float
    daly: float
    sim: Simulated


def project(inputs: Inputs, gpus: Sequence[int], rate: FailureRate = LLAMA3, work: float = 30 * DAY,
            reps: int = 400, seed: int = 0) -> list[Row]:
    """For each job size: ETTR at the measured interval and at Young's and Daly's optima."""
    R, tau, C = inputs.restart.value, inputs.interval.value, inputs.cost.value
    rows = []
    for n in gpus:
        M = rate.mtbf_s(n)
        points = [("current interval", tau)]
        if C > 0 and not math.isinf(M):
            points += [("Young optimum", young_interval(C, M)), ("Daly optimum", daly_interval(C, M))]
        for label, t in points:
            rows.append(Row(n, label, t, M, ettr_first_order(t, C, R, M), ettr_daly(t, C, R, M, work),
                            simulate(work, t, C, R, M, reps=reps, seed=seed)))
    return rows


def format_report(inputs: Inputs, rows: list[Row], rate: FailureRate, work: float, seed: int) -> str:
    """The table `ray-chaos project` prints and the report attaches."""
    lines = ["inputs (measured in the session unless an option set them)"]
    lines += [f"  {name:<22} {_s(m.value):>12}   {m.source}" for name, m in (
        ("restart cost R", inputs.restart), ("checkpoint interval", inputs.interval), ("checkpoint cost C", inputs.cost))]
    shown = (("time to detect", inputs.detect, "s"), ("time to restart", inputs.restart_attempt, "s"),
             ("step time", inputs.step_time, "s"), ("checkpoint every", inputs.every_steps, "steps"),
             ("steps lost", inputs.steps_lost, "steps"))
    lines += ["  context (medians, not model inputs: R already holds detect and restart; a failure at a random",
              "  moment loses tau/2 on average, not the steps lost in the session, where triggers chose the moment)"]
    lines += [f"  {name:<22} {_s(v) if unit == 's' else f'{v:g} {unit}':>12}" for name, v, unit in shown if v is not None]
    lines += [f"  from {inputs.faults} recovered fault(s) in {inputs.tests} test(s)", "", "assumptions"]
    lines += [f"  failure rate           {rate.per_gpu_hour:.3g} interruptions per GPU-hour ({rate.source})",
              "  failures               Poisson, independent, each one stops the whole job; rate linear in GPUs",
              "  R and C                constant with job size (measured on a small cluster: likely optimistic)",
              f"  job                    {work / DAY:g} days of productive work; simulated {rows[0].sim.reps if rows else 0}"
              f" times, seed {seed}, 95 % interval", ""]
    lines.append(f"{'GPUs':>7} {'MTBF':>9}  {'interval':<18} {'tau':>9} {'first-order':>11} {'Daly':>8}"
                 f" {'simulated [95% CI]':>26} {'failures':>9}")
    for r in rows:
        ci = f"{r.sim.ettr:.4f} [{r.sim.low:.4f}, {r.sim.high:.4f}]"
        lines.append(f"{r.gpus:>7} {_s(r.mtbf):>9}  {r.label:<18} {_s(r.tau):>9} {r.first_order:>11.4f}"
                     f" {r.daly:>8.4f} {ci:>26} {r.sim.mean_failures:>9.1f}")
    return "\n".join(lines)


def _s(seconds: float) -> str:
    """Seconds in the unit a person reads best."""
    if math.isinf(seconds):
        return "inf"
    if seconds >= 2 * DAY:
        return f"{seconds / DAY:.1f} d"
    if seconds >= 2 * HOUR:
        return f"{seconds / HOUR:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


# -- fixed vs elastic ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ElasticInputs:
    """What one lost node cost the session's elastic runs (``metrics.elastic``, chaos.summary)."""

    first_report: Measured  # the loss -> the first report of the attempt at the smaller size
    degraded: Measured  # that first report -> the first report at full size again
    resize_restart: Measured  # Train's resize decision -> the grown attempt's first report
    losses: int
    session_throughput: float | None = None  # measured: (size / step time) below full over at full
    capacity_back: Measured | None = None  # the loss -> the lost node back (context: both modes wait on it)


def load_elastic(path: Path, records: list) -> ElasticInputs | None:
    """The elastic figures of a summary's records; None when it has no elastic run that lost
    capacity and grew back (nothing to compare)."""
    figures = [e for r in records if (e := _elastic(r))]
    losses = [x for e in figures for x in e.get("losses") or [] if x.get("degraded_s") is not None]
    resizes = [x for e in figures for x in e.get("resizes") or []]
    first = _numbers(path, "time_to_first_report_s", (x.get("time_to_first_report_s") for x in losses))
    degraded = _numbers(path, "degraded_s", (x.get("degraded_s") for x in losses))
    restart = _numbers(path, "restart_s", (x.get("restart_s") for x in resizes))
    if not (first and degraded and restart):
        return None
    back = _numbers(path, "capacity_back_s", (x.get("capacity_back_s") for x in losses))
    where = f"{path}: median of"
    return ElasticInputs(Measured(statistics.median(first), f"{where} {len(first)} loss(es)"),
                         Measured(statistics.median(degraded), f"{where} {len(degraded)} loss(es)"),
                         Measured(statistics.median(restart), f"{where} {len(restart)} resize(s)"),
                         len(losses), _median(_numbers(path, "throughput ratio", map(_throughput_ratio, figures))),
                         Measured(statistics.median(back), f"{where} {len(back)} loss(es)") if back else None)


def _throughput_ratio(figures: dict) -> float | None:
    """Throughput (world size / step time) at the smallest size the run had over its full size's."""
    times = {int(size): t for size, t in (figures.get("step_time_s") or {}).items() if t}
    full = figures.get("max_workers")
    if full not in times or len(times) < 2:
        return None
    low = min(times)
    return (low / times[low]) / (full / times[full])


def elastic_restart_cost(el: ElasticInputs, tau: float, kept: float) -> float:
    """What one loss costs an elastic job, in full-speed seconds: its first report after the
    loss, the degraded time at ``kept`` of full throughput (less the resize's restart, when it
    trains nothing), the resize's restart, and the work since the last checkpoint that the
    resize throws away (tau/2 on average: a resize starts the new group from it)."""
    running = max(el.degraded.value - el.resize_restart.value, 0.0)
    return el.first_report.value + (1 - kept) * running + el.resize_restart.value + tau / 2


@dataclasses.dataclass(frozen=True)
class Comparison:
    gpus: int
    mtbf: float
    kept: float  # throughput left with one node gone
    fixed_r: float
    elastic_r: float
    fixed: float  # Daly ETTR
    elastic: float
    fixed_sim: Simulated
    elastic_sim: Simulated


def compare(inputs: Inputs, gpus: Sequence[int], rate: FailureRate = LLAMA3, work: float = 30 * DAY,
            gpus_per_node: int = 8, reps: int = 400, seed: int = 0) -> list[Comparison]:
    """Per job size, at the current interval: a fixed-size job pays R per failure; an elastic
    one its own cost (elastic_restart_cost), with one node of ``gpus_per_node`` lost."""
    el = inputs.elastic
    if el is None:
        raise ChaosError("no elastic run in the summary lost capacity and grew back: nothing to compare with")
    tau, C, R = inputs.interval.value, inputs.cost.value, inputs.restart.value
    rows = []
    for n in gpus:
        M, kept = rate.mtbf_s(n), max(0.0, 1 - gpus_per_node / n)
        Re = elastic_restart_cost(el, tau, kept)
        rows.append(Comparison(n, M, kept, R, Re, ettr_daly(tau, C, R, M, work), ettr_daly(tau, C, Re, M, work),
                               simulate(work, tau, C, R, M, reps=reps, seed=seed),
                               simulate(work, tau, C, Re, M, reps=reps, seed=seed)))
    return rows


def format_comparison(inputs: Inputs, rows: list[Comparison], gpus_per_node: int) -> str:
    """The fixed-vs-elastic table `ray-chaos project` prints after the projection."""
    el = inputs.elastic
    assert el is not None
    figures = [("first report, fixed", inputs.restart), ("first report, elastic", el.first_report),
               ("degraded (below full)", el.degraded), ("resize restart", el.resize_restart)]
    if el.capacity_back is not None:
        figures.append(("lost node back after", el.capacity_back))
    lines = ["fixed vs elastic (a node lost per failure: a fixed job waits for it, an elastic one goes on without "
             "it and grows back)"]
    lines += [f"  {name:<26} {_s(m.value):>9}   {m.source}" for name, m in figures]
    if el.session_throughput is not None:
        lines.append(f"  {'throughput when degraded':<26} {el.session_throughput:>9.2f}   measured: the smallest "
                     "size's over the full size's")
    lines += ["  elastic R = first report + (1 - kept) x (degraded - resize restart) + resize restart + tau/2",
              f"  (a resize restarts from the last checkpoint); kept = 1 - {gpus_per_node}/GPUs; both R grow with the "
              "time a lost node takes to come back",
              "",
              f"{'GPUs':>7} {'MTBF':>9} {'kept':>7} {'R fixed':>9} {'R elastic':>10} {'fixed':>8} {'elastic':>8}"
              f" {'simulated fixed':>24} {'simulated elastic':>24}"]
    for r in rows:
        fixed, elastic = (f"{x.ettr:.4f} [{x.low:.4f}, {x.high:.4f}]" for x in (r.fixed_sim, r.elastic_sim))
        lines.append(f"{r.gpus:>7} {_s(r.mtbf):>9} {r.kept:>7.4f} {_s(r.fixed_r):>9} {_s(r.elastic_r):>10}"
                     f" {r.fixed:>8.4f} {r.elastic:>8.4f} {fixed:>24} {elastic:>24}")
    return "\n".join(lines)


# -- the picture ---------------------------------------------------------------------

PLOT_GPUS = (1024, 4096, 16384)


def render_plot(inputs: Inputs, path: str | os.PathLike, gpus: Sequence[int] = PLOT_GPUS,
                rate: FailureRate = LLAMA3, work: float = 30 * DAY, reps: int = 200, seed: int = 0) -> Path:
    """Projected ETTR against checkpoint interval, one curve per job size (PNG).

    Lines: Daly's model (solid) and Young's first order (dashed); dots with bars: the
    simulation; a vertical line at the measured interval; a star at Daly's optimum.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure  # no pyplot: no global state

    R, tau, C = inputs.restart.value, inputs.interval.value, inputs.cost.value
    Ms = [rate.mtbf_s(n) for n in gpus]
    optima = [daly_interval(C, M) for M in Ms if C > 0 and not math.isinf(M)]
    lo = min([tau, *optima]) / 10
    hi = max([tau, *optima]) * 10
    grid = np.geomspace(lo, hi, 200)
    fig = Figure(figsize=(10, 5.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_xscale("log")
    for i, (n, M) in enumerate(zip(gpus, Ms)):
        colour = colormaps["tab10"](i)
        ax.plot(grid, [ettr_daly(t, C, R, M) for t in grid], color=colour, linewidth=1.6,
                label=f"{n:,} GPUs (MTBF {_s(M)})")
        ax.plot(grid, [ettr_first_order(t, C, R, M) for t in grid], color=colour, linewidth=1, linestyle="--")
        dots = np.geomspace(lo, hi, 7)
        sims = sweep(work, dots, C, R, M, reps=reps, seed=seed)
        ax.errorbar(dots, [s.ettr for s in sims], yerr=[[s.ettr - s.low for s in sims], [s.high - s.ettr for s in sims]],
                    fmt="o", markersize=4, color=colour, capsize=2)
        if C > 0 and not math.isinf(M):
            t = daly_interval(C, M)
            ax.plot([t], [ettr_daly(t, C, R, M)], marker="*", markersize=13, color=colour, markeredgecolor="black")
    ax.axvline(tau, color="black", linestyle=":", linewidth=1.3, label=f"current interval {_s(tau)} ({_origin(inputs.interval)})")
    ax.plot([], [], color="0.4", linestyle="--", linewidth=1, label="Young first order")
    ax.plot([], [], "o", color="0.4", markersize=4, label="simulated (95 % CI)")
    ax.plot([], [], "*", color="white", markeredgecolor="black", markersize=11, label="Daly optimum")
    floor = min(ettr_daly(t, C, R, M) for t in (lo, hi, tau) for M in Ms)
    ax.set_ylim(max(0.0, floor - 0.1 * (1 - floor)), 1.0)
    ax.set_xlabel("checkpoint interval tau (compute seconds between checkpoints, log scale)")
    ax.set_ylabel("projected ETTR (productive / wall time)")
    ax.set_title(f"Projected ETTR: R = {_s(R)} ({_origin(inputs.restart)}), C = {_s(C)} ({_origin(inputs.cost)}); "
                 f"failures at {rate.per_gpu_hour:.3g}/GPU-hour, Poisson", fontsize=10)
    ax.grid(alpha=0.25, which="both")
    ax.legend(loc="lower left", fontsize=8)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def _origin(m: Measured) -> str:
    return m.source if m.source.startswith("--") else "measured"


# -- the report section --------------------------------------------------------------


def attach(results_dir: str | os.PathLike, summary_path: str | os.PathLike, gpus: Sequence[int] = PLOT_GPUS,
           rate: FailureRate = LLAMA3, work: float = 30 * DAY, reps: int = 200, seed: int = 0) -> Path:
    """Put the projection into an Allure results directory as the session's global
    attachments (Allure 3's ``<uuid>-globals.json``): the plot and the table, on the report's
    session-wide page.  A projection is no test, so it is no test result either — one would
    count in the report's success rate.  Returns the globals file; raises ChaosError when the
    summary holds nothing to project from."""
    import time
    import uuid as uuidlib

    inputs = load_inputs(summary_path)
    rows = project(inputs, gpus, rate, work=work, reps=reps, seed=seed)
    results = Path(results_dir)
    results.mkdir(parents=True, exist_ok=True)
    # one projection per results directory: generating the report again replaces it
    uid = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"chaos.projection.ettr:{results.resolve()}"))
    png = render_plot(inputs, results / f"{uid}-ettr-attachment.png", gpus, rate, work=work, reps=reps, seed=seed)
    table = results / f"{uid}-table-attachment.txt"
    table.write_text(format_report(inputs, rows, rate, work, seed) + "\n"
                     + f"Projected from {summary_path}. Assumptions: Poisson failures at {rate.per_gpu_hour:.3g} per "
                       f"GPU-hour ({rate.source}), linear in GPUs; restart and checkpoint cost as measured on this "
                       "(small) cluster, which is likely optimistic (docs/projection.md).\n")
    now = int(time.time() * 1000)
    out = results / f"{uid}-globals.json"
    out.write_text(json.dumps({"attachments": [
        {"name": "ETTR projection: ETTR vs checkpoint interval", "source": png.name, "type": "image/png",
         "timestamp": now},
        {"name": "ETTR projection: table", "source": table.name, "type": "text/plain", "timestamp": now}],
        "errors": []}, indent=1))
    return out
