"""Suite-level fixtures: the stub CUDA driver for machines without a GPU."""

import pytest


@pytest.fixture(scope="session")
def cuda_driver_dir(tmp_path_factory) -> str:
    """A directory with the stub libcuda.so.1 (fixtures/cuda_stub), for the CPU path."""
    from fixtures.cuda_stub import build_stub

    return str(build_stub(tmp_path_factory.mktemp("cuda-stub")))
