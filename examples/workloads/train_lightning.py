"""PyTorch Lightning under Ray Train V2, the way Ray's docs show it: ``RayDDPStrategy``,
``RayLightningEnvironment``, ``ray.train.lightning.RayTrainReportCallback`` and
``prepare_trainer``, resuming with ``trainer.fit(..., ckpt_path=...)`` from
``ray.train.get_checkpoint()``.

CPU only, a tiny regression model on synthetic data.  Ray's callback reports (with a
checkpoint) at the end of every epoch: ``step`` = ``trainer.global_step`` and ``epoch`` =
``trainer.current_epoch``.  Epochs are 4 batches long.

    python train_lightning.py --storage /shared/storage

Reports (each with a checkpoint): step 4, 8, 12, 16, 20, 24 (epoch 0..5).  A correct
restart from the checkpoint at step 8 reports step 12 first.

    --ignore-checkpoint   BUG: calls trainer.fit() without ckpt_path, so every rank
                          starts again from epoch 0
"""

import argparse
import os
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import ray.train
import ray.train.lightning
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

BATCHES_PER_EPOCH = 4


class Regressor(pl.LightningModule):
    def __init__(self, step_seconds: float):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.step_seconds = step_seconds

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        time.sleep(self.step_seconds)  # stands in for a real model's compute
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * BATCHES_PER_EPOCH * 16, 8, generator=g)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16, shuffle=True)


def train_func(config):
    pl.seed_everything(0)
    model = Regressor(config["step_seconds"])
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        accelerator="cpu",
        devices="auto",
        strategy=ray.train.lightning.RayDDPStrategy(),
        plugins=[ray.train.lightning.RayLightningEnvironment()],
        callbacks=[ray.train.lightning.RayTrainReportCallback()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    trainer = ray.train.lightning.prepare_trainer(trainer)

    checkpoint = ray.train.get_checkpoint()
    if checkpoint and not config["ignore_checkpoint"]:
        with checkpoint.as_directory() as ckpt_dir:
            ckpt_path = os.path.join(ckpt_dir, ray.train.lightning.RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(model, train_dataloaders=data(), ckpt_path=ckpt_path)
    else:
        trainer.fit(model, train_dataloaders=data())


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--name", default=f"lightning-{os.getpid()}", help="the Train run's name")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--step-seconds", type=float, default=0.3)
    p.add_argument("--ignore-checkpoint", action="store_true")
    a = p.parse_args()
    TorchTrainer(
        train_func,
        train_loop_config={"epochs": a.epochs, "step_seconds": a.step_seconds,
                           "ignore_checkpoint": a.ignore_checkpoint},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=a.storage, name=a.name,
                             failure_config=FailureConfig(max_failures=3)),
    ).fit()
