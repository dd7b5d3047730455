"""CUDA faults on a real GPU with real PyTorch (marker ``gpu``).

An uncorrectable ECC error (214) injected by the shim into rank 1's kernel launches must
surface in PyTorch as ``torch.AcceleratorError`` with error_code 214, make Train restart
the process and resume from the latest checkpoint.  Run it with scripts/gpu-check.sh.
"""

import pytest

from chaos.faults.cuda import CudaFault
from chaos.triggers import AfterCheckpoint

pytestmark = [pytest.mark.chaos, pytest.mark.gpu]


@pytest.fixture(autouse=True)
def _needs_gpu(chaos):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible here (torch.cuda.is_available() is False); run scripts/gpu-check.sh on a GPU node")
    if not chaos.env.cluster.alive_workers() or not any(n.resources.get("GPU") for n in chaos.env.cluster.alive_workers()):
        pytest.skip("the cluster's worker nodes advertise no GPU (embedded: --chaos-gpus-per-worker 1)")


def test_ecc_on_a_real_gpu_restarts_and_resumes(chaos):
    fault = CudaFault("ecc", rank=1, after=20)  # the real driver: no stub directory
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5, device="cuda"),
        faults=[(AfterCheckpoint(2), fault)],
    )
    outcome.assert_verdicts()
    [inj] = outcome.timeline.of("cuda_injection")
    assert inj.data["error"] == 214 and inj.data["rank"] == 1
    messages = [m for e in outcome.timeline.of("worker_error") for m in e.data["errors"].values()]
    assert any("AcceleratorError" in m and "uncorrectable ECC error encountered" in m for m in messages), messages
