"""The supported Ray range (chaos/ray_support.py): one source of truth, and the start-up
checks that refuse a Ray outside it or a cluster whose Ray differs from the harness's."""

import http.server
import re
import threading
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from chaos import ray_support
from chaos.errors import ChaosError
from chaos.ray_support import (CEILING, FLOOR, SUPPORTED, RayVersionError, check_supported, cluster_mismatch,
                               require_same_ray, unsupported_reason)

ROOT = Path(__file__).resolve().parents[2]


def _pyproject_dependencies() -> list[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def test_pyproject_states_the_range_the_module_checks():
    [ray] = [Requirement(d) for d in _pyproject_dependencies() if Requirement(d).name == "ray"]
    assert ray.specifier == SpecifierSet(SUPPORTED), f"pyproject.toml says ray{ray.specifier}, chaos/ray_support.py {SUPPORTED}"
    assert {"train", "default"} <= ray.extras
    assert (FLOOR, CEILING) == (Version("2.58"), Version("2.61"))


def test_constraints_pin_a_default_ray_inside_the_range():
    pins = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", (ROOT / "constraints.txt").read_text(), re.M))
    assert "ray" in pins, "constraints.txt pins no Ray"
    assert unsupported_reason(pins["ray"]) is None, pins["ray"]


def test_the_floor_covers_the_existing_preemption_gate():
    """Every supported Ray has the preemption budget the preemption faults are gated on
    (chaos/faults/preempt.py); the gate stays for whoever lowers the floor."""
    from chaos.faults.preempt import MIN_RAY

    assert (FLOOR.major, FLOOR.minor) >= MIN_RAY


@pytest.mark.parametrize("version", ["2.58.0", "2.58.1", "2.59.0", "2.60.0", "2.60.3", "2.60.0rc1", "2.59.0.dev0",
                                     "2.60.0+cpu"])
def test_inside_the_range(version):
    assert unsupported_reason(version) is None
    assert check_supported(version) == version


@pytest.mark.parametrize("version", ["2.57.1", "2.55.0", "2.0.0", "1.13.0", "2.58.0rc1"])
def test_below_the_floor_is_refused_naming_version_range_and_why(version):
    with pytest.raises(RayVersionError) as e:
        check_supported(version)
    message = str(e.value)
    assert f"Ray {version} is older" in message and SUPPORTED in message
    assert "the floor is 2.58" in message and "max_preemption_failures" in message
    assert isinstance(e.value, ChaosError)


@pytest.mark.parametrize("version", ["2.61.0", "2.61.0rc1", "2.70.2", "3.0.0", "3.0.0.dev0"])
def test_above_the_ceiling_is_refused(version):
    with pytest.raises(RayVersionError, match=rf"Ray {re.escape(version)} is newer than this harness supports "
                                              rf"\(Ray {re.escape(SUPPORTED)}\).*2\.60\.x"):
        check_supported(version)


def test_a_version_that_is_no_version_is_refused():
    with pytest.raises(RayVersionError, match="'nightly' is not a version number"):
        check_supported("nightly")


def test_default_is_the_installed_ray():
    import ray

    assert check_supported() == ray.__version__  # the Ray constraints.txt installs is supported


def test_same_ray_on_cluster_and_harness():
    assert cluster_mismatch("2.60.0", "2.60.0") is None
    assert cluster_mismatch(" 2.60.0\n", "2.60.0") is None
    require_same_ray("2.59.0", "2.59.0")


def test_a_cluster_of_another_supported_ray_names_both_and_the_fix():
    message = cluster_mismatch("2.59.0", "2.60.0", where="the cluster of profile 'staging'")
    assert message.startswith("the cluster of profile 'staging' runs Ray 2.59.0, this harness runs Ray 2.60.0")
    assert "pip install 'ray[train,default]==2.59.0'" in message
    with pytest.raises(RayVersionError, match="runs Ray 2.59.0, this harness runs Ray 2.60.0"):
        require_same_ray("2.59.0", "2.60.0")


def test_a_patch_release_apart_is_a_mismatch_as_for_rays_driver():
    assert "runs Ray 2.60.1, this harness runs Ray 2.60.0" in cluster_mismatch("2.60.1", "2.60.0")


def test_a_cluster_outside_the_range_says_so():
    message = cluster_mismatch("2.57.1", "2.60.0")
    assert "runs Ray 2.57.1, this harness runs Ray 2.60.0" in message
    assert "Ray 2.60.0: the harness must run the cluster's Ray (Ray's driver refuses another version, and the harness's " \
        "version gates read its own Ray). Ray 2.57.1 is older than this harness supports" in message and "pip install" not in message
    assert "newer than this harness supports" in cluster_mismatch("3.0.0.dev0", "2.60.0")


def test_cluster_mismatch_defaults_to_the_installed_ray():
    import ray

    assert cluster_mismatch(ray.__version__) is None
    assert f"this harness runs Ray {ray.__version__}" in cluster_mismatch("2.58.1" if ray.__version__ != "2.58.1" else "2.59.0")


class _Version(http.server.BaseHTTPRequestHandler):
    body = b'{"version": "4", "ray_version": "2.59.0", "ray_commit": "abc"}'

    def do_GET(self):
        ok = self.path == "/api/version"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(self.body if ok else b"")

    def log_message(self, *_):
        pass


@pytest.fixture
def dashboard():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Version)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_dashboard_ray_version_reads_api_version(dashboard):
    assert ray_support.dashboard_ray_version(dashboard + "/") == "2.59.0"


def test_dashboard_ray_version_names_the_url_when_unreachable(dashboard):
    with pytest.raises(RayVersionError, match=r"could not read the cluster's Ray version from http://127\.0\.0\.1:\d+/x/api/version"):
        ray_support.dashboard_ray_version(dashboard + "/x", timeout=5)
