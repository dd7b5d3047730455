"""The session's preflight: with a profile, doctor's checks run once, before the first test
reaches the profile's cluster; a cluster no kind can run on stops the session at once with the table (one short
output, no traceback per test), and a kind that cannot run is refused in its own tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

from chaos import pytest_plugin
from chaos.pytest_plugin import PREFLIGHT_FAILED, Chaos

ROOT = Path(__file__).resolve().parents[2]
SUITE = '''
import pytest

@pytest.mark.chaos
def test_one(chaos):
    chaos.raylet_kill()

@pytest.mark.chaos
def test_two(chaos):
    chaos.partition()

@pytest.mark.chaos
def test_three(chaos):
    chaos.worker_kill()

def test_plain():
    pass
'''


def unreachable_profile(tmp_path: Path) -> Path:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "staging.yaml"
    path.write_text(f"name: gone\nray:\n  dashboard_url: http://127.0.0.1:{port}\n  gcs_address: 127.0.0.1:6379\n"
                    "storage:\n  path: /mnt/shared/chaos\nsafety:\n  allow_all_workers: true\n")
    return path


def session(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_suite.py").write_text(SUITE)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--chaos-profile",
                           str(unreachable_profile(tmp_path)), "test_suite.py", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin",
                                                                            "PYTHONPATH": str(ROOT)})


def test_an_unreachable_cluster_stops_the_session_at_once_with_the_table(tmp_path):
    done = session(tmp_path, "-m", "chaos")
    out = done.stdout + done.stderr
    assert done.returncode == PREFLIGHT_FAILED, out
    assert "✗ cluster  Ray dashboard: http://127.0.0.1:" in out and "fix: make http://127.0.0.1:" in out, out
    assert "stops: every fault kind" in out and "preflight (ray-chaos doctor --profile " in out
    assert "Traceback" not in out and "RayVersionError" not in out and "test_one" not in out, out
    assert len(out.splitlines()) < 25, out


def test_a_session_that_selects_no_chaos_test_runs_no_preflight(tmp_path):
    done = session(tmp_path, "-m", "not nochaos")
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "1 passed, 3 deselected" in out and "doctor" not in out, out


def test_a_dry_run_stops_too_when_the_cluster_cannot_be_read(tmp_path):
    done = session(tmp_path, "-m", "chaos", "--chaos-dry-run")
    assert done.returncode == PREFLIGHT_FAILED and "✗ cluster  Ray dashboard" in done.stdout, done.stdout


def chaos_with(blocked: dict) -> Chaos:
    config = types.SimpleNamespace(stash=pytest.Stash(), getoption=lambda name: "grpc")
    config.stash[pytest_plugin._BLOCKED] = blocked
    backend = types.SimpleNamespace(profile=None, kube=None, head=None, object_storage=None, storage_proxy=None)
    return Chaos(types.SimpleNamespace(backend=backend), types.SimpleNamespace(config=config))


def test_a_kind_the_preflight_found_cannot_run_is_refused_naming_it():
    chaos = chaos_with({"partition": ["host 10.0.0.2: tools: not found: iptables (for partition); fix: install it"]})
    with pytest.raises(pytest.fail.Exception, match=r"partition refused before any injection: .*not found: iptables"):
        chaos.partition()
    assert chaos.raylet_kill().kind == "raylet-kill"  # its twin: a kind nothing stops is built
