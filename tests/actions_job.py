"""One job of a GitHub Actions workflow, its steps run as a runner runs them, for the tests of
the recipes (examples/github-actions/): `run:` scripts in order under ``bash -e`` (the default
shell on Linux), ``${{ ... }}`` expressions in them and in ``env:`` replaced from a table the
test gives (one it does not give is an error, never an empty string), a step after a failed
one only when its ``if:`` asks for it (``always()``, ``failure()``), and the job's conclusion as
GitHub decides it: failure when a step failed without ``continue-on-error``.  What runs a
script, and what stands for a ``uses:`` step, is the caller's (``execute``)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Callable

from ruamel.yaml import YAML

EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
EMULATED = {"name", "id", "run", "uses", "with", "env", "if", "continue-on-error"}


@dataclasses.dataclass
class Step:
    index: int
    name: str
    run: str | None  # the script, expressions still in it
    uses: str | None
    env: dict[str, str]
    condition: str
    continue_on_error: bool
    spec: dict


@dataclasses.dataclass
class Ran:
    step: Step
    outcome: str  # success | failure | skipped
    output: str = ""


@dataclasses.dataclass
class JobResult:
    ran: list[Ran]
    conclusion: str  # success | failure

    def of(self, name: str) -> Ran:
        [ran] = [r for r in self.ran if r.step.name == name]
        return ran

    def transcript(self) -> str:
        return "\n".join(f"[{r.outcome}] {r.step.name}\n{r.output[-4000:]}" for r in self.ran)


def load(path: Path) -> dict:
    return YAML(typ="safe").load(path.read_text())


def steps(workflow: dict, job: str) -> list[Step]:
    out = []
    for i, spec in enumerate(workflow["jobs"][job]["steps"]):
        unknown = set(spec) - EMULATED
        if unknown:
            raise ValueError(f"step {i} uses {sorted(unknown)}, which this runner does not emulate")
        out.append(Step(i, spec.get("name") or spec.get("uses") or f"step {i}", spec.get("run"), spec.get("uses"),
                        {k: str(v) for k, v in (spec.get("env") or {}).items()}, str(spec.get("if", "")).strip(),
                        bool(spec.get("continue-on-error", False)), spec))
    return out


def substitute(text: str, values: dict[str, str]) -> str:
    """``text`` with every ``${{ expr }}`` replaced by ``values[expr]``; KeyError naming an unknown one."""
    def one(m: re.Match) -> str:
        if m[1] not in values:
            raise KeyError(f"no value for the expression ${{{{ {m[1]} }}}} in {text!r}")
        return values[m[1]]
    return EXPRESSION.sub(one, text)


def runs_now(condition: str, failed: bool) -> bool:
    """Whether a step with ``if: condition`` runs, given whether the job has failed so far."""
    expr = EXPRESSION.fullmatch(condition)
    expr_text = (expr[1] if expr else condition).strip()
    if expr_text in ("", "success()"):
        return not failed
    if expr_text in ("always()", "!cancelled()"):
        return True
    if expr_text == "failure()":
        return failed
    raise ValueError(f"if: {condition!r} is not emulated")


def run_job(workflow: dict, job: str, values: dict[str, str], base_env: dict[str, str],
            execute: Callable[[Step, str | None, dict[str, str]], tuple[int, str]]) -> JobResult:
    """Run ``job``'s steps: ``execute(step, script, env)`` -> (exit code, output) for each step that
    runs (``script`` None for a ``uses:`` step); ``env`` is ``base_env`` under the workflow's, the
    job's and the step's ``env:``, expressions replaced."""
    env = dict(base_env)
    for scope in (workflow.get("env") or {}, workflow["jobs"][job].get("env") or {}):
        env.update({k: substitute(str(v), values) for k, v in scope.items()})
    failed, ran = False, []
    for step in steps(workflow, job):
        if not runs_now(step.condition, failed):
            ran.append(Ran(step, "skipped"))
            continue
        script = substitute(step.run, values) if step.run is not None else None
        code, output = execute(step, script, {**env, **{k: substitute(v, values) for k, v in step.env.items()}})
        ran.append(Ran(step, "success" if code == 0 else "failure", output))
        if code != 0 and not step.continue_on_error:
            failed = True
    return JobResult(ran, "failure" if failed else "success")
