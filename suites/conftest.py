"""Suite-level fixtures: the stub CUDA driver for machines without a GPU, the example user
scripts, and the proof that the harness is no Ray driver."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def example_workloads() -> Path:
    """The example user scripts: examples/workloads beside suites/ in a checkout, and
    chaos/examples/workloads beside chaos/suites in the wheel (pyproject.toml maps them so)."""
    return Path(__file__).resolve().parents[1] / "examples" / "workloads"


@pytest.fixture(scope="session")
def cuda_driver_dir(request, tmp_path_factory) -> str | None:
    """A directory with the stub libcuda.so.1 (chaos/shim/cuda_stub), for the CPU path on the
    embedded cluster (its nodes share this machine's files); None on a profile's cluster,
    whose nodes have their own driver on their library path."""
    if request.config.getoption("chaos_profile"):
        return None
    from chaos.shim.cuda_stub import build_stub

    return str(build_stub(tmp_path_factory.mktemp("cuda-stub")))


@pytest.fixture(autouse=True, scope="session")
def no_ray_driver():
    """Every suite runs with ``ray.init`` refused in the pytest process: the harness reaches a
    cluster over its dashboard, the Jobs API and its hosts' transports only, so that it can
    run where no raylet of the cluster is (a CI runner), and survive the head's loss."""
    import ray

    def refused(*args, **kwargs):
        raise RuntimeError("ray.init() called in the harness's process: the harness must not be a Ray driver "
                           "(suites/conftest.py)")

    real, ray.init = ray.init, refused
    try:
        yield
    finally:
        ray.init = real
