"""Ray's own framework integrations under a raylet kill, written as their users write them
(examples/workloads/: a Hugging Face ``Trainer`` with Ray's ``RayTrainReportCallback`` and a
PyTorch Lightning script with ``RayDDPStrategy``), submitted unchanged on the shared
cluster.  Both report ``step`` (the framework's global step) only when they checkpoint,
every 4 steps: a correct restart from the checkpoint at step 8 reports step 12 first.
Their bugs are in make integration (tests/integration/test_framework_workloads.py)."""

import re
import shlex
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from chaos.train.run import user_spec
from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos

RESUMED = re.compile(r"attempt 1 resumed at step (\d+), right after the latest checkpoint \(step (\d+)\) on every rank")


@pytest.fixture
def script(chaos, example_workloads):
    """A spec for ``examples/workloads/<file>`` under a Train run name of its own; the
    workers' local scratch (the Trainer's output_dir, Lightning's per-rank checkpoint dirs,
    named after the run) is removed afterwards."""
    names = []

    def spec(file: str):
        name = f"{Path(file).stem}-{uuid.uuid4().hex[:6]}"
        names.append(name)
        command = f"python {file} --storage {shlex.quote(chaos.env.backend.storage_path)} --name {name}"
        return user_spec(command, name, working_dir=str(example_workloads))

    yield spec
    for name in names:
        for scratch in Path(tempfile.gettempdir()).glob(f"*{name}*"):
            shutil.rmtree(scratch, ignore_errors=True)


def assert_resumed_one_save_interval_on(outcome):
    outcome.assert_verdicts()
    message = outcome.verdict("resumed-from-latest").message
    m = RESUMED.search(message)
    assert m and int(m[1]) == int(m[2]) + 4, message


def test_hf_trainer_resumes_from_its_checkpoint(chaos, script):
    outcome = chaos.run(script("train_hf_transformers.py"), faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))])
    assert_resumed_one_save_interval_on(outcome)


@pytest.mark.extended  # the Hugging Face twin runs per commit
def test_lightning_resumes_from_its_checkpoint(chaos, script):
    outcome = chaos.run(script("train_lightning.py"), faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))])
    assert_resumed_one_save_interval_on(outcome)
