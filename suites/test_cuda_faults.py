"""CUDA faults inside a training rank, through the LD_PRELOAD shim.

CPU path (any machine): the reference workload's step goes through the CUDA driver API
the way libcudart does, against the stub driver (chaos/shim/cuda_stub); the shim fails or hangs
the call in rank 1 only.  GPU path: see test_cuda_gpu.py (marker ``gpu``).
"""

import pytest

from chaos.faults.cuda import CudaFault
from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos


@pytest.fixture(autouse=True)
def _reference_workload_only(chaos):
    if chaos.user_workload:
        pytest.skip("the CPU CUDA path drives the stub driver from the reference workload; "
                    "put your own script under CUDA faults on a GPU node (test_cuda_gpu.py)")


def injections(outcome):
    return outcome.timeline.of("cuda_injection")


def run_with(chaos, fault):
    """The reference workload on the stub GPU, the fault in rank 1 after checkpoint 2, one charge expected."""
    return chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=20, checkpoint_every=5, device="stub-cuda"),
        faults=[(AfterCheckpoint(2), fault)],
    )


def rank_processes(outcome, rank):
    """(node id, pid) of ``rank`` per attempt: PIDs alone repeat across test hosts' PID namespaces."""
    return [next((p["node_id"], p["pid"]) for p in a.data["placement"] if p["rank"] == rank)
            for a in outcome.timeline.attempts()]


def test_ecc_error_in_rank_1_after_checkpoint_2(chaos, cuda_driver_dir):
    """Uncorrectable ECC (214, deferred + sticky): Train restarts the process, resumes from the checkpoint."""
    fault = CudaFault("ecc", rank=1, driver_dir=cuda_driver_dir)
    outcome = run_with(chaos, fault)
    outcome.assert_verdicts()
    [inj] = injections(outcome)
    assert inj.data["error"] == 214 and inj.data["rank"] == 1, inj.data
    errors = outcome.timeline.of("worker_error")
    assert any("uncorrectable ECC error encountered" in msg for e in errors for msg in e.data["errors"].values()), errors
    old, new = rank_processes(outcome, 1)[:2]
    assert inj.data["pid"] == old[1], f"the shim fired in pid {inj.data['pid']}, rank 1 was {old}"
    assert new != old, f"the faulty process {old} must be replaced by a new one, got {new}"


@pytest.mark.extended
def test_sticky_error_proves_the_old_process_could_not_go_on(chaos, cuda_driver_dir):
    """Illegal address (700, sticky): the in-process retry fails too, so only a new process helps."""
    fault = CudaFault("illegal-address", rank=1, driver_dir=cuda_driver_dir)
    outcome = run_with(chaos, fault)
    outcome.assert_verdicts()
    messages = [m for e in outcome.timeline.of("worker_error") for m in e.data["errors"].values()]
    assert any("an illegal memory access was encountered" in m and "failed too" in m and "unusable" in m
               for m in messages), messages
    assert injections(outcome)[0].data["pid"] == rank_processes(outcome, 1)[0][1]


@pytest.mark.extended
def test_hang_is_caught_by_the_collective_timeout(chaos, cuda_driver_dir):
    """A hung sync in rank 1: the run's collective timeout must fire, Train restarts, resumes."""
    fault = CudaFault("ecc", rank=1, driver_dir=cuda_driver_dir, mode="hang", collective_timeout_s=15,
                      symbols=["cuCtxSynchronize*"], sticky=False)
    outcome = run_with(chaos, fault)
    outcome.assert_verdicts()
    [inj] = injections(outcome)
    assert inj.data["mode"] == "hang"
    errors = " ".join(m for e in outcome.timeline.of("worker_error") for m in e.data["errors"].values())
    assert "imed out" in errors or "timeout" in errors.lower(), f"the hang was not ended by a timeout: {errors}"
