"""docs/reference/python-api.md: what a suite of your own calls — the ``chaos`` fixture,
the fault kinds' factories, the triggers, the outcome — from signatures and docstrings."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from typing import Any, Callable

from chaos import triggers
from chaos.docgen.markdown import code, doc_of, first_paragraph, header, paragraphs, table
from chaos.experiment import Outcome
from chaos.faults import catalog
from chaos.faults.registry import fault_class
from chaos.faults.xid import XIDS
from chaos.pytest_plugin import Chaos
from chaos.shim.plan import PRESETS, Plan
from chaos.train.run import reference_spec
from chaos.verdicts import Diagnosis, Expect, Status, Verdict

INTRO = """
A chaos suite is a pytest test that takes the `chaos` fixture (the harness's pytest plugin
gives it) and is marked `chaos`:

```python
import pytest
from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos

def test_raylet_kill(chaos):
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=20, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))],
    )
    outcome.assert_verdicts()
```

`chaos.run` takes the workload, a list of `(trigger, fault)` pairs and optionally an
expectation; what each fault should cost and how fast recovery must be follow from its kind
([fault-kinds.md](fault-kinds.md)) unless `chaos.expect(...)` says otherwise.
"""

TRIGGERS = [triggers.AfterCheckpoint, triggers.AfterPersisted, triggers.AtStep, triggers.CheckpointPhase,
            triggers.AfterRecovery]
CHAOS_METHODS = ["workload", "run", "expect", "fault", "correlated"]


def _annotation(a: Any) -> str:
    return a if isinstance(a, str) else getattr(a, "__name__", str(a))


def signature(fn: Callable, skip: tuple[str, ...] = ("self", "cls", "settings")) -> str:
    """``(rank: int = 1, method: str = 'grpc')``: annotations as written, without quotes."""
    parts, star = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.name in skip:
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
        star = star or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}" if p.annotation is not p.empty else f"={p.default!r}"
        parts.append(text)
    return "(" + ", ".join(parts) + ")"


def _entry(title: str, call: str, doc: str) -> str:
    return f"### {title}\n\n```python\n{call}\n```\n\n" + (paragraphs(doc) + "\n\n" if doc else "")


def _fixture() -> str:
    out = "## The `chaos` fixture\n\n" + paragraphs(doc_of(Chaos)) + "\n\n"
    for name in CHAOS_METHODS:
        out += _entry(f"`chaos.{name}`", f"chaos.{name}{signature(getattr(Chaos, name))}",
                      doc_of(getattr(Chaos, name)))
        if name == "expect":
            out += ("Its fields (`chaos.verdicts.Expect`, keyword-only, never changed in place: what a suite leaves "
                    "unset follows from its faults, the profile and the options):\n\n" + _fields(Expect))
        if name == "workload":
            out += ("The reference workload's parameters (`chaos.train.run.reference_spec`; `seed` defaults to "
                    "`--chaos-seed`, `python` to the cluster's):\n\n"
                    f"```python\nchaos.workload{signature(reference_spec, skip=('name', 'storage_path', 'python'))}"
                    "\n```\n\n")
    return out


def _fault_kinds() -> str:
    out = ("## Fault kinds\n\nEvery kind of the catalog is a method of the fixture, `-` spelt `_`: "
           "`chaos.raylet_kill(rank=1)` is `chaos.fault(\"raylet-kill\", rank=1)`. `rank` is the Train rank whose "
           "node (or process) the fault hits, resolved from the run's live placement when the fault fires.\n\n")
    for kind in catalog.KINDS:
        cls = fault_class(kind)
        doc = doc_of(cls) or first_paragraph(doc_of(sys.modules[cls.__module__]))
        own = [doc_of(cls.__dict__[m]) for m in ("__init__", "build") if m in cls.__dict__]
        out += _entry(f"`{kind}`", f"chaos.{kind.replace('-', '_')}{signature(cls)}",
                      "\n\n".join(d for d in [doc, *own] if d)) + EXTRAS.get(kind, lambda: "")()
    return out


def _cuda() -> str:
    """The presets, and the shim plan's fields ``**overrides`` may set."""
    presets = table(["preset", "what it sets"], [(code(name), ", ".join(f"{k}={v}" for k, v in fields.items()))
                                                 for name, fields in PRESETS.items()])
    fields = ", ".join(code(f) for f in Plan.model_fields if f not in ("plan_id", "rank"))
    return (f"`preset` is one of:\n\n{presets}`**overrides` sets any other field of the shim's plan "
            f"(`chaos.shim.plan.Plan`): {fields}.\n\n")


def _xid() -> str:
    return "`xid` is one of:\n\n" + table(["xid", "CUDA error every driver call returns", "remediation"], [
        (code(n), code(s.error), s.remediation) for n, s in XIDS.items()])


EXTRAS: dict[str, Callable[[], str]] = {"cuda": _cuda, "xid": _xid}


def _triggers() -> str:
    out = ("## Triggers (`chaos.triggers`)\n\nWhen a fault fires: each waits on an event of the run "
           "(never a bare sleep) and fails with what it awaited and what it saw.\n\n")
    for t in TRIGGERS:
        out += _entry(f"`{t.__name__}`", f"{t.__name__}{signature(t)}", doc_of(t))
    return out


def _fields(cls: type) -> str:
    rows = [(code(f.name), code(_annotation(f.type))) for f in dataclasses.fields(cls)]
    return table(["field", "type"], rows)


def _outcome() -> str:
    out = ("## The outcome\n\n`chaos.run` returns an `Outcome` (`chaos.experiment`): the run's verdicts, its "
           "timeline and what was injected.\n\n" + _fields(Outcome))
    for name in ("assert_verdicts", "verdict"):
        out += _entry(f"`Outcome.{name}`", f"outcome.{name}{signature(getattr(Outcome, name))}",
                      doc_of(getattr(Outcome, name)))
    return out + ("### `Verdict`\n\nOne verdict: its name, status, message, diagnosis and evidence.\n\n"
                  + _fields(Verdict) + "`status` is a `chaos.verdicts.Status`: "
                  + ", ".join(code(s.value) for s in sorted(Status, key=lambda s: s.rank))
                  + " in that order (several merge to the greatest); `diagnosis` a `chaos.verdicts.Diagnosis` "
                  f"({len(Diagnosis)}: [diagnoses.md](diagnoses.md)).\n\n")


def render() -> str:
    return (header("Python API", "the `chaos` fixture (`chaos/pytest_plugin.py`), `chaos/triggers.py`, the fault "
                   "classes and `chaos/experiment.py`", INTRO)
            + _fixture() + _fault_kinds() + _triggers() + _outcome())
