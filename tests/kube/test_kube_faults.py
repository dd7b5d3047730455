"""The Kubernetes and HyperPod faults (chaos/faults/kube.py) against the emulated API server,
without a Ray cluster: a small backend gives the faults a real KubeAccess and maps a Ray
node id to its pod; the tests check what reached the API (deletions and their grace,
evictions and disruption-budget 429s, cordons, health labels, boto3 calls), the revert,
the sweep from the ledger plan, and the budget each kind expects.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import types

import pytest
from kubernetes.client.rest import ApiException

from chaos.cluster import Target
from chaos.embedded.kube import ApiServer, DisruptionBudget, serve
from chaos.embedded.kube.hyperpod import HostInfo, Hosts, HyperPodAgent, api_client_for
from chaos.embedded.kube.resources import NODES, PODS, RAYCLUSTERS, prepare_new
from chaos.embedded.sagemaker import SageMakerEndpoint
from chaos.errors import ClusterError, InjectionError, WaitTimeout
from chaos.faults import catalog, preempt, registry
from chaos.faults.base import FaultContext, Injection
from chaos.faults.kube import (MARK, GracefulPodDelete, HyperPodReboot, HyperPodReplace, NodeDrain, PodDelete,
                               PodEvict, kube_of, list_nodes_at, wait_nodes, write_by_node_pod)
from chaos.hyperpod import HEALTH_LABEL, INSTANCE_ID_LABEL, PENDING_REBOOT, PENDING_REPLACEMENT, SCHEDULABLE
from chaos.profile import dump_profile
from chaos.profile.models import HyperPodSettings
from chaos.timeline import Timeline
from chaos.transport.kube import KubeExecTransport
from chaos.transport.kube_access import KubeAccess
from kube_helpers import OWNER, SLEEPER, TERM_IGNORER, example_job_rbac, pod_gone, pod_ready, wait_for

RAY = {"ray.io/cluster": "rc", "ray.io/node-type": "worker", "ray.io/group": "gpu"}
ID1, ID2 = "i-0123456789abcdef0", "i-0fedcba9876543210"
NODE_ID = "a" * 56  # the Ray node the target names


@dataclasses.dataclass
class FakeBackend:
    """What the faults use of KubernetesBackend: ``kube`` and ``pod_of``."""

    kube: KubeAccess
    pods: dict[str, str]  # Ray node id -> pod name

    def pod_of(self, target: Target):
        return self.kube.pod(self.pods[target.node_id])


@pytest.fixture(autouse=True)
def no_aws(monkeypatch):
    """boto3 only ever reaches the local endpoint: no credentials, config or instance metadata."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SAGEMAKER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)


def access(server: ApiServer, sagemaker_url: str | None = None) -> KubeAccess:
    hyperpod = (HyperPodSettings(cluster_name="ml-cluster", region="us-east-1", endpoint_url=sagemaker_url)
                if sagemaker_url else None)
    return KubeAccess(api_client_for(server.url), "default", "rc", hyperpod=hyperpod, request_timeout=10)


def node_info(boot_id: str) -> dict:
    """A kubelet's status.nodeInfo (the client's models require every field)."""
    return {"bootID": boot_id, "machineID": "m1", "systemUUID": "u1", "kernelVersion": "6.1.0",
            "osImage": "Amazon Linux 2023", "containerRuntimeVersion": "containerd://1.7.27",
            "kubeletVersion": "v1.32.5", "kubeProxyVersion": "v1.32.5", "operatingSystem": "linux",
            "architecture": "amd64"}


def node(server: ApiServer, name: str, boot_id: str | None = "boot-1", labels: dict | None = None) -> dict:
    status = {"conditions": [{"type": "Ready", "status": "True"}]}
    if boot_id:
        status["nodeInfo"] = node_info(boot_id)
    return server.store.create(NODES.plural, prepare_new(NODES, {"metadata": {"name": name, "labels": labels or {}},
                                                                 "status": status}, None))


def pod(server: ApiServer, name: str, node_name: str | None, labels: dict | None = None, grace: int = 30,
        env: dict | None = None, command: list | None = None, owner: dict = OWNER, annotations: dict | None = None):
    spec = {"containers": [{"name": "ray-worker", "image": "rayproject/ray", "command": command or SLEEPER,
                            "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}],
            "terminationGracePeriodSeconds": grace, **({"nodeName": node_name} if node_name else {})}
    created = server.pods.create(prepare_new(PODS, {"metadata": {"name": name, "labels": RAY if labels is None
                                                                 else labels, "ownerReferences": [owner],
                                                                 "annotations": annotations or {}},
                                                    "spec": spec}, "default"))
    if node_name:
        wait_for(server, lambda: pod_ready(server, name), f"pod {name} Ready",
                 seen=lambda: server.store.get(PODS.plural, "default", name))
    return created


def setup(server: ApiServer, fault, pod_name: str, sagemaker_url: str | None = None):
    backend = FakeBackend(access(server, sagemaker_url), {NODE_ID: pod_name})
    ctx = FaultContext(cluster=None, timeline=Timeline(), backend=backend)
    return ctx, Injection(fault, Target(node_id=NODE_ID, node_ip="10.0.0.5", rank=1), host=None)


def roundtrip(plan: dict) -> dict:
    """The plan as ``ray-chaos sweep`` reads it back from the ledger."""
    return json.loads(json.dumps(plan))


def deletions(server: ApiServer, name: str) -> list[tuple[str, int | None]]:
    """(event, deletionGracePeriodSeconds) of every change of pod ``name`` that carried a deletion."""
    return [(e.type, e.obj["metadata"].get("deletionGracePeriodSeconds")) for e in server.store.events(PODS.plural)
            if e.obj["metadata"]["name"] == name and "deletionTimestamp" in e.obj["metadata"]]


# -- the catalog -------------------------------------------------------------------------------------
def test_each_kind_expects_its_budget_and_the_graceful_ones_need_a_ray_that_charges_preemption(monkeypatch):
    expected = {"pod-delete": ("worker_group", PodDelete), "pod-delete-graceful": ("preemption", GracefulPodDelete),
                "pod-evict": ("preemption", PodEvict), "drain": ("preemption", NodeDrain),
                "hyperpod-reboot": ("worker_group", HyperPodReboot), "node-replace": ("worker_group", HyperPodReplace)}
    for kind, (budget, cls) in expected.items():
        assert catalog.kind(kind).budget_class == budget == cls.budget_class
        assert registry.fault_class(kind) is cls
    monkeypatch.setattr(preempt, "ray_version", lambda: (2, 57))
    for cls in (GracefulPodDelete, PodEvict, NodeDrain):
        with pytest.raises(InjectionError, match=rf"{cls.kind} needs Ray >= 2.58 .* charged to max_failures"):
            cls()
    PodDelete(), HyperPodReboot(), HyperPodReplace()  # a hard failure is one on any Ray


@pytest.mark.parametrize("make, message", [
    (lambda: GracefulPodDelete(grace_s=0), "grace 0 is a hard delete: pod-delete"),
    (lambda: PodEvict(retry_s=0), "retry_s and retry_interval_s must be > 0"),
    (lambda: NodeDrain(timeout_s=0), "timeout_s and retry_interval_s must be > 0"),
    (lambda: HyperPodReboot(via="ssm"), r"via='ssm' unknown; expected one of \('label', 'boto3'\)"),
])
def test_bad_settings_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_backend_without_kubernetes_is_refused_by_name():
    from chaos.backends import EmbeddedBackend

    with pytest.raises(InjectionError, match="pod-delete needs the Kubernetes API .* backend embedded-plain has none"):
        kube_of(EmbeddedBackend(), "pod-delete")


# -- pod delete --------------------------------------------------------------------------------------
def test_hard_delete_removes_the_pod_at_once_with_grace_0(server, kubelet):
    pod(server, "w1", "n1", grace=30)
    fault = PodDelete(rank=1)
    ctx, inj = setup(server, fault, "w1")
    assert fault.revert_plan(inj)["action"] == "none"
    details = fault.inject(ctx, inj)
    assert pod_gone(server, "w1"), "grace 0: the object is gone when the call returns"
    assert deletions(server, "w1") == [("MODIFIED", 0), ("DELETED", 0)]
    assert details == {"pod": "default/w1", "uid": inj.evidence["pod_uid"], "node": "n1", "grace_s": 0}
    assert inj.evidence["pods_before"] == ["w1"]
    assert not ctx.timeline.of("preemption_notice"), "a hard delete is no preemption"
    fault.after_detect(ctx, inj)
    assert inj.evidence["pods_after"] == []
    assert fault.revert(ctx, inj) is False and PodDelete.sweep(roundtrip(fault.revert_plan(inj)), ctx.backend) is False


def test_graceful_delete_uses_the_pods_grace_and_notices_until_rays_window(server, kubelet):
    pod(server, "w1", "n1", grace=30, env={"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "10"}, command=TERM_IGNORER)
    fault = GracefulPodDelete(rank=1)
    ctx, inj = setup(server, fault, "w1")
    details = fault.inject(ctx, inj)
    assert deletions(server, "w1") == [("MODIFIED", 30)], "the pod's own grace, still terminating"
    assert details["grace_s"] == 30 and details["window_s"] == 10.0 and details["sigkill_inside_window"] is False
    notice = ctx.timeline.of("preemption_notice")[0]
    assert (notice.data["via"], notice.data["window_s"], notice.data["node_id"]) == ("pod-delete", 10.0, NODE_ID)
    assert notice.data["deadline"] == pytest.approx(notice.t + 10.0)


def test_graceful_delete_with_a_shorter_grace_is_killed_inside_the_window(server, kubelet):
    pod(server, "w1", "n1", grace=30)  # no window in the spec: Ray's default, 30 s
    fault = GracefulPodDelete(rank=1, grace_s=4)
    ctx, inj = setup(server, fault, "w1")
    details = fault.inject(ctx, inj)
    assert deletions(server, "w1")[0] == ("MODIFIED", 4)
    assert (details["window_s"], details["window_from"]) == (30.0, "Ray's default (not set in the pod spec)")
    assert details["sigkill_inside_window"] is True, "Ray 2.60 charges this to max_failures (docs/verdicts.md)"
    assert ctx.timeline.of("preemption_notice")[0].data["window_s"] == 4.0
    wait_for(server, lambda: pod_gone(server, "w1"), "the pod gone once its process ended")


def test_a_pod_that_would_not_drain_is_not_deleted(server, kubelet):
    pod(server, "w1", "n1", env={"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"})
    fault = GracefulPodDelete(rank=1)
    ctx, inj = setup(server, fault, "w1")
    with pytest.raises(InjectionError, match="RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0: Ray does not drain it"):
        fault.inject(ctx, inj)
    assert deletions(server, "w1") == [] and not ctx.timeline.of("preemption_notice")


def test_an_unknown_or_replaced_pod_is_a_clear_error(server, kubelet):
    ctx, inj = setup(server, PodDelete(), "ghost")
    with pytest.raises(ClusterError, match="pods default/ghost not found"):
        PodDelete().inject(ctx, inj)
    pod(server, "w1", "n1")
    ctx, inj = setup(server, PodDelete(), "w1")
    stale = ctx.backend.pod_of(inj.target)
    ctx.backend.pod_of = lambda target: dataclasses.replace(stale, uid="uid-of-an-older-pod")
    with pytest.raises(ClusterError, match="HTTP 409.*UID in the precondition"):
        PodDelete().inject(ctx, inj)
    assert not pod_gone(server, "w1"), "a namesake of the resolved pod is never deleted"


# -- eviction ----------------------------------------------------------------------------------------
@pytest.fixture
def budgeted():
    """No processes (pods are Ready at once and stop at once); at least one healthy Ray pod."""
    with serve(budgets=[DisruptionBudget("ray-workers", "default", "ray.io/group=gpu", min_available=1)]) as api:
        yield api


def test_an_eviction_refused_by_a_budget_is_an_error_naming_it(budgeted):
    pod(budgeted, "w1", "n1")
    fault = PodEvict(rank=1)
    ctx, inj = setup(budgeted, fault, "w1")
    with pytest.raises(InjectionError, match=r"refused \(429\): Cannot evict pod as it would violate the pod's "
                                             "disruption budget.*give retry_s"):
        fault.inject(ctx, inj)
    assert not pod_gone(budgeted, "w1")
    assert [e.data["attempt"] for e in ctx.timeline.of("eviction_refused")] == [1]


def test_an_eviction_is_retried_until_the_budget_allows_it(budgeted):
    pod(budgeted, "w1", "n1", env={"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "12"})
    pod(budgeted, "w2", None)  # Pending: not healthy, so w1 may not go yet
    fault = PodEvict(rank=1, retry_s=15, retry_interval_s=0.1)
    ctx, inj = setup(budgeted, fault, "w1")
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(details=fault.inject(ctx, inj)))
    worker.start()
    ctx.timeline.wait_for(lambda events: any(e.kind == "eviction_refused" for e in events), 10,
                          "the first refused eviction")
    budgeted.pods.set_status("default", "w2", {"conditions": [{"type": "Ready", "status": "True"}]})
    worker.join(20)
    assert result["details"]["eviction_attempts"] >= 2 and pod_gone(budgeted, "w1")
    assert [e.obj["metadata"]["name"] for e in budgeted.store.events(PODS.plural) if e.type == "DELETED"] == ["w1"]
    evictions = [q for m, q, _, _ in budgeted.requests if m == "POST" and q.endswith("/pods/w1/eviction")]
    assert len(evictions) == result["details"]["eviction_attempts"]
    notice = ctx.timeline.of("preemption_notice")[0]
    assert (notice.data["via"], notice.data["window_s"]) == ("pod-evict", 12.0)


def test_an_eviction_still_refused_at_its_deadline_says_what_was_seen(budgeted):
    pod(budgeted, "w1", "n1")
    fault = PodEvict(rank=1, retry_s=0.5, retry_interval_s=0.1)
    ctx, inj = setup(budgeted, fault, "w1")
    with pytest.raises(InjectionError, match=r"timed out after 0s waiting for the eviction of pod default/w1 .*"
                                             r"attempt\(s\), the last refused \(429\)"):
        fault.inject(ctx, inj)
    assert len(ctx.timeline.of("eviction_refused")) >= 2 and not pod_gone(budgeted, "w1")


# -- drain -------------------------------------------------------------------------------------------
def node_state(server: ApiServer, name: str) -> tuple[bool, str | None]:
    obj = server.store.get(NODES.plural, None, name)
    return bool(obj["spec"].get("unschedulable")), (obj["metadata"].get("annotations") or {}).get(MARK)


def test_drain_cordons_evicts_all_but_daemonset_and_mirror_pods_and_reverts(budgeted):
    node(budgeted, "n1")
    pod(budgeted, "w1", "n1")
    pod(budgeted, "w2", "n2")  # another Ray pod keeps the budget satisfied
    pod(budgeted, "sidecar", "n1", labels={})
    pod(budgeted, "agent", "n1", labels={}, owner={"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds",
                                                    "uid": "ds-uid", "controller": True})
    pod(budgeted, "static", "n1", labels={}, annotations={"kubernetes.io/config.mirror": "hash"})
    fault = NodeDrain(rank=1)
    ctx, inj = setup(budgeted, fault, "w1")
    plan = roundtrip(fault.revert_plan(inj))
    details = fault.inject(ctx, inj)
    assert node_state(budgeted, "n1") == (True, f"drain:{NODE_ID}")
    assert details["evicted"] == ["default/sidecar", "default/w1"] and sorted(details["skipped"]) == \
        ["default/agent", "default/static"]
    assert all(pod_gone(budgeted, p) for p in ("w1", "sidecar")) and not pod_gone(budgeted, "agent")
    assert ctx.timeline.of("preemption_notice")[0].data["via"] == "drain"
    assert fault.revert(ctx, inj) is True and node_state(budgeted, "n1") == (False, None)
    assert fault.revert(ctx, inj) is False, "nothing left to revert"
    # A second drain, left by a killed session: the sweep finds the node by the plan's mark.
    pod(budgeted, "w3", "n1")
    ctx, inj = setup(budgeted, fault, "w3")
    fault.inject(ctx, inj)
    assert node_state(budgeted, "n1")[0] is True
    assert NodeDrain.sweep(plan, ctx.backend) is True and node_state(budgeted, "n1") == (False, None)


def test_a_drain_blocked_by_a_budget_fails_at_its_deadline_and_its_cordon_is_reverted(budgeted):
    node(budgeted, "n1")
    pod(budgeted, "w1", "n1")
    fault = NodeDrain(rank=1, timeout_s=0.5, retry_interval_s=0.1)
    ctx, inj = setup(budgeted, fault, "w1")
    with pytest.raises(InjectionError, match="timed out after 0s waiting for the eviction of pod default/w1"):
        fault.inject(ctx, inj)
    assert node_state(budgeted, "n1")[0] is True, "the cordon stays armed until reverted"
    assert fault.revert(ctx, inj) is True and node_state(budgeted, "n1") == (False, None)


def test_a_node_cordoned_before_the_drain_stays_cordoned(budgeted):
    node(budgeted, "n1")
    budgeted.store.update(NODES.plural, None, "n1", lambda n: {**n, "spec": {"unschedulable": True}})
    pod(budgeted, "w1", "n1")
    pod(budgeted, "w2", "n2")
    fault = NodeDrain(rank=1)
    ctx, inj = setup(budgeted, fault, "w1")
    fault.inject(ctx, inj)
    assert inj.evidence["cordon"] == "was cordoned already: left as it was"
    assert fault.revert(ctx, inj) is False and node_state(budgeted, "n1") == (True, None)


def test_a_drain_of_a_node_with_no_object_is_a_clear_error(budgeted):
    pod(budgeted, "w1", "gone-node")
    ctx, inj = setup(budgeted, NodeDrain(), "w1")
    with pytest.raises(ClusterError, match="nodes gone-node not found"):
        NodeDrain().inject(ctx, inj)


# -- HyperPod ----------------------------------------------------------------------------------------
class FakeHosts(Hosts):
    """The pods here have no processes: a power-off only records the call (and which pods were
    still there).  A reboot comes back with a new boot id in the node's status; a replacement is
    a new instance."""

    def __init__(self, server: ApiServer):
        self.server = server
        self.calls: list[tuple[str, str]] = []
        self.pods_at_power_off: list[str] = []

    def kernel_log(self, node_name: str) -> None:
        return None  # no kernel logs here: health monitoring has nothing to read

    def power_off(self, node_name: str) -> None:
        self.calls.append(("power_off", node_name))
        self.pods_at_power_off = [p["metadata"]["name"] for p in self.server.store.list(PODS.plural)[0]
                                  if p["spec"].get("nodeName") == node_name]

    def reboot(self, node_name: str) -> dict:
        self.calls.append(("reboot", node_name))

        def booted(obj: dict) -> dict:
            obj["status"]["nodeInfo"] = node_info("boot-2")
            return obj

        self.server.store.update(NODES.plural, None, node_name, booted)
        return {"boot_id": "boot-2"}

    def replace(self, node_name: str) -> HostInfo:
        self.calls.append(("replace", node_name))
        return HostInfo(instance_id=ID2)


@pytest.fixture
def hyperpod():
    """A server without processes, the HyperPod-like agent and the SageMaker endpoint."""
    with serve() as api:
        hosts = FakeHosts(api)
        with HyperPodAgent(api_client_for(api.url), hosts) as agent:
            assert agent.ready.wait(10), "the agent never listed the nodes"
            with SageMakerEndpoint(agent, cluster_name="ml-cluster") as endpoint:
                yield api, hosts, endpoint


def hp_node(server: ApiServer, name: str = "hyperpod-" + ID1, **kwargs) -> str:
    node(server, name, labels={HEALTH_LABEL: SCHEDULABLE, INSTANCE_ID_LABEL: ID1}, **kwargs)
    return name


@pytest.mark.parametrize("via", ["label", "boto3"])
def test_hyperpod_reboot_waits_for_the_node_back_with_a_new_boot_id(hyperpod, via):
    server, hosts, endpoint = hyperpod
    name = hp_node(server)
    pod(server, "w1", name)
    fault = HyperPodReboot(rank=1, via=via, recover_timeout_s=15)
    ctx, inj = setup(server, fault, "w1", endpoint.url)
    details = fault.inject(ctx, inj)
    assert details["boot_id_before"] == "boot-1" and details["instance_id"] == ID1
    if via == "boto3":
        assert endpoint.calls == [("BatchRebootClusterNodes", {"ClusterName": "ml-cluster", "NodeIds": [ID1]})]
    else:
        assert endpoint.calls == []
    fault.after_detect(ctx, inj)
    ev = inj.evidence
    assert (ev["node"], ev["node_after"], ev["boot_id_before"], ev["boot_id_after"]) == (name, name, "boot-1", "boot-2")
    assert ev["pods_before"] == ["default/w1"] and ev["pods_after"] == []
    assert hosts.calls == [("power_off", name), ("reboot", name)] and hosts.pods_at_power_off == ["w1"]
    assert server.store.get(NODES.plural, None, name)["metadata"]["labels"][HEALTH_LABEL] == SCHEDULABLE
    assert fault.revert(ctx, inj) is False, "the agent restored the label itself"
    assert node_state(server, name) == (False, None), "the sweep mark is gone"


@pytest.mark.parametrize("via", ["label", "boto3"])
def test_hyperpod_replace_waits_for_a_new_node_object(hyperpod, via):
    server, hosts, endpoint = hyperpod
    name = hp_node(server)
    pod(server, "w1", name)
    fault = HyperPodReplace(rank=1, via=via, recover_timeout_s=15)
    ctx, inj = setup(server, fault, "w1", endpoint.url)
    fault.inject(ctx, inj)
    fault.after_detect(ctx, inj)
    ev = inj.evidence
    assert (ev["new_node"], ev["new_instance_id"]) == ("hyperpod-" + ID2, ID2)
    assert server.store.get(NODES.plural, None, name) is None
    assert hosts.calls == [("power_off", name), ("replace", name)] and hosts.pods_at_power_off == ["w1"]
    assert [c[0] for c in endpoint.calls] == (["BatchReplaceClusterNodes"] if via == "boto3" else [])
    assert fault.revert(ctx, inj) is False


def test_a_health_label_the_agent_never_acted_on_is_restored_by_revert_and_by_sweep():
    with serve() as server:  # no agent: the recovery never runs
        name = hp_node(server)
        pod(server, "w1", name)
        fault = HyperPodReboot(rank=1, recover_timeout_s=0.5)
        ctx, inj = setup(server, fault, "w1")
        plan = roundtrip(fault.revert_plan(inj))
        fault.inject(ctx, inj)
        labels = server.store.get(NODES.plural, None, name)["metadata"]["labels"]
        assert labels[HEALTH_LABEL] == PENDING_REBOOT
        with pytest.raises(WaitTimeout, match=f"waiting for node {name} to be back Ready and Schedulable .* saw: "
                                            f"{name}: {HEALTH_LABEL}={PENDING_REBOOT}"):
            fault.after_detect(ctx, inj)
        assert HyperPodReboot.sweep(plan, ctx.backend) is True
        assert server.store.get(NODES.plural, None, name)["metadata"]["labels"][HEALTH_LABEL] == SCHEDULABLE
        assert node_state(server, name) == (False, None)
        replace = HyperPodReplace(rank=1)
        ctx, inj = setup(server, replace, "w1")
        replace.inject(ctx, inj)
        assert server.store.get(NODES.plural, None, name)["metadata"]["labels"][HEALTH_LABEL] == PENDING_REPLACEMENT
        assert replace.revert(ctx, inj) is True
        assert server.store.get(NODES.plural, None, name)["metadata"]["labels"][HEALTH_LABEL] == SCHEDULABLE


def test_hyperpod_bad_input_is_refused_before_anything_is_asked(hyperpod):
    server, hosts, endpoint = hyperpod
    name = hp_node(server, boot_id=None)
    pod(server, "w1", name)
    ctx, inj = setup(server, HyperPodReboot(), "w1", endpoint.url)
    with pytest.raises(InjectionError, match="reports no status.nodeInfo.bootID"):
        HyperPodReboot().inject(ctx, inj)
    node(server, "plain-node", labels={HEALTH_LABEL: SCHEDULABLE})  # no instance id anywhere
    pod(server, "w2", "plain-node")
    ctx, inj = setup(server, HyperPodReplace(via="boto3"), "w2", endpoint.url)
    with pytest.raises(InjectionError, match="node plain-node has no instance id"):
        HyperPodReplace(via="boto3").inject(ctx, inj)
    ctx, inj = setup(server, HyperPodReplace(via="boto3"), "w1")  # no hyperpod: section
    with pytest.raises(InjectionError, match="needs the HyperPod cluster: kubernetes.hyperpod"):
        HyperPodReplace(via="boto3").inject(ctx, inj)
    assert endpoint.calls == [] and hosts.calls == []
    assert server.store.get(NODES.plural, None, name)["metadata"]["labels"][HEALTH_LABEL] == SCHEDULABLE


def test_a_sagemaker_error_names_its_code_and_the_mark_is_reverted(hyperpod):
    server, hosts, endpoint = hyperpod
    name = hp_node(server)
    pod(server, "w1", name)
    fault = HyperPodReboot(via="boto3")
    ctx, inj = setup(server, fault, "w1", endpoint.url)
    endpoint.cluster_name = "another-cluster"
    with pytest.raises(InjectionError, match=f"batch_reboot_cluster_nodes of {ID1} .* in ml-cluster failed: "
                                             ".*ResourceNotFound"):
        fault.inject(ctx, inj)
    assert fault.revert(ctx, inj) is False and node_state(server, name) == (False, None) and hosts.calls == []


def test_the_chaos_fixture_builds_them_and_skips_where_there_is_no_kubernetes(server):
    """Every Kubernetes kind through the fixture's one factory (``chaos.<kind>(...)``), and a
    backend without the Kubernetes API skips it naming the capability."""
    from types import SimpleNamespace

    from chaos.pytest_plugin import Chaos

    request = SimpleNamespace(config=SimpleNamespace(getoption={"chaos_raylet_kill": "grpc"}.__getitem__,
                                                  stash=pytest.Stash()))
    backend = FakeBackend(access(server), {})
    backend.profile = None
    kube = Chaos(SimpleNamespace(backend=backend), request=request)
    assert isinstance(kube.pod_delete(rank=2), PodDelete) and kube.pod_delete(rank=2).rank == 2
    assert kube.pod_evict(retry_s=30).retry_s == 30 and kube.node_replace(via="boto3").via == "boto3"
    assert (type(kube.pod_delete_graceful()), type(kube.drain()), type(kube.hyperpod_reboot())) == \
        (GracefulPodDelete, NodeDrain, HyperPodReboot)
    assert type(kube.fault("node-replace")) is HyperPodReplace
    plain = Chaos(SimpleNamespace(backend=SimpleNamespace(kube=None, label="embedded", profile=None)), request=request)
    with pytest.raises(pytest.skip.Exception, match="pod-delete needs the Kubernetes API of the cluster's platform: "
                                                    ".* backend is embedded"):
        plain.pod_delete()
    with pytest.raises(AttributeError, match="no attribute 'pod_explode' \\(fault kinds: raylet_kill, "):
        plain.pod_explode()


def test_ray_chaos_sweep_with_a_kubernetes_profile_uncordons_what_a_killed_session_left(tmp_path, monkeypatch):
    """The README's `ray-chaos sweep --profile` after a session died mid-drain: the command
    line, the kubernetes backend it picks from the profile and the ledger, end to end."""
    import subprocess
    import sys


    import chaos.ledger
    from chaos.backends.lock import this_runner
    from chaos.embedded.kube.kubeconfig import write_kubeconfig
    from chaos.ledger import Ledger

    with serve() as server:
        node(server, "n1")
        pod(server, "w1", "n1")
        fault = NodeDrain(rank=1)
        ctx, inj = setup(server, fault, "w1")
        ledger = Ledger(tmp_path / "ledger.jsonl")
        killed = subprocess.Popen(["true"])  # the session that writes the entry, SIGKILLed below
        killed.wait()
        monkeypatch.setattr(chaos.ledger, "this_runner", lambda: {**this_runner(), "pid": str(killed.pid)})
        ledger.record(fault.kind, inj.target.to_json(), roundtrip(fault.revert_plan(inj)), test="killed-session")
        fault.inject(ctx, inj)  # ... and the session is SIGKILLed here: the node stays cordoned
        assert node_state(server, "n1") == (True, f"drain:{NODE_ID}")
        profile = tmp_path / "k8s.yaml"
        dump_profile({
            "name": "k8s-sweep", "ray": {"dashboard_url": "http://127.0.0.1:9", "gcs_address": "127.0.0.1:9"},
            "storage": {"path": str(tmp_path)}, "hosts": {"defaults": {"transport": "k8s"}},
            "kubernetes": {"kubeconfig": str(write_kubeconfig(tmp_path / "kubeconfig", server.url)),
                           "namespace": "default", "ray_cluster": "rc"}}, profile)
        ray_chaos = os.path.join(os.path.dirname(sys.executable), "ray-chaos")
        done = subprocess.run([ray_chaos, "sweep", "--profile", str(profile), "--ledger", str(ledger.path)],
                              capture_output=True, text=True, timeout=60)
        # the profile's dashboard answers nothing here: the sweep reverts what it can tell is a gone
        # session's (a process of this machine that ended) and fails for the lock it could not check
        assert done.returncode == 1, done.stdout + done.stderr
        assert "sweep: reverted drain" in done.stdout and "uncordon" in done.stdout, done.stdout
        assert "sweep: could not check the cluster's lock: cannot reach the Jobs API at http://127.0.0.1:9" \
            in done.stdout, done.stdout
        assert node_state(server, "n1") == (False, None), "the sweep must uncordon the node and drop its mark"
        assert not Ledger(ledger.path).open_entries()


def xid_sweep_backend(server, transport):
    """What Xid.sweep asks of a backend: the API, the profile's settings, the host's transport."""
    from chaos.profile.models import KubernetesSettings

    return types.SimpleNamespace(python="python3", kube=access(server),
                                 profile=types.SimpleNamespace(kubernetes=KubernetesSettings(ray_cluster="rc")),
                                 reach=lambda key: types.SimpleNamespace(transport=transport))


def test_xid_sweep_disarms_and_lists_what_the_node_agent_set_without_clearing_it(caplog):
    """A killed session's xid: the sweep disarms the plan on the host and names the nodes that
    carry the agent's condition or label — clearing them could cancel a real remediation."""
    from chaos.faults.xid import Xid
    from chaos.transport.base import CommandResult

    with serve() as server:
        labels = {HEALTH_LABEL: PENDING_REBOOT}
        node(server, "hyperpod-a", labels=labels)
        node(server, "hyperpod-b", labels={HEALTH_LABEL: SCHEDULABLE})
        def condition(n):
            n["status"]["conditions"].append({"type": "NvidiaErrorReboot", "status": "True",
                                              "reason": "XidHardwareFailure", "message": "NVRM: Xid 48"})
            return n

        server.store.update(NODES.plural, None, "hyperpod-a", condition)
        commands = []

        class Transport:
            host = "pod-a"

            def run(self, command, timeout=None, privileged=False):
                commands.append(command)
                return CommandResult("pod-a", command, 0, "", "")

        Backend = xid_sweep_backend(server, Transport())
        from chaos.faults.kube import NODE_SHELL_LABELS

        pod(server, "chaos-node-shell-left", None, labels=dict(NODE_SHELL_LABELS))
        with caplog.at_level("WARNING", logger="chaos.faults.xid"):
            assert Xid.sweep({"action": "disarm-xid", "host": "pod-a", "control": "/dev/shm/chaos-xid-x.ctl",
                              "log": "/tmp/chaos-xid-x.jsonl"}, Backend) is True
        assert "/dev/shm/chaos-xid-x.ctl" in commands[0] and commands[0].endswith("/dev/shm/chaos-xid-x.ctl ''")
        assert commands[1] == "rm -f /dev/shm/chaos-xid-x.ctl /tmp/chaos-xid-x.jsonl", "the session's files go too"
        assert "[ ! -c /dev/kmsg ]" in commands[2], "the stand-in is emptied only where it is not the device"
        listed = [r.getMessage() for r in caplog.records]
        assert len(listed) == 1 and "node hyperpod-a carries" in listed[0] and "NvidiaErrorReboot" in listed[0], listed
        after = server.store.get(NODES.plural, None, "hyperpod-a")
        assert after["metadata"]["labels"][HEALTH_LABEL] == PENDING_REBOOT, "the sweep cleared the agent's label"
        assert any(c["type"] == "NvidiaErrorReboot" for c in after["status"]["conditions"])
        assert server.store.get(PODS.plural, "default", "chaos-node-shell-left") is None, "a node-shell pod was left"


def test_xid_sweep_deletes_a_left_node_shell_though_the_rays_pod_went_with_the_node():
    """The node agent rebooted the node: the Ray pod the ledger names is gone, so the sweep's
    exec there fails (the entry stays open) — the node-shell pod a killed session left is
    deleted first all the same (pending, it could write the Xid line again once the node is back)."""
    from chaos.errors import TransportError
    from chaos.faults.kube import NODE_SHELL_LABELS
    from chaos.faults.xid import Xid

    with serve() as server:
        node(server, "hyperpod-a")

        class Gone:
            host = "pod-a"

            def run(self, command, timeout=None, privileged=False):
                raise TransportError('pod-a: pods "pod-a" not found')

        Backend = xid_sweep_backend(server, Gone())
        pod(server, "chaos-node-shell-left", None, labels=dict(NODE_SHELL_LABELS))
        with pytest.raises(TransportError, match="not found"):
            Xid.sweep({"action": "disarm-xid", "host": "pod-a", "control": "/dev/shm/chaos-xid-x.ctl"}, Backend)
        assert server.store.get(PODS.plural, "default", "chaos-node-shell-left") is None, "a node-shell pod was left"


# -- the xid fault's chain watch ------------------------------------------------------------
def chain_watch(server, name, agent_slo_s=5.0, recover_timeout_s=5.0):
    from chaos.faults.kube import list_nodes_at
    from chaos.faults.xid import AgentSignals, _ChainWatch

    kube = access(server)
    node_obj = server.store.get(NODES.plural, None, name)
    timeline = Timeline()
    watch = _ChainWatch(kube, node_obj, list_nodes_at(kube), AgentSignals(), agent_slo_s, recover_timeout_s,
                        timeline, "f1", 48)
    watch.t0 = timeline.emit("fault", "xid_logged", ledger_id="f1").t
    return watch, timeline


def set_labels(server, name, **labels):
    def change(n):
        n["metadata"]["labels"].update(labels)
        return n

    server.store.update(NODES.plural, None, name, change)


def test_the_chain_watch_replays_a_label_the_agent_set_and_cleared_before_it_looked():
    """The agent may act and recover in under a second: the watch starts from a list taken
    before the line, so the short-lived label and the new boot id are still seen, in order."""
    with serve() as server:
        name = hp_node(server, boot_id="boot-1")
        watch, timeline = chain_watch(server, name)
        set_labels(server, name, **{HEALTH_LABEL: PENDING_REBOOT})

        def rebooted(n):
            n["metadata"]["labels"][HEALTH_LABEL] = SCHEDULABLE
            n["status"]["nodeInfo"] = node_info("boot-2")
            return n

        server.store.update(NODES.plural, None, name, rebooted)
        watch.start()
        watch.join(20)
        kinds = [e.kind for e in timeline.events]
        assert kinds == ["xid_logged", "node_agent_signal", "node_agent_acted", "node_recovered"], kinds
        back = timeline.of("node_recovered")[0].data
        assert (back["action"], back["boot_id_after"]) == ("reboot", "boot-2"), back


def test_an_unrelated_new_node_is_no_replacement():
    """The old node deleted, and a node of another instance group (an autoscaler's) joins: the
    node is not recovered."""
    with serve() as server:
        name = "hyperpod-" + ID1
        node(server, name, labels={HEALTH_LABEL: SCHEDULABLE, INSTANCE_ID_LABEL: ID1,
                                   "sagemaker.amazonaws.com/instance-group-name": "workers"})
        watch, timeline = chain_watch(server, name, recover_timeout_s=2.0)
        watch.start()
        set_labels(server, name, **{HEALTH_LABEL: PENDING_REPLACEMENT})
        server.store.remove(NODES.plural, None, name)
        node(server, "karpenter-abc", labels={"sagemaker.amazonaws.com/instance-group-name": "other"})
        watch.join(20)
        kinds = [e.kind for e in timeline.events]
        assert "node_agent_acted" in kinds and "node_recovered" not in kinds, kinds
        assert "karpenter-abc" not in json.dumps(timeline.of("node_not_recovered")[0].data), timeline.events


def test_a_signal_already_on_the_node_makes_the_chain_unverifiable_not_a_pass():
    with serve() as server:
        name = hp_node(server)
        set_labels(server, name, **{HEALTH_LABEL: PENDING_REBOOT})
        watch, timeline = chain_watch(server, name)
        watch.start()
        watch.join(20)
        [failed] = timeline.of("chain_watch_failed")
        assert "already carried" in failed.data["error"] and not timeline.of("node_agent_acted"), timeline.events


# -- the example CronJob's RBAC (examples/kubernetes/chaos-cronjob.yaml) ---------------------------------
def test_the_example_jobs_rbac_lets_the_kubernetes_faults_and_the_backend_through(kubelet):
    """Every API call of the pod faults, a drain and its revert, exec into a Ray pod, the
    node-shell pod of the xid fault, the node watch and the RayCluster lookup, made with the
    example CronJob's permissions and no other: a missing one is a 403 naming it."""
    budget = DisruptionBudget("ray-workers", "default", "ray.io/group=gpu", min_available=1)
    with serve(lifecycle=kubelet, budgets=[budget], rbac=example_job_rbac()) as server:
        for name in ("n1", "n2"):
            node(server, name)
        for name, on in (("w1", "n1"), ("w2", "n2"), ("w3", "n2"), ("w4", "n2")):
            pod(server, name, on)
        kube = access(server)
        assert [p.name for p in kube.ray_pods()] == ["w1", "w2", "w3", "w4"]
        assert KubeExecTransport(kube, "w2", container="ray-worker").run("echo in-pod").stdout.strip() == "in-pod"
        for fault, name in ((PodDelete(rank=1), "w3"), (PodEvict(rank=1), "w4")):
            ctx, inj = setup(server, fault, name)
            fault.inject(ctx, inj)
            wait_for(server, lambda: pod_gone(server, name), f"pod {name} gone")
        drain = NodeDrain(rank=1)
        ctx, inj = setup(server, drain, "w1")
        assert drain.inject(ctx, inj)["evicted"] == ["default/w1"]
        assert drain.revert(ctx, inj) is True and node_state(server, "n1") == (False, None)
        nodes, rv = list_nodes_at(kube)
        assert wait_nodes(kube, lambda by_uid: (len(by_uid), f"{len(by_uid)} nodes"), 10, "the nodes",
                          resume={"nodes": nodes, "rv": rv}) == 2
        # the node-shell pod is created, watched to its end and deleted; its log read gets past RBAC
        # to the local runtime, which keeps no container logs (400, where a refusal is a 403)
        with pytest.raises(ApiException, match="container logs are not emulated"):
            write_by_node_pod(kube, "n2", "busybox:1.36", "echo written", {}, "a line")
        server.store.create(RAYCLUSTERS.plural, prepare_new(RAYCLUSTERS, {
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"},
            "spec": {"headGroupSpec": {}, "workerGroupSpecs": []}}, "default"))
        assert kube.raycluster()["metadata"]["name"] == "rc"
