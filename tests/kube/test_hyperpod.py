"""The HyperPod-like agent (chaos/embedded/kube/hyperpod.py) and the SageMaker endpoint for boto3
(chaos/embedded/sagemaker.py), against a real emulated API server whose pods are local processes.

boto3 only ever talks to the local endpoint (endpoint_url, fake credentials, no retries,
no instance metadata).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from chaos.embedded.kube import ApiServer
from chaos.embedded.kube.hyperpod import (REBOOT_STEPS, REPLACE_STEPS, UNSCHEDULABLE_TAINT, HostInfo, Hosts,
                                          HyperPodAgent, api_client_for)
from chaos.embedded.kube.resources import NODES, PODS
from chaos.hyperpod import HEALTH_LABEL, INSTANCE_ID_LABEL, PENDING_REBOOT, PENDING_REPLACEMENT, SCHEDULABLE
from kube_helpers import add_node, add_pod, wait_for
from local_kubelet import LocalProcesses

boto3 = pytest.importorskip("boto3")
botocore = pytest.importorskip("botocore")
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError, ParamValidationError  # noqa: E402

WORKER = {"ray.io/cluster": "rc", "ray.io/node-type": "worker"}
ID1, ID2 = "i-0123456789abcdef0", "i-0fedcba9876543210"


class FakeHosts(Hosts):
    """Power-off SIGKILLs the processes of the node's pods (what a host going down does to them);
    reboot/replace block until the test releases them.  What the node and its pods looked like at
    each call is kept."""

    def __init__(self, server: ApiServer, kubelet: LocalProcesses):
        self.server, self.kubelet = server, kubelet
        self.release = threading.Event()
        self.calls: list[tuple[str, str]] = []
        self.seen_at_call: dict[tuple[str, str], dict] = {}  # (call, node) -> {"node": ..., "pods": [...]}
        self.boots = 0
        self.entered = threading.Event()

    def _seen(self, what: str, node: str) -> list[dict]:
        pods = [p for p in self.server.store.list(PODS.plural)[0] if p["spec"].get("nodeName") == node]
        self.seen_at_call[(what, node)] = {"node": self.server.store.get(NODES.plural, None, node),
                                           "pods": [p["metadata"]["name"] for p in pods]}
        self.calls.append((what, node))
        return pods

    def kernel_log(self, node_name: str) -> None:
        return None  # no kernel logs here: health monitoring has nothing to read

    def power_off(self, node_name: str) -> None:
        procs = [self.kubelet.procs[p["metadata"]["uid"]] for p in self._seen("power_off", node_name)]
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session, started by the test kubelet
        for proc in procs:
            proc.wait(timeout=10)

    def _enter(self, what: str, node: str) -> None:
        self._seen(what, node)
        self.entered.set()
        if not self.release.wait(15):
            raise TimeoutError(f"test never released the {what} of {node}")

    def reboot(self, node_name: str) -> dict:
        self._enter("reboot", node_name)
        self.boots += 1
        return {"boot_id": f"boot-{self.boots}"}

    def replace(self, node_name: str) -> HostInfo:
        self._enter("replace", node_name)
        return HostInfo(instance_id=ID2, addresses=({"type": "InternalIP", "address": "198.18.0.9"},))


@pytest.fixture(autouse=True)
def no_aws(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
                "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SAGEMAKER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)


@pytest.fixture
def hosts(server, kubelet):
    fake = FakeHosts(server, kubelet)
    yield fake
    fake.release.set()


@pytest.fixture
def agent(server, hosts):
    with HyperPodAgent(api_client_for(server.url), hosts) as running:
        assert running.ready.wait(10), "agent never finished its first node list"
        wait_for(server, lambda: server.store.watching(NODES.plural) >= 1, "the agent's node watch",
                 seen=lambda: server.store.watching(NODES.plural))
        yield running


def hp_node(server: ApiServer, name: str, instance: str) -> dict:
    return add_node(server, name, {HEALTH_LABEL: SCHEDULABLE, INSTANCE_ID_LABEL: instance,
                                   "sagemaker.amazonaws.com/instance-group-name": "workers"})


def label(server: ApiServer, name: str, value: str) -> None:
    def change(node: dict) -> dict:
        node["metadata"]["labels"][HEALTH_LABEL] = value
        return node
    server.store.update(NODES.plural, None, name, change)


def node_history(server: ApiServer, name: str, after: int) -> list[tuple[str, str | None, bool, list, str]]:
    """(event type, health label, unschedulable, taint keys, Ready) of every change of node ``name``."""
    out = []
    for event in server.store.events(NODES.plural, after):
        obj = event.obj
        if obj["metadata"]["name"] != name:
            continue
        ready = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}.get("Ready", "")
        out.append((event.type, obj["metadata"].get("labels", {}).get(HEALTH_LABEL),
                    bool(obj.get("spec", {}).get("unschedulable")),
                    [t["key"] for t in obj.get("spec", {}).get("taints") or []], ready))
    return out


def sagemaker_client(url: str):
    return boto3.client("sagemaker", endpoint_url=url, region_name="us-east-1", aws_access_key_id="AKIDFAKE",
                        aws_secret_access_key="fake-secret",
                        config=Config(retries={"total_max_attempts": 1, "mode": "standard"},
                                      connect_timeout=5, read_timeout=10))


def test_label_triggered_reboot_kills_pods_cordons_and_restores(server, kubelet, agent, hosts):
    hp_node(server, "hyperpod-" + ID1, ID1)
    node = "hyperpod-" + ID1
    add_pod(server, "w1", node, WORKER)
    add_pod(server, "w2", node, WORKER, grace=30)
    procs = [kubelet.procs[server.store.get(PODS.plural, "default", p)["metadata"]["uid"]] for p in ("w1", "w2")]
    start = server.store.resource_version
    label(server, node, PENDING_REBOOT)
    assert hosts.entered.wait(10), f"reboot never called; agent saw {agent.steps(node)}"
    down = hosts.seen_at_call[("power_off", node)]
    assert down["pods"] == ["w1", "w2"], "the host goes down before its pods are deleted"
    assert down["node"]["spec"]["unschedulable"] is True
    assert {"key": UNSCHEDULABLE_TAINT["key"], "effect": "NoSchedule"}.items() <= \
        down["node"]["spec"]["taints"][0].items()
    assert down["node"]["metadata"]["labels"][HEALTH_LABEL] == PENDING_REBOOT
    during = hosts.seen_at_call[("reboot", node)]
    assert during["pods"] == [], "every pod on the node is gone (force-deleted) before the host boots again"
    assert {c["type"]: c["status"] for c in during["node"]["status"]["conditions"]}["Ready"] == "False"
    assert [p.returncode for p in procs] == [-signal.SIGKILL] * 2, "the power-off killed them"
    hosts.release.set()
    agent.wait_for(node, "schedulable")
    final = server.store.get(NODES.plural, None, node)
    assert final["metadata"]["labels"][HEALTH_LABEL] == SCHEDULABLE
    assert not final["spec"].get("unschedulable") and not final["spec"].get("taints")
    assert agent.steps(node) == list(REBOOT_STEPS)
    times = [t.mono for t in agent.history(node)]
    assert times == sorted(times)
    assert agent.history(node)[-2].detail == {"boot_id": "boot-1"}
    assert agent.history(node)[REBOOT_STEPS.index("pods_killed")].detail["pods"] == ["default/w1", "default/w2"]
    assert hosts.calls == [("power_off", node), ("reboot", node)]
    # The node's own event order: label, cordon+taint, NotReady, (host back) Ready, Schedulable+uncordoned.
    assert node_history(server, node, start) == [
        ("MODIFIED", PENDING_REBOOT, False, [], ""),
        ("MODIFIED", PENDING_REBOOT, True, [UNSCHEDULABLE_TAINT["key"]], ""),
        ("MODIFIED", PENDING_REBOOT, True, [UNSCHEDULABLE_TAINT["key"]], "False"),
        ("MODIFIED", PENDING_REBOOT, True, [UNSCHEDULABLE_TAINT["key"]], "True"),
        ("MODIFIED", SCHEDULABLE, False, [], "True"),
    ]
    pod_events = [(e.type, e.obj["metadata"]["name"]) for e in server.store.events(PODS.plural, start)]
    assert ("DELETED", "w1") in pod_events and ("DELETED", "w2") in pod_events
    assert all(e.obj["metadata"].get("deletionGracePeriodSeconds") == 0
               for e in server.store.events(PODS.plural, start) if e.type == "DELETED")


# A pod that notes a SIGTERM (a Ray pod would drain as PREEMPTION) and keeps running.
TERM_NOTER = [sys.executable, "-c", "import pathlib, signal, sys, time; "
              "signal.signal(signal.SIGTERM, lambda *_: pathlib.Path(sys.argv[1]).write_text('SIGTERM')); "
              "print('ready', flush=True); time.sleep(3600)"]


@pytest.mark.parametrize("value, last", [(PENDING_REBOOT, "schedulable"), (PENDING_REPLACEMENT, "node_created")])
def test_the_host_goes_down_before_its_pods_are_deleted(server, kubelet, agent, hosts, tmp_path, value, last):
    """Every pod dies at once with its host: none is deleted (and so SIGTERMed) while it still runs."""
    node = "hyperpod-" + ID1
    hp_node(server, node, ID1)
    marker = tmp_path / "w1.sigterm"
    add_pod(server, "w1", node, WORKER, command=[*TERM_NOTER, str(marker)])
    proc = kubelet.procs[server.store.get(PODS.plural, "default", "w1")["metadata"]["uid"]]
    label(server, node, value)
    assert hosts.entered.wait(10), f"reboot/replace never called; agent saw {agent.steps(node)}"
    assert [what for what, _ in hosts.calls] == ["power_off", "reboot" if value == PENDING_REBOOT else "replace"]
    assert hosts.seen_at_call[("power_off", node)]["pods"] == ["w1"], "pods deleted before the host went down"
    assert proc.returncode == -signal.SIGKILL and not marker.exists(), \
        f"w1 exited {proc.returncode}; SIGTERM noted: {marker.exists()}"
    steps = agent.steps(node)
    assert steps.index("host_down") < steps.index("pods_killed"), steps
    hosts.release.set()
    agent.wait_for(node, last)
    assert not marker.exists()


def test_a_failed_power_off_leaves_the_node_and_its_pods_alone(server, kubelet, agent, hosts):
    def broken(node_name: str) -> None:
        raise OSError(f"power controller of {node_name} unreachable")

    hosts.power_off = broken
    hp_node(server, "n1", ID1)
    add_pod(server, "w1", "n1", WORKER)
    proc = kubelet.procs[server.store.get(PODS.plural, "default", "w1")["metadata"]["uid"]]
    label(server, "n1", PENDING_REBOOT)
    failed = agent.wait_for("n1", "failed")
    assert failed.detail["error"] == "OSError: power controller of n1 unreachable"
    assert agent.steps("n1") == ["requested", "cordoned", "failed"]
    pod = server.store.get(PODS.plural, "default", "w1")
    assert pod is not None and not pod["metadata"].get("deletionTimestamp") and proc.poll() is None


def test_label_triggered_replace_makes_a_new_node(server, agent, hosts):
    old = hp_node(server, "hyperpod-" + ID1, ID1)
    add_pod(server, "w1", old["metadata"]["name"], WORKER)
    hosts.release.set()
    label(server, old["metadata"]["name"], PENDING_REPLACEMENT)
    done = agent.wait_for(old["metadata"]["name"], "node_created")
    new_name = "hyperpod-" + ID2
    assert done.detail["new_node"] == new_name
    assert server.store.get(NODES.plural, None, old["metadata"]["name"]) is None
    new = server.store.get(NODES.plural, None, new_name)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    labels = new["metadata"]["labels"]
    assert labels[HEALTH_LABEL] == SCHEDULABLE and labels[INSTANCE_ID_LABEL] == ID2
    assert labels["sagemaker.amazonaws.com/instance-group-name"] == "workers"
    assert {"type": "Ready", "status": "True"}.items() <= new["status"]["conditions"][0].items()
    assert new["status"]["addresses"] == [{"type": "InternalIP", "address": "198.18.0.9"}]
    assert hosts.seen_at_call[("power_off", old["metadata"]["name"])]["pods"] == ["w1"]
    assert hosts.seen_at_call[("replace", old["metadata"]["name"])] == {"node": None, "pods": []}
    assert agent.steps(old["metadata"]["name"]) == list(REPLACE_STEPS)
    assert [t.step for t in agent.history(new_name)] == ["host_replaced", "node_created"]


def test_kubectl_label_overwrite_triggers_the_reboot(server, agent, hosts, kubectl):
    hp_node(server, "n1", ID1)
    hosts.release.set()
    result = kubectl.run("label", "node", "n1", f"{HEALTH_LABEL}={PENDING_REBOOT}", "--overwrite")
    assert result.returncode == 0, result.stderr
    agent.wait_for("n1", "schedulable")
    assert hosts.calls == [("power_off", "n1"), ("reboot", "n1")]
    assert server.store.get(NODES.plural, None, "n1")["metadata"]["labels"][HEALTH_LABEL] == SCHEDULABLE


def test_a_failed_reboot_is_recorded_and_not_restarted_by_stale_events(server, agent, hosts):
    def broken(node_name: str) -> dict:
        raise OSError(f"power controller of {node_name} unreachable")

    hosts.reboot = broken
    hp_node(server, "n1", ID1)
    label(server, "n1", PENDING_REBOOT)
    failed = agent.wait_for("n1", "failed")
    assert failed.detail["error"] == "OSError: power controller of n1 unreachable"
    node = server.store.get(NODES.plural, None, "n1")
    assert node["spec"]["unschedulable"] is True and node["metadata"]["labels"][HEALTH_LABEL] == PENDING_REBOOT
    # Only a new change starts it again (the stale events of the failed attempt do not).
    hp_node(server, "n2", ID2)
    hosts.reboot = FakeHosts.reboot.__get__(hosts)
    hosts.release.set()
    label(server, "n2", PENDING_REBOOT)
    agent.wait_for("n2", "schedulable")
    assert agent.steps("n1") == ["requested", "cordoned", "host_down", "not_ready", "pods_killed", "host_rebooting",
                                 "failed"]
    again = time.monotonic()
    label(server, "n1", SCHEDULABLE)
    label(server, "n1", PENDING_REBOOT)
    agent.wait_for("n1", "schedulable", since=again)
    assert agent.steps("n1").count("requested") == 2


def test_watch_rewatches_a_dropped_stream_and_relists_after_410(kubelet):
    with ApiServer(lifecycle=kubelet, history=4) as server:
        hosts = FakeHosts(server, kubelet)
        hosts.release.set()
        with HyperPodAgent(api_client_for(server.url), hosts) as agent:
            assert agent.ready.wait(10)
            wait_for(server, lambda: server.store.watching(NODES.plural) == 1, "the agent's watch")
            a = hp_node(server, "a", ID1)
            # A dropped stream: the agent re-watches from its version (no re-list).
            server.store.close_watches()
            wait_for(server, lambda: server.store.watching(NODES.plural) == 1, "the agent's second watch",
                     seen=lambda: server.store.watching(NODES.plural))
            watches = [q for _, q, _, _ in server.requests if q.startswith("/api/v1/nodes?") and "watch=" in q]
            assert len(watches) == 2 and f"resourceVersion={a['metadata']['resourceVersion']}" in watches[1], watches
            assert agent.relists == 1
            # Drop it again and, before it can come back, push its version out of the history:
            # the label below is then only visible to a re-list.
            with server.store._lock:  # the agent's re-watch waits on this lock
                server.store.close_watches()
                hp_node(server, "b", ID2)
                label(server, "b", PENDING_REBOOT)
                for i in range(5):
                    server.store.create("namespaces", {"metadata": {"name": f"filler{i}", "resourceVersion": "0"}})
            agent.wait_for("b", "schedulable")
            assert agent.relists == 2, "the 410 made the agent re-list"
            label(server, "a", PENDING_REBOOT)  # and it still sees live changes
            agent.wait_for("a", "schedulable")
        assert hosts.calls == [("power_off", "b"), ("reboot", "b"), ("power_off", "a"), ("reboot", "a")]


# ---- the SageMaker endpoint ------------------------------------------------------------------


@pytest.fixture
def sagemaker(agent):
    from chaos.embedded.sagemaker import SageMakerEndpoint
    with SageMakerEndpoint(agent, cluster_name="ml-cluster") as endpoint:
        yield endpoint


def _model() -> dict:
    path = Path(botocore.__file__).parent / "data" / "sagemaker" / "2017-07-24" / "service-2.json"
    if path.exists():
        return json.loads(path.read_text())
    with gzip.open(f"{path}.gz") as f:
        return json.load(f)


def _members(model: dict, shape: str) -> set[str]:
    return set(model["shapes"][shape]["members"])


def test_batch_reboot_through_boto3(server, agent, hosts, sagemaker):
    hp_node(server, "hyperpod-" + ID1, ID1)
    sm = sagemaker_client(sagemaker.url)
    hosts.release.set()
    answer = sm.batch_reboot_cluster_nodes(ClusterName="ml-cluster", NodeIds=[ID1, "i-00000000000000000"])
    answer.pop("ResponseMetadata")
    assert answer == {"Successful": [ID1], "Failed": [{"NodeId": "i-00000000000000000",
                                                      "ErrorCode": "InstanceIdNotFound",
                                                      "Message": answer["Failed"][0]["Message"]}]}
    model = _model()
    assert set(answer) <= _members(model, "BatchRebootClusterNodesResponse")
    assert set(answer["Failed"][0]) == set(model["shapes"]["BatchRebootClusterNodesError"]["required"])
    assert answer["Failed"][0]["ErrorCode"] in model["shapes"]["BatchRebootClusterNodesErrorCode"]["enum"]
    agent.wait_for("hyperpod-" + ID1, "schedulable")
    assert hosts.calls == [("power_off", "hyperpod-" + ID1), ("reboot", "hyperpod-" + ID1)]
    op, body = sagemaker.calls[0]
    assert op == "BatchRebootClusterNodes" and set(body) <= _members(model, "BatchRebootClusterNodesRequest")
    summaries = sm.list_cluster_nodes(ClusterName="ml-cluster")["ClusterNodeSummaries"]
    assert [(s["InstanceId"], s["InstanceStatus"]["Status"]) for s in summaries] == [(ID1, "Running")]
    details = sm.describe_cluster_node(ClusterName="ml-cluster", NodeId=ID1)["NodeDetails"]
    assert details["InstanceGroupName"] == "workers" and details["LaunchTime"].tzinfo is not None


def test_batch_replace_through_boto3(server, agent, hosts, sagemaker):
    hp_node(server, "hyperpod-" + ID1, ID1)
    sm = sagemaker_client(sagemaker.url)
    answer = sm.batch_replace_cluster_nodes(ClusterName=sagemaker.cluster_arn, NodeIds=[ID1],
                                            NodeLogicalIds=["worker-1"])
    assert answer["Successful"] == [ID1] and answer["Failed"] == []
    assert answer["SuccessfulNodeLogicalIds"] == [] and \
        answer["FailedNodeLogicalIds"][0]["ErrorCode"] == "InstanceIdNotFound"
    assert set(answer) - {"ResponseMetadata"} <= _members(_model(), "BatchReplaceClusterNodesResponse")
    assert hosts.entered.wait(10)
    again = sm.batch_replace_cluster_nodes(ClusterName="ml-cluster", NodeIds=[ID1])
    assert [f["ErrorCode"] for f in again["Failed"]] == ["InvalidInstanceStatus"]
    assert again["Successful"] == [], "a node already being replaced is not replaced twice"
    hosts.release.set()
    agent.wait_for("hyperpod-" + ID1, "node_created")
    assert server.store.get(NODES.plural, None, "hyperpod-" + ID2) is not None
    assert hosts.calls == [("power_off", "hyperpod-" + ID1), ("replace", "hyperpod-" + ID1)]


def test_boto3_errors(sagemaker):
    sm = sagemaker_client(sagemaker.url)
    with pytest.raises(ClientError) as missing:
        sm.batch_reboot_cluster_nodes(ClusterName="no-such-cluster", NodeIds=[ID1])
    assert missing.value.response["Error"]["Code"] == "ResourceNotFound"
    assert missing.value.operation_name == "BatchRebootClusterNodes"
    assert "ResourceNotFound" in [e["shape"] for e in _model()["operations"]["BatchRebootClusterNodes"]["errors"]]
    # botocore itself checks the minimum (1 id) ...
    with pytest.raises(ParamValidationError):
        sm.batch_reboot_cluster_nodes(ClusterName="ml-cluster", NodeIds=[])
    # ... but not the maximum of 25: the service refuses 26 (ValidationException).
    calls = len(sagemaker.calls)
    with pytest.raises(ClientError) as too_many:
        sm.batch_replace_cluster_nodes(ClusterName="ml-cluster", NodeIds=[f"i-{n:017x}" for n in range(26)])
    assert too_many.value.response["Error"]["Code"] == "ValidationException"
    assert "less than or equal to 25" in too_many.value.response["Error"]["Message"]
    assert len(sagemaker.calls) == calls + 1, "botocore sent the 26 ids (no client-side maximum)"
    ids_shape = _model()["shapes"]["BatchReplaceClusterNodesRequestNodeIdsList"]
    assert (ids_shape["min"], ids_shape["max"]) == (1, 25)
    with pytest.raises(ClientError) as bad_id:
        sm.batch_reboot_cluster_nodes(ClusterName="ml-cluster", NodeIds=["node-1"])
    assert bad_id.value.response["Error"]["Code"] == "ValidationException"


def test_describe_cluster_through_boto3(server, agent, sagemaker):
    hp_node(server, "hyperpod-" + ID1, ID1)
    hp_node(server, "hyperpod-" + ID2, ID2)
    sm = sagemaker_client(sagemaker.url)
    for name in ("ml-cluster", sagemaker.cluster_arn):
        answer = sm.describe_cluster(ClusterName=name)
        answer.pop("ResponseMetadata")
        assert answer["ClusterStatus"] == "InService" and answer["ClusterArn"] == sagemaker.cluster_arn
        assert [(g["InstanceGroupName"], g["CurrentCount"], g["TargetCount"]) for g in answer["InstanceGroups"]] == \
            [("workers", 2, 2)]
    model = _model()
    assert set(model["shapes"]["DescribeClusterResponse"]["required"]) <= set(answer) <= \
        _members(model, "DescribeClusterResponse")
    assert set(answer["InstanceGroups"][0]) <= _members(model, "ClusterInstanceGroupDetails")
    assert answer["ClusterStatus"] in model["shapes"]["ClusterStatus"]["enum"]
    with pytest.raises(ClientError) as missing:
        sm.describe_cluster(ClusterName="no-such-cluster")
    assert missing.value.response["Error"]["Code"] == "ResourceNotFound"
