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
    --learn               trains (SGD on a seeded model, its weights and optimizer in the
                          checkpoint) and reports the training loss every step
    --evaluate-after-restore  (implies --learn) after loading, reports the restored step
                          with the loss evaluated there, then trains on: Hugging Face's
                          evaluate-on-resume shape, a correct resume
    --restore-step-only   (implies --learn) loads the step but not the weights and the
                          optimizer: the state was lost
    --optimizer-in-tmp    (implies --learn) keeps the optimizer's state out of the checkpoint, in a
                          file per checkpoint step on rank 0's node (/tmp/<run>-opt-<step>.pt), which
                          every rank loads on a restore if it is there (else starts the optimizer
                          afresh, saying so):
                          right where every node shares one filesystem; without one, a restart on
                          two nodes finds it on one at most, and that state is lost
    --initial-checkpoint  hands Train the initial weights as a checkpoint before the first
                          step, in a report without a step (there is none yet)
    --step-time S         seconds per step (default 0.3)
    --hold-after-checkpoint K  an attempt that restored nothing waits 20 s after it reports its
                          checkpoint at step K (a slow validation pass): a fault on that commit
                          lands before step K + 1 is reported, however slow the machine
    --report-at-checkpoints-only  reports only when it checkpoints (every 5th step)
    --checkpoint-before-metrics  (implies --learn) at each save, hands Train the checkpoint in a
                          report of its own without metrics (report({}, checkpoint=ck)), then the
                          step's metrics: the checkpoint holds the state after that step
    --save-at-top         (implies --learn) saves at the top of every 5th step the state before
                          training it, labelled with that step, then trains it and reports its loss;
                          a restore begins at the saved step (and saves it again at its top)
    --skip-restored-step  (with --save-at-top) BUG: a restore begins after the saved step, whose
                          batch is then never trained
    --double-stride-after-restore  after loading step s, skips a save interval (goes on at s + 6)
                          and from then on saves and reports every 10th step: data skipped,
                          under a stride only the restarted attempt shows
    --no-checkpoint       never hands Train a checkpoint
    --warmup-fit          first a short fault-free fit() of its own (3 steps, no checkpoint:
                          a smoke test of the data and model), then the run under test
    --restore-newest-folder  loads the newest checkpoint folder in the run's storage (scans it
                          itself) instead of the one Train hands it: a folder a rank wrote but Ray
                          never committed, where a fault came before every rank reported
    --slow-checkpoint-report S  ranks other than 0 hand Train a shard of each checkpoint too,
                          uploaded by their own checkpoint_upload_fn that takes S seconds: rank
                          0's part is on storage while Ray waits for theirs
    --slow-start S        every attempt loads for S seconds before its first step (a slow data
                          loader or a large checkpoint): a slow reporter, not a stalled one
    --crash-on-preemption-notice  every rank asks ray.train.get_preemption_info() each step;
                          on the first notice rank 0 raises ValueError (a script bug in its
                          notice handler), on a node the preemption does not touch
    --workers N           Train workers (default 2)
    --relax-collectives   FailureConfig(relax_collectives_on_preemption=True) (Ray >= 2.60)
    --survivors-checkpoint-on-notice  every rank asks ray.train.get_preemption_info() each step; on
                          the notice a preempted rank stops there (reclaimed before it reports),
                          the others save a just-in-time checkpoint of that step without it and
                          wait for the restart: only relaxed collectives let them commit it
    --hang-after-fit      after fit() returns, waits forever (a non-daemon thread or a process
                          pool nobody joins): Train's run ended, the job never does
    --leak-actor          after fit() returns, starts a detached actor (named "leaked" in
                          namespace "user-train", 0.5 CPU) and leaves it: resources the job
                          never gives back
"""

import argparse
import glob
import os
import shutil
import tempfile
import threading
import time

import torch

import ray.train
import ray.train.torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def loop(config):
    learn = config["learn"]
    torch.manual_seed(0)  # every rank and every attempt starts from the same weights
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rank = ray.train.get_context().get_world_rank()
    start, ckpt = 0, None
    if not config["ignore_checkpoint"] and (rank == 0 or not config["restore_rank0_only"]):
        ckpt = ray.train.get_checkpoint()
        if ckpt and config["crash_on_restore"]:
            raise RuntimeError("could not load the checkpoint: optimizer state has another shape")
        if ckpt and config["restore_newest_folder"]:
            start = max(torch.load(f)["step"] for f in glob.glob(os.path.join(config["run_dir"], "*", "s.pt")))
        elif ckpt and config["restore_previous"]:
            steps = sorted(torch.load(f)["step"] for f in glob.glob(os.path.join(config["run_dir"], "*", "s.pt")))
            start = steps[-2] if len(steps) > 1 else 0
        elif ckpt:
            with ckpt.as_directory() as d:
                saved = torch.load(os.path.join(d, "s.pt"))
            start = saved["step"]
            if learn and not config["restore_step_only"]:
                model.load_state_dict(saved["model"])
                if config["optimizer_in_tmp"]:
                    restore_node_local_optimizer(opt, config["run_dir"], start, rank)
                else:
                    opt.load_state_dict(saved["opt"])
    if config["initial_checkpoint"] and ckpt is None:
        report_with_checkpoint({}, 0, model, opt, rank)
    if start and config["evaluate_after_restore"]:
        with torch.no_grad():
            ray.train.report({config["metric"]: start, "loss": float(batch_loss(model, start))})
    time.sleep(config["slow_start"])  # stands in for loading data or a large checkpoint
    first = start if start and config["retrain_checkpoint_step"] else start + 1
    if start and config["save_at_top"]:  # the saved state is the one step `start` begins from
        first = start + 1 if config["skip_restored_step"] else start
    doubled = bool(start) and config["double_stride_after_restore"]
    if doubled:
        first = start + 6
    for step in range(first, config["steps"] + 1):
        if config["save_at_top"] and step % 5 == 0:
            report_with_checkpoint({config["metric"]: step}, step, model, opt, rank)
        loss = batch_loss(model, step) if learn else model(torch.ones(2, 4)).sum()
        opt.zero_grad()
        loss.backward()
        if learn:
            opt.step()
        if config["survivors_checkpoint_on_notice"]:
            info = ray.train.get_preemption_info()
            if info is not None:
                if rank not in info.preempted_ranks:
                    report_with_checkpoint({config["metric"]: step}, step, model, opt, rank)
                threading.Event().wait()  # the restart (or the node's end) tears this worker down
        torch.distributed.all_reduce(torch.ones(1))  # ranks step together, as DDP's gradient sync does
        time.sleep(config["step_time"])
        counted = (step - 1) % config["epoch_steps"] if config["epoch_steps"] else step
        metrics = {config["metric"]: counted}
        if learn:
            metrics["loss"] = float(loss)
        if start and config["no_step_after_restore"]:
            metrics = {"loss": float(loss)}
        if config["crash_on_preemption_notice"] and ray.train.get_preemption_info() is not None and rank == 0:
            raise ValueError("preemption handler: checkpoint path template has no {step} field")
        saves = step % (10 if doubled else 5) == 0 and not config["no_checkpoint"] and not config["save_at_top"]
        if config["report_at_checkpoints_only"] and not saves:
            continue
        if saves and config["optimizer_in_tmp"] and rank == 0:
            torch.save(opt.state_dict(), node_local_optimizer(config["run_dir"], step))
        kept = None if config["optimizer_in_tmp"] else opt  # what the checkpoint holds besides the weights
        if saves and config["checkpoint_before_metrics"]:
            report_with_checkpoint({}, step, model, kept, rank)
            ray.train.report(metrics)
        elif saves:
            report_with_checkpoint(metrics, step, model, kept, rank, config["slow_checkpoint_report"])
            if step == config["hold_after_checkpoint"] and not start:
                time.sleep(20)
        else:
            ray.train.report(metrics)


def report_with_checkpoint(metrics, step, model, opt, rank, slow_upload_s=0.0):
    """Rank 0 saves the step, weights and optimizer; every rank reports (Train waits for all).
    With ``slow_upload_s`` the other ranks hand Train a shard too, uploaded that slowly."""
    with tempfile.TemporaryDirectory() as d:
        if rank == 0:
            state = {"step": step, "model": model.state_dict(), **({"opt": opt.state_dict()} if opt else {})}
            torch.save(state, os.path.join(d, "s.pt"))
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))
        elif slow_upload_s:
            with open(os.path.join(d, f"shard-{rank}.txt"), "w") as out:
                out.write(str(step))
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d),
                             checkpoint_upload_fn=lambda ckpt, name: slow_upload(ckpt, name, slow_upload_s))
        else:
            ray.train.report(metrics)


def node_local_optimizer(run_dir, step):
    """The buggy shape's file: on the node's own disk, outside the checkpoint.  One per checkpoint
    step, so that a restore reads the state of the step it restored (one file, overwritten at the
    next save, would hold a later step's state when the fault lands after that save but before its
    checkpoint commits: a second bug, which the shared-filesystem twin must not have)."""
    return f"/tmp/{os.path.basename(run_dir)}-opt-{step}.pt"


def restore_node_local_optimizer(opt, run_dir, step, rank):
    path = node_local_optimizer(run_dir, step)
    if os.path.exists(path):
        opt.load_state_dict(torch.load(path))
    else:
        print(f"rank {rank}: no optimizer state at {path}: starting the optimizer afresh", flush=True)


def slow_upload(checkpoint, dir_name, seconds):
    """A rank's own upload (checkpoint_upload_fn) that takes ``seconds``: a big shard on slow storage."""
    time.sleep(seconds)
    dest = os.path.join(ray.train.get_context().get_storage().experiment_fs_path, dir_name)
    shutil.copytree(checkpoint.path, dest, dirs_exist_ok=True)
    return Checkpoint.from_directory(dest)


class Leaked:
    def ping(self):
        return True


def batch_loss(model, step):
    """The loss on step ``step``'s batch: the same data at the same step in every attempt."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(8, 4, generator=g)
    return ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for flag in ("--ignore-checkpoint", "--default-failure-config", "--crash-before-training", "--restore-rank0-only",
                 "--restore-previous-checkpoint", "--crash-on-restore", "--retrain-checkpoint-step",
                 "--no-step-after-restore", "--learn", "--evaluate-after-restore", "--restore-step-only",
                 "--initial-checkpoint", "--report-at-checkpoints-only", "--no-checkpoint", "--warmup-fit",
                 "--double-stride-after-restore", "--crash-on-preemption-notice", "--restore-newest-folder",
                 "--hang-after-fit", "--relax-collectives", "--survivors-checkpoint-on-notice", "--leak-actor",
                 "--checkpoint-before-metrics", "--save-at-top", "--skip-restored-step", "--optimizer-in-tmp"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--metric", default="step")
    p.add_argument("--max-failures", type=int, default=3)
    p.add_argument("--epoch-steps", type=int, default=0)
    p.add_argument("--step-time", type=float, default=0.3)
    p.add_argument("--slow-checkpoint-report", type=float, default=0.0)
    p.add_argument("--slow-start", type=float, default=0.0)
    p.add_argument("--hold-after-checkpoint", type=int, default=0)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--storage", default=os.environ.get("USER_STORAGE", "/tmp/user-train-storage"))
    a = p.parse_args()
    if a.crash_before_training:
        raise RuntimeError("could not open the training data: /data/shards does not exist")
    name = f"user-{os.getpid()}"
    config = {"ignore_checkpoint": a.ignore_checkpoint, "steps": a.steps, "metric": a.metric,
              "restore_rank0_only": a.restore_rank0_only, "crash_on_restore": a.crash_on_restore,
              "restore_previous": a.restore_previous_checkpoint, "run_dir": os.path.join(a.storage, name),
              "retrain_checkpoint_step": a.retrain_checkpoint_step, "epoch_steps": a.epoch_steps,
              "no_step_after_restore": a.no_step_after_restore,
              "learn": a.learn or a.evaluate_after_restore or a.restore_step_only or a.checkpoint_before_metrics
              or a.save_at_top or a.optimizer_in_tmp,
              "checkpoint_before_metrics": a.checkpoint_before_metrics, "save_at_top": a.save_at_top,
              "skip_restored_step": a.skip_restored_step, "optimizer_in_tmp": a.optimizer_in_tmp,
              "evaluate_after_restore": a.evaluate_after_restore, "restore_step_only": a.restore_step_only,
              "initial_checkpoint": a.initial_checkpoint, "step_time": a.step_time,
              "report_at_checkpoints_only": a.report_at_checkpoints_only, "no_checkpoint": a.no_checkpoint,
              "double_stride_after_restore": a.double_stride_after_restore,
              "crash_on_preemption_notice": a.crash_on_preemption_notice,
              "restore_newest_folder": a.restore_newest_folder, "slow_checkpoint_report": a.slow_checkpoint_report,
              "slow_start": a.slow_start, "hold_after_checkpoint": a.hold_after_checkpoint,
              "survivors_checkpoint_on_notice": a.survivors_checkpoint_on_notice}
    relax = {"relax_collectives_on_preemption": True} if a.relax_collectives else {}
    if a.warmup_fit:
        TorchTrainer(loop, train_loop_config={**config, "steps": 3}, scaling_config=ScalingConfig(num_workers=a.workers),
                     run_config=RunConfig(storage_path=a.storage, name=f"{name}-warmup")).fit()
    TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=a.workers),
        run_config=RunConfig(storage_path=a.storage, name=name,
                             failure_config=None if a.default_failure_config else FailureConfig(
                                 max_failures=a.max_failures, **relax)),
    ).fit()
    if a.leak_actor:
        leaked = ray.remote(num_cpus=0.5)(Leaked).options(name="leaked", namespace="user-train", lifetime="detached")
        ray.get(leaked.remote().ping.remote())
    if a.hang_after_fit:
        threading.Event().wait()
