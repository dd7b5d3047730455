"""The reference workload: a small deterministic DDP model under Ray Train V2.

Written like a careful user's script: it resumes from ``ray.train.get_checkpoint()``,
reports a ``step`` metric every step (with ``state_digest``, a digest of the weights and the
optimizer's state after the step, for the final-state verdict), and commits a checkpoint every
``--checkpoint-every`` steps from rank 0 — and, with ``--checkpoint-on-preemption 1``, at
once when ``ray.train.get_preemption_info()`` says a node is being preempted.  Step s's checkpoint holds the state after
step s, so a correct resume reports step s + 1 first.

``--device stub-cuda`` makes every training step also go through the CUDA driver API
(via chaos.shim.driver_client, the way libcudart does), so the CUDA fault shim can
fail a step on machines without a GPU; ``--device cuda`` trains on real GPUs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time


def _device_step(driver) -> None:
    """One step on the (stub) GPU.  A failed step is retried once in the same process,
    as a naive script would: a sticky error makes the retry fail too, which is the
    evidence that the process could not go on and had to be replaced."""
    from chaos.shim.driver_client import CudaDriverError

    try:
        driver.step()
    except CudaDriverError as first:
        try:
            driver.step()
        except CudaDriverError as again:
            raise RuntimeError(f"{first}; retrying the step in the same process failed too ({again}): "
                               "the CUDA context is unusable") from first
        print(f"CUDA step failed once ({first}) and succeeded on retry in the same process", flush=True)


def state_digest(model, optimizer) -> str:
    """The first 16 hex digits of a sha256 over every parameter and buffer and the
    optimizer's state (tensors and hyper-parameters): equal only when two runs' models are
    bit-identical, so a restart that restored the step but not the weights or the
    optimizer shows in the final state (chaos.verify.final_state_matches)."""
    import torch

    def tensor_bytes(t: torch.Tensor) -> bytes:
        return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()

    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(tensor_bytes(t))
    opt = optimizer.state_dict()
    for index, state in sorted(opt["state"].items()):
        for key, value in sorted(state.items()):
            h.update(f"{index}.{key}".encode())
            h.update(tensor_bytes(value) if torch.is_tensor(value) else repr(value).encode())
    h.update(repr(opt["param_groups"]).encode())
    return h.hexdigest()[:16]


def train_loop(config: dict) -> None:
    import torch

    import ray.train
    import ray.train.torch
    from ray.train import Checkpoint

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    torch.manual_seed(config["seed"])
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    model = ray.train.torch.prepare_model(model)  # moves it to this worker's GPU when there is one
    device = ray.train.torch.get_device()

    driver = None
    if config["device"] == "stub-cuda":
        from chaos.shim.driver_client import DriverClient

        driver = DriverClient()

    noticed = False  # a preemption notice was answered with a just-in-time checkpoint
    for step in range(start + 1, config["steps"] + 1):
        gen = torch.Generator().manual_seed(config["seed"] * 1_000_003 + step * 1000 + rank)
        x = torch.randn(64, 16, generator=gen).to(device)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if driver is not None:
            _device_step(driver)
        time.sleep(config["step_time"])  # stands in for the rest of a real step's compute
        inner = model.module if hasattr(model, "module") else model
        metrics = {"step": step, "loss": float(loss.item()), "worker_time": time.time(),
                   "state_digest": state_digest(inner, optimizer)}
        # Every rank asks (the call is a barrier that agrees on one answer across ranks).
        jit = config["checkpoint_on_preemption"] and not noticed and ray.train.get_preemption_info() is not None
        if jit:
            noticed = True
            print(f"rank {rank}: preemption notice at step {step}: checkpointing now", flush=True)
        if (jit or step % config["checkpoint_every"] == 0) and rank == 0:
            with tempfile.TemporaryDirectory() as d:
                torch.save({"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                           os.path.join(d, "state.pt"))
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))
        else:
            ray.train.report(metrics)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--step-time", type=float, default=0.3)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--max-failures", type=int, default=3)
    p.add_argument("--max-preemption-failures", type=int, default=-1)
    p.add_argument("--storage-path", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--device", choices=["cpu", "stub-cuda", "cuda"], default="cpu")
    p.add_argument("--seed", type=int, default=0, help="model init and data (the run is deterministic per seed)")
    p.add_argument("--checkpoint-on-preemption", type=int, choices=[0, 1], default=0,
                   help="1: checkpoint at once when Train says a node is being preempted")
    args = p.parse_args(argv)

    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # A hang must be caught by a timeout the run configures: the process group's.
    timeout = os.environ.get("CHAOS_COLLECTIVE_TIMEOUT_S")
    # gloo even on GPUs: the embedded GPU path may put several ranks on one shared GPU, which NCCL refuses.
    torch_config = TorchConfig(backend="gloo", **({"timeout_s": int(float(timeout))} if timeout else {}))

    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"steps": args.steps, "checkpoint_every": args.checkpoint_every,
                           "step_time": args.step_time, "device": args.device, "seed": args.seed,
                           "checkpoint_on_preemption": bool(args.checkpoint_on_preemption)},
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.device == "cuda"),
        torch_config=torch_config,
        run_config=RunConfig(
            name=args.name,
            storage_path=args.storage_path,
            failure_config=FailureConfig(max_failures=args.max_failures,
                                         max_preemption_failures=args.max_preemption_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=3),
        ),
    )
    result = trainer.fit()
    print(f"reference workload finished: last metrics {result.metrics}")


if __name__ == "__main__":
    main()
