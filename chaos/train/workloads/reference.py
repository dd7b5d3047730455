"""The reference workload: a small deterministic DDP model under Ray Train V2.

Written like a careful user's script: it resumes from ``ray.train.get_checkpoint()``,
reports a ``step`` metric every step, and commits a checkpoint every ``--checkpoint-every``
steps from rank 0 — and, with ``--checkpoint-on-preemption 1``, at once when
``ray.train.get_preemption_info()`` says a node is being preempted.  Step s's checkpoint
holds the state after step s, so a correct resume reports step s + 1 first.

Its state has every part a real restore can lose (``TrainState``): the weights, an optimizer
with momentum, an LR scheduler, an RNG (input noise) and a data cursor through a shuffled
dataset.  Each report carries ``state_digest`` (weights and optimizer after the step, for the
final-state verdict) and ``digest_<part>`` of the state the step *began* from, so the
trajectory verdict can name the part a restore lost.  ``--forget PART`` is the buggy twin:
a restore that leaves that part fresh.

``--num-workers MIN-MAX`` runs it elastic (``ScalingConfig(num_workers=(min, max))``): Train
sizes the worker group to the capacity it finds at each start, and every
``--resize-interval`` seconds checks whether a healthy group can grow.  Each rank's batch
follows the data cursor and its rank, and the cursor advances by every rank's batch, so a
checkpoint taken at one world size restores at another.

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
    optimizer shows in the final state (chaos.verdicts.final_state)."""
    return _digest(*_tensor_chunks(model.state_dict()), *_optimizer_chunks(optimizer))


# The parts of the state a restore must bring back, in the order a trajectory verdict names
# them (chaos.verdicts.states.DIGEST_PARTS); the reference workload reports digest_<part> for each.
PARTS = ("data", "rng", "scheduler", "optimizer", "weights")
POOL = 1024  # samples in the dataset the data cursor walks through, reshuffled every pass
BATCH = 64  # samples per rank per step


def _digest(*chunks: bytes) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()[:16]


class TrainState:
    """Model, optimizer (SGD with momentum), LR scheduler, RNG and data cursor: the same on
    every rank (DDP keeps the weights equal, the RNG and cursor advance alike), so rank 0's
    checkpoint restores every rank."""

    def __init__(self, seed: int, world_size: int, total_steps: int):
        import torch

        torch.manual_seed(seed)
        self.seed, self.world_size = seed, world_size
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        # One cycle: its learning rate (and momentum) follow the scheduler's own step count,
        # so a scheduler that was not restored starts the cycle over.
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(self.optimizer, max_lr=0.02, total_steps=total_steps)
        self.rng = torch.Generator().manual_seed(seed * 7919 + 1)
        self.cursor = 0  # samples of the stream consumed by all ranks together
        self.pool = torch.randn(POOL, 16, generator=torch.Generator().manual_seed(seed * 7919 + 2))
        self._orders: dict[int, object] = {}

    def _order(self, epoch: int):
        import torch

        if epoch not in self._orders:
            self._orders = {epoch: torch.randperm(POOL, generator=torch.Generator().manual_seed(
                self.seed * 7919 + 3 + epoch))} | {e: o for e, o in self._orders.items() if e == epoch - 1}
        return self._orders[epoch]

    def batch(self, rank: int):
        """This rank's inputs and targets at the cursor, with noise from the RNG."""
        import torch

        first = self.cursor + rank * BATCH
        rows = [int(self._order(pos // POOL)[pos % POOL]) for pos in range(first, first + BATCH)]
        x = self.pool[rows] + 0.01 * torch.randn(BATCH, 16, generator=self.rng)
        return x, x.sum(dim=1, keepdim=True)

    def advance(self) -> None:
        """After the optimizer's step: the scheduler's step and the cursor past every rank's batch."""
        self.scheduler.step()
        self.cursor += BATCH * self.world_size

    def digests(self) -> dict[str, str]:
        """``digest_<part>`` of each part as it is now."""
        return {"digest_weights": _digest(*_tensor_chunks(self.model.state_dict())),
                "digest_optimizer": _digest(*_optimizer_chunks(self.optimizer)),
                "digest_scheduler": _digest(repr(sorted(self.scheduler.state_dict().items())).encode()),
                "digest_rng": _digest(_bytes(self.rng.get_state())),
                "digest_data": _digest(f"{self.seed}:{self.cursor}".encode())}

    def to_checkpoint(self, step: int) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "rng": self.rng.get_state(), "cursor": self.cursor,
                "step": step}

    def restore(self, saved: dict, forget: tuple[str, ...] = ()) -> int:
        """Load ``saved`` but the parts in ``forget`` (the buggy twins); returns its step."""
        if "weights" not in forget:
            self.model.load_state_dict(saved["model"])
        if "optimizer" not in forget:
            self.optimizer.load_state_dict(saved["optimizer"])
        if "scheduler" not in forget:
            self.scheduler.load_state_dict(saved["scheduler"])
        if "rng" not in forget:
            self.rng.set_state(saved["rng"])
        if "data" not in forget:
            self.cursor = int(saved["cursor"])
        return int(saved["step"])


def _bytes(t) -> bytes:
    import torch

    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _tensor_chunks(state: dict):
    for name, t in state.items():
        yield f"{name}:{t.dtype}:{tuple(t.shape)}".encode()
        yield _bytes(t)


def _optimizer_chunks(optimizer):
    import torch

    opt = optimizer.state_dict()
    for index, state in sorted(opt["state"].items()):
        for key, value in sorted(state.items()):
            yield f"{index}.{key}".encode()
            yield _bytes(value) if torch.is_tensor(value) else repr(value).encode()
    yield repr(opt["param_groups"]).encode()


def train_loop(config: dict) -> None:
    import torch

    import ray.train
    import ray.train.torch
    from ray.train import Checkpoint

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    state = TrainState(config["seed"], ctx.get_world_size(), config["steps"])
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            saved = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        start = state.restore(saved, tuple(config["forget"]))
    model = ray.train.torch.prepare_model(state.model)  # moves it to this worker's GPU when there is one
    device = ray.train.torch.get_device()

    driver = None
    if config["device"] == "stub-cuda":
        from chaos.shim.driver_client import DriverClient

        driver = DriverClient()

    noticed = False  # a preemption notice was answered with a just-in-time checkpoint
    for step in range(start + 1, config["steps"] + 1):
        began = state.digests()
        x, y = state.batch(rank)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.advance()
        if driver is not None:
            _device_step(driver)
        time.sleep(config["step_time"])  # stands in for the rest of a real step's compute
        metrics = {"step": step, "loss": float(loss.item()), "worker_time": time.time(),
                   "state_digest": state_digest(state.model, state.optimizer), **began}
        # Every rank asks (the call is a barrier that agrees on one answer across ranks).
        jit = config["checkpoint_on_preemption"] and not noticed and ray.train.get_preemption_info() is not None
        if jit:
            noticed = True
            print(f"rank {rank}: preemption notice at step {step}: checkpointing now", flush=True)
        if (jit or step % config["checkpoint_every"] == 0) and rank == 0:
            # the digests of the state saved: what the step after a restore must begin from
            metrics.update({f"saved_{k}": v for k, v in state.digests().items()})
            with tempfile.TemporaryDirectory() as d:
                torch.save(state.to_checkpoint(step), os.path.join(d, "state.pt"))
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))
        else:
            ray.train.report(metrics)


def worker_count(text: str) -> int | tuple[int, int]:
    """``--num-workers``: ``N`` (a fixed group) or ``MIN-MAX`` (an elastic one)."""
    low, sep, high = text.partition("-")
    try:
        counts = (int(low), int(high)) if sep else (int(text),)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give N or MIN-MAX, e.g. 3 or 2-3") from None
    if min(counts) < 1 or counts[0] > counts[-1]:
        raise argparse.ArgumentTypeError(f"{text!r}: workers must be >= 1, and MIN <= MAX")
    return counts if sep else counts[0]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--step-time", type=float, default=0.3)
    p.add_argument("--num-workers", type=worker_count, default=2, metavar="N|MIN-MAX",
                   help="ranks: N, or MIN-MAX for an elastic run (Train starts as many as the cluster has room for)")
    p.add_argument("--resize-interval", type=float, default=None, metavar="S",
                   help="elastic run: seconds between Train's checks whether a healthy group can grow "
                        "(ScalingConfig.elastic_resize_monitor_interval_s; Ray's default 60)")
    p.add_argument("--max-failures", type=int, default=3)
    p.add_argument("--max-preemption-failures", type=int, default=-1)
    p.add_argument("--storage-path", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--device", choices=["cpu", "stub-cuda", "cuda"], default="cpu")
    p.add_argument("--seed", type=int, default=0, help="model init and data (the run is deterministic per seed)")
    p.add_argument("--checkpoint-on-preemption", type=int, choices=[0, 1], default=0,
                   help="1: checkpoint at once when Train says a node is being preempted")
    p.add_argument("--forget", action="append", choices=PARTS, default=[],
                   help="a buggy restore that leaves this part of the state fresh (repeatable)")
    args = p.parse_args(argv)

    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # A hang must be caught by a timeout the run configures: the process group's.
    timeout = os.environ.get("CHAOS_COLLECTIVE_TIMEOUT_S")
    # gloo even on GPUs: the embedded GPU path may put several ranks on one shared GPU, which NCCL refuses.
    torch_config = TorchConfig(backend="gloo", **({"timeout_s": int(float(timeout))} if timeout else {}))

    elastic = {} if args.resize_interval is None else {"elastic_resize_monitor_interval_s": args.resize_interval}
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"steps": args.steps, "checkpoint_every": args.checkpoint_every,
                           "step_time": args.step_time, "device": args.device, "seed": args.seed,
                           "checkpoint_on_preemption": bool(args.checkpoint_on_preemption),
                           "forget": args.forget},
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.device == "cuda", **elastic),
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
