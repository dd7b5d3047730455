"""ray-chaos doctor's Kubernetes and HyperPod checks against the emulated API server and the
emulated SageMaker endpoint: RBAC asked per permission (SelfSubjectAccessReview), the xid
node-shell pod's admission (server-side dry run), HyperPod credentials and DescribeCluster.
Each ✗ has its ✔ twin.  No Ray is started."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from chaos.doctor.check import Check
from chaos.doctor import hyperpod as hyperpod_doctor
from chaos.doctor import kube as kube_doctor
from chaos.embedded.kube import ApiServer, Rbac, Rule, write_kubeconfig
from chaos.embedded.kube.admission import ENFORCE
from chaos.embedded.kube.hyperpod import HyperPodAgent, api_client_for
from chaos.embedded.kube.resources import NAMESPACES, PODS, RAYCLUSTERS, prepare_new
from chaos.embedded.sagemaker import SageMakerEndpoint
from chaos.faults import catalog
from chaos.profile.loading import profile_from_dict
from kube_helpers import add_node, example_job_rbac

NS = "ml"
# What a session on a Kubernetes profile may inject: every kind its backend can serve.
KINDS = {k for k, entry in catalog.KINDS.items() if entry.needs in (None, "kube")}
INSTANCE = "i-0123456789abcdef0"


def start(tmp_path, rbac: Rbac | None, labels: dict | None = None) -> ApiServer:
    """A server with namespace ``ml`` (``labels`` on it), a RayCluster and its head and worker
    pods bound to nodes (the null runtime runs nothing)."""
    server = ApiServer(rbac=rbac).start()
    server.store.create(NAMESPACES.plural, prepare_new(NAMESPACES, {"metadata": {"name": NS, "labels": labels or {}}},
                                                       None))
    add_node(server, "head-node")
    add_node(server, "hyperpod-" + INSTANCE, {"sagemaker.amazonaws.com/instance-group-name": "workers",
                                              "chaos.ray.io/instance-id": INSTANCE})
    server.store.create(RAYCLUSTERS.plural, prepare_new(RAYCLUSTERS, {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"}, "spec": {}}, NS))
    for name, node, kind in (("rc-head", "head-node", "head"), ("rc-worker", "hyperpod-" + INSTANCE, "worker")):
        server.pods.create(prepare_new(PODS, {"metadata": {"name": name, "labels": {
            "ray.io/cluster": "rc", "ray.io/node-type": kind, "ray.io/group": kind}},
            "spec": {"nodeName": node, "containers": [{"name": "ray", "image": "rayproject/ray"}]}}, NS))
    return server


@pytest.fixture
def cluster(tmp_path):
    servers: list[ApiServer] = []

    def make(rbac: Rbac | None = None, labels: dict | None = None, hyperpod: dict | None = None):
        server = start(tmp_path, rbac, labels)
        servers.append(server)
        kubeconfig = write_kubeconfig(tmp_path / f"kubeconfig-{len(servers)}", server.url)
        return server, profile(kubeconfig, hyperpod)

    yield make
    for server in servers:
        server.stop()


def profile(kubeconfig, hyperpod: dict | None = None):
    kubernetes = {"namespace": NS, "ray_cluster": "rc", "kubeconfig": str(kubeconfig),
                  **({"hyperpod": hyperpod} if hyperpod else {})}
    return profile_from_dict({"name": "k8s", "ray": {"dashboard_url": "http://127.0.0.1:1",
                                                     "gcs_address": "127.0.0.1:2"},
                              "storage": {"path": "/tmp/chaos"}, "kubernetes": kubernetes,
                              "hosts": {"defaults": {"transport": "k8s"}}})


def without(rbac: Rbac, verb: str, resource: str) -> Rbac:
    """``rbac`` with ``verb`` on ``resource`` taken out of every rule."""
    rules = tuple(dataclasses.replace(r, verbs=tuple(v for v in r.verbs if v != verb)) if resource in r.resources
                  else r for r in rbac.rules)
    return Rbac(rules, user=rbac.user)


def failing(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]


# -- RBAC ---------------------------------------------------------------------------------
def test_the_example_jobs_role_grants_every_permission_the_kinds_use(cluster):
    server, prof = cluster(example_job_rbac(NS))
    checks = kube_doctor.checks(prof, KINDS)
    assert failing(checks) == [], [c for c in checks if not c.ok]
    api, rbac_line, admission = checks
    assert api.what == "API server" and "v1.33.1+chaos.emulated" in api.detail
    assert rbac_line.what == f"RBAC: {len(kube_doctor.permissions(KINDS))} permission(s) the enabled kinds use"
    assert "delete pods in namespace ml" in rbac_line.detail and "create pods/exec in namespace ml" in rbac_line.detail
    assert "patch nodes at cluster scope" in rbac_line.detail
    assert "admitted (server-side dry run on Ray worker rc-worker's node hyperpod-" in admission.detail
    reviews = [p for m, p, _, _ in server.requests if "selfsubjectaccessreviews" in p]
    assert len(reviews) == len(kube_doctor.permissions(KINDS))
    assert len(server.store.list(PODS.plural, NS)[0]) == 2, "the dry run created nothing"


def test_a_role_without_delete_pods_stops_the_kinds_that_delete(cluster):
    _, prof = cluster(without(example_job_rbac(NS), "delete", "pods"))
    [refused] = failing(kube_doctor.checks(prof, KINDS))
    assert refused.what == "RBAC: delete pods in namespace ml"
    assert refused.kinds == ("pod-delete", "pod-delete-graceful", "xid")
    assert refused.detail == ("not allowed for user emulated of context emulated; needed by pod-delete, "
                              "pod-delete-graceful, xid")
    assert refused.fix.startswith('add to a Role in namespace ml: {apiGroups: [""], resources: [pods], verbs: [delete]}')
    assert "examples/kubernetes/chaos-cronjob.yaml" in refused.fix
    # only the kinds enabled are named, and with none of them nothing is missing
    [only] = failing(kube_doctor.checks(prof, {"pod-delete", "raylet-kill"}))
    assert only.kinds == ("pod-delete",)
    assert failing(kube_doctor.checks(prof, {"raylet-kill", "pod-evict"})) == []


def test_what_the_backend_needs_stops_every_kind(cluster):
    _, prof = cluster(without(example_job_rbac(NS), "list", "pods"))
    refused = {c.what: c for c in failing(kube_doctor.checks(prof, {"pod-evict"}))}
    assert set(refused) == {"RBAC: list pods in namespace ml"}
    assert refused["RBAC: list pods in namespace ml"].kinds == () and \
        "every kind (the backend itself)" in refused["RBAC: list pods in namespace ml"].detail
    _, cluster_scoped = cluster(Rbac((Rule(("*",), ("*",), (NS,)),)))  # a Role only: nothing at cluster scope
    refused = {c.what: c for c in failing(kube_doctor.checks(cluster_scoped, {"drain", "raylet-kill"}))}
    assert set(refused) == {"RBAC: get nodes at cluster scope", "RBAC: patch nodes at cluster scope",
                            "RBAC: list nodes at cluster scope", "RBAC: list pods at cluster scope",
                            "RBAC: create pods/eviction at cluster scope"}
    assert refused["RBAC: patch nodes at cluster scope"].fix.startswith(
        'add to a ClusterRole: {apiGroups: [""], resources: [nodes], verbs: [patch]}')
    assert refused["RBAC: list pods at cluster scope"].kinds == ("drain",)


def test_an_unreachable_api_server_is_one_line_that_stops_everything(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prof = profile(write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}"))
    [line] = kube_doctor.checks(prof, KINDS)
    assert not line.ok and line.kinds == () and "cannot reach the Kubernetes API server" in line.detail


# -- admission of the node-shell pod -------------------------------------------------------
def test_a_baseline_namespace_refuses_the_xid_node_shell_pod(cluster):
    _, prof = cluster(example_job_rbac(NS), labels={ENFORCE: "baseline"})
    [refused] = failing(kube_doctor.checks(prof, KINDS))
    assert refused.what.startswith("admission of the xid node-shell pod") and refused.kinds == ("xid",)
    assert 'refused (403): pods "chaos-node-shell-' in refused.detail
    assert 'violates PodSecurity "baseline:latest": host namespaces (hostPID=true), hostPath volumes (volume ' \
        '"kmsg"), privileged (container "shell" must not set securityContext.privileged=true)' in refused.detail
    assert "pod-security.kubernetes.io/enforce=privileged" in refused.fix
    # the twin: a namespace that admits privileged pods
    _, admitted = cluster(example_job_rbac(NS), labels={ENFORCE: "privileged"})
    assert failing(kube_doctor.checks(admitted, KINDS)) == []
    # without xid enabled the pod is not asked about
    assert not [c for c in kube_doctor.checks(prof, KINDS - {"xid"}) if "node-shell" in c.what]


def test_the_dry_run_is_the_fault_s_own_manifest(cluster, monkeypatch):
    from chaos.faults import kube as kube_faults

    built = []
    original = kube_faults.node_shell_pod
    monkeypatch.setattr(kube_faults, "node_shell_pod", lambda *a: built.append(a) or original(*a))
    server, prof = cluster()
    kube_doctor.checks(prof, {"xid"})
    assert [a[:3] for a in built] == [(NS, "hyperpod-" + INSTANCE, "busybox:1.36")]
    assert any(m == "POST" and p.startswith(f"/api/v1/namespaces/{NS}/pods?") and "dryRun=All" in p
               for m, p, _, _ in server.requests)


# -- HyperPod ------------------------------------------------------------------------------
@pytest.fixture
def sagemaker(cluster):
    server, _ = cluster()
    agent = HyperPodAgent(api_client_for(server.url), hosts=None, health_monitoring=False)  # type: ignore[arg-type]
    with SageMakerEndpoint(agent, cluster_name="ml-cluster") as endpoint:
        yield server, endpoint


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """No AWS configuration of this machine's: credentials only as a test sets them."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


def test_hyperpod_credentials_and_describe_cluster(cluster, sagemaker, aws_env):
    server, endpoint = sagemaker
    aws_env.setenv("AWS_ACCESS_KEY_ID", "AKIDFAKE")
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
    hp = {"cluster_name": "ml-cluster", "region": "us-east-1", "endpoint_url": endpoint.url}
    _, prof = cluster(hyperpod=hp)
    creds, described = hyperpod_doctor.checks(prof, KINDS)
    assert creds.ok and creds.detail == "from env"
    assert described.ok and described.what == f"DescribeCluster ml-cluster in us-east-1 at {endpoint.url}"
    assert described.detail.startswith("InService, workers (1 nodes), node recovery Automatic")
    assert [op for op, _ in endpoint.calls] == ["DescribeCluster"]  # read-only: nothing else was called
    # the ✗ twin: a cluster these credentials do not see
    _, unknown = cluster(hyperpod={**hp, "cluster_name": "other-cluster"})
    creds, refused = hyperpod_doctor.checks(unknown, KINDS)
    assert creds.ok and not refused.ok and refused.kinds == ("hyperpod-reboot", "node-replace")
    assert refused.detail.startswith("ResourceNotFound: ") and "Cluster other-cluster not found" in refused.detail
    assert "cluster_name and region" in refused.fix
    # without the kinds that call SageMaker there is nothing to check
    assert hyperpod_doctor.checks(prof, {"pod-delete"}) == []


def test_hyperpod_without_credentials_or_endpoint(cluster, sagemaker, aws_env):
    _, endpoint = sagemaker
    _, remote = cluster(hyperpod={"cluster_name": "ml-cluster", "region": "us-east-1",
                                  "endpoint_url": "https://sagemaker.example.com"})
    [creds] = hyperpod_doctor.checks(remote, KINDS)
    assert not creds.ok and creds.kinds == ("hyperpod-reboot", "node-replace")
    assert "AWS_PROFILE" in creds.fix and "via='boto3'" in creds.detail
    # the emulated endpoint on loopback takes unsigned requests: no credentials needed there
    _, local = cluster(hyperpod={"cluster_name": "ml-cluster", "region": "us-east-1", "endpoint_url": endpoint.url})
    assert all(c.ok for c in hyperpod_doctor.checks(local, KINDS))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, closed = cluster(hyperpod={"cluster_name": "ml-cluster", "region": "us-east-1",
                                  "endpoint_url": f"http://127.0.0.1:{port}"})
    _, unreachable = hyperpod_doctor.checks(closed, KINDS)
    assert not unreachable.ok and unreachable.detail.startswith("EndpointConnectionError")
    assert "endpoint_url" in unreachable.fix


def test_doctor_runs_both_for_a_hyperpod_profile(cluster, sagemaker, aws_env):
    """What ``chaos.doctor.run`` adds for a Kubernetes profile: these lines, kube's then hyperpod's."""
    from chaos.doctor import _platform_checks

    _, endpoint = sagemaker
    _, prof = cluster(example_job_rbac(NS), hyperpod={"cluster_name": "ml-cluster", "region": "us-east-1",
                                                      "endpoint_url": endpoint.url})
    checks = _platform_checks(prof, KINDS)
    assert [c.subject for c in checks] == ["kubernetes"] * 3 + ["hyperpod"] * 2 and all(c.ok for c in checks)
