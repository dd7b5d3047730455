"""The emulated API server driven by the real kubectl (bundled 1.33 and the gcloud dispatcher).

Each test has its own server, HOME and kubeconfig; pods are local processes (local_kubelet).
"""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from chaos.embedded.kube import ApiServer, DisruptionBudget
from chaos.embedded.kube.resources import NODES, PODS
from kube_helpers import (TERM_IGNORER, add_node, add_pod, bundled_kubectl, make_kubectl, pod_gone,
                      pod_phase, wait_for)

WORKER = {"ray.io/cluster": "rc", "ray.io/node-type": "worker", "ray.io/group": "g"}
HEAD = {"ray.io/cluster": "rc", "ray.io/node-type": "head", "ray.io/group": "headgroup"}


def names(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    return sorted(result.stdout.split())


def test_dispatcher_picks_kubectl_133_from_server_version(dispatched_kubectl):
    result = dispatched_kubectl.run("version", "-o", "json")
    assert result.returncode == 0, result.stderr
    versions = json.loads(result.stdout)
    assert versions["serverVersion"]["minor"] == "33"
    assert versions["clientVersion"]["gitVersion"].startswith("v1.33.")


@pytest.mark.parametrize("which", ["kubectl", "dispatched_kubectl"])
def test_get_pods_with_label_selectors(server, which, request):
    kubectl = request.getfixturevalue(which)
    add_node(server, "n1")
    add_pod(server, "rc-head-x", "n1", HEAD)
    add_pod(server, "rc-g-worker-a", "n1", WORKER)
    add_pod(server, "rc-g-worker-b", "n1", {**WORKER, "gpu": "yes"})
    add_pod(server, "other", "n1", {"app": "x"})
    assert names(kubectl.run("get", "pods", "-l", "ray.io/cluster=rc,ray.io/node-type=worker", "-o", "name")) == \
        ["pod/rc-g-worker-a", "pod/rc-g-worker-b"]
    assert names(kubectl.run("get", "pods", "-l", "ray.io/node-type in (head,worker),!gpu", "-o", "name")) == \
        ["pod/rc-g-worker-a", "pod/rc-head-x"]
    assert names(kubectl.run("get", "pods", "-l", "ray.io/node-type!=worker", "-o", "name")) == \
        ["pod/other", "pod/rc-head-x"]
    assert names(kubectl.run("get", "pods", "-l", "ray.io/group notin (g),ray.io/cluster", "-o", "name")) == \
        ["pod/rc-head-x"]
    table = kubectl.run("get", "pods", "-l", "ray.io/cluster==rc")
    assert table.returncode == 0 and "rc-head-x" in table.stdout and "other" not in table.stdout
    bad = kubectl.run("get", "pods", "-l", "a in (b")
    assert bad.returncode != 0


def test_get_nodes_with_field_selectors(server, kubectl):
    add_node(server, "n1")
    add_node(server, "n2")
    server.store.update(NODES.plural, None, "n1", lambda n: {**n, "spec": {"unschedulable": True}})
    assert names(kubectl.run("get", "nodes", "--field-selector", "spec.unschedulable=true", "-o", "name")) == \
        ["node/n1"]
    assert names(kubectl.run("get", "nodes", "--field-selector", "spec.unschedulable=false", "-o", "name")) == \
        ["node/n2"]
    assert names(kubectl.run("get", "nodes", "--field-selector", "metadata.name!=n1", "-o", "name")) == ["node/n2"]
    add_pod(server, "p1", "n1")
    add_pod(server, "p2", "n2")
    assert names(kubectl.run("get", "pods", "-A", "--field-selector", "spec.nodeName=n2,status.phase=Running",
                             "-o", "name")) == ["pod/p2"]
    bad = kubectl.run("get", "nodes", "--field-selector", "spec.podCIDR=x")
    assert bad.returncode != 0 and "field label not supported: spec.podCIDR" in bad.stderr


def test_force_delete_removes_the_object_at_once_and_the_kubelet_still_kills(server, kubectl, kubelet):
    add_node(server, "n1")
    pod = add_pod(server, "w", "n1", WORKER, command=TERM_IGNORER, grace=30)
    before = server.store.resource_version
    result = kubectl.run("delete", "pod", "w", "--grace-period=0", "--force")
    assert result.returncode == 0, result.stderr
    assert 'pod "w" force deleted' in result.stdout
    assert "Immediate deletion does not wait" in result.stderr
    events = server.store.events(PODS.plural, before)
    assert [e.type for e in events] == ["MODIFIED", "DELETED"]  # the deletion is written, then the object goes
    assert events[0].obj["metadata"]["deletionGracePeriodSeconds"] == 0
    process = kubelet.procs[pod["metadata"]["uid"]]
    assert process.wait(timeout=15) == -9  # SIGTERM ignored, SIGKILL after the 2 s floor


def test_graceful_delete_waits_for_deleted(server, kubectl, kubelet):
    add_node(server, "n1")
    pod = add_pod(server, "w", "n1", WORKER, command=TERM_IGNORER, grace=2)
    before = server.store.resource_version
    result = kubectl.run("delete", "pod", "w")
    assert result.returncode == 0, result.stderr
    assert 'pod "w" deleted' in result.stdout
    assert pod_gone(server, "w")
    events = server.store.events(PODS.plural, before)
    assert [e.type for e in events] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert events[0].obj["metadata"]["deletionGracePeriodSeconds"] == 2
    assert events[0].obj["metadata"]["deletionTimestamp"]
    assert events[1].obj["metadata"]["deletionGracePeriodSeconds"] == 0  # the kubelet: containers gone
    assert kubelet.procs[pod["metadata"]["uid"]].returncode == -9  # the grace ran out: SIGKILL
    watched = [path for method, path, _, _ in server.requests if "watch=true" in path]
    assert watched and "fieldSelector=metadata.name%3Dw" in watched[0]


def test_label_node_and_cordon_uncordon(server, kubectl):
    add_node(server, "n1", {"zone": "a"})
    health = "sagemaker.amazonaws.com/node-health-status"
    before = server.store.resource_version
    assert kubectl.run("label", "node", "n1", f"{health}=UnschedulablePendingReboot").returncode == 0
    node = server.store.get(NODES.plural, None, "n1")
    assert node["metadata"]["labels"] == {"zone": "a", health: "UnschedulablePendingReboot"}
    assert int(node["metadata"]["resourceVersion"]) > before
    refused = kubectl.run("label", "node", "n1", f"{health}=Schedulable")
    assert refused.returncode != 0 and "--overwrite" in refused.stderr
    assert kubectl.run("label", "node", "n1", f"{health}=Schedulable", "--overwrite").returncode == 0
    assert kubectl.run("label", "node", "n1", "zone-").returncode == 0
    assert server.store.get(NODES.plural, None, "n1")["metadata"]["labels"] == {health: "Schedulable"}
    cordon = kubectl.run("cordon", "n1")
    assert cordon.returncode == 0 and "node/n1 cordoned" in cordon.stdout
    assert server.store.get(NODES.plural, None, "n1")["spec"] == {"unschedulable": True}
    assert kubectl.run("uncordon", "n1").returncode == 0
    assert "unschedulable" not in server.store.get(NODES.plural, None, "n1")["spec"]
    events = server.store.events(NODES.plural, before)
    assert [e.type for e in events] == ["MODIFIED"] * 5
    assert [e.rv for e in events] == sorted(e.rv for e in events)
    patches = [(m, ct) for m, path, ct, _ in server.requests if m == "PATCH"]
    assert ("PATCH", "application/merge-patch+json") in patches
    assert ("PATCH", "application/strategic-merge-patch+json") in patches


def test_drain_evicts_the_nodes_pods(server, kubectl):
    add_node(server, "n1")
    add_node(server, "n2")
    add_pod(server, "a", "n1", WORKER)
    add_pod(server, "b", "n1", WORKER)
    add_pod(server, "c", "n2", WORKER)
    result = kubectl.run("drain", "n1", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=20s")
    assert result.returncode == 0, result.stderr
    assert "node/n1 drained" in result.stdout
    assert pod_gone(server, "a") and pod_gone(server, "b") and pod_phase(server, "c") == "Running"
    assert server.store.get(NODES.plural, None, "n1")["spec"]["unschedulable"] is True
    evictions = sorted(path for m, path, _, _ in server.requests if m == "POST" and path.endswith("/eviction"))
    assert evictions == ["/api/v1/namespaces/default/pods/a/eviction", "/api/v1/namespaces/default/pods/b/eviction"]


def test_drain_reports_a_disruption_budget_refusal(kubelet, tmp_path):
    budget = DisruptionBudget("workers", "default", "ray.io/node-type=worker", min_available=2)
    with ApiServer(lifecycle=kubelet, budgets=[budget]) as server:
        kubectl = make_kubectl(bundled_kubectl(33), server, tmp_path, "drain")
        add_node(server, "n1")
        add_node(server, "n2")
        add_pod(server, "a", "n1", WORKER)
        add_pod(server, "b", "n2", WORKER)
        result = kubectl.run("drain", "n1", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=2s")
        assert result.returncode != 0
        assert "Cannot evict pod as it would violate the pod's disruption budget" in result.stderr
        assert "will retry after 5s" in result.stderr
        assert "global timeout reached: 2s" in result.stderr
        assert pod_phase(server, "a") == "Running"
        assert "deletionTimestamp" not in server.store.get(PODS.plural, "default", "a")["metadata"]


@pytest.mark.parametrize("which", ["kubectl", "dispatched_kubectl"])
def test_exec_exit_code_and_stream_separation(server, which, request):
    kubectl = request.getfixturevalue(which)
    add_node(server, "n1")
    add_pod(server, "w", "n1", WORKER)
    failed = kubectl.exec_script("w", "echo out; echo err >&2; exit 3")
    assert failed.returncode == 3, failed.stderr
    assert failed.stdout == "out\n"
    assert failed.stderr.startswith("err\n") and "command terminated with exit code 3" in failed.stderr
    ok = kubectl.exec_script("w", "printf hello", "-c", "ray")
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "hello", "")
    upgrades = [upgrade for m, path, _, upgrade in server.requests if "/exec?" in path]
    assert upgrades == ["websocket", "websocket"]
    wrong = kubectl.run("exec", "w", "-c", "nope", "--", "true")
    assert wrong.returncode != 0 and "container nope is not valid for pod w" in wrong.stderr


def test_exec_with_stdin(server, kubectl):
    add_node(server, "n1")
    add_pod(server, "w", "n1", WORKER)
    result = kubectl.run("exec", "-i", "w", "--", "sh", "-c", "read first; echo got:$first; cat; echo done >&2",
                         stdin="hello\nrest of it\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "got:hello\nrest of it\n"
    assert result.stderr == "done\n"


def test_get_watch_sees_events(server, kubectl, tmp_path):
    add_node(server, "n1")
    add_pod(server, "a", "n1", WORKER)
    proc = subprocess.Popen([kubectl.binary, "get", "pods", "-w", "--output-watch-events"],
                            env=kubectl.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    seen = threading.Condition()

    def read() -> None:
        for line in proc.stdout:
            with seen:
                lines.append(" ".join(line.split()[:2]))  # EVENT NAME (AGE dropped)
                seen.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(server, lambda: server.store.watching(PODS.plural) >= 1, "kubectl's watch to open",
                 seen=lambda: lines)
        add_pod(server, "b", "n1", WORKER)
        server.pods.delete("default", "b", 0)
        with seen:
            assert seen.wait_for(lambda: "DELETED b" in lines, 15), f"kubectl -w printed only {lines}"
        assert lines[:3] == ["EVENT NAME", "ADDED a", "ADDED b"]
        assert lines[-1] == "DELETED b"
        assert set(lines[3:-1]) == {"MODIFIED b"}  # the kubelet's Running and Ready
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        reader.join(timeout=10)


@pytest.mark.parametrize("minor", [30, 31, 32])
def test_exec_over_websocket_with_every_bundled_kubectl_from_130(server, tmp_path, minor):
    kubectl = make_kubectl(bundled_kubectl(minor), server, tmp_path, f"1{minor}")
    add_node(server, "n1")
    add_pod(server, "w", "n1", WORKER)
    result = kubectl.exec_script("w", "echo out; exit 7")
    assert (result.returncode, result.stdout) == (7, "out\n"), result.stderr
    assert [upgrade for _, path, _, upgrade in server.requests if "/exec?" in path] == ["websocket"]


@pytest.mark.parametrize("minor", [27, 28, 29])
def test_spdy_kubectl_gets_a_clean_error(server, tmp_path, minor):
    old = make_kubectl(bundled_kubectl(minor), server, tmp_path, f"1{minor}")
    add_node(server, "n1")
    add_pod(server, "w", "n1", WORKER)
    result = old.run("exec", "w", "--", "true")
    assert result.returncode != 0
    assert "SPDY/3.1 streaming is not implemented" in result.stderr
    assert [upgrade for _, path, _, upgrade in server.requests if "/exec?" in path] == ["SPDY/3.1"]
