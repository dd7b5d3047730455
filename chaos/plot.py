"""The timeline picture: what happened to training, when, and what it cost.

One PNG per chaos test, attached to its Allure result.  Training step against wall time
(seconds since the first event), one colour per attempt (one line per rank, in the
attempt's colour, where its ranks reported different steps), checkpoint commits marked;
vertical lines for faults, node deaths/rejoins and attempt starts; the re-done (lost)
steps shaded; time to detect and time to recover drawn from each fault; a storage fault's
window shaded.  Below it, on the same time axis, the event markers in lanes of their own — a
band per source (fault, node agent, Ray nodes, storage, Train) — each label in the first row
of its lane where it overlaps no other (measured text extents), so a chain of events a second
apart stays readable; the storage lane shows each checkpoint's upload from its first request
to its last, as the storage fault proxy saw it, each attempt's restore of one, and the storage
faults' windows.

`plot_data` derives every number the picture shows, so tests can check the numbers
without reading pixels; `render_timeline` only draws them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
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
# The lanes below the steps, top to bottom, and the lane of each marker kind.
LANES = ("fault", "node agent", "Ray nodes", "storage", "Train")
LANE_OF = {"fault_injected": "fault", "xid_logged": "fault",
           "node_agent_signal": "node agent", "node_agent_silent": "node agent", "node_down": "node agent",
           "node_recovered": "node agent",
           "node_dead": "Ray nodes", "node_alive": "Ray nodes", "head_unreachable": "Ray nodes",
           "head_reachable": "Ray nodes",
           "attempt_started": "Train", "run_finished": "Train", "job_submitted": "Train"}
STORAGE_KINDS = ("storage-partition", "storage-errors", "storage-slow")
ROW_IN = 0.2  # inches per label row in a lane
LABEL_PAD_PX = 4  # pixels between two labels in one row


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

    @property
    def lane(self) -> str:
        return LANE_OF[self.kind]


@dataclasses.dataclass
class Span:
    """A stretch of time in the storage lane: a checkpoint's upload (``ok``: it completed) or a
    storage fault's window."""

    x0: float
    x1: float
    label: str
    ok: bool = True


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
    uploads: list[Span] = dataclasses.field(default_factory=list)  # each checkpoint's upload (storage events)
    restores: list[Span] = dataclasses.field(default_factory=list)  # each attempt's restore of one
    windows: list[Span] = dataclasses.field(default_factory=list)  # each storage fault's window


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

    end_x = (events[-1].t - t0) if events else 0.0
    return PlotData(
        has_steps=has_steps,
        attempts=dict(sorted(attempts.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))),
        markers=[Marker(e.t - t0, e.kind, _marker_label(e)) for e in events
                 if e.kind in MARKER_STYLE and (e.kind != "job_submitted" or e.data.get("resubmits"))],
        lost=_lost_spans(timeline, t0) if has_steps else [],
        recoveries=[Recovery(m.fault_t - t0, m.time_to_detect, m.time_to_recover) for m in recovery_metrics(timeline)],
        end_x=end_x,
        ranks=dict(sorted(ranks.items())),
        uploads=_uploads(timeline, t0),
        restores=_restores(timeline, t0),
        windows=_windows(timeline, t0, end_x),
    )


def _uploads(timeline: Timeline, t0: float) -> list[Span]:
    """Each checkpoint folder's upload, named by the step Train committed it at (a failed one
    was never committed)."""
    from chaos.storage.events import uploads

    steps = {str(r.data["checkpoint"]).rstrip("/").rsplit("/", 1)[-1]: r.data.get("step")
             for r in timeline.reports() if r.data.get("checkpoint")}
    return [Span(u.start - t0, u.end - t0, f"step {steps[u.checkpoint]}" if u.checkpoint in steps else
                 "upload failed" if not u.ok else "not committed", u.ok) for u in uploads(timeline)]


def _restores(timeline: Timeline, t0: float) -> list[Span]:
    """Each attempt's restore of a checkpoint (a client's reads of its objects), named by the
    step it was committed at; a failed one says so."""
    from chaos.storage.events import restores

    steps = {str(r.data["checkpoint"]).rstrip("/").rsplit("/", 1)[-1]: r.data.get("step")
             for r in timeline.reports() if r.data.get("checkpoint")}
    return [Span(r.start - t0, r.end - t0, ("restore failed" if not r.ok else
                                            f"restore step {steps.get(r.checkpoint, '?')}"), r.ok)
            for r in restores(timeline)]


def _windows(timeline: Timeline, t0: float, end_x: float) -> list[Span]:
    """Each storage fault's window: from when it began to match (its injection, or the first
    request it met) to its end (the run's end if none was recorded)."""
    out = []
    for f in timeline.of("fault_injected"):
        if f.data.get("fault") not in STORAGE_KINDS:
            continue
        ledger_id = f.data.get("ledger_id")
        end = timeline.first("storage_window_ended", where=lambda e, lid=ledger_id: e.data.get("ledger_id") == lid)
        start = end.data.get("started") if end is not None and end.data.get("started") else f.t
        out.append(Span(start - t0, (end.t - t0) if end is not None else end_x, f"{f.data['fault']} window"))
    return out


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
    fig = build_figure(timeline, title)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def build_figure(timeline: Timeline, title: str = "") -> Figure:
    """The picture: the steps above, the lanes below, on one time axis.  Laid out by hand (no
    constrained layout), so a label's width measured here is the width it is drawn at."""
    data = plot_data(timeline)
    lanes = [lane for lane in LANES if lane in ("fault", "Train") or any(m.lane == lane for m in data.markers)
             or (lane == "storage" and (data.uploads or data.windows))]
    fig = Figure(figsize=(11, 5.0), dpi=100)
    FigureCanvasAgg(fig)
    xlim = (0.0, max(data.end_x, 1.0) * 1.02)
    rows = _lane_rows(fig, data, lanes, xlim)
    lane_in = sum(max(1, len(r)) for r in rows.values()) * ROW_IN + 0.15 * len(lanes)
    height = 5.0 + lane_in
    fig.set_size_inches(11, height)
    left, width = 0.07, 0.72
    ax = fig.add_axes((left, (lane_in + 0.95) / height, width, 3.6 / height))
    lanes_ax = fig.add_axes((left, 0.5 / height, width, lane_in / height), sharex=ax)
    _draw_steps(ax, data, title)
    _draw_lanes(lanes_ax, data, lanes, rows)
    ax.set_xlim(*xlim)
    ax.tick_params(labelbottom=False)
    lanes_ax.set_xlabel("wall time since first event (s)")
    return fig


def _draw_steps(ax, data: PlotData, title: str) -> None:
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
    for i, w in enumerate(data.windows):
        ax.axvspan(w.x0, w.x1, color="tab:red", alpha=0.10, zorder=0, label="storage fault window" if not i else None)
    seen = set()
    for m in data.markers:  # the lines only: their labels are in the lanes below
        ax.axvline(m.x, label=m.kind.replace("_", " ") if m.kind not in seen else None, zorder=1, **MARKER_STYLE[m.kind])
        seen.add(m.kind)
    _draw_recoveries(ax, data.recoveries)
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


# -- the lanes -----------------------------------------------------------------------------
@dataclasses.dataclass
class _Label:
    x: float  # where its marker is
    text: str
    colour: object
    right: bool = False  # drawn to the left of its marker (it would run past the axis otherwise)


def _lane_labels(data: PlotData, lane: str) -> list[_Label]:
    if lane == "storage":
        spans = [(u, "tab:green") for u in data.uploads] + [(r, "tab:blue") for r in data.restores]
        return sorted([_Label(sp.x0, sp.label, colour if sp.ok else "tab:red") for sp, colour in spans],
                      key=lambda lab: lab.x)
    return [_Label(m.x, m.label, MARKER_STYLE[m.kind]["color"]) for m in data.markers if m.lane == lane]


def _lane_rows(fig: Figure, data: PlotData, lanes: list[str], xlim: tuple[float, float]) -> dict[str, list[list]]:
    """Each lane's labels in rows: a label goes into the first row whose last label ends before
    it begins (its measured width, in the axis's units), else into a new row."""
    renderer = fig.canvas.get_renderer()
    px_per_s = fig.get_figwidth() * fig.dpi * 0.72 / (xlim[1] - xlim[0])
    out: dict[str, list[list]] = {}
    for lane in lanes:
        rows: list[list] = []
        ends: list[float] = []
        for lab in _lane_labels(data, lane):
            probe = fig.text(0, 0, lab.text, fontsize=7)
            w = (probe.get_window_extent(renderer).width + LABEL_PAD_PX) / px_per_s
            probe.remove()
            lab.right = lab.x + w > xlim[1]
            x0, x1 = (lab.x - w, lab.x) if lab.right else (lab.x, lab.x + w)
            row = next((i for i, end in enumerate(ends) if end <= x0), None)
            if row is None:
                rows.append([])
                ends.append(x1)
                row = len(rows) - 1
            rows[row].append(lab)
            ends[row] = x1
        out[lane] = rows
    return out


def _draw_lanes(ax, data: PlotData, lanes: list[str], rows: dict[str, list[list]]) -> None:
    """Bands top to bottom; in each, its markers' ticks and labels row by row (text gid
    ``lane:<name>``), the storage lane's uploads as bars and the storage faults' windows."""
    y, ticks = 0.0, []
    for lane in lanes:
        height = max(1, len(rows[lane])) + 0.6
        ticks.append((y + height / 2, lane))
        for m in data.markers:
            if m.lane == lane:
                ax.vlines(m.x, y, y + height, color=MARKER_STYLE[m.kind]["color"], linewidth=0.9,
                          linestyle=MARKER_STYLE[m.kind]["linestyle"])
        if lane == "storage":
            _draw_storage(ax, data, y, height)
        for i, row in enumerate(rows[lane]):
            for lab in row:
                ax.text(lab.x, y + 0.3 + i + 0.5, (lab.text + " ") if lab.right else (" " + lab.text), fontsize=7,
                        color=lab.colour, ha="right" if lab.right else "left", va="center", gid=f"lane:{lane}",
                        clip_on=False)
        y += height
        ax.axhline(y, color="0.8", linewidth=0.8)
    ax.set_ylim(y, 0)
    ax.set_yticks([t for t, _ in ticks], [name for _, name in ticks], fontsize=8)
    ax.grid(axis="x", alpha=0.25)


def _draw_storage(ax, data: PlotData, y: float, height: float) -> None:
    """The storage faults' windows shaded, each upload (and, hatched, each restore) a bar from
    its first request to its last (at least a few pixels wide: a small checkpoint moves in
    milliseconds); red where it failed."""
    for w in data.windows:
        ax.fill_between([w.x0, w.x1], y, y + height, color="tab:red", alpha=0.15, linewidth=0)
    span = max((data.end_x or 1.0), 1.0) / 400
    for spans, colour in ((data.uploads, "tab:green"), (data.restores, "tab:blue")):
        for u in spans:
            ax.broken_barh([(u.x0, max(u.x1 - u.x0, span))], (y + 0.05, 0.25), color=colour if u.ok else "tab:red",
                           hatch=None if colour == "tab:green" else "//")


def _nan_if_none(step: int | None) -> float:
    """A report without the step metric leaves a gap in its attempt's line."""
    return float("nan") if step is None else step


def _attempt_colours(n: int) -> list:
    """Distinct colours while they last (tab10), then a continuous map."""
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    cmap = colormaps["viridis"]
    return [cmap(i / (n - 1)) for i in range(n)]


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
