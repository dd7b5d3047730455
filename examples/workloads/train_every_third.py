"""Plain PyTorch DDP under Ray Train V2 that reports metrics only every 3rd step and
checkpoints at the end of every epoch (every 6th step), as users write them.

Each rank reads its own shard of a synthetic stream; its position in that stream (the
step counter) is per-rank state, saved by every rank next to the model in the
checkpoint (``progress-rank<r>.json``), the way per-rank data-loader state is saved.

    python train_every_third.py --storage /shared/storage

Reports: step 3, 6, 9, ... (every 3rd step); checkpoints at 6, 12, 18, ... (epoch ends).
A correct restart from the checkpoint at step 12 reports step 15 first.

    --restore-rank0-only   BUG: only rank 0 loads its progress file after a restart, so
                           rank 1 replays its data from step 1 (model weights and epoch
                           are restored on every rank, so the ranks stay in lockstep)
"""

import argparse
import json
import os
import tempfile
import time

import torch

import ray.train
import ray.train.torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

STEPS_PER_EPOCH = 6
REPORT_EVERY = 3


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def train_loop(config):
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start_epoch, step = 0, 0

    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"), weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start_epoch = state["epoch"] + 1
            if rank == 0 or not config["restore_rank0_only"]:
                with open(os.path.join(d, f"progress-rank{rank}.json")) as f:
                    step = json.load(f)["step"]

    model = ray.train.torch.prepare_model(model)
    for epoch in range(start_epoch, config["epochs"]):
        for _ in range(STEPS_PER_EPOCH):
            step += 1
            x, y = batch(rank, step)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(config["step_seconds"])  # stands in for a real model's compute
            if step % REPORT_EVERY:
                continue
            metrics = {"step": step, "epoch": epoch, "loss": loss.item()}
            if step % STEPS_PER_EPOCH == 0:  # end of the epoch: checkpoint
                with tempfile.TemporaryDirectory() as d:
                    if rank == 0:
                        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                    "epoch": epoch}, os.path.join(d, "model.pt"))
                    with open(os.path.join(d, f"progress-rank{rank}.json"), "w") as f:
                        json.dump({"step": step}, f)
                    ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))
            else:
                ray.train.report(metrics)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--name", default=f"every-third-{os.getpid()}", help="the Train run's name")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--step-seconds", type=float, default=0.25)
    p.add_argument("--restore-rank0-only", action="store_true")
    a = p.parse_args()
    TorchTrainer(
        train_loop,
        train_loop_config={"epochs": a.epochs, "step_seconds": a.step_seconds,
                           "restore_rank0_only": a.restore_rank0_only},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=a.storage, name=a.name,
                             failure_config=FailureConfig(max_failures=3)),
    ).fit()
