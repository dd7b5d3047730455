"""The shim against a real driver (and PyTorch, when installed): only on a GPU machine.

Run there with: python -m pytest tests/shim/test_shim_gpu.py -q
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.shim.build import ensure_shim
from chaos.shim.plan import Plan

pytestmark = pytest.mark.skipif(not Path("/dev/nvidiactl").exists(), reason="needs an NVIDIA GPU and driver")

CLIENT = """
from chaos.shim.driver_client import DriverClient
c = DriverClient()
c.step()
try:
    c.step()
except RuntimeError as e:
    print(e.error_code, e)
"""

TORCH = """
import torch
try:
    x = torch.ones(1024, device="cuda")
    (x * 2).sum().item()
    torch.cuda.synchronize()
    print("no error")
except RuntimeError as e:
    print(getattr(e, "error_code", None), str(e).splitlines()[0])
"""


def run(script: str, plan: Plan, tmp_path: Path) -> str:
    env = {**os.environ, "LD_PRELOAD": str(ensure_shim(tmp_path)), "CHAOS_CUDA_PLAN": plan.render(),
           "CHAOS_CUDA_LOG": str(tmp_path / "log")}
    env.pop("CHAOS_CUDA_CONTROL", None)
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_driver_client_on_a_real_driver(tmp_path):
    out = run(CLIENT, Plan.preset("launch-failed", after=1), tmp_path)
    assert out == "719 CUDA error: unspecified launch failure"


def test_pytorch_sees_a_deferred_ecc_error(tmp_path):
    pytest.importorskip("torch")
    out = run(TORCH, Plan.preset("ecc"), tmp_path)
    assert "uncorrectable ECC error encountered" in out, out
