"""Fault-free baselines for the final-state and state-trajectory verdicts, made once per
workload and cached.

A baseline is a run of the same workload (entrypoint, parameters, seed) with no fault,
through the same path as the run under test (an Experiment: the Jobs API, the recorder,
the verdicts); its state per rank at every step is what a correct restore must follow, and
its final state what it must end in.

Cached under ``<reports>/baselines/<key>.json``.  The key is what decides the final
state and nothing that differs per run: the entrypoint without its run name and storage
path, the seed, the step and state metrics, the Ray and torch versions, and the workload's
code (the reference workload's module; for a user's script the ``*.py`` files of its
working directory and the files its command names).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import shlex
import time
from pathlib import Path
from typing import Callable

from chaos.errors import Aborted, ChaosError
from chaos.report import Reporter
from chaos.timeline import Timeline
from chaos.train.run import RunSpec, reference_spec
from chaos.verdicts import Expect, Status, Verdict
from chaos.verdicts.states import Baseline, final_states, trajectory_of

log = logging.getLogger(__name__)

# Options whose value differs per run and never decides the final state: left out of the key.
PER_RUN_OPTIONS = ("--storage-path", "--storage", "--name", "--run-name")
# The reference workload's options that only act on a failure or a restore (its retry
# budgets, the buggy twins' --forget): a fault-free run is the same with any value, so the
# buggy twins share the healthy run's baseline.
REFERENCE_RESTORE_ONLY = ("--max-failures", "--max-preemption-failures", "--forget")
# What a cached baseline holds; a file of another schema is made anew (its key differs).
SCHEMA = 2  # 2: the per-step trajectory
REFERENCE_MODULE = Path(__file__).parent / "train" / "workloads" / "reference.py"
# Directories of a user's working dir that hold no workload code (besides dot-directories
# and virtualenvs, found by their pyvenv.cfg).
SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}


def _entrypoint_tokens(entrypoint: str, dropped: tuple[str, ...] = ()) -> list[str]:
    """The command's words with the values of PER_RUN_OPTIONS (``--opt v`` or ``--opt=v``)
    replaced by a placeholder, and the ``dropped`` options left out."""
    out, skip = [], False
    for w in shlex.split(entrypoint):
        option = w.split("=", 1)[0]
        if skip:
            skip = False
        elif option in PER_RUN_OPTIONS:
            out.append(f"{option}=<per-run>")
            skip = "=" not in w
        elif option in dropped:
            skip = "=" not in w
        else:
            out.append(w)
    return out


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def code_hash(spec: RunSpec) -> str:
    """The workload's code: the reference module, or a user's ``*.py`` under its working
    directory (dot-directories, caches and virtualenvs skipped) plus every file its command
    names there (a config file, say)."""
    if spec.params.get("workload") == "reference":
        return _file_hash(REFERENCE_MODULE)
    root = Path(spec.working_dir) if spec.working_dir else None
    h = hashlib.sha256()
    if root is None or not root.is_dir():
        return h.hexdigest()
    files = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS
                             and not (Path(dirpath) / d / "pyvenv.cfg").exists())
        files.update(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    for word in shlex.split(spec.entrypoint):
        candidate = root / word  # an absolute word (the interpreter's path) is not under root
        if candidate.is_file() and candidate.resolve().is_relative_to(root.resolve()):
            files.add(candidate)
    for f in sorted(files):
        h.update(str(f.resolve().relative_to(root.resolve())).encode() + b"\0" + _file_hash(f).encode())
    return h.hexdigest()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cache_key(spec: RunSpec) -> tuple[str, dict]:
    """(key, what it was made of): equal for runs that must end in the same state."""
    reference = spec.params.get("workload") == "reference"
    material = {
        "schema": SCHEMA,
        "entrypoint": _entrypoint_tokens(spec.entrypoint, REFERENCE_RESTORE_ONLY if reference else ()),
        "seed": spec.params.get("seed"),
        "env_vars": dict(sorted(spec.env_vars.items())),
        "step_metric": spec.step_metric,
        "state_metric": spec.state_metric,
        "ray": _version("ray"),
        "torch": _version("torch"),
        "code": code_hash(spec),
        **({"runtime_env": spec.runtime_env} if spec.runtime_env else {}),  # pip, conda: another state
    }
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]
    return key, material


class BaselineCache:
    """Baselines by key under ``root`` (``<reports>/baselines``), one JSON file each."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def load(self, key: str) -> Baseline | None:
        """The cached baseline, or None; an unreadable file is said and made anew."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            baseline = Baseline.from_json(json.loads(path.read_text())["baseline"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("cached baseline %s is unreadable (%s): making it anew", path, e)
            return None
        baseline.cached = True
        return baseline

    def store(self, baseline: Baseline, material: dict) -> Path:
        """Written whole or not at all (another pytest-xdist worker may write the same key)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(baseline.key)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"baseline": baseline.to_json(), "key_material": material}, indent=1, default=str))
        os.replace(tmp, path)
        return path

    def get(self, spec: RunSpec, make: Callable[[str], Baseline], refresh: bool = False) -> Baseline:
        """The cached baseline for ``spec``'s key, else ``make(key)``'s (cached when it has no
        error); ``refresh`` makes a new one even when one is cached."""
        key, material = cache_key(spec)
        if not refresh:
            cached = self.load(key)
            if cached is not None:
                return cached
        baseline = make(key)
        if baseline.error is None:
            self.store(baseline, material)
        return baseline


def baseline_spec(spec: RunSpec, storage_path: str, fault_env: dict[str, str]) -> RunSpec:
    """``spec`` as a run of its own: a new Train run name for the reference workload (a run
    resumes from any checkpoint under its name), healthy (no ``forget``); a user's script
    names its runs itself.
    The faults' run environment comes along (nothing is armed), so both runs start alike."""
    name = f"{spec.name}-baseline"
    if spec.params.get("workload") == "reference":
        params = {k: v for k, v in spec.params.items() if k not in ("workload", "forget")}
        params["checkpoint_on_preemption"] = bool(params.get("checkpoint_on_preemption"))
        new = reference_spec(name, storage_path, **params)
        new.env_vars = {**fault_env, **spec.env_vars}
        return new
    return dataclasses.replace(spec, name=name, env_vars={**fault_env, **spec.env_vars})


def from_run(key: str, job_id: str | None, timeline, verdicts: list[Verdict]) -> Baseline:
    """The final state of a fault-free run, or why it cannot serve as a baseline."""
    started = timeline.first("controller_started")
    base = Baseline(key, job_id=job_id, made_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    run_name=started.data.get("run_name") if started else None,
                    storage_path=started.data.get("storage_path") if started else None)
    failing = [v for v in verdicts if v.status in (Status.FAIL, Status.UNVERIFIABLE)]
    if failing:
        base.error = f"the fault-free run (job {job_id}) failed: " + "; ".join(v.message for v in failing)
        return base
    base.final = final_states(timeline)
    base.trajectory = trajectory_of(timeline)
    if not any(v["state"] for v in base.final.values()):
        base.error = f"the fault-free run (job {job_id}) reported no state value"
    return base


class _BaselineReporter(Reporter):
    """Says and steps through the test's reporter, each line marked 'baseline:'; leaves the
    test's Allure labels and parameters alone (they describe the run under test)."""

    def __init__(self, inner: Reporter):
        super().__init__()
        self._inner = inner

    def say(self, text: str) -> None:
        self._inner.say(f"baseline: {text}")

    def labels(self, fault_kind: str, backend: str, story: str) -> None:
        pass

    def parameter(self, name: str, value) -> None:
        pass


def baseline_for(env, spec: RunSpec, faults: list, test_id: str, reporter: Reporter, judging,
                 refresh: bool = False) -> Baseline:
    """The cached fault-free baseline of ``spec``, else one made now by running it with no
    fault on ``env`` (an Experiment, as the run under test); a run that fails or breaks
    leaves the reason in ``error`` (the final-state verdict is then unverifiable)."""
    from chaos.experiment import Experiment, prepare_faults

    def make(key: str) -> Baseline:
        # The faults' run environment, as the faulted run will have it: what it names is put
        # on the hosts first (e.g. the CUDA shim), or it would name the harness's own copy.
        prepare_faults(env, faults, Timeline(), reporter.say)
        fault_env: dict[str, str] = {}
        for _, fault in faults:
            fault_env.update(fault.run_env())
        quiet = _BaselineReporter(reporter)
        try:
            with reporter.step(f"baseline {key}: a fault-free run of the same workload and seed"):
                exp = Experiment(env, baseline_spec(spec, env.backend.storage_path, fault_env),
                                 [], Expect(), f"{test_id} (baseline)", reporter=quiet, judging=judging)
                outcome = exp.run()
        except Aborted:
            raise
        except ChaosError as e:
            return Baseline(key, error=f"the fault-free run broke: {e}")
        baseline = from_run(key, outcome.run.job_id, outcome.timeline, outcome.verdicts)
        reporter.say(f"baseline {key}: " + (baseline.error or "final state " + "; ".join(
            f"rank {rank} step {v['step']} {v['state']}" for rank, v in sorted(baseline.final.items()))))
        return baseline

    baseline = BaselineCache(Path(env.out_dir) / "baselines").get(spec, make, refresh)
    if baseline.cached:
        reporter.say(f"baseline {baseline.key}: cached, from job {baseline.job_id} of {baseline.made_at}")
    return baseline
