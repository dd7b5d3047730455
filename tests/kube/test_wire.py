"""Wire details no single client exercises: what older clients send, media types, SPDY,
status subresources, finalizers, and the server as its own process."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from chaos.embedded.kube import ApiServer, DisruptionBudget
from chaos.embedded.kube.resources import PODS
from kube_helpers import TERM_IGNORER, add_node, add_pod, pod_gone, wait_for

REPO = Path(__file__).resolve().parents[2]


def call(server: ApiServer, method: str, path: str, body: object = None, headers: dict | None = None,
         ) -> tuple[int, dict | list]:
    """One request with exactly ``headers`` (no default Content-Type); returns (HTTP status,
    decoded JSON body, or the list of watch events)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
    try:
        connection.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                           headers=headers or {})
        response = connection.getresponse()
        raw, code = response.read(), response.status
    finally:
        connection.close()
    if "watch=" in path and code == 200:
        return code, [json.loads(line) for line in raw.splitlines() if line.strip()]
    return code, json.loads(raw)


@pytest.mark.parametrize("flag", ["true", "True", "1", "t"])
def test_watch_flag_parsed_like_go_parsebool(server, flag):
    add_node(server, "n1")
    code, events = call(server, "GET", f"/api/v1/nodes?watch={flag}&timeoutSeconds=1")
    assert code == 200 and [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "n1")]


def test_selector_watch_turns_label_changes_into_added_and_deleted(server):
    add_node(server, "n1", {"pool": "ray"})
    start = server.store.resource_version
    merge = {"Content-Type": "application/merge-patch+json"}
    for labels in ({"pool": "other"}, {"pool": "ray"}, {"pool": "ray", "x": "y"}):
        code, _ = call(server, "PATCH", "/api/v1/nodes/n1", {"metadata": {"labels": labels}}, headers=merge)
        assert code == 200
    call(server, "DELETE", "/api/v1/nodes/n1")
    code, events = call(server, "GET", f"/api/v1/nodes?watch=1&labelSelector=pool%3Dray&resourceVersion={start}"
                                       "&timeoutSeconds=1")
    assert [(e["type"], e["object"]["metadata"]["labels"].get("pool")) for e in events] == [
        ("DELETED", "other"), ("ADDED", "ray"), ("MODIFIED", "ray"), ("DELETED", "ray")]
    assert [int(e["object"]["metadata"]["resourceVersion"]) for e in events] == list(range(start + 1, start + 5))


def test_two_budgets_on_one_pod_is_a_server_error(kubelet):
    budgets = [DisruptionBudget(name, "default", "app=x", min_available=0) for name in ("one", "two")]
    with ApiServer(lifecycle=kubelet, budgets=budgets) as server:
        add_node(server, "n1")
        add_pod(server, "p", "n1", {"app": "x"})
        code, status = call(server, "POST", "/api/v1/namespaces/default/pods/p/eviction", {"kind": "Eviction"})
        assert code == 500 and "more than one PodDisruptionBudget" in status["message"]


def test_invalid_booleans_and_selectors_are_400(server):
    code, body = call(server, "GET", "/api/v1/nodes?watch=yes")
    assert (code, body["reason"]) == (400, "BadRequest")
    code, body = call(server, "GET", "/api/v1/pods?labelSelector=a%3E1x")
    assert code == 400 and "integer" in body["message"]


def test_set_based_and_numeric_label_selectors(server):
    add_node(server, "n1", {"rank": "3", "zone": "a"})
    add_node(server, "n2", {"rank": "10"})
    add_node(server, "n3", {"zone": "b"})

    def selected(selector: str) -> list[str]:
        code, body = call(server, "GET", "/api/v1/nodes?labelSelector=" + urllib.request.quote(selector))
        assert code == 200, body
        return [item["metadata"]["name"] for item in body["items"]]

    assert selected("rank>5") == ["n2"]
    assert selected("rank<5,zone") == ["n1"]
    assert selected("zone notin (a)") == ["n2", "n3"]
    assert selected("!rank") == ["n3"]
    assert selected("zone in (a, b),rank") == ["n1"]


def test_protobuf_and_table_accept_get_json(server):
    add_node(server, "n1")
    code, body = call(server, "GET", "/api/v1/nodes/n1",
                      headers={"Accept": "application/vnd.kubernetes.protobuf,application/json"})
    assert code == 200 and body["kind"] == "Node"
    code, body = call(server, "GET", "/api/v1/nodes", headers={
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"})
    assert code == 200 and body["kind"] == "NodeList" and "kind" not in body["items"][0]


def test_protobuf_body_is_415(server):
    add_node(server, "n1")
    code, body = call(server, "PATCH", "/api/v1/nodes/n1", {"spec": {}},
                      headers={"Content-Type": "application/vnd.kubernetes.protobuf"})
    assert (code, body["reason"]) == (415, "UnsupportedMediaType")
    code, body = call(server, "PATCH", "/api/v1/nodes/n1", [{"op": "add", "path": "/spec/x", "value": 1}],
                      headers={"Content-Type": "application/json-patch+json"})
    assert code == 415


def test_v1beta1_eviction_without_content_type(server):
    add_node(server, "n1")
    add_pod(server, "p", "n1")
    body = {"kind": "Eviction", "apiVersion": "policy/v1beta1", "metadata": {"name": "p", "namespace": "default"}}
    code, status = call(server, "POST", "/api/v1/namespaces/default/pods/p/eviction", body)
    assert (code, status["status"], status["code"]) == (201, "Success", 201)
    wait_for(server, lambda: pod_gone(server, "p"), "evicted pod p removed")
    code, status = call(server, "POST", "/api/v1/namespaces/default/pods/q/eviction",
                        {**body, "metadata": {"name": "other"}}, headers={"Content-Type": "application/json"})
    assert code == 400 and "does not match" in status["message"]


def test_spdy_upgrade_is_400_naming_spdy(server):
    add_node(server, "n1")
    add_pod(server, "p", "n1")
    code, status = call(server, "POST", "/api/v1/namespaces/default/pods/p/exec?command=true&stdout=true",
                        headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1",
                                 "X-Stream-Protocol-Version": "v4.channel.k8s.io"})
    assert (code, status["reason"]) == (400, "BadRequest")
    assert "SPDY/3.1 streaming is not implemented" in status["message"]
    code, status = call(server, "GET", "/api/v1/namespaces/default/pods/p/exec?command=true")
    assert (code, status["message"]) == (400, "Upgrade request required")
    code, status = call(server, "GET", "/api/v1/namespaces/default/pods/nope/exec?command=true")
    assert (code, status["details"]) == (404, {"kind": "pods", "name": "nope"})


def test_status_subresource_and_stale_update(server):
    add_node(server, "n1")
    add_pod(server, "p", "n1")
    pod = server.store.get(PODS.plural, "default", "p")
    code, updated = call(server, "PATCH", "/api/v1/namespaces/default/pods/p/status",
                         {"status": {"phase": "Failed"}, "spec": {"nodeName": "elsewhere"}},
                         headers={"Content-Type": "application/merge-patch+json"})
    assert code == 200 and updated["status"]["phase"] == "Failed" and updated["spec"]["nodeName"] == "n1"
    code, updated = call(server, "PATCH", "/api/v1/namespaces/default/pods/p",
                         {"status": {"phase": "Running"}, "metadata": {"labels": {"x": "y"}}},
                         headers={"Content-Type": "application/merge-patch+json"})
    assert updated["status"]["phase"] == "Failed" and updated["metadata"]["labels"] == {"x": "y"}
    code, body = call(server, "PUT", "/api/v1/namespaces/default/pods/p", pod,
                      headers={"Content-Type": "application/json"})
    assert (code, body["reason"]) == (409, "Conflict")
    code, body = call(server, "GET", "/api/v1/namespaces/default/pods/p")
    code, replaced = call(server, "PUT", "/api/v1/namespaces/default/pods/p/status",
                          {**body, "status": {"phase": "Succeeded"}}, headers={"Content-Type": "application/json"})
    assert code == 200 and replaced["status"] == {"phase": "Succeeded"}


def test_finalizer_holds_a_terminated_pod_until_removed(server):
    add_node(server, "n1")
    add_pod(server, "p", "n1")
    code, _ = call(server, "PATCH", "/api/v1/namespaces/default/pods/p",
                   {"metadata": {"finalizers": ["chaos-mesh/records"]}},
                   headers={"Content-Type": "application/strategic-merge-patch+json"})
    assert code == 200
    code, pod = call(server, "DELETE", "/api/v1/namespaces/default/pods/p", {"gracePeriodSeconds": 1},
                     headers={"Content-Type": "application/json"})
    assert code == 200 and pod["metadata"]["deletionGracePeriodSeconds"] == 1
    wait_for(server, lambda: server.store.get(PODS.plural, "default", "p")["metadata"]["deletionGracePeriodSeconds"]
             == 0, "the kubelet to report pod p's containers gone")
    assert not pod_gone(server, "p")
    code, _ = call(server, "PATCH", "/api/v1/namespaces/default/pods/p",
                   {"metadata": {"$deleteFromPrimitiveList/finalizers": ["chaos-mesh/records"]}},
                   headers={"Content-Type": "application/strategic-merge-patch+json"})
    assert code == 200 and pod_gone(server, "p")


def test_unknown_paths_and_verbs(server):
    code, body = call(server, "GET", "/api/v1/widgets")
    assert (code, body["kind"], body["reason"]) == (404, "Status", "NotFound")
    code, body = call(server, "DELETE", "/api/v1/namespaces/default")
    assert (code, body["reason"]) == (405, "MethodNotAllowed")
    code, body = call(server, "DELETE", "/api/v1/namespaces/default/pods/p/status")
    assert (code, body["reason"]) == (405, "MethodNotAllowed")  # a subresource has its own verbs
    code, body = call(server, "GET", "/apis/policy/v1")
    assert code == 200 and body["groupVersion"] == "policy/v1"
    code, body = call(server, "GET", "/api/v1")
    eviction = next(r for r in body["resources"] if r["name"] == "pods/eviction")
    assert (eviction["group"], eviction["version"], eviction["verbs"]) == ("policy", "v1", ["create"])


def test_server_runs_as_its_own_process(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "chaos.embedded.kube", "--kubeconfig", str(kubeconfig)],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(proc.stdout.readline())
        assert started["pid"] == proc.pid
        with urllib.request.urlopen(started["url"] + "/version", timeout=10) as response:
            assert json.loads(response.read())["minor"] == "33"
        assert started["url"] in kubeconfig.read_text()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_a_later_delete_only_shortens_the_grace(server):
    add_node(server, "n1")
    add_pod(server, "p", "n1", command=TERM_IGNORER, grace=30)
    json_body = {"Content-Type": "application/json"}
    path = "/api/v1/namespaces/default/pods/p"
    code, first = call(server, "DELETE", path, {}, headers=json_body)
    assert code == 200 and first["metadata"]["deletionGracePeriodSeconds"] == 30
    code, same = call(server, "DELETE", path + "?gracePeriodSeconds=60")
    assert same["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]  # longer: pending, unchanged
    code, shorter = call(server, "DELETE", path, {"gracePeriodSeconds": -5}, headers=json_body)
    assert shorter["metadata"]["deletionGracePeriodSeconds"] == 1  # negative counts as 1
    assert shorter["metadata"]["deletionTimestamp"] < first["metadata"]["deletionTimestamp"]
    code, status = call(server, "DELETE", path, {"preconditions": {"uid": "not-this-pod"}}, headers=json_body)
    assert (code, status["reason"]) == (409, "Conflict")
    assert "the UID in the precondition (not-this-pod) does not match the UID in record" in status["message"]
    wait_for(server, lambda: pod_gone(server, "p"), "pod p removed once SIGKILLed after its 1 s grace")


def test_null_runtime_runs_bound_pods_instantly_and_refuses_exec():
    with ApiServer() as server:
        pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}}
        code, created = call(server, "POST", "/api/v1/namespaces/default/pods", pod,
                             headers={"Content-Type": "application/json"})
        assert code == 201
        code, running = call(server, "GET", "/api/v1/namespaces/default/pods/p")
        assert running["status"] == {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        code, status = call(server, "GET", "/api/v1/namespaces/default/pods/p/exec?command=true",
                            headers={"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                                     "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                                     "Sec-WebSocket-Protocol": "v5.channel.k8s.io"})
        assert code == 400 and "no container runtime" in status["message"]
        code, _ = call(server, "DELETE", "/api/v1/namespaces/default/pods/p")
        assert code == 200 and pod_gone(server, "p")
        assert [e.type for e in server.store.events(PODS.plural, int(created["metadata"]["resourceVersion"]))] == \
            ["MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]  # Running, deletion (30 s), containers gone, removed
