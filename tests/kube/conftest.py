"""Fixtures for the emulated API server's fidelity tests: a server whose pods are local
processes, and kubectl runs with a fresh HOME and kubeconfig (helpers: kube_helpers.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from chaos.embedded.kube import ApiServer

sys.path.insert(0, str(Path(__file__).parent))

from kube_helpers import Kubectl, bundled_kubectl, make_kubectl  # noqa: E402
from local_kubelet import LocalProcesses  # noqa: E402


@pytest.fixture
def kubelet(tmp_path):
    runtime = LocalProcesses(tmp_path / "containers")
    yield runtime
    runtime.close()


@pytest.fixture
def server(kubelet):
    with ApiServer(lifecycle=kubelet, bookmark_interval_s=0.3) as api:
        yield api


@pytest.fixture
def kubectl(server, tmp_path) -> Kubectl:
    """kubectl 1.33 (WebSocket exec), called directly."""
    return make_kubectl(bundled_kubectl(33), server, tmp_path, "133")


@pytest.fixture
def dispatched_kubectl(server, tmp_path) -> Kubectl:
    """/usr/bin/kubectl, the dispatcher that picks the bundled kubectl by the server's /version."""
    bundled_kubectl(33)
    return make_kubectl(shutil.which("kubectl"), server, tmp_path, "dispatcher")

