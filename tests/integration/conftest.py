"""One stand-in cluster for every chaos session that reaches its cluster through a profile, as
nightly CI against staging does: started once (`python -m chaos.embedded up --profile-out`),
stopped after the last test; each test gets it with every worker host alive again.  Under
make integration's xdist workers, each worker has a stand-in of its own."""

import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from chaos.cluster import ClusterView

load_yaml = YAML(typ="safe", pure=True).load

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def _standin_cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("standin")
    profile = d / "profile.yaml"
    run = lambda *a: subprocess.run([sys.executable, "-m", "chaos.embedded", *a, "--dir", str(d / "cluster")],
                                    cwd=ROOT, capture_output=True, text=True, timeout=300)
    # its nodes get the stub CUDA driver on their library path, as a GPU node has its driver:
    # the CUDA sessions through the profile bring none (suites/conftest.py's cuda_driver_dir)
    from chaos.shim.cuda_stub import build_stub

    up = run("up", "--profile-out", str(profile), "--cuda-driver-dir", str(build_stub(d / "cuda-stub")))
    assert up.returncode == 0, up.stdout + up.stderr
    yield d, profile
    down = run("down")
    assert down.returncode == 0, down.stdout + down.stderr


@pytest.fixture
def standin(_standin_cluster):
    """The stand-in, once node recovery has brought back any host an earlier test took down."""
    d, profile = _standin_cluster
    data = load_yaml(profile.read_text())
    ClusterView(data["ray"]["dashboard_url"], data["ray"]["gcs_address"]).wait_alive_workers(
        len(data["hosts"]["overrides"]), timeout=180)
    return d, profile


@pytest.fixture(scope="session")
def _no_shared_fs_standin(tmp_path_factory):
    """The foreign-cluster stand-in without a shared filesystem: machines that share nothing,
    checkpoints on S3 only (moto behind the storage fault proxy on the bridge's address)."""
    d = tmp_path_factory.mktemp("no-shared-fs")
    profile = d / "profile.yaml"
    run = lambda *a: subprocess.run([sys.executable, "-m", "chaos.embedded", *a, "--dir", str(d / "cluster")],
                                    cwd=ROOT, capture_output=True, text=True, timeout=300)
    up = run("up", "--foreign", "--no-shared-fs", "--profile-out", str(profile))
    assert up.returncode == 0, up.stdout + up.stderr
    yield d, profile
    down = run("down")
    assert down.returncode == 0, down.stdout + down.stderr


@pytest.fixture
def no_shared_fs(_no_shared_fs_standin):
    """The stand-in without a shared filesystem, every worker alive again; (dir, profile, its S3
    storage path, the environment a session needs: the credentials' values its profile names)."""
    from chaos.storage.local import CREDENTIALS

    d, profile = _no_shared_fs_standin
    data = load_yaml(profile.read_text())
    ClusterView(data["ray"]["dashboard_url"], data["ray"]["gcs_address"]).wait_alive_workers(
        len(data["safety"]["allowlist"]), timeout=180)
    return d, profile, data["storage"]["path"], dict(CREDENTIALS)


@pytest.fixture(scope="session")
def foreign_standin(tmp_path_factory):
    """A cluster the harness did not start (chaos/embedded/foreign.py, 3 workers), for the
    tests that run documented commands and recipes from a runner outside it."""
    from chaos.embedded.foreign import ForeignCluster, ForeignConfig
    from chaos.embedded.testhost import testhosts_supported

    supported, why = testhosts_supported()
    if not supported:
        pytest.skip(f"the foreign-cluster stand-in's machines are test hosts, which are not possible here: {why}")
    cluster = ForeignCluster(ForeignConfig(workers=3, base_dir=tmp_path_factory.mktemp("foreign") / "cluster")).up()
    try:
        yield cluster
    finally:
        cluster.down()
