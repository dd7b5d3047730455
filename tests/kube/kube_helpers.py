"""Helpers for the emulated API server's fidelity tests: containers, objects, waits, kubectl runs."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from ruamel.yaml import YAML

from chaos.embedded.kube import ApiServer, Rbac, Rule, write_kubeconfig
from chaos.embedded.kube.resources import NODES, PODS, prepare_new

# Each prints a line once ready (the local kubelet's readiness probe).
SLEEPER = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(3600)"]
TERM_IGNORER = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(3600)"]
EXAMPLE_JOB = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "chaos-cronjob.yaml"
OWNER = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc", "uid": "rc-uid", "controller": True}


def wait_for(server: ApiServer, check: Callable[[], object], what: str, timeout: float = 15.0,
             seen: Callable[[], object] | None = None) -> None:
    """Wait (on the store's change condition) until ``check()`` is truthy; fail saying what was seen."""
    if not server.store.wait(lambda: bool(check()), timeout):
        observed = seen() if seen else check()
        pytest.fail(f"waited {timeout}s for {what}; saw {observed!r}")


def add_node(server: ApiServer, name: str, labels: dict | None = None) -> dict:
    return server.store.create(NODES.plural, prepare_new(NODES, {"metadata": {"name": name, "labels": labels or {}},
                                                                 "status": {}}, None))


def add_pod(server: ApiServer, name: str, node: str | None, labels: dict | None = None,
            command: list[str] | None = None, grace: int = 30, namespace: str = "default") -> dict:
    pod = {"metadata": {"name": name, "labels": labels or {}, "ownerReferences": [OWNER]},
           "spec": {"containers": [{"name": "ray", "image": "rayproject/ray", "command": command or SLEEPER}],
                    "terminationGracePeriodSeconds": grace, **({"nodeName": node} if node else {})}}
    created = server.pods.create(prepare_new(PODS, pod, namespace))
    if node:
        wait_for(server, lambda: pod_ready(server, name, namespace), f"pod {name} Ready",
                 seen=lambda: server.store.get(PODS.plural, namespace, name))
    return created


def pod_phase(server: ApiServer, name: str, namespace: str = "default") -> str | None:
    pod = server.store.get(PODS.plural, namespace, name)
    return pod["status"].get("phase") if pod else None


def pod_ready(server: ApiServer, name: str, namespace: str = "default") -> bool:
    pod = server.store.get(PODS.plural, namespace, name)
    conditions = pod["status"].get("conditions", []) if pod else []
    return {"type": "Ready", "status": "True"} in conditions


def pod_gone(server: ApiServer, name: str, namespace: str = "default") -> bool:
    return server.store.get(PODS.plural, namespace, name) is None


def bundled_kubectl(minor: int) -> Path:
    """The gcloud package's kubectl.1.<minor> beside the dispatcher, or skip saying why."""
    dispatcher = shutil.which("kubectl")
    if dispatcher is None:
        pytest.skip("kubectl not on this machine: no kubectl on PATH (the gcloud kubectl package provides it)")
    binary = Path(dispatcher).resolve().parent / f"kubectl.1.{minor}"
    if not binary.exists():
        pytest.skip(f"kubectl not on this machine: {binary} is missing (gcloud kubectl package bundles 1.27-1.33)")
    return binary


@dataclass
class Kubectl:
    binary: str
    home: Path
    kubeconfig: Path

    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "KUBECONFIG": str(self.kubeconfig), "PATH": "/usr/bin:/bin"}

    def run(self, *args: str, timeout: float = 30, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary, *args], env=self.env(), input=stdin, capture_output=True, text=True,
                              timeout=timeout)

    def exec_script(self, pod: str, script: str, *options: str) -> subprocess.CompletedProcess:
        """``kubectl exec -i POD OPTIONS -- sh -c SCRIPT``, SCRIPT started by kubectl's first line of stdin.

        Every bundled kubectl (1.30-1.33: client-go before kubernetes/kubernetes#131203) starts
        reading the WebSocket before it has created its stdout/stderr/error streams and drops
        what arrives in between ("Unknown stream id 1, discarding message"; with the exit
        Status dropped too, "error: closed all streams" and exit 1).  A command that answers at
        once loses that race now and then on a loaded machine.  kubectl sends stdin only once
        all its streams exist, so a script that first reads a line of it cannot answer early.
        """
        return self.run("exec", "-i", pod, *options, "--", "sh", "-c", f"read -r _streams_ready; {script}",
                        stdin="\n")



def make_kubectl(binary: str | Path, server: ApiServer, tmp_path: Path, name: str) -> Kubectl:
    home = tmp_path / f"home-{name}"
    home.mkdir()
    return Kubectl(str(binary), home, write_kubeconfig(tmp_path / f"kubeconfig-{name}", server.url))


@contextlib.contextmanager
def host_network(state_dir: Path, bridge: str, subnet: str):
    """Test hosts on a bridge of the test's own (skipped without root/namespaces): what a crashed
    earlier run left on it swept first; after the test, every host and the bridge must be gone."""
    from chaos.embedded import netns, testhost

    ok, reason = testhost.testhosts_supported()
    if not ok:
        pytest.skip(reason)
    testhost.TestHostNetwork.sweep(bridge)
    net = testhost.TestHostNetwork(state_dir=state_dir, bridge=bridge, subnet=subnet, boot_delay=0.1, boot_timeout=15)
    try:
        yield net.up()
    finally:
        net.close()
        assert not netns.netns_names(f"{bridge}-") and not netns.link_exists(bridge), "test host network left behind"


def example_job_rbac(namespace: str = "default") -> Rbac:
    """The example CronJob's Role (here in ``namespace``) and ClusterRole as the emulator's allow-list,
    which matches resources by name (``pods/exec``), not by API group."""
    rules = []
    for doc in YAML(typ="safe").load_all(EXAMPLE_JOB.read_text()):
        if doc and doc["kind"] in ("Role", "ClusterRole"):
            scope = (namespace,) if doc["kind"] == "Role" else None
            rules += [Rule(tuple(r["verbs"]), tuple(r["resources"]), scope) for r in doc["rules"]]
    return Rbac(tuple(rules), user="system:serviceaccount:ml-staging:ray-chaos")
