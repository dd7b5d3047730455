"""Contract fixtures: a real run's recorder tape and the harness's own events, kept small
enough to review, and the timeline a replay of them gives.

``make integration`` records them (tests/integration, with ``CHAOS_CONTRACT_DIR`` set):
each session of a script shape runs with ``--chaos-tape``, and ``record`` turns its run
directory into ``fixtures/<name>.json`` — after checking that replaying the tape gives
exactly the recorder events the live session saw, so a tape that misses a fact fails
where it was recorded.  tests/contract/test_replay.py judges the replayed timelines
against diagnoses written by hand.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import shlex
from pathlib import Path

import ray

from chaos.timeline import Event, Timeline
from chaos.train import tape
from chaos.verdicts import Expect

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_SCHEMA = 1
RERECORD = "make integration (it re-records tests/contract/fixtures; review the diff and commit it)"


def run_dir(reports: Path, test: str = "") -> Path:
    """The one taped run under ``reports`` (of test function ``test``, when given)."""
    runs = [d for d in (reports / "runs").iterdir() if (d / "tape.jsonl").exists() and d.name.startswith(test)]
    if len(runs) != 1:
        raise AssertionError(f"expected one taped run{' of ' + test if test else ''} under {reports / 'runs'}, "
                             f"found {[d.name for d in runs]}")
    return runs[0]


def _comparable(events: list[dict]) -> list[list[tuple]]:
    """The events in order, those of one instant (one hook call: a poll's per-rank events) as a
    sorted group: the live timeline keeps their arrival order, which the sink does not fix."""
    return [sorted((e["kind"], json.dumps(e["data"], sort_keys=True, default=str)) for e in group)
            for _, group in itertools.groupby(events, key=lambda e: e["t"])]


def record(name: str, run_dir: Path, command: list[str], recorded_by: str) -> Path | None:
    """Write ``fixtures/<name>.json`` from a taped run's directory (only under make integration:
    ``CHAOS_CONTRACT_DIR``); returns the path written, or None when not recording."""
    out_dir = os.environ.get("CHAOS_CONTRACT_DIR")
    if not out_dir:
        return None
    header, lines = tape.read(run_dir / "tape.jsonl")
    events = json.loads((run_dir / "timeline.json").read_text())["events"]
    live = [e for e in events if e["source"] == "recorder"]
    replayed = tape.replay(header, lines)
    assert _comparable(replayed) == _comparable(live), (
        f"{name}: replaying the tape does not give the recorder events the session saw "
        f"({len(replayed)} replayed, {len(live)} live): the tape misses a fact")
    judging = json.loads((run_dir / "judging.json").read_text())
    offset = next((e["data"] for e in events if e["kind"] == "clock_offset"), {"offset_s": 0.0, "rtt_s": 0.5})
    fixture = {
        "fixture": FIXTURE_SCHEMA, "name": name, "ray": ray.__version__, "tape_schema": header["tape"],
        "recorded_by": recorded_by, "command": shlex.join(command),
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "clock_offset": offset, "expectation": judging["expectation"], "finished": judging["finished"],
        "tape_header": header, "tape": lines,
        "harness_events": [e for e in events if e["source"] != "recorder"],
    }
    path = Path(out_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # One line per tape entry and event: a re-recording's diff reads line by line.
    body = ",\n".join(f" {json.dumps(k)}: " + (
        "[\n" + ",\n".join("  " + json.dumps(x, default=str) for x in v) + "\n ]" if isinstance(v, list)
        else json.dumps(v, default=str)) for k, v in fixture.items())
    path.write_text("{\n" + body + "\n}\n")
    return path


class Fixture:
    def __init__(self, name: str):
        self.name = name
        self.data = json.loads((FIXTURES / f"{name}.json").read_text())

    def stale(self) -> str | None:
        """Why this fixture cannot stand for the harness as it is, with how to re-record it."""
        d = self.data
        if d.get("fixture") != FIXTURE_SCHEMA or d.get("tape_schema") != tape.SCHEMA:
            return (f"{self.name}.json has fixture schema {d.get('fixture')} / tape schema {d.get('tape_schema')}, "
                    f"this harness reads {FIXTURE_SCHEMA} / {tape.SCHEMA}: re-record with {RERECORD}")
        recorded, installed = d["ray"].split(".")[:2], ray.__version__.split(".")[:2]
        if recorded != installed:
            return (f"{self.name}.json was recorded on Ray {d['ray']}, the default Ray is now {ray.__version__}: "
                    f"re-record with {RERECORD}")
        return None

    def timeline(self) -> Timeline:
        """The harness's events as recorded, plus the recorder's as the replay makes them
        (head clock, corrected by the offset the session measured, as live)."""
        offset = self.data["clock_offset"]
        recorder = [Event.from_json({**e, "t": e["t"] - offset["offset_s"]})
                    for e in tape.replay(self.data["tape_header"], self.data["tape"])]
        timeline = Timeline([*recorder, *(Event.from_json(e) for e in self.data["harness_events"])])
        timeline.clock_offset = offset["offset_s"]
        timeline.clock_uncertainty = max(0.05, offset["rtt_s"])
        return timeline

    def expectation(self) -> Expect:
        """What the session expected (its final-state comparison left out: that baseline is
        another run's)."""
        return Expect.from_json({k: v for k, v in self.data["expectation"].items() if k != "final_state"})

    @property
    def finished(self) -> bool:
        return self.data["finished"]


def names() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.json"))
