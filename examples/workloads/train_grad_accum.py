"""Plain PyTorch DDP with gradient accumulation under Ray Train V2, as users write it.

``global_step`` counts micro-batches, so it advances by the accumulation factor at every
optimizer step, where the script reports: global_step 4, 8, 12, ...; every 3rd optimizer
step (global_step 12, 24, 36, ...) it also commits a checkpoint.  A correct restart from
the checkpoint at global_step 24 reports global_step 28 first.

    python train_grad_accum.py --storage /shared/storage

    --resume-next-step   BUG (off by one): after loading the checkpoint it "continues with
                         the next optimizer step", which skips one accumulation window of
                         data: the first report after a restart from 24 is 32, not 28
"""

import argparse
import os
import tempfile
import time

import torch

import ray.train
import ray.train.torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

ACCUM = 4             # micro-batches per optimizer step
CHECKPOINT_EVERY = 3  # optimizer steps


def micro_batch(rank: int, global_step: int):
    g = torch.Generator().manual_seed(1000 * global_step + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def train_loop(config):
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_step = 0

    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        opt_step = state["opt_step"]
        if config["resume_next_step"]:
            opt_step += 1  # "continue with the next step" -- but opt_step already counts the done ones

    model = ray.train.torch.prepare_model(model)
    global_step = opt_step * ACCUM
    while opt_step < config["opt_steps"]:
        for micro in range(ACCUM):
            global_step += 1
            x, y = micro_batch(rank, global_step)
            loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM
            if micro < ACCUM - 1:
                with model.no_sync():  # accumulate locally, all-reduce on the last micro-batch
                    loss.backward()
            else:
                loss.backward()
            time.sleep(config["step_seconds"] / ACCUM)  # stands in for a real model's compute
        optimizer.step()
        optimizer.zero_grad()
        opt_step += 1
        metrics = {"global_step": global_step, "loss": loss.item() * ACCUM}
        if opt_step % CHECKPOINT_EVERY == 0:
            with tempfile.TemporaryDirectory() as d:
                if rank == 0:
                    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                "opt_step": opt_step}, os.path.join(d, "state.pt"))
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d) if rank == 0 else None)
        else:
            ray.train.report(metrics)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--name", default=f"grad-accum-{os.getpid()}", help="the Train run's name")
    p.add_argument("--opt-steps", type=int, default=15)
    p.add_argument("--step-seconds", type=float, default=0.5, help="seconds per optimizer step")
    p.add_argument("--resume-next-step", action="store_true")
    a = p.parse_args()
    TorchTrainer(
        train_loop,
        train_loop_config={"opt_steps": a.opt_steps, "step_seconds": a.step_seconds,
                           "resume_next_step": a.resume_next_step},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=a.storage, name=a.name,
                             failure_config=FailureConfig(max_failures=3)),
    ).fit()
