"""Hugging Face Transformers ``Trainer`` under Ray Train V2, the way Ray's docs show it:
``ray.train.huggingface.transformers.RayTrainReportCallback`` + ``prepare_trainer``, and
``trainer.train(resume_from_checkpoint=...)`` from ``ray.train.get_checkpoint()``.

CPU only: a tiny GPT-2 built from a config (nothing is downloaded) on a synthetic
dataset.  Ray's callback reports only when the Trainer saves (every ``save_steps``), with
the metrics merged from ``state.log_history``: ``step`` is the global step of the latest
log, so ``logging_steps`` divides ``save_steps`` to keep it equal to the saved step.

    python train_hf_transformers.py --storage /shared/storage

Reports (each with a checkpoint): step 4, 8, 12, 16, 20.  A correct restart from the
checkpoint at step 8 reports step 12 first.

    --ignore-checkpoint   BUG: calls trainer.train() without resume_from_checkpoint, so
                          every rank starts again from step 0
    --logging-steps N, --save-steps M  (default 2, 4) where M is no multiple of N the reported step
                          is the last logged one: logging 10, saving 25 reports 20, 50, 70, 100
"""

import argparse
import os
import tempfile
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import ray.train
import ray.train.huggingface.transformers
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

SEQ = 16
VOCAB = 64


class Tokens(torch.utils.data.Dataset):
    """Synthetic token sequences (a counting pattern per sample), deterministic."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = (torch.arange(SEQ) * (1 + i % 5) + i) % VOCAB
        return {"input_ids": ids, "labels": ids.clone()}


class StepTime(TrainerCallback):
    """Stands in for a real model's compute: each optimizer step takes this long."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def train_func(config):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=1, n_head=2))
    run_name = ray.train.get_context().get_experiment_name()
    with tempfile.TemporaryDirectory(prefix=f"{run_name}-") as output_dir:  # this worker's local scratch
        args = TrainingArguments(
            output_dir=output_dir,
            max_steps=config["max_steps"],
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            logging_strategy="steps",
            logging_steps=config["logging_steps"],
            save_strategy="steps",
            save_steps=config["save_steps"],
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
            ddp_find_unused_parameters=False,
            seed=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(256),
                          callbacks=[StepTime(config["step_seconds"])])
        trainer.add_callback(ray.train.huggingface.transformers.RayTrainReportCallback())
        trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)

        checkpoint = ray.train.get_checkpoint()
        if checkpoint and not config["ignore_checkpoint"]:
            with checkpoint.as_directory() as checkpoint_dir:
                checkpoint_path = os.path.join(
                    checkpoint_dir, ray.train.huggingface.transformers.RayTrainReportCallback.CHECKPOINT_NAME)
                trainer.train(resume_from_checkpoint=checkpoint_path)
        else:
            trainer.train()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--name", default=f"hf-trainer-{os.getpid()}", help="the Train run's name")
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--step-seconds", type=float, default=0.4)
    p.add_argument("--ignore-checkpoint", action="store_true")
    p.add_argument("--logging-steps", type=int, default=2)
    p.add_argument("--save-steps", type=int, default=4)
    a = p.parse_args()
    TorchTrainer(
        train_func,
        train_loop_config={"max_steps": a.max_steps, "step_seconds": a.step_seconds,
                           "ignore_checkpoint": a.ignore_checkpoint, "logging_steps": a.logging_steps,
                           "save_steps": a.save_steps},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=a.storage, name=a.name,
                             failure_config=FailureConfig(max_failures=3)),
    ).fit()
