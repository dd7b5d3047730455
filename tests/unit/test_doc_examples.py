"""The Python in the README and docs/ calls the API as it is: every ``chaos.workload(...)``,
``chaos.expect(...)``, fault kind, trigger and outcome call binds to the real signature
(a renamed or removed argument fails here, not in a user's first suite), and every import
in the examples resolves."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from chaos import triggers
from chaos.docgen.markdown import fenced_blocks
from chaos.experiment import Outcome
from chaos.faults import catalog
from chaos.faults.registry import fault_class
from chaos.pytest_plugin import Chaos
from chaos.train.run import reference_spec

ROOT = Path(__file__).resolve().parents[2]
# docs/reference/ shows signatures, generated from the functions themselves (test_docgen.py)
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.parent.name != "reference")]


def _signature(owner: str, name: str) -> inspect.Signature | None:
    """The signature a call ``owner.name(...)`` binds to (None: not an API call)."""
    if owner == "chaos":
        if name == "workload":  # the reference workload's parameters, as the fixture passes them on
            params = inspect.signature(reference_spec).parameters.values()
            return inspect.Signature([p for p in params if p.name not in ("name", "storage_path")])
        if name in ("run", "expect", "fault", "correlated"):
            return inspect.signature(getattr(Chaos(None, None), name))
        kind = name.replace("_", "-")
        if kind not in catalog.KINDS:
            raise AssertionError(f"chaos.{name}: no such method of the fixture, nor a fault kind")
        return inspect.signature(fault_class(kind))
    if owner == "outcome":
        return inspect.signature(getattr(Outcome, name)).replace(parameters=[
            p for p in inspect.signature(getattr(Outcome, name)).parameters.values() if p.name != "self"])
    return None


def api_calls(source: str) -> list[tuple[str, inspect.Signature, ast.Call]]:
    """Each call of the API in ``source``: (what it calls, its signature, the call)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            sig = _signature(f.value.id, f.attr)
            if sig is not None:
                out.append((f"{f.value.id}.{f.attr}", sig, node))
        elif isinstance(f, ast.Name) and isinstance(getattr(triggers, f.id, None), type):
            out.append((f.id, inspect.signature(getattr(triggers, f.id)), node))
    return out


def misbound(source: str) -> list[str]:
    """Every API call in ``source`` whose arguments do not bind, with why."""
    wrong = []
    for what, sig, call in api_calls(source):
        args = [object()] * len([a for a in call.args if not isinstance(a, ast.Starred)])
        kwargs = {k.arg: object() for k in call.keywords if k.arg is not None}
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            wrong.append(f"{what}(...) at line {call.lineno}: {e}")
    return wrong


def examples() -> list[tuple[str, str]]:
    return [(f"{p.relative_to(ROOT)}#{i}", block) for p in PAGES
            for i, block in enumerate(b for info, b in fenced_blocks(p.read_text()) if info == "python")]


@pytest.mark.parametrize(("where", "source"), examples(), ids=[w for w, _ in examples()])
def test_an_example_calls_the_api_as_it_is(where, source):
    assert not misbound(source), misbound(source)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module.startswith("chaos"):
            module = importlib.import_module(node.module)
            missing = [a.name for a in node.names if not hasattr(module, a.name)]
            assert not missing, f"{where}: {node.module} has no {missing}"


def test_the_readme_example_is_checked():
    readme = [s for w, s in examples() if w.startswith("README.md")]
    called = {what for s in readme for what, _, _ in api_calls(s)}
    assert {"chaos.run", "chaos.workload", "chaos.raylet_kill", "chaos.expect", "AfterCheckpoint",
            "outcome.assert_verdicts"} <= called, called


def test_an_argument_the_api_does_not_take_is_caught():
    assert misbound("chaos.run(chaos.workload(num_workers=2), faults=[(AfterCheckpoint(2), "
                    "chaos.raylet_kill(rank=1))], expect=chaos.expect(slo_recover_s=60))") == []
    wrong = misbound("chaos.workload(num_worker=2)\nchaos.expect(slo_recovery_s=1)\nAtStep(n=3, atempt=1)\n"
                     "chaos.raylet_kill(rank=1, method='grpc', via='drain')\noutcome.verdict()")
    assert [w.split("(")[0] for w in wrong] == ["chaos.workload", "chaos.expect", "AtStep", "chaos.raylet_kill",
                                                "outcome.verdict"], wrong
    with pytest.raises(AssertionError, match="chaos.raylet_kil: no such method"):
        misbound("chaos.raylet_kil(rank=1)")
