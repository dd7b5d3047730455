"""Seeded fault campaigns: one long run taken through a schedule of mixed faults.

A `Schedule` is data (JSON): the seed, the fault kinds allowed, the workload it was drawn
for and an ordered list of entries — a fault kind with its parameters and target **rank**
(so it replays on another cluster), its trigger and the gap to the previous fault.
`draw(seed, kinds, ...)` makes one from a seed alone (its own ``random.Random``);
`Schedule.load`/`dump` store it; `to_faults(chaos)` gives what ``chaos.run`` takes.

Triggers (chaos.triggers; each counts only the attempt running when its wait starts):
``{"at": "step", "step": n}``; ``{"at": "checkpoint", "step": S, "phase": "before" |
"during" | "after", "offset_s": x}`` (x only for "during"; S a checkpoint step);
``{"at": "after-recovery", "delay_s": d}``.

Spacing: a fault may keep the run training for a while before it is detected (its *lag*:
``DETECT_ALLOWANCE_S``, plus a preemption's deadline).  The *reach* of an entry is the
highest step the run can have reported by then: the highest step its trigger fires at plus
that lag.  A step or checkpoint trigger must fire beyond the previous entry's reach (else
reports of the restarted attempt would satisfy it at once); its gap is the steps between.
An after-recovery delay is its own gap.  `draw` keeps every gap >= ``min_gap_steps`` (a
checkpoint interval by default, so each restarted attempt commits before it is hit
again), spreads the faults over the run, one per equal slot, and leaves ``min_gap_steps``
after the last one's reach for the run to finish on.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path
from typing import Any, Callable

from chaos.faults import catalog
from chaos.triggers import PHASES, AfterRecovery, AtStep, CheckpointPhase

VERSION = 1
TRIGGERS = ("step", "checkpoint", "after-recovery")
#: seconds a fault may leave the run training before Ray/Train notice it (a raylet kill is
#: seen in 1–3 s on the embedded cluster); a preemption adds its deadline
DETECT_ALLOWANCE_S = 5.0


class ScheduleError(ValueError):
    """A schedule that cannot be loaded or drawn, with the file and field at fault."""


# -- what each kind needs in a campaign ---------------------------------------------
def drawn() -> list[str]:
    """The catalog's kinds a campaign draws (each kind's ``draw``; the rest say why not)."""
    return [name for name, k in catalog.KINDS.items() if k.draw is not None]


def draw_of(kind: str) -> catalog.Draw:
    return catalog.kind(kind).draw


def lag_s(kind: str, params: dict) -> float:
    """How long a fault of ``kind`` may leave the run training: detection, plus its notice."""
    return DETECT_ALLOWANCE_S + draw_of(kind).notice_s(params)


def check_kinds(kinds) -> list[str]:
    """The allowed kinds, sorted (a draw does not depend on their order); unknown ones and
    ones a campaign cannot draw are refused by name, with the catalog's reason."""
    kinds = list(kinds)
    if not kinds:
        raise ScheduleError(f"no fault kinds allowed; a campaign draws from: {', '.join(drawn())}")
    for name in kinds:
        if name not in catalog.KINDS:
            raise ScheduleError(f"unknown fault kind {name!r}; known kinds: {', '.join(catalog.KINDS)}")
        why = catalog.kind(name).not_drawn
        if why is not None:
            raise ScheduleError(f"fault kind {name!r} is not drawn into campaigns: {catalog.NOT_DRAWN[why]}; "
                                f"a campaign draws from: {', '.join(drawn())}")
    return sorted(set(kinds))


# -- the schedule --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Workload:
    """The run a schedule was drawn for (the reference workload's parameters)."""

    steps: int
    checkpoint_every: int
    step_time: float
    num_workers: int

    def steps_in(self, seconds: float) -> int:
        """The most steps the run can report in ``seconds`` (a step takes at least step_time)."""
        return math.ceil(seconds / self.step_time - 1e-9)


@dataclasses.dataclass(frozen=True)
class Entry:
    kind: str
    rank: int
    params: dict
    trigger: dict  # see the module docstring

    def make_trigger(self):
        t = self.trigger
        if t["at"] == "step":
            return AtStep(t["step"], fresh=True)
        if t["at"] == "checkpoint":
            return CheckpointPhase(t["step"], t["phase"], t.get("offset_s", 0.0))
        return AfterRecovery(t["delay_s"])

    def fires(self, previous_reach: int, w: Workload) -> tuple[int | None, int]:
        """(lowest, highest) step the trigger can fire at; lowest is None for a delay, which
        fires wherever the restarted attempt has got to."""
        t = self.trigger
        if t["at"] == "step":
            return t["step"], t["step"]
        if t["at"] == "checkpoint":
            return {"before": (t["step"] - 1,) * 2, "during": (t["step"] - 1, t["step"]),
                    "after": (t["step"],) * 2}[t["phase"]]
        return None, previous_reach + 1 + w.steps_in(t["delay_s"])

    def reach(self, previous_reach: int, w: Workload) -> int:
        """The highest step the run can have reported when this fault is detected."""
        return self.fires(previous_reach, w)[1] + w.steps_in(lag_s(self.kind, self.params))

    def gap(self, previous_reach: int, w: Workload) -> dict:
        low = self.fires(previous_reach, w)[0]
        return {"seconds": self.trigger["delay_s"]} if low is None else {"steps": low - previous_reach}

    def describe(self) -> str:
        params = "".join(f", {k}={v}" for k, v in self.params.items())
        return f"{self.kind} (rank {self.rank}{params}) {self.make_trigger().describe()}"


@dataclasses.dataclass(frozen=True)
class Schedule:
    seed: int
    kinds: list[str]
    workload: Workload
    min_gap_steps: int
    entries: list[Entry]
    version: int = VERSION

    # -- JSON ------------------------------------------------------------------------
    def to_json(self) -> dict:
        reach, entries = 0, []
        for e in self.entries:
            entries.append({"kind": e.kind, "rank": e.rank, "params": e.params, "trigger": e.trigger,
                            "gap": e.gap(reach, self.workload)})
            reach = e.reach(reach, self.workload)
        return {"version": self.version, "seed": self.seed, "kinds": self.kinds,
                "workload": dataclasses.asdict(self.workload), "min_gap_steps": self.min_gap_steps,
                "entries": entries}

    def dump(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def from_json(cls, data, source: str = "schedule") -> "Schedule":
        """Parse and check; every error names ``source`` and the field."""
        return _parse(data, source)

    @classmethod
    def load(cls, path) -> "Schedule":
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ScheduleError(f"{path}: cannot read the schedule: {e.strerror or e}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ScheduleError(f"{path}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        return _parse(data, str(path))

    # -- use -------------------------------------------------------------------------
    def charges(self, profile: Any = None) -> dict[str, int]:
        """Failures each budget class should be charged over the whole campaign (a profile's
        expected_budget moves a kind's charges, as it does for every suite)."""
        out: dict[str, int] = {}
        for e in self.entries:
            cls = catalog.expected_charge(e.kind, profile)
            if cls:
                out[cls] = out.get(cls, 0) + 1
        return out

    def triggers(self) -> list:
        return [e.make_trigger() for e in self.entries]

    def to_faults(self, chaos) -> list[tuple]:
        """[(trigger, fault)] for ``chaos.run``, faults built through the fixture's factory (the
        session's options and profile; a kind the backend cannot inject skips the test)."""
        return [(e.make_trigger(), chaos.fault(e.kind, rank=e.rank, **draw_of(e.kind).fixed, **e.params))
                for e in self.entries]

    def describe(self) -> str:
        w = self.workload
        lines = [f"campaign seed {self.seed}: {len(self.entries)} faults of {', '.join(self.kinds)} in a "
                 f"{w.steps}-step run (checkpoint every {w.checkpoint_every}, step {w.step_time:g} s, "
                 f"{w.num_workers} ranks)"]
        lines += [f"  {i}. {e.describe()}" for i, e in enumerate(self.entries, 1)]
        return "\n".join(lines)


# -- drawing -------------------------------------------------------------------------
def draw(seed: int, kinds, *, faults: int, ranks: int, steps: int, checkpoint_every: int, step_time: float,
         min_gap_steps: int | None = None) -> Schedule:
    """A campaign of ``faults`` faults of the allowed ``kinds`` for a run of ``steps`` steps
    over ``ranks`` ranks; the same arguments give the same schedule (``random.Random(seed)``).

    The run is cut into ``faults`` equal slots, one fault each; every gap is at least
    ``min_gap_steps`` (default: ``checkpoint_every``).  Refused when the slots are too short
    for the worst case of the allowed kinds (two gaps and two lags)."""
    kinds = check_kinds(kinds)
    w = Workload(steps=steps, checkpoint_every=checkpoint_every, step_time=step_time, num_workers=ranks)
    _check_workload(w, "draw")
    min_gap = checkpoint_every if min_gap_steps is None else min_gap_steps
    if faults < 1 or min_gap < 1:
        raise ScheduleError(f"draw: faults ({faults}) and min_gap_steps ({min_gap}) must be >= 1")
    worst = max(w.steps_in(lag_s(k, {p: max(vs) for p, vs in draw_of(k).params.items()})) for k in kinds)
    slot = steps // faults
    if slot < 2 * (worst + min_gap):
        raise ScheduleError(
            f"draw: {faults} faults do not fit into a {steps}-step run: each needs a slot of at least "
            f"{2 * (worst + min_gap)} steps (twice the gap of {min_gap} plus the longest lag of the allowed kinds, "
            f"{worst} steps at {step_time:g} s a step), and a slot is {slot}; draw fewer faults or a longer run")
    rng = random.Random(seed)
    entries: list[Entry] = []
    reach = 0
    for i in range(faults):
        kind = rng.choice(kinds)
        params = {p: rng.choice(values) for p, values in sorted(draw_of(kind).params.items())}
        rank = rng.randrange(ranks)
        lag = w.steps_in(lag_s(kind, params))
        lo = max(i * slot + 1, reach + min_gap)
        hi = (i + 1) * slot if i < faults - 1 else min((i + 1) * slot, steps - lag - min_gap)
        options = _trigger_options(lo, hi, reach, min_gap, w)
        entries.append(Entry(kind, rank, params, rng.choice(options)(rng)))
        reach = entries[-1].reach(reach, w)
    schedule = Schedule(seed=seed, kinds=kinds, workload=w, min_gap_steps=min_gap, entries=entries)
    _check_entries(schedule, "draw")
    return schedule


def _trigger_options(lo: int, hi: int, reach: int, min_gap: int, w: Workload) -> list[Callable]:
    """The trigger types that can fire within steps [lo, hi], each a draw from an rng."""
    options = [lambda rng: {"at": "step", "step": rng.randint(lo, hi)}]
    ce = w.checkpoint_every
    # before/during fire at S-1 (and during up to S): S-1 >= lo and S <= hi
    commits = [s for s in range(ce * math.ceil((lo + 1) / ce), hi + 1, ce) if s >= 2]
    if commits:
        def at_checkpoint(rng):
            phase = rng.choice(PHASES)
            trigger = {"at": "checkpoint", "step": rng.choice(commits), "phase": phase}
            if phase == "during":
                trigger["offset_s"] = round(w.step_time * rng.uniform(0.3, 0.9), 2)
            return trigger
        options.append(at_checkpoint)
    # a delay fires by step reach + 1 + steps_in(delay) <= hi; at least min_gap steps' time
    most = hi - reach - 1
    if most >= min_gap:
        options.append(lambda rng: {"at": "after-recovery",
                                    "delay_s": round(rng.randint(min_gap, most) * w.step_time, 3)})
    return options


# -- checking ------------------------------------------------------------------------
def _check_workload(w: Workload, where: str) -> None:
    for name in ("steps", "checkpoint_every", "num_workers"):
        value = getattr(w, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"{where}: workload.{name} must be an integer >= 1, got {value!r}")
    if isinstance(w.step_time, bool) or not isinstance(w.step_time, (int, float)) or w.step_time <= 0:
        raise ScheduleError(f"{where}: workload.step_time must be a number of seconds > 0, got {w.step_time!r}")


def _check_entries(s: Schedule, where: str) -> None:
    """Rules every schedule keeps, drawn or hand-written: kinds allowed, ranks that exist,
    triggers inside the run and beyond the previous fault's reach."""
    w, reach = s.workload, 0
    for i, e in enumerate(s.entries, 1):
        at = f"{where}: entries[{i - 1}] ({e.kind})"
        if e.kind not in s.kinds:
            raise ScheduleError(f"{at}: kind {e.kind!r} is not among the schedule's kinds {s.kinds}")
        if not 0 <= e.rank < w.num_workers:
            raise ScheduleError(f"{at}: rank {e.rank} does not exist in a run of {w.num_workers} ranks")
        allowed = draw_of(e.kind).params
        if set(e.params) != set(allowed):
            raise ScheduleError(f"{at}: params {sorted(e.params)} should be exactly {sorted(allowed)}")
        for p, v in e.params.items():
            if v not in allowed[p]:
                raise ScheduleError(f"{at}: params.{p}={v!r}; expected one of {list(allowed[p])}")
        t = e.trigger
        if t["at"] == "checkpoint" and t["step"] % w.checkpoint_every:
            raise ScheduleError(f"{at}: trigger.step {t['step']} is not a checkpoint step "
                                f"(checkpoint every {w.checkpoint_every})")
        low, high = e.fires(reach, w)
        if high >= w.steps:
            raise ScheduleError(f"{at}: trigger fires as late as step {high}, outside the run: the last step "
                                f"is {w.steps} and the fault must hit a running step")
        if low is not None and low <= reach:
            raise ScheduleError(f"{at}: trigger can fire at step {low}, but the run may have reached step {reach} "
                                "before the previous fault is detected: restarted reports would fire it at once; "
                                f"move it past step {reach}")
        reach = e.reach(reach, w)


def _parse(data, source: str) -> Schedule:
    def need(obj, key, kind, where):
        if not isinstance(obj, dict) or key not in obj:
            raise ScheduleError(f"{source}: missing field {where}{key}")
        value = obj[key]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise ScheduleError(f"{source}: field {where}{key} must be {names}, got {value!r}")
        return value

    if not isinstance(data, dict):
        raise ScheduleError(f"{source}: a schedule is a JSON object, got {type(data).__name__}")
    version = need(data, "version", int, "")
    if version != VERSION:
        raise ScheduleError(f"{source}: field version is {version}; this harness reads version {VERSION}")
    seed = need(data, "seed", int, "")
    try:
        kinds = check_kinds(need(data, "kinds", list, ""))
    except (ScheduleError, TypeError) as e:
        raise ScheduleError(f"{source}: field kinds: {e}") from None
    wd = need(data, "workload", dict, "")
    w = Workload(**{f.name: need(wd, f.name, (int, float) if f.name == "step_time" else int, "workload.")
                    for f in dataclasses.fields(Workload)})
    _check_workload(w, source)
    min_gap = need(data, "min_gap_steps", int, "")
    if not need(data, "entries", list, ""):
        raise ScheduleError(f"{source}: field entries is empty: a campaign has at least one fault")
    entries = []
    for i, ed in enumerate(data["entries"]):
        where = f"entries[{i}]."
        if not isinstance(ed, dict):
            raise ScheduleError(f"{source}: field entries[{i}] must be an object, got {ed!r}")
        kind = need(ed, "kind", str, where)
        rank = need(ed, "rank", int, where)
        params = need(ed, "params", dict, where)
        t = need(ed, "trigger", dict, where)
        at = need(t, "at", str, where + "trigger.")
        if at not in TRIGGERS:
            raise ScheduleError(f"{source}: field {where}trigger.at is {at!r}; expected one of {TRIGGERS}")
        if at == "after-recovery":
            delay = need(t, "delay_s", (int, float), where + "trigger.")
            if delay < 0:
                raise ScheduleError(f"{source}: field {where}trigger.delay_s must be >= 0, got {delay}")
            trigger = {"at": at, "delay_s": delay}
        else:
            step = need(t, "step", int, where + "trigger.")
            if step < 1:
                raise ScheduleError(f"{source}: field {where}trigger.step must be >= 1, got {step}")
            trigger = {"at": at, "step": step}
            if at == "checkpoint":
                trigger["phase"] = need(t, "phase", str, where + "trigger.")
                if "offset_s" in t:
                    trigger["offset_s"] = need(t, "offset_s", (int, float), where + "trigger.")
        extra = set(t) - set(trigger)
        if extra:
            raise ScheduleError(f"{source}: field {where}trigger has unknown keys {sorted(extra)} for at={at!r}")
        entry = Entry(kind, rank, params, trigger)
        try:
            entry.make_trigger()
        except ValueError as e:
            raise ScheduleError(f"{source}: field {where}trigger: {e}") from None
        entries.append(entry)
    schedule = Schedule(seed=seed, kinds=kinds, workload=w, min_gap_steps=min_gap, entries=entries, version=version)
    _check_entries(schedule, source)
    # A stored gap must be the one its triggers imply (it is derived, shown for people).
    for i, (ed, stored) in enumerate(zip(data["entries"], schedule.to_json()["entries"])):
        if "gap" in ed and ed["gap"] != stored["gap"]:
            raise ScheduleError(f"{source}: field entries[{i}].gap is {ed['gap']}, but its trigger and the previous "
                                f"fault imply {stored['gap']}")
    return schedule
