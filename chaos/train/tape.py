"""The tape: every fact the recorder took from Ray Train, as JSON lines, and its replay.

With ``RAY_CHAOS_TAPE_FILE`` set in the run's environment the recorder appends each
hook's facts (``chaos.train.recording``) to that file before it judges them; ``replay``
feeds a tape through a fresh ``Recording`` and returns the events the live recorder
emitted.  The contract tier (tests/contract) keeps tapes of real runs of many script
shapes and replays them through the recorder's logic and the verdicts, so the facts
Ray really gives, not hand-made timelines, are what those tests judge.

Line 1 is a header (schema, Ray version, the recorder's settings); then one line per
hook call: ``{"t": controller clock, "hook": name, "facts": {...}}``.  A reported metric
that is neither a JSON scalar nor None is written as ``{"$scalar": type, "value": v}``
when it has ``.item()`` (numpy/torch scalars), else ``{"$other": type}``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

from chaos.train.recording import Recording

ENV_TAPE_FILE = "RAY_CHAOS_TAPE_FILE"
SCHEMA = 1  # bump when a hook's facts change shape; fixtures of another schema must be re-recorded


class _Scalar:
    """A taped numpy/torch scalar: what the recorder's logic reads of one is ``.item()``."""

    def __init__(self, value: Any):
        self._value = value

    def item(self) -> Any:
        return self._value


def _encode_value(value: Any) -> Any:
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    if hasattr(value, "item"):
        try:
            return {"$scalar": type(value).__name__, "value": value.item()}
        except (TypeError, ValueError):
            pass
    return {"$other": type(value).__name__}


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict) and "$scalar" in value:
        return _Scalar(value["value"])
    return value


def _per_value(facts: dict, hook: str, code: Callable[[Any], Any]) -> dict:
    """``facts`` with every reported metric value passed through ``code``."""
    if hook == "reported":
        return {**facts, "metrics": [{k: code(v) for k, v in (m or {}).items()} for m in facts["metrics"]]}
    if hook == "poll_checkpoints":
        return {"reports": {rank: {**r, "metrics": {k: code(v) for k, v in (r["metrics"] or {}).items()}}
                            for rank, r in facts["reports"].items()}}
    return facts


def encode(hook: str, facts: dict) -> dict:
    return _per_value(facts, hook, _encode_value)


def decode(hook: str, facts: dict) -> dict:
    return _per_value(facts, hook, _decode_value)


class TapeWriter:
    """Appends to the tape file; never breaks the user's run (a write error is logged once)."""

    def __init__(self, path: str, header: dict):
        self.path = path
        self._failed = False
        self._write({"tape": SCHEMA, **header})

    def _write(self, line: dict) -> None:
        if self._failed:
            return
        try:
            with open(self.path, "a") as out:
                out.write(json.dumps(line, default=str) + "\n")
        except OSError as e:
            self._failed = True
            logging.getLogger(__name__).warning("ray-chaos recorder could not write its tape %s: %s", self.path, e)

    def write(self, t: float, hook: str, facts: dict) -> None:
        self._write({"t": t, "hook": hook, "facts": encode(hook, facts)})


def read(path: str | Path) -> tuple[dict, list[dict]]:
    """(header, hook lines) of a tape file; a controller restarted on the same file (a
    resubmitted run) starts a new header, which stays in the lines as a ``header`` hook."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines or "tape" not in lines[0]:
        raise ValueError(f"{path}: not a tape (no header line)")
    return lines[0], [{"hook": "header", "facts": line} if "tape" in line else line for line in lines[1:]]


def replay(header: dict, lines: list[dict]) -> list[dict]:
    """The recorder events a tape's hook calls produce, in order (a new header starts a new
    controller, as a resubmitted job does)."""
    if header.get("tape") != SCHEMA:
        raise ValueError(f"tape schema {header.get('tape')} is not this harness's ({SCHEMA}): re-record it")
    events: list[dict] = []
    recording = Recording(header.get("step_metric", "auto"), header.get("state_metric"), events.append)
    for line in lines:
        if line["hook"] == "header":
            recording = Recording(line["facts"].get("step_metric", "auto"), line["facts"].get("state_metric"),
                                  events.append)
            continue
        recording.take(line["hook"], line["t"], decode(line["hook"], line["facts"]))
    return events
