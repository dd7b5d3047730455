"""The part of the harness a Ray job runs, shipped as the job's ``py_modules``.

A job on the team's cluster gets the recorder (``RAY_TRAIN_CALLBACKS`` names
``chaos.train.recorder.Recorder``), its event channel and tape, and the reference workload
with the stub CUDA device it drives; none of the harness's own side (the pytest plugin, the
backends, the emulated control planes), which is most of the package and would be uploaded
with every job.  The CUDA shim, its plan and what other faults deliver travel over the
host's transport, not with the job.

``JOB_FILES`` is checked both ways by tests/unit/test_job_package.py: every ``chaos`` import
in these files (at any depth) names one of them, and each module imports in a fresh
interpreter that sees only this package and Ray.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import chaos

JOB_FILES = (
    "__init__.py",
    "faults/__init__.py", "faults/catalog.py",  # the recorder reads the budget limits' field names
    "shim/__init__.py", "shim/cuda_errors.py", "shim/driver_client.py",  # the reference's stub-cuda device
    "train/__init__.py", "train/channel.py", "train/recorder.py", "train/recording.py", "train/tape.py",
    "train/workloads/__init__.py", "train/workloads/reference.py",
)


@functools.cache
def job_package() -> Path:
    """A ``chaos`` directory holding ``JOB_FILES`` only, made once per process and removed at
    its exit (Ray names an upload by its content, so every job of a session shares one)."""
    source = Path(chaos.__file__).resolve().parent
    root = Path(tempfile.mkdtemp(prefix="ray-chaos-job-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for name in JOB_FILES:
        target = root / "chaos" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, target)
    return root / "chaos"
