"""The kubernetes backend's Kubernetes side against the emulated API server: KubeAccess (loading,
bad input, RBAC, RayCluster/namespace lookups, pods by IP), exec over v5 and the v4 fallback,
and the backend's node facts and hosts with a fake Ray node table (no Ray cluster here).

Pods are local processes (local_kubelet) so that exec runs real commands.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from chaos.backends import KubernetesBackend, for_profile
from chaos.cluster import Node, Target
from chaos.embedded.kube import ApiServer, podexec, write_kubeconfig
from chaos.embedded.kube.rbac import Rbac, Rule
from chaos.embedded.kube.resources import RAYCLUSTERS, prepare_new
from chaos.embedded.kube.status import ApiError
from chaos.errors import ClusterError, ProfileError, TransportError, WaitTimeout
from chaos.profile import profile_from_dict
from chaos.profile.models import KubernetesSettings
from chaos.safety import TargetRefused
from chaos.transport.kube import V4, V5, HandshakeRefused, KubeExecTransport, exit_code, negotiate
from chaos.transport.kube_access import KubeAccess, api_error
from chaos.waits import poll_until
from kube_helpers import add_pod

INSTANCE_TYPE = "node.kubernetes.io/instance-type"
GROUP_LABEL = "sagemaker.amazonaws.com/instance-group-name"


@pytest.fixture
def api(kubelet):
    with ApiServer(lifecycle=kubelet) as server:
        yield server


def kubeconfig(server: ApiServer, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", server.url)


def settings(path: Path, **kw) -> KubernetesSettings:
    return KubernetesSettings(ray_cluster=kw.pop("ray_cluster", "rc"), kubeconfig=str(path), **kw)


@pytest.fixture
def access(api, tmp_path) -> KubeAccess:
    return KubeAccess.from_settings(settings(kubeconfig(api, tmp_path), request_timeout_s=5))


def add_node(server: ApiServer, name: str, labels: dict) -> None:
    from chaos.embedded.kube.resources import NODES
    server.store.create(NODES.plural, prepare_new(NODES, {"metadata": {"name": name, "labels": labels}, "spec": {},
                                                          "status": {}}, None))


def ray_pod(server: ApiServer, name: str, node: str, ip: str, node_type: str = "worker",
            cluster: str = "rc") -> None:
    add_pod(server, name, node, {"ray.io/cluster": cluster, "ray.io/node-type": node_type,
                                 "ray.io/group": "headgroup" if node_type == "head" else "gpu"})
    server.pods.set_status("default", name, {"podIP": ip})


@pytest.fixture
def ray_cluster(api):
    """Head on n0, workers on n1 and n2; n1 and n2 in the gpu-workers instance group."""
    api.store.create(RAYCLUSTERS.plural, prepare_new(RAYCLUSTERS, {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"},
        "spec": {"headGroupSpec": {}, "workerGroupSpecs": []}}, "default"))
    add_node(api, "n0", {INSTANCE_TYPE: "ml.m5.xlarge", GROUP_LABEL: "controller"})
    for i in (1, 2):
        add_node(api, f"n{i}", {INSTANCE_TYPE: "ml.g5.8xlarge", GROUP_LABEL: "gpu-workers"})
    ray_pod(api, "rc-head", "n0", "10.0.0.10", "head")
    ray_pod(api, "rc-gpu-worker-a", "n1", "10.0.0.11")
    ray_pod(api, "rc-gpu-worker-b", "n2", "10.0.0.12")
    add_pod(api, "other", "n2", {"ray.io/cluster": "another"})
    return api


# -- loading: bad input named ---------------------------------------------------------------------------
def test_a_missing_kubeconfig_is_named(tmp_path):
    with pytest.raises(ClusterError, match=r"kubernetes.kubeconfig .*/nope\.yaml does not exist"):
        KubeAccess.from_settings(settings(tmp_path / "nope.yaml"))


def test_a_context_not_in_the_kubeconfig_names_the_contexts_there(api, tmp_path):
    with pytest.raises(ClusterError, match=r"context 'staging' is not in kubeconfig .*; its contexts: emulated$"):
        KubeAccess.from_settings(settings(kubeconfig(api, tmp_path), context="staging"))


def test_an_unreachable_server_is_named_within_the_deadline(tmp_path):
    with socket.socket() as s:  # a loopback port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=rf"cannot reach the Kubernetes API server at http://127.0.0.1:{port} "
                                           r"\(context emulated\) within 2s"):
        KubeAccess.from_settings(settings(path, request_timeout_s=2))
    assert time.monotonic() - t0 < 5


def test_rbac_refusals_name_identity_verb_resource_and_namespace(kubelet, tmp_path):
    rbac = Rbac((Rule(("get", "list"), ("pods",)),))
    with ApiServer(lifecycle=kubelet, rbac=rbac) as server:
        add_node(server, "n1", {})
        ray_pod(server, "rc-gpu-worker-a", "n1", "10.0.0.11")
        kube = KubeAccess.from_settings(settings(kubeconfig(server, tmp_path)))
        assert [p.name for p in kube.ray_pods()] == ["rc-gpu-worker-a"]
        with pytest.raises(ClusterError) as e:
            kube.node("n1")
        assert str(e.value).startswith("RBAC: the profile's identity (user emulated of context emulated) may not get "
                                       "nodes at cluster scope: ")
        assert 'cannot get resource "nodes"' in str(e.value)
        with pytest.raises(ClusterError, match=r"^RBAC: .* may not get rayclusters.ray.io in namespace default: "):
            kube.raycluster()
        with pytest.raises(TransportError, match=r"^pod default/rc-gpu-worker-a: cannot run `true`: RBAC: the "
                                                 r"profile's identity \(user emulated of context emulated\) may not "
                                                 r"create pods/exec in namespace default"):
            KubeExecTransport(kube, "rc-gpu-worker-a").run("true")


def test_raycluster_found_missing_or_in_a_missing_namespace(ray_cluster, access, tmp_path):
    assert access.raycluster()["metadata"]["name"] == "rc"
    with pytest.raises(ClusterError, match=r"^RayCluster default/train not found; RayClusters in namespace "
                                           r"default: rc$"):
        KubeAccess(access.api_client, "default", "train").raycluster()
    with pytest.raises(ClusterError, match=r"^namespace ml-staging not found on http://127.0.0.1:\d+ \(looking for "
                                           r"RayCluster ml-staging/rc"):
        KubeAccess(access.api_client, "ml-staging", "rc").raycluster()


def test_api_error_wording_for_gone_and_unreachable():
    gone = ApiException(status=410, reason="Gone", body='{"message": "too old resource version: 5 (90)"}')
    assert str(api_error(gone, "watch", "pods", namespace="ml")) == (
        "watch pods in namespace ml: the resource version is too old (410 Gone): too old resource version: 5 (90); "
        "list again and start from the new version")
    lost = api_error(ConnectionRefusedError(111, "Connection refused"), "delete", "pods", name="p", namespace="ml",
                     server="the Kubernetes API server at https://k8s:443")
    assert str(lost) == ("cannot reach the Kubernetes API server at https://k8s:443 to delete pods ml/p: "
                         "ConnectionRefusedError: [Errno 111] Connection refused")


def test_sagemaker_client_comes_from_the_hyperpod_section(access):
    with pytest.raises(ClusterError, match="no hyperpod: section"):
        access.sagemaker()
    hp = KubernetesSettings.model_validate({"ray_cluster": "rc", "hyperpod": {
        "cluster_name": "ml-hp", "region": "us-west-2", "endpoint_url": "http://127.0.0.1:9"}}).hyperpod
    sm = KubeAccess(access.api_client, "default", "rc", hyperpod=hp).sagemaker()
    assert (sm.meta.region_name, sm.meta.endpoint_url) == ("us-west-2", "http://127.0.0.1:9")


# -- pods ------------------------------------------------------------------------------------------------
def test_pods_of_the_raycluster_and_the_pod_of_a_ray_node_ip(ray_cluster, access):
    pods = access.ray_pods()
    assert [(p.name, p.node_type, p.group, p.node_name, p.ip) for p in pods] == [
        ("rc-gpu-worker-a", "worker", "gpu", "n1", "10.0.0.11"),
        ("rc-gpu-worker-b", "worker", "gpu", "n2", "10.0.0.12"),
        ("rc-head", "head", "headgroup", "n0", "10.0.0.10")]
    assert access.pod_for_ip("10.0.0.12").name == "rc-gpu-worker-b"
    assert access.pod("rc-head").is_head and access.pod("rc-head").containers == ("ray",)
    with pytest.raises(ClusterError, match=r"^no pod of RayCluster default/rc has IP 10.9.9.9 .*; pods seen: "
                                           r"rc-gpu-worker-a=10.0.0.11, rc-gpu-worker-b=10.0.0.12, rc-head=10.0.0.10$"):
        access.pod_for_ip("10.9.9.9")
    with pytest.raises(ClusterError, match=r'^pods default/gone not found \(trying to get it\): pods "gone" not found'):
        access.pod("gone")


# -- exec --------------------------------------------------------------------------------------------------
@pytest.fixture
def offered(monkeypatch):
    """The subprotocols each exec offered and what the server chose (None: refused)."""
    seen: list[tuple[str, str | None]] = []
    real = podexec.check_upgrade

    def recording(request):
        offer = request.headers.get("Sec-WebSocket-Protocol", "")
        try:
            chosen = real(request)
        except ApiError:
            seen.append((offer, None))
            raise
        seen.append((offer, chosen))
        return chosen

    monkeypatch.setattr(podexec, "check_upgrade", recording)
    return seen


def test_exec_over_v5_gives_exit_codes_stdout_and_stderr(ray_cluster, access, offered):
    t = KubeExecTransport(access, "rc-gpu-worker-a", container="ray")
    r = t.run("echo out; echo err >&2; exit 3")
    assert (r.host, r.exit_code, r.stdout, r.stderr) == ("rc-gpu-worker-a", 3, "out\n", "err\n")
    assert t.run(["printf", "%s", "é ü"]).check().stdout == "é ü"  # argv as given, UTF-8 intact
    assert offered == [(V5, V5), (V5, V5)] and access.exec_protocol is None
    assert [e.exit_code for e in t.transcript] == [3, 0]


def test_exec_falls_back_to_v4_when_the_server_refuses_v5_and_remembers(ray_cluster, access, offered, monkeypatch):
    recording = podexec.check_upgrade

    def v4_only(request):  # a pre-1.30 apiserver: v5 is not one of its subprotocols
        if request.headers.get("Sec-WebSocket-Protocol") != V4:
            recording(request)  # recorded as offered
            raise ApiError(403, "Forbidden", "requested protocol(s) are not supported")
        return recording(request)

    monkeypatch.setattr(podexec, "check_upgrade", v4_only)
    t = KubeExecTransport(access, "rc-gpu-worker-b")
    assert t.run("echo v4; exit 7").exit_code == 7 and t.transcript[-1].stdout == "v4\n"
    assert t.run("true").ok
    assert [offer for offer, _ in offered] == [V5, V4, V4] and access.exec_protocol == V4


def test_negotiation_treats_a_missing_echo_as_refusal_and_other_errors_as_final():
    class Stream:
        def __init__(self, subprotocol):
            self.subprotocol, self.closed = subprotocol, False

        def close(self):
            self.closed = True

    opened = {V5: Stream(None), V4: Stream(V4)}
    ws, protocol = negotiate(lambda p: opened[p])
    assert (ws, protocol, opened[V5].closed) == (opened[V4], V4, True)

    def not_found(p):
        raise HandshakeRefused(p, 404, "", "Not Found")
    with pytest.raises(HandshakeRefused) as e:
        negotiate(not_found)
    assert e.value.protocol == V5  # no v4 attempt: a missing pod is missing either way


def test_exit_code_from_the_status_channel():
    assert exit_code('{"metadata": {}, "status": "Success"}') == 0
    assert exit_code('{"status": "Failure", "reason": "NonZeroExitCode", '
                     '"details": {"causes": [{"reason": "ExitCode", "message": "137"}]}}') == 137
    with pytest.raises(ValueError, match="executable file not found"):
        exit_code('{"status": "Failure", "reason": "InternalError", "message": "OCI runtime exec failed: '
                  'executable file not found in $PATH"}')


def test_a_command_past_its_deadline_is_named_with_its_pod(ray_cluster, access):
    t = KubeExecTransport(access, "rc-gpu-worker-a")
    t0 = time.monotonic()
    with pytest.raises(TransportError, match=r"^pod default/rc-gpu-worker-a: `echo begun; exec sleep 30` did not "
                                             r"finish within 0.5s \(command timeout\); stdout so far: begun"):
        t.run("echo begun; exec sleep 30", timeout=0.5)  # exec: closing the stream ends it
    assert time.monotonic() - t0 < 3
    with pytest.raises(TransportError, match=r"^pod default/nope: cannot run `true`: pods/exec default/nope not found"):
        KubeExecTransport(access, "nope").run("true")


def test_launch_returns_at_once_and_the_command_runs_on(ray_cluster, access, tmp_path):
    marker = tmp_path / "launched"
    t = KubeExecTransport(access, "rc-gpu-worker-a")
    t0 = time.monotonic()
    t.launch(f"sleep 0.5; echo done > {marker}")
    assert time.monotonic() - t0 < 0.5  # did not wait for the command
    poll_until(lambda: (marker.exists() and marker.read_text() == "done\n", "no file yet"), 10, "the launched command",
               interval=0.1)
    t.close()


# -- the backend, without Ray ----------------------------------------------------------------------------------
RAY_HEAD = Node("h" * 56, "10.0.0.10", True, True, None, None, None, {})
RAY_W1 = Node("a" * 56, "10.0.0.11", True, False, None, None, None, {}, {"ray.io/node-id": "a" * 56})
RAY_W2_AS_HEAD = Node("b" * 56, "10.0.0.12", True, False, None, None, None, {})


class RayTable:
    """Ray's node table as a backend asks it (a ClusterView stand-in)."""

    def __init__(self, *nodes: Node):
        self.nodes_ = list(nodes)

    def node(self, node_id):
        return next((n for n in self.nodes_ if n.node_id == node_id), None)

    def hostname(self, node_id):
        return None

    def alive_workers(self):
        return [n for n in self.nodes_ if n.alive and not n.is_head]


def backend(access: KubeAccess, *nodes: Node, **safety) -> KubernetesBackend:
    profile = profile_from_dict({
        "name": "k8s", "ray": {"dashboard_url": "http://10.0.0.10:8265", "gcs_address": "10.0.0.10:6379"},
        "storage": {"path": "/fsx/chaos"}, "kubernetes": {"ray_cluster": "rc"},
        "safety": safety or {"allowlist": [{"label": f"{GROUP_LABEL}=gpu-workers"}]}})
    b = KubernetesBackend(profile, kube=access)
    b.cluster = RayTable(*nodes)
    return b


def test_node_info_merges_node_and_pod_labels_for_the_allowlist(ray_cluster, access):
    b = backend(access, RAY_HEAD, RAY_W1)
    info = b.node_info(RAY_W1.node_id)
    assert not info.is_head and info.hostname == "rc-gpu-worker-a"
    assert {k: info.labels[k] for k in (INSTANCE_TYPE, GROUP_LABEL, "ray.io/group", "ray.io/node-id", "k8s.pod",
                                        "k8s.node")} == {
        INSTANCE_TYPE: "ml.g5.8xlarge", GROUP_LABEL: "gpu-workers", "ray.io/group": "gpu", "ray.io/node-id": "a" * 56,
        "k8s.pod": "rc-gpu-worker-a", "k8s.node": "n1"}
    b.check_target(Target(RAY_W1.node_id, RAY_W1.ip))  # selected by the Kubernetes node's label
    with pytest.raises(TargetRefused) as e:
        b.check_target(Target(RAY_HEAD.node_id, RAY_HEAD.ip))
    assert e.value.rule == "safety.allow_head"
    assert b.node_info("c" * 56) is None


def test_the_pods_node_type_makes_a_head_even_when_ray_says_worker(ray_cluster, access):
    api = ray_cluster
    api.pods.delete("default", "rc-gpu-worker-b", grace=0)
    ray_pod(api, "rc-head-2", "n2", "10.0.0.12", "head")
    b = backend(access, RAY_W2_AS_HEAD, allow_all_workers=True)
    assert b.node_info(RAY_W2_AS_HEAD.node_id).is_head
    with pytest.raises(TargetRefused, match="allow_head"):
        b.check_target(Target(RAY_W2_AS_HEAD.node_id, RAY_W2_AS_HEAD.ip))


def test_hosts_are_pods_reached_by_exec(ray_cluster, access):
    b = backend(access, RAY_HEAD, RAY_W1)
    assert b.host_key(RAY_W1) == "rc-gpu-worker-a"
    host = b.host(RAY_W1.node_id)
    assert (host.key, host.name) == ("rc-gpu-worker-a", "pod default/rc-gpu-worker-a on node n1")
    assert dict(host.labels) == {"k8s.pod": "rc-gpu-worker-a", "k8s.node": "n1", "k8s.namespace": "default"}
    assert host.transport.run("echo $0").check().stdout == "sh\n"
    assert b.reach("rc-gpu-worker-a") is host
    assert b.pod_of(Target(RAY_W1.node_id, RAY_W1.ip)).node_name == "n1"
    assert b.boot_id(host) == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    with pytest.raises(TransportError, match=r"^pod default/gone: cannot be reached: pods default/gone not found"):
        b.connect("gone")  # a deleted pod is a host that does not answer (what boot-id polls expect)
    b.close_hosts()


def test_healed_means_every_worker_pod_ready_and_ray_back_to_baseline(ray_cluster, access):
    b = backend(access, RAY_HEAD, RAY_W1)
    b._pod_baseline, b._baseline = 2, 1
    assert b.healthy_workers() == (True, "2 of 2 worker pods Running+Ready; 1 of 1 Ray worker nodes alive")
    ray_cluster.pods.delete("default", "rc-gpu-worker-b", grace=0)
    ok, seen = b.healthy_workers()
    assert not ok and seen.startswith("1 of 2 worker pods Running+Ready")
    with pytest.raises(WaitTimeout, match=r"every worker pod of RayCluster default/rc Running\+Ready and 1 Ray "
                                          r"worker nodes alive; saw: 1 of 2 worker pods"):
        b.wait_healed(0.3)


def test_the_backend_serves_kubernetes_profiles_and_refuses_other_transports():
    base = {"name": "k8s", "ray": {"dashboard_url": "http://10.0.0.10:8265", "gcs_address": "10.0.0.10:6379"},
            "storage": {"path": "/fsx/chaos"}, "kubernetes": {"ray_cluster": "rc"}}
    assert isinstance(for_profile(profile_from_dict({**base, "hosts": {"defaults": {"transport": "k8s"}}})),
                      KubernetesBackend)
    mixed = profile_from_dict({**base, "hosts": {"defaults": {"transport": "k8s"}, "overrides": [
        {"match": {"label": "ray.io/group=cpu"}, "transport": "ssh"}]}})
    with pytest.raises(ProfileError, match=r"hosts.overrides\[0\].transport: ssh cannot be served"):
        KubernetesBackend(mixed)


def test_the_cuda_shim_goes_into_pods_through_exec_while_other_threads_use_the_api_client(ray_cluster, access,
                                                                                          tmp_path):
    """The shim's sources in commands an exec URL carries, into two pods at once while a third
    thread lists pods through the same KubeAccess: the client's exec swaps its ApiClient's
    request method while it opens a stream, so on a shared client the plain calls went out as
    WebSocket handshakes (make chaos's Xid suites failed so).  Every call must stay plain."""
    import concurrent.futures

    from chaos.shim import build

    stop = threading.Event()

    def list_pods() -> int:
        calls = 0
        while not stop.is_set() or calls < 20:
            assert [p.name for p in access.ray_pods()] == ["rc-gpu-worker-a", "rc-gpu-worker-b", "rc-head"]
            calls += 1
        return calls

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        plain = pool.submit(list_pods)
        deliveries = [pool.submit(build.deliver_shim, KubeExecTransport(access, pod, container="ray"),
                                  root=str(tmp_path)) for pod in ("rc-gpu-worker-a", "rc-gpu-worker-b")]
        paths = {d.result(timeout=120) for d in deliveries}
        stop.set()
        assert plain.result(timeout=60) >= 20
    assert paths == {f"{tmp_path}/{build.shim_hash('cc')}/libchaos_cuda.so"}
    assert [p.name for p in access.ray_pods()] == ["rc-gpu-worker-a", "rc-gpu-worker-b", "rc-head"]
