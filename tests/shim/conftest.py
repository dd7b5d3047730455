"""Builds the shim, the stub driver and the C test driver once per session, and runs the
driver under the shim with a plan, collecting its per-call results and the JSON log."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from chaos.shim.build import ensure_shim
from chaos.shim.control import read_log
from chaos.shim.plan import Plan
from chaos.shim.cuda_stub import build_stub

from shim_helpers import DEADLINE_S, Interactive, Run, compile_program

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shim-build")


@pytest.fixture(scope="session")
def stub_dir(build_dir) -> Path:
    return build_stub(build_dir / "stub")


@pytest.fixture(scope="session")
def shim(build_dir) -> Path:
    return ensure_shim(build_dir / "cache")


@pytest.fixture(scope="session")
def driver(build_dir, stub_dir) -> Path:
    return compile_program(HERE / "driver.c", build_dir / "driver", f"-L{stub_dir}", "-l:libcuda.so.1",
                           f"-Wl,-rpath,{stub_dir}", "-ldl", "-lpthread")


@pytest.fixture
def shim_env(shim, stub_dir, tmp_path):
    """Environment for a shimmed process: a fresh control file and log per test."""
    def make(plan: Plan | str | None = None, control: bool = True, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("CHAOS_CUDA_") and k not in ("RANK", "LOCAL_RANK")}
        env.update(LD_PRELOAD=str(shim), LD_LIBRARY_PATH=str(stub_dir), CHAOS_CUDA_LOG=str(tmp_path / "shim.log"))
        if control:
            env["CHAOS_CUDA_CONTROL"] = str(tmp_path / "control")
        if plan is not None:
            env["CHAOS_CUDA_PLAN"] = plan.render() if isinstance(plan, Plan) else plan
        env.update(extra)
        return env
    make.control = tmp_path / "control"
    make.log = tmp_path / "shim.log"
    return make


@pytest.fixture
def run_driver(driver, shim_env):
    """Run the driver to completion (bounded by DEADLINE_S) and collect its output and log."""
    def go(path: str, *commands: str, plan: Plan | str | None = None, env: dict | None = None) -> Run:
        env = env or shim_env(plan)
        p = subprocess.run([str(driver), path, *commands], env=env, capture_output=True, text=True,
                           timeout=DEADLINE_S)
        assert p.returncode == 0, p.stderr
        log = read_log(env["CHAOS_CUDA_LOG"]) if Path(env["CHAOS_CUDA_LOG"]).exists() else []
        return Run(p.stdout.splitlines(), log)
    return go


@pytest.fixture
def interactive(driver):
    started: list[Interactive] = []

    def start(path: str, *commands: str, env: dict) -> Interactive:
        run = Interactive(driver, path, list(commands), env)
        started.append(run)
        return run
    yield start
    for run in started:
        run.kill()
