"""A user's own Ray Train script, as small as one gets: what the README's
"Your own training script" command runs under chaos, unchanged.

It restores the model and optimizer from the checkpoint Ray Train hands it, reports
``step`` and ``loss`` every step, a checkpoint every 5th, and retries up to 3 failures.

    python my_train.py [--storage DIR] [--steps N]

``--storage`` must be a path every node of the cluster sees (the embedded cluster's nodes
share this machine's /tmp).
"""

import argparse
import os
import tempfile
import time
import uuid

import torch

import ray.train
import ray.train.torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def train(config):
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    x, y = torch.ones(16, 8), torch.zeros(16, 1)
    for step in range(start + 1, config["steps"] + 1):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        time.sleep(0.3)
        metrics = {"step": step, "loss": loss.item()}
        if step % 5 == 0:
            with tempfile.TemporaryDirectory() as d:
                if ray.train.get_context().get_world_rank() == 0:
                    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                               os.path.join(d, "state.pt"))
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))
        else:
            ray.train.report(metrics)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--storage", default="/tmp/ray-chaos-my-train")
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    TorchTrainer(
        train,
        train_loop_config={"steps": a.steps},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=a.storage, name=f"my-train-{uuid.uuid4().hex[:8]}",
                             failure_config=FailureConfig(max_failures=3)),
    ).fit()
