"""The timeline picture: what happened to training, when, and what it cost.

One PNG per chaos test, attached to its Allure result.  Training step against wall time
(seconds since the first event), one colour per attempt (one line per rank, in the
attempt's colour, where its ranks reported different steps), checkpoint commits marked;
vertical lines for faults, node deaths/rejoins and attempt starts; the re-done (lost)
steps shaded; time to detect and time to recover drawn from each fault.

`plot_data` derives every number the picture shows, so tests can check the numbers
without reading pixels; `render_timeline` only draws them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from matplotlib import colormaps
from matplotlib.figure import Figure  # no pyplot: no global state, safe in threads
from matplotlib.ticker import MaxNLocator

from chaos.timeline import Event, Timeline, recovery_metrics, steps_of

MARKER_STYLE = {
    "fault_injected": {"color": "tab:red", "linestyle": "--", "linewidth": 1.6},
    "node_dead": {"color": "black", "linestyle": ":", "linewidth": 1.3},
    "node_alive": {"color": "tab:green", "linestyle": ":", "linewidth": 1.3},
    "attempt_started": {"color": "0.55", "linestyle": "-", "linewidth": 0.8},
    "run_finished": {"color": "0.2", "linestyle": "-.", "linewidth": 1.0},
    # an xid fault's automatic node recovery chain: kernel-log line, the agent's verdict, node back
    "xid_logged": {"color": "tab:purple", "linestyle": "--", "linewidth": 1.0},
    "node_agent_signal": {"color": "tab:orange", "linestyle": "-", "linewidth": 1.2},
    "node_agent_silent": {"color": "tab:orange", "linestyle": ":", "linewidth": 1.2},
    "node_down": {"color": "tab:brown", "linestyle": "-", "linewidth": 1.0},
    "node_recovered": {"color": "tab:olive", "linestyle": "-", "linewidth": 1.2},
    # a head fault (chaos.faults.head): the head's node table gone, answering again; the run resubmitted
    "head_unreachable": {"color": "black", "linestyle": "-.", "linewidth": 1.3},
    "head_reachable": {"color": "tab:green", "linestyle": "-.", "linewidth": 1.3},
    "job_submitted": {"color": "tab:blue", "linestyle": "--", "linewidth": 1.0},
}
LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1}


@dataclasses.dataclass
class Point:
    x: float  # seconds since the first event
    step: int | None
    checkpoint: bool


@dataclasses.dataclass
class Marker:
    x: float
    kind: str
    label: str


@dataclasses.dataclass
class LostSpan:
    """Attempt ``attempt`` re-did steps ``first_step``..``last_step`` between x0 and x1."""

    attempt: int
    first_step: int
    last_step: int
    x0: float
    x1: float

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1


@dataclasses.dataclass
class Recovery:
    """Times measured from one fault; None when the stage was never seen."""

    fault_x: float
    time_to_detect: float | None
    time_to_recover: float | None


@dataclasses.dataclass
class PlotData:
    has_steps: bool
    attempts: dict[int, list[Point]]  # rank 0's steps, for attempts whose ranks agreed
    markers: list[Marker]
    lost: list[LostSpan]
    recoveries: list[Recovery]
    end_x: float
    # attempts whose ranks reported different steps (one restarting from scratch, say):
    # (attempt, rank) -> that rank's points, drawn instead of the attempt's single line
    ranks: dict[tuple[int, int], list[Point]] = dataclasses.field(default_factory=dict)


def plot_data(timeline: Timeline) -> PlotData:
    """Everything the picture shows, in seconds since the first event."""
    events = timeline.events
    t0 = events[0].t if events else 0.0
    reports = timeline.reports()
    has_steps = any(r.data.get("step") is not None for r in reports)

    attempts: dict[int, list[Point]] = {a.attempt: [] for a in timeline.attempts() if a.attempt is not None}
    split = {r.attempt for r in reports if len(set(steps_of(r).values())) > 1}
    ranks: dict[tuple[int, int], list[Point]] = {}
    for r in reports:
        if r.attempt in split:
            for rank, step in sorted(steps_of(r).items()):
                ranks.setdefault((r.attempt, rank), []).append(Point(r.t - t0, step, bool(r.data.get("checkpoint"))))
        else:
            attempts.setdefault(r.attempt, []).append(Point(r.t - t0, r.data.get("step"),
                                                            bool(r.data.get("checkpoint"))))
    for a in split:
        attempts.pop(a, None)

    return PlotData(
        has_steps=has_steps,
        attempts=dict(sorted(attempts.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))),
        markers=[Marker(e.t - t0, e.kind, _marker_label(e)) for e in events
                 if e.kind in MARKER_STYLE and (e.kind != "job_submitted" or e.data.get("resubmits"))],
        lost=_lost_spans(timeline, t0) if has_steps else [],
        recoveries=[Recovery(m.fault_t - t0, m.time_to_detect, m.time_to_recover) for m in recovery_metrics(timeline)],
        end_x=(events[-1].t - t0) if events else 0.0,
        ranks=dict(sorted(ranks.items())),
    )


def _marker_label(e: Event) -> str:
    if e.kind == "fault_injected":
        return f"fault: {e.data.get('fault', '?')}"
    if e.kind in ("node_dead", "node_alive"):
        node = str(e.data.get("node_ip") or e.data.get("node_id") or "?")[:15]
        return f"{e.kind.replace('_', ' ')} {node}"
    if e.kind == "attempt_started":
        return f"attempt {e.attempt}"
    if e.kind == "xid_logged":
        return f"kernel log: Xid {e.data.get('xid', '?')}"
    if e.kind == "node_agent_signal":
        value = e.data.get("value")
        shown = {"condition": lambda v: v.get("type"), "label": lambda v: v.rsplit("=", 1)[-1],
                 "taints": lambda v: ",".join(v)}.get(e.data.get("signal"), str)(value)
        return f"agent: {e.data.get('signal')} {shown}"
    if e.kind == "node_agent_silent":
        return "agent: no action"
    if e.kind == "node_down":
        return "node deleted" if e.data.get("deleted") else "node down"
    if e.kind in ("head_unreachable", "head_reachable"):
        return e.kind.replace("_", " ")
    if e.kind == "job_submitted":
        return "resubmitted"
    if e.kind == "node_recovered":
        return {"reboot": "node rebooted", "replace": "node replaced"}.get(e.data.get("action"), "node back")
    return f"run {e.data.get('state', 'finished')}"


def _lost_spans(timeline: Timeline, t0: float) -> list[LostSpan]:
    """Steps each restarted attempt re-did: those at or below the high-water mark before it started."""
    spans = []
    for start in timeline.attempts():
        high_water = max(
            (r.data["step"] for r in timeline.reports() if r.t < start.t and r.data.get("step") is not None),
            default=None,
        )
        redone = [
            r
            for r in timeline.reports(start.attempt)
            if r.data.get("step") is not None and high_water is not None and r.data["step"] <= high_water
        ]
        if redone:
            steps = [r.data["step"] for r in redone]
            spans.append(LostSpan(start.attempt, min(steps), max(steps), start.t - t0, redone[-1].t - t0))
    return spans


def render_timeline(timeline: Timeline, path: str | os.PathLike, title: str = "") -> Path:
    """Draw the timeline picture to ``path`` (PNG) and return the path."""
    data = plot_data(timeline)
    fig = Figure(figsize=(11, 5.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    order = sorted(set(data.attempts) | {a for a, _ in data.ranks}, key=lambda a: (a is None, a or 0))
    colour_of = dict(zip(order, _attempt_colours(len(order))))
    lines = [(attempt, None, points) for attempt, points in data.attempts.items()]
    lines += [(attempt, rank, points) for (attempt, rank), points in data.ranks.items()]
    for attempt, rank, points in lines:
        colour = colour_of[attempt]
        xs = [p.x for p in points]
        ys = [_nan_if_none(p.step) for p in points] if data.has_steps else [attempt or 0] * len(points)
        label = f"attempt {attempt}" + (f", rank {rank}" if rank is not None else "")
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.4, color=colour, label=label,
                linestyle="-" if not rank else (0, (4, 1 + rank)))
        ckpt = [(p.x, y) for p, y in zip(points, ys) if p.checkpoint]
        if ckpt:
            ax.scatter(*zip(*ckpt), marker="D", s=42, color=colour, edgecolors="black", zorder=3)
    if any(p.checkpoint for _, _, points in lines for p in points):
        ax.scatter([], [], marker="D", s=42, color="white", edgecolors="black", label="checkpoint committed")

    for span in data.lost:
        ax.axvspan(span.x0, span.x1, color="tab:orange", alpha=0.18, zorder=0)
        ax.text((span.x0 + span.x1) / 2, 0.02, f"{span.steps} steps\nre-done", transform=ax.get_xaxis_transform(),
                ha="center", va="bottom", fontsize=8, color="tab:orange")

    _draw_markers(ax, data.markers)
    _draw_recoveries(ax, data.recoveries)

    ax.set_xlim(left=0, right=max(data.end_x, 1.0) * 1.02)
    ax.set_xlabel("wall time since first event (s)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if data.has_steps:
        ax.set_ylabel("training step")
    else:
        ax.set_ylabel("attempt")
        ax.set_yticks(sorted({a or 0 for a in data.attempts}) or [0])
    suffix = "" if data.has_steps else " (no step metric: report times only)"
    ax.set_title((title or "Ray Train run under chaos") + suffix, fontsize=11)
    ax.grid(alpha=0.25)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, ncol=1 + len(lines) // 20)

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def _nan_if_none(step: int | None) -> float:
    """A report without the step metric leaves a gap in its attempt's line."""
    return float("nan") if step is None else step


def _attempt_colours(n: int) -> list:
    """Distinct colours while they last (tab10), then a continuous map."""
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    cmap = colormaps["viridis"]
    return [cmap(i / (n - 1)) for i in range(n)]


def _draw_markers(ax, markers: list[Marker]) -> None:
    seen = set()
    for m in markers:
        style = MARKER_STYLE[m.kind]
        legend = m.kind.replace("_", " ") if m.kind not in seen else None
        seen.add(m.kind)
        ax.axvline(m.x, label=legend, zorder=1, **style)
        ax.text(m.x, 0.99, m.label, transform=ax.get_xaxis_transform(), rotation=90, ha="right", va="top",
                fontsize=7, color=style["color"])


def _draw_recoveries(ax, recoveries: list[Recovery]) -> None:
    """Arrows from each fault to detection and to the first report after recovery."""
    for i, r in enumerate(recoveries):
        for row, (what, seconds, colour) in enumerate(
            (("detect", r.time_to_detect, "black"), ("recover", r.time_to_recover, "tab:purple"))
        ):
            y = 0.80 - 0.08 * row - 0.03 * (i % 3)
            if seconds is None:
                if len(recoveries) > 3:  # many faults: a missing arrow says it, a label per fault would clutter
                    continue
                ax.text(r.fault_x, y, f" {what}: not seen", transform=ax.get_xaxis_transform(), fontsize=8, color=colour,
                        bbox=LABEL_BOX)
                continue
            ax.annotate("", xy=(r.fault_x + seconds, y), xytext=(r.fault_x, y), xycoords=ax.get_xaxis_transform(),
                        arrowprops={"arrowstyle": "<->", "color": colour, "linewidth": 1.1})
            ax.text(r.fault_x + seconds / 2, y + 0.01, f"{what} {seconds:.1f} s", transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8, color=colour, bbox=LABEL_BOX)
