"""DriverClient (ctypes, cuGetProcAddress + dlsym) fails like PyTorch under each preset."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from chaos.shim.control import arm, process_env, read_log
from chaos.shim.plan import Plan

# The error as the caller gets it: Ray pickles a worker's exception to the controller (an
# exception that cannot be rebuilt from its pickle reached Train as a deserialization error).
STEPS = """
import json, pickle, sys
from chaos.shim.driver_client import DriverClient
client = DriverClient()
for _ in range(int(sys.argv[1])):
    try:
        client.step()
        print(json.dumps(None))
    except RuntimeError as raised:
        e = pickle.loads(pickle.dumps(raised))
        print(json.dumps([str(e), e.error_code, e.symbol]))
"""


def steps(env: dict, n: int) -> list:
    p = subprocess.run([sys.executable, "-c", STEPS, str(n)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


def test_clean_steps_without_a_plan(shim_env):
    assert steps(shim_env(), 3) == [None, None, None]


@pytest.mark.parametrize("preset, failures", [
    ("ecc", [None, ["CUDA error: uncorrectable ECC error encountered", 214, "cuCtxSynchronize"],
             ["CUDA error: uncorrectable ECC error encountered", 214, "cuMemcpyHtoD"]]),
    ("illegal-address", [None, ["CUDA error: an illegal memory access was encountered", 700, "cuLaunchKernel"],
                         ["CUDA error: an illegal memory access was encountered", 700, "cuMemcpyHtoD"]]),
    ("launch-failed", [None, ["CUDA error: unspecified launch failure", 719, "cuLaunchKernel"], None]),
])
def test_presets_surface_as_pytorch_errors(shim_env, preset, failures):
    assert steps(shim_env(Plan.preset(preset, after=1)), 3) == failures


def test_process_env_puts_a_process_under_the_shim(shim, stub_dir, tmp_path):
    env = {**os.environ, "LD_LIBRARY_PATH": str(stub_dir),
           **process_env(shim, tmp_path / "ctl", tmp_path / "log", Plan.preset("launch-failed", plan_id="pe"))}
    assert steps(env, 2) == [["CUDA error: unspecified launch failure", 719, "cuLaunchKernel"], None]
    assert [e["event"] for e in read_log(tmp_path / "log")] == ["arm", "inject"]


def test_gpu_lost_armed_through_the_control_file(shim_env):
    env = shim_env()
    arm(shim_env.control, Plan.preset("gpu-lost", rank=0))
    assert steps({**env, "RANK": "1"}, 1) == [None]
    p = subprocess.run([sys.executable, "-c", STEPS, "1"], env={**env, "RANK": "0"}, capture_output=True,
                       text=True, timeout=60)
    assert "CUDA error: unknown error" in p.stderr  # raised by cuMemAlloc in DriverClient()
