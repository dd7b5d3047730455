"""The upgrade canary's behaviour-difference table: two sessions' summary.json in, markdown out.

Why: before a platform team moves its clusters to another Ray, ``make canary RAY=<version>``
(``scripts/canary.sh``; README, "Upgrade canary") runs the same chaos suites once on the
default Ray (``constraints.txt``, in ``.venv``) and once on the candidate (in
``.venv-canary/<version>``), each session writing its ``summary.json`` (``chaos.summary``).
What an upgrade changes is how Ray handles the faults: which retry budget it charges, how
fast the failure is detected and the run recovers, whether the run still passes and with
which diagnosis.  summary.json has all of that per test; this module lines the two sessions
up test by test, default and candidate side by side, and marks what differs -- the table
one reviews before the upgrade.

Pure on purpose: dicts in, a string out, so it is tested on hand-made summaries without Ray
or a cluster; ``main`` (``python -m chaos.canary compare DEFAULT CANARY``) is the only part
that reads or writes files.

What is marked as a difference (``≠``):

* outcome, budgets charged (count and limit, per class), diagnosis (every verdict that did
  not pass, n/a aside: name, status, diagnosis): any change at all -- these are behaviour;
* a test with a record in one session only (not selected, skipped, or ended before its run
  was recorded there; that session's pytest output says which): behaviour too;
* time to detect / time to recover (the worst over the test's faults, as summary.json keeps
  them): only a change beyond both ``tolerance_s`` and ``tolerance_rel`` of the default's
  value, or a time observed on one side only.  Each side is one run on a busy machine, so a
  few seconds either way is noise, not behaviour.

``compare`` exits 1 when any behaviour differs (timing alone does not), 0 when none does, and
2 when a summary cannot be read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from chaos.errors import ChaosError
from chaos.faults.catalog import limit_name
from chaos.verdicts.status import Status

TOLERANCE_S = 5.0  # a time difference smaller than this is never marked
TOLERANCE_REL = 0.25  # ... nor one smaller than this share of the default's time

MARK = "**≠**"
ROWS = ("outcome", "budget charged", "time to detect", "time to recover", "diagnosis")
_TIMES = {"time to detect": "time_to_detect", "time to recover": "time_to_recover"}

Key = tuple[str, str]  # (test node id, backend): summary.json keeps one record per pair


@dataclasses.dataclass
class Cell:
    """One attribute of one test in both sessions."""

    row: str
    default: str
    canary: str
    mark: str = ""  # "" (same) or what differs, starting with MARK

    @property
    def differs(self) -> bool:
        return bool(self.mark)


@dataclasses.dataclass
class Entry:
    """One test's rows of the table."""

    test: str
    backend: str
    fault: str
    cells: list[Cell]
    only_in: str | None = None  # the label of the one session that has a record of the test

    @property
    def behaviour_differs(self) -> bool:
        return self.only_in is not None or any(c.differs for c in self.cells if c.row not in _TIMES)

    @property
    def timing_differs(self) -> bool:
        return any(c.differs for c in self.cells if c.row in _TIMES)


def records(summary: Mapping[str, Any], where: str = "summary") -> dict[Key, dict]:
    """The per-test records of a summary.json, by (test, backend)."""
    recs = summary.get("records") if isinstance(summary, Mapping) else None
    if not isinstance(recs, list):
        raise ChaosError(f"{where} has no 'records' list: not the summary.json of a chaos session")
    if not all(isinstance(r, Mapping) and r.get("test") for r in recs):
        raise ChaosError(f"{where} has a record without a 'test': not the summary.json of a chaos session")
    return {(r["test"], r.get("backend", "")): r for r in recs}


def compare(default: Mapping[str, Any], canary: Mapping[str, Any], labels: Sequence[str] = ("default", "canary"),
            tolerance_s: float = TOLERANCE_S, tolerance_rel: float = TOLERANCE_REL) -> list[Entry]:
    """Every test of either session, in node-id order, with its rows and what differs."""
    a, b = records(default, labels[0]), records(canary, labels[1])
    out = []
    for key in sorted(a.keys() | b.keys()):
        ra, rb = a.get(key), b.get(key)
        faults = dict.fromkeys(r.get("fault_kind") or "?" for r in (ra, rb) if r is not None)
        rows = Entry(test=key[0], backend=key[1], fault=" / ".join(faults), cells=[])
        if ra is None or rb is None:
            rows.only_in = labels[0] if rb is None else labels[1]
        for row in ROWS:
            va, vb = _cell(row, ra), _cell(row, rb)
            cell = Cell(row, va, vb)
            if rows.only_in is not None:
                if row == "outcome":
                    cell.mark = f"{MARK} no record in {labels[1] if rb is None else labels[0]}"
            elif row in _TIMES:
                cell.mark = _time_mark(_metric(ra, _TIMES[row]), _metric(rb, _TIMES[row]), tolerance_s, tolerance_rel)
            elif va != vb:
                cell.mark = MARK
            rows.cells.append(cell)
        out.append(rows)
    return out


def behaviour_differs(rows: Sequence[Entry]) -> bool:
    return any(r.behaviour_differs for r in rows)


def table(default: Mapping[str, Any], canary: Mapping[str, Any], labels: Sequence[str] = ("default", "canary"),
          sources: Sequence[str] | None = None, tolerance_s: float = TOLERANCE_S,
          tolerance_rel: float = TOLERANCE_REL) -> str:
    """The markdown table of ``compare``, with a headline count and a legend.

    ``labels`` name the sessions (the Ray versions); ``sources`` where their summaries came
    from (shown under the table, with each summary's ``generated_at``)."""
    rows = compare(default, canary, labels, tolerance_s, tolerance_rel)
    da, db = labels
    behaviour = [r for r in rows if r.behaviour_differs and r.only_in is None]
    only = [r for r in rows if r.only_in is not None]
    timing = [r for r in rows if not r.behaviour_differs and r.timing_differs]
    same = len(rows) - len(behaviour) - len(only) - len(timing)
    lines = [
        f"## Ray upgrade canary: {db} against {da} (default)",
        "",
        f"{len(rows)} test(s): {len(behaviour)} behave differently (outcome, budget charged or diagnosis), "
        f"{len(only)} recorded in one session only, {len(timing)} differ in timing only, {same} the same.",
        "",
        f"| test | | {_escape(da)} (default) | {_escape(db)} (canary) | differs |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"`{_escape(r.test)}` ({_escape(r.fault)}" + (f", {_escape(r.backend)}" if r.backend else "") + ")"
        for i, c in enumerate(r.cells):
            lines.append(f"| {head if i == 0 else ''} | {c.row} | {_escape(c.default)} | {_escape(c.canary)} | {c.mark} |")
    lines += [
        "",
        f"{MARK}: differs.  Times are the worst over a test's faults; they are marked only beyond "
        f"{tolerance_s:g} s and {tolerance_rel:.0%} of the default's (one run per side), or when one side did not "
        "observe them (—).  Budget charged: what Ray charged per class, as `count to limit=value`.  Diagnosis: "
        "every verdict that did not pass, n/a aside (`none`: all passed).  No record: the session has no record of the test "
        "(not selected, skipped, or ended before its run was recorded; its pytest output says which).",
    ]
    if sources:
        lines.append("")
        for label, source, summary in zip(labels, sources, (default, canary)):
            generated = summary.get("generated_at") if isinstance(summary, Mapping) else None
            lines.append(f"- {_escape(label)}: `{source}`" + (f" (generated {generated})" if generated else ""))
    return "\n".join(lines) + "\n"


# -- cells ------------------------------------------------------------------------------
def _cell(row: str, record: Mapping[str, Any] | None) -> str:
    if record is None:
        return "no record" if row == "outcome" else ""
    if row == "outcome":
        return str(record.get("outcome") or "?")
    if row == "budget charged":
        return _charged(record)
    if row in _TIMES:
        return _seconds(_metric(record, _TIMES[row]))
    return _diagnosis(record)


def _metric(record: Mapping[str, Any] | None, name: str) -> float | None:
    value = ((record or {}).get("metrics") or {}).get(name)
    return float(value) if isinstance(value, (int, float)) else None


def _charged(record: Mapping[str, Any]) -> str:
    charged = (record.get("metrics") or {}).get("charged")
    if not isinstance(charged, Mapping):
        return "not measured"
    parts = [f"{c.get('count')} to {limit_name(cls)}={_limit(c.get('limit'))}"
             for cls, c in sorted(charged.items()) if isinstance(c, Mapping) and c.get("count")]
    return ", ".join(parts) or "nothing"


def _limit(limit: Any) -> str:
    """As the verdicts write it: a number >= 0, else unlimited (Ray logs inf, -1 or nothing)."""
    try:
        value = float(limit)
    except (TypeError, ValueError):
        return "unlimited"
    if not 0 <= value < float("inf"):
        return "unlimited"
    return str(int(value)) if value.is_integer() else str(value)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def _diagnosis(record: Mapping[str, Any]) -> str:
    verdicts = record.get("verdicts") or []
    if not verdicts:
        return "no verdicts"
    # n/a is no finding (a claim that did not arise in this run, e.g. no step re-done: timing)
    parts = sorted({f"{v.get('name')}: {v.get('status')}" + (f" ({v['diagnosis']})" if v.get("diagnosis") else "")
                    for v in verdicts if v.get("status") not in (Status.PASS, Status.NOT_APPLICABLE)})
    return "; ".join(parts) or "none"


def _time_mark(a: float | None, b: float | None, tolerance_s: float, tolerance_rel: float) -> str:
    if a is None and b is None:
        return ""
    if a is None or b is None:
        return MARK
    delta = b - a
    if abs(delta) > tolerance_s and abs(delta) > tolerance_rel * abs(a):
        return f"{MARK} {delta:+.1f} s"
    return ""


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# -- command line -----------------------------------------------------------------------
def _load(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ChaosError(f"summary not found: {path}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ChaosError(f"cannot read summary {path}: {e}") from None
    records(data, path)  # refuse anything but a session's summary.json, naming the file
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.canary", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="the behaviour-difference table of two sessions' summary.json")
    c.add_argument("default", help="summary.json of the session on the default Ray")
    c.add_argument("canary", help="summary.json of the session on the candidate Ray")
    c.add_argument("--labels", nargs=2, metavar=("DEFAULT", "CANARY"),
                   help="names of the two sessions (default: the summaries' directory names, e.g. the Ray versions)")
    c.add_argument("--out", help="also write the table to this file")
    c.add_argument("--tolerance-s", type=float, default=TOLERANCE_S, help="time differences up to this are not marked")
    c.add_argument("--tolerance-rel", type=float, default=TOLERANCE_REL,
                   help="... nor those up to this share of the default's time")
    args = parser.parse_args(argv)
    try:
        default, canary = _load(args.default), _load(args.canary)
    except ChaosError as e:
        print(f"canary: {e}", file=sys.stderr)
        return 2
    labels = args.labels or [Path(p).resolve().parent.name for p in (args.default, args.canary)]
    text = table(default, canary, labels, sources=[args.default, args.canary], tolerance_s=args.tolerance_s,
                 tolerance_rel=args.tolerance_rel)
    sys.stdout.write(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 1 if behaviour_differs(compare(default, canary, labels, args.tolerance_s, args.tolerance_rel)) else 0


if __name__ == "__main__":
    sys.exit(main())
