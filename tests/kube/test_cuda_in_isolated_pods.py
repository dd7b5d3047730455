"""A CUDA fault in Kubernetes pods whose node shares nothing with this machine: the emulated
kubelet runs the pods on an *isolated* test host (its own /tmp, /var/tmp and /dev/shm; the
checkout, the venv and the reports hidden; a node's own Python with Ray at /opt/ray and its
driver at /opt/cuda/lib64, here the stub), so nothing reaches it but exec through the API server.

CudaFault's own steps, as a session runs them against a KubeRay cluster: ``prepare`` builds the
shim in the pod through exec; ``inject`` refuses a rank whose process did not load it (naming
the pod and the PID) and arms the one that did, whose next driver call fails as PyTorch's
would; ``revert`` disarms it and brings the shim's log into the timeline; ``sweep`` (what
``ray-chaos sweep`` does from the ledger) removes what an armed fault left in the pod.
Needs root (namespaces, a bridge): skipped with the reason otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
import uuid
from pathlib import Path

import pytest

from chaos.backends.base import Host
from chaos.cluster import Node, Target
from chaos.embedded import testhost
from chaos.embedded.kube import ApiServer
from chaos.embedded.kube.hyperpod import api_client_for
from chaos.embedded.kube.kubelet import HostMachine, Kubelet
from chaos.embedded.kube.resources import PODS, prepare_new
from chaos.errors import InjectionError
from chaos.faults.base import FaultContext, Injection
from chaos.faults.cuda import CudaFault
from chaos.shim.control import control_command
from chaos.shim.plan import Plan
from chaos.timeline import Timeline
from chaos.transport.kube import KubeExecTransport
from chaos.transport.kube_access import KubeAccess
from chaos.waits import poll_until
from kube_helpers import host_network, wait_for

ROOT = Path(__file__).resolve().parents[2]
BRIDGE, SUBNET = "ckc0", "198.18.202.0/28"
NODE = "gpu-a"
PYTHON = "/opt/ray/bin/python"  # the node's own Python with Ray (this venv, bound there)
DRIVER = "/opt/cuda/lib64"  # the node's CUDA driver: the stub, bound there

# A Train rank's driver traffic: chaos.shim's driver client, written to the pod's /tmp by its
# container command as an image or a job's runtime_env brings code (the checkout is not on the
# node; an exec's URL could not carry it); one step every 0.2 s until a step fails, which it
# prints as PyTorch's error would read.
RANK = """from __future__ import annotations
import json, os, time
{errors}
{client}
client = DriverClient()
print("ready", os.getpid(), flush=True)
while True:
    try:
        client.step()
    except RuntimeError as e:
        print(json.dumps([str(e), e.error_code, e.symbol]), flush=True)
        break
    time.sleep(0.2)
"""


def rank_source() -> str:
    shim = ROOT / "chaos" / "shim"
    client = (shim / "driver_client.py").read_text().replace("from chaos.shim.cuda_errors import CODES, error_message\n",
                                                             "")
    errors = (shim / "cuda_errors.py").read_text()
    return RANK.format(**{name: text.replace("from __future__ import annotations\n", "")
                          for name, text in (("errors", errors), ("client", client))})


@pytest.fixture(scope="module")
def node_host(tmp_path_factory):
    """One isolated test host, booted with no workload (the kubelet's containers enter it)."""
    from chaos.shim.cuda_stub import build_stub

    ok, reason = testhost.testhosts_supported()
    if not ok:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("cuda-pods")
    stub = build_stub(base / "cuda")
    isolation = testhost.Isolation(binds=((sys.prefix, "/opt/ray"), (str(stub), DRIVER)),
                                   hide=tuple(sorted({str(ROOT), sys.prefix})))
    with host_network(base / "hosts", BRIDGE, SUBNET) as net:
        host = net.add_host(NODE, isolation=isolation)
        host.boot()
        yield host


@pytest.fixture
def server(node_host, tmp_path):
    kubelet = Kubelet(tmp_path / "pods")
    kubelet.add_node(NODE, HostMachine(node_host), {"pool": "gpu"})
    try:
        with ApiServer(lifecycle=kubelet, bookmark_interval_s=0.3) as api:
            yield api
    finally:
        kubelet.close()


@dataclasses.dataclass
class PodBackend:
    """What CudaFault uses of the kubernetes backend: each Ray node's pod as a host reached by exec."""

    access: KubeAccess
    pods: dict[str, str]  # Ray node id -> pod
    python: str = PYTHON

    def host(self, node_id: str) -> Host:
        return self.reach(self.pods[node_id])

    def reach(self, key: str, node: Node | None = None) -> Host:
        return Host(key=key, name=key, transport=KubeExecTransport(self.access, key, container="ray"))


@dataclasses.dataclass
class PodNodes:
    """The Ray node table the faults read: one alive worker node per pod."""

    ids: list[str]

    def alive_workers(self) -> list[Node]:
        return [Node(node_id=i, ip="10.0.0.1", alive=True, is_head=False, start_time=None, end_time=None,
                     death_reason=None, resources={"CPU": 1.0}) for i in self.ids]


def start_rank(pod: KubeExecTransport, name: str, env: dict[str, str]) -> int:
    """A rank process started in the pod as the raylet starts Train's workers there (its own
    session, its output in the pod's /tmp/<name>.log); its PID inside the pod, once it is ready."""
    assign = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    pod.run(f"cd /tmp && {assign} setsid {PYTHON} /tmp/rank.py > /tmp/{name}.log 2>&1 < /dev/null &",
            timeout=30).check()

    def ready():
        log = rank_log(pod, name)
        if "Traceback" in log:
            pytest.fail(f"rank {name} died in pod {pod.pod_name}:\n{log}")
        found = re.search(r"^ready (\d+)$", log, re.M)
        return (int(found.group(1)) if found else None), f"its log: {log[-300:]!r}"
    return poll_until(ready, 60, f"rank {name} to start its driver client in pod {pod.pod_name}")


def rank_log(pod: KubeExecTransport, name: str) -> str:
    return pod.run(f"cat /tmp/{name}.log", timeout=30).stdout


def test_a_cuda_fault_fires_in_a_pod_on_a_node_that_shares_nothing_with_the_harness(server):
    access = KubeAccess(api_client_for(server.url), "default", "rc", request_timeout=10)
    server.pods.create(prepare_new(PODS, {"metadata": {"name": "worker"}, "spec": {
        "nodeName": NODE, "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "ray", "image": "rayproject/ray", "command": [
            "sh", "-c", f"cat > /tmp/rank.py <<'EOF'\n{rank_source()}\nEOF\necho ready; exec sleep 3600"]}]}},
        "default"))
    wait_for(server, lambda: (server.store.get(PODS.plural, "default", "worker") or {}).get("status", {})
             .get("phase") == "Running", "pod worker Running", timeout=30)
    backend = PodBackend(access, {"n1": "worker"})
    ctx = FaultContext(cluster=PodNodes(["n1"]), timeline=Timeline(), backend=backend)
    pod = backend.host("n1").transport
    fault = CudaFault("ecc", rank=1)

    said = fault.prepare(ctx)
    assert said == f"the CUDA shim at {fault.shim_path} on 1 worker host", said
    assert fault.shim_path.startswith("/var/tmp/ray-chaos/shim/"), fault.shim_path
    assert pod.run(f"test -f {fault.shim_path}", timeout=30).ok
    # the node's /var/tmp is its own: what the pod has there came through exec
    canary = Path(fault.shim_path).with_name(f".harness-side-{uuid.uuid4().hex[:8]}")
    canary.parent.mkdir(parents=True, exist_ok=True)
    canary.write_text("this machine\n")
    try:
        assert not pod.run(f"test -e {canary}", timeout=30).ok, "the pod sees this machine's /var/tmp"
    finally:
        canary.unlink()
    env = fault.run_env()
    assert env["LD_PRELOAD"] == fault.shim_path

    node = {"LD_LIBRARY_PATH": DRIVER, "RANK": "1"}  # the node's driver; Ray's rank variable
    plain = Target(node_id="n1", node_ip="10.0.0.1", rank=1, pid=start_rank(pod, "plain", node))  # no shim
    shimmed = Target(node_id="n1", node_ip="10.0.0.1", rank=1, pid=start_rank(pod, "shimmed", {**node, **env}))

    # a process without the shim would never see the fault: refused, naming the pod and the PID
    with pytest.raises(InjectionError, match=rf"^worker: rank 1's process \(PID {plain.pid}\) has not loaded the "
                                             rf"CUDA shim {re.escape(fault.shim_path)} \(not in /proc/{plain.pid}/maps\)"
                                             r": not armed$"):
        fault.inject(ctx, Injection(fault, plain, host=backend.host("n1")))

    inj = Injection(fault, shimmed, host=backend.host("n1"))
    armed = fault.inject(ctx, inj)
    assert armed["control"] == fault.control_path and armed["plan_id"].startswith("ecc-")

    def failed():
        log = rank_log(pod, "shimmed").strip()
        last = log.splitlines()[-1] if log else ""
        return (json.loads(last) if last.startswith("[") else None), f"its log: {log[-300:]!r}"
    error = poll_until(failed, 30, "the shimmed rank's next driver call to fail")
    assert error[:2] == ["CUDA error: uncorrectable ECC error encountered", 214], error
    assert "[" not in rank_log(pod, "plain"), "the rank without the shim failed too"

    plan = json.loads(json.dumps(fault.revert_plan(inj)))  # as the ledger keeps it
    assert fault.revert(ctx, inj)
    injected = ctx.timeline.of("cuda_injection")
    assert [(e.data["host"], e.data["pid"], e.data["rank"], e.data["error"]) for e in injected] == \
        [(NODE, shimmed.pid, 1, 214)], [e.data for e in injected]  # logged on the node, by the rank
    assert not pod.run(f"ls {fault.control_path}", timeout=30).ok, "revert left the control file"
    assert not pod.run(f"ls {fault.log_path}", timeout=30).ok, "revert left the shim's log"

    # ray-chaos sweep after a session that died with the fault armed (the rank has exited, so
    # inject would refuse it: armed as inject arms): disarmed, the files gone
    assert "is gone" in str(pytest.raises(InjectionError, fault.inject, ctx, inj).value)
    pod.run(control_command(fault.control_path, Plan.preset("ecc", rank=1), python=PYTHON), timeout=30).check()
    pod.run(f"echo x >> {fault.log_path}", timeout=30).check()
    assert pod.run(f"ls {fault.control_path} {fault.log_path}", timeout=30).ok
    assert CudaFault.sweep(plan, backend)
    assert not pod.run(f"ls {fault.control_path}", timeout=30).ok, "sweep left the control file"
    assert not pod.run(f"ls {fault.log_path}", timeout=30).ok, "sweep left the shim's log"
