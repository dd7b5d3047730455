"""A user's Ray Train V2 script, as users write them — with flags that reproduce
the classic mistakes the harness must catch.

    --ignore-checkpoint   never calls get_checkpoint() (ray-project/ray#46814)
    --default-failure-config   leaves FailureConfig at its default (max_failures=0)
    --crash-before-training    raises before the trainer starts
    --restore-rank0-only  only rank 0 loads the checkpoint; rank 1 replays from step 0 and,
                          once rank 0 is done, waits forever in the per-step all-reduce
    --metric NAME         name of the reported step counter (default "step")
    --restore-previous-checkpoint  loads the checkpoint before the one Train hands it (scans
                          the run's storage folder itself): an older checkpoint
    --crash-on-restore    raises while loading the checkpoint Train hands it (every restart)
    --max-failures N      FailureConfig(max_failures=N) (default 3)
    --retrain-checkpoint-step  restarts at the restored step itself (range(step, N)): that
                          step is trained and its checkpoint committed twice
    --epoch-steps N       reports the step within its epoch of N steps (0..N-1, again every
                          epoch): a counter that goes back
    --no-step-after-restore  a restored attempt reports its loss without the step metric
"""

import argparse
import glob
import os
import tempfile
import time

import torch

import ray.train
import ray.train.torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def loop(config):
    model = torch.nn.Linear(4, 1)
    rank = ray.train.get_context().get_world_rank()
    start = 0
    if not config["ignore_checkpoint"] and (rank == 0 or not config["restore_rank0_only"]):
        ckpt = ray.train.get_checkpoint()
        if ckpt and config["crash_on_restore"]:
            raise RuntimeError("could not load the checkpoint: optimizer state has another shape")
        if ckpt and config["restore_previous"]:
            steps = sorted(torch.load(f)["step"] for f in glob.glob(os.path.join(config["run_dir"], "*", "s.pt")))
            start = steps[-2] if len(steps) > 1 else 0
        elif ckpt:
            with ckpt.as_directory() as d:
                start = torch.load(os.path.join(d, "s.pt"))["step"]
    first = start if start and config["retrain_checkpoint_step"] else start + 1
    for step in range(first, config["steps"] + 1):
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        torch.distributed.all_reduce(torch.ones(1))  # ranks step together, as DDP's gradient sync does
        time.sleep(0.3)
        counted = (step - 1) % config["epoch_steps"] if config["epoch_steps"] else step
        metrics = {config["metric"]: counted}
        if start and config["no_step_after_restore"]:
            metrics = {"loss": float(loss)}
        if step % 5 == 0 and rank == 0:
            with tempfile.TemporaryDirectory() as d:
                torch.save({"step": step}, os.path.join(d, "s.pt"))
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))
        else:
            ray.train.report(metrics)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--ignore-checkpoint", action="store_true")
    p.add_argument("--default-failure-config", action="store_true")
    p.add_argument("--crash-before-training", action="store_true")
    p.add_argument("--restore-rank0-only", action="store_true")
    p.add_argument("--metric", default="step")
    p.add_argument("--restore-previous-checkpoint", action="store_true")
    p.add_argument("--crash-on-restore", action="store_true")
    p.add_argument("--max-failures", type=int, default=3)
    p.add_argument("--retrain-checkpoint-step", action="store_true")
    p.add_argument("--epoch-steps", type=int, default=0)
    p.add_argument("--no-step-after-restore", action="store_true")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--storage", default=os.environ.get("USER_STORAGE", "/tmp/user-train-storage"))
    a = p.parse_args()
    if a.crash_before_training:
        raise RuntimeError("could not open the training data: /data/shards does not exist")
    name = f"user-{os.getpid()}"
    TorchTrainer(
        loop,
        train_loop_config={"ignore_checkpoint": a.ignore_checkpoint, "steps": a.steps, "metric": a.metric,
                           "restore_rank0_only": a.restore_rank0_only, "crash_on_restore": a.crash_on_restore,
                           "restore_previous": a.restore_previous_checkpoint,
                           "run_dir": os.path.join(a.storage, name),
                           "retrain_checkpoint_step": a.retrain_checkpoint_step, "epoch_steps": a.epoch_steps,
                           "no_step_after_restore": a.no_step_after_restore},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=a.storage, name=name,
                             failure_config=None if a.default_failure_config else FailureConfig(
                                 max_failures=a.max_failures)),
    ).fit()
