"""The emulated API server driven by the official ``kubernetes`` Python client."""

from __future__ import annotations

import json
import threading

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import V4_CHANNEL_PROTOCOL

from chaos.embedded.kube import ApiServer, DisruptionBudget, Rbac, Rule
from chaos.embedded.kube.resources import NODES, PODS
from kube_helpers import TERM_IGNORER, add_node, add_pod, pod_gone, wait_for

WORKER = {"ray.io/cluster": "rc", "ray.io/node-type": "worker"}


def core(server: ApiServer) -> client.CoreV1Api:
    config = client.Configuration(host=server.url, api_key={"authorization": "any-token"},
                                  api_key_prefix={"authorization": "Bearer"})
    return client.CoreV1Api(client.ApiClient(config))


def status_of(err: ApiException) -> dict:
    return json.loads(err.body)


def test_list_with_label_and_field_selectors(server):
    api = core(server)
    add_node(server, "n1")
    add_node(server, "n2")
    add_pod(server, "w1", "n1", WORKER)
    add_pod(server, "w2", "n2", WORKER)
    add_pod(server, "h", "n1", {"ray.io/cluster": "rc", "ray.io/node-type": "head"})
    pods = api.list_namespaced_pod("default", label_selector="ray.io/node-type=worker")
    assert sorted(p.metadata.name for p in pods.items) == ["w1", "w2"]
    assert int(pods.metadata.resource_version) == server.store.resource_version
    on_n1 = api.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1",
                                            label_selector="ray.io/node-type in (head)")
    assert [p.metadata.name for p in on_n1.items] == ["h"]
    assert [n.metadata.name for n in api.list_node(field_selector="metadata.name=n2").items] == ["n2"]
    with pytest.raises(ApiException) as bad:
        api.list_namespaced_pod("default", label_selector="a in (b")
    assert bad.value.status == 400


def test_watch_stream_sequence_and_resume(server, kubelet):
    api = core(server)
    add_node(server, "n1")
    start = api.list_namespaced_pod("default").metadata.resource_version
    add_pod(server, "w", "n1", WORKER, command=TERM_IGNORER, grace=1)
    api.delete_namespaced_pod("w", "default")
    wait_for(server, lambda: pod_gone(server, "w"), "pod w removed after its grace")
    seen = []
    for event in watch.Watch().stream(api.list_namespaced_pod, "default", resource_version=start,
                                      label_selector="ray.io/node-type=worker", timeout_seconds=1):
        seen.append((event["type"], event["object"].metadata.deletion_grace_period_seconds,
                     event["object"].status.phase))
    assert seen[0] == ("ADDED", None, "Pending")
    assert ("MODIFIED", 1, "Running") in seen
    assert seen[-2:] == [("MODIFIED", 0, "Running"), ("DELETED", 0, "Running")]
    middle_rv = server.store.events(PODS.plural, int(start))[2].rv
    resumed = [e["type"] for e in watch.Watch().stream(api.list_namespaced_pod, "default",
                                                        resource_version=str(middle_rv), timeout_seconds=1)]
    assert resumed == [t for t, _, _ in seen[3:]]


def test_watch_live_events_and_bookmarks(server):
    api = core(server)
    add_node(server, "n1")
    events: list[tuple[str, str | None]] = []
    arrived = threading.Condition()
    w = watch.Watch()

    def run() -> None:
        for event in w.stream(api.list_node, allow_watch_bookmarks=True, timeout_seconds=10):
            obj = event["object"]  # a BOOKMARK's object stays a dict: it is not a whole Node
            name = obj["metadata"].get("name") if isinstance(obj, dict) else obj.metadata.name
            with arrived:
                events.append((event["type"], name))
                arrived.notify_all()
            if event["type"] == "DELETED":
                w.stop()

    def wait_event(kind: str, after: str | None = None) -> None:
        """Until a ``kind`` event arrived (later than the first ``after`` event, if given)."""
        def arrived_in_order() -> bool:
            kinds = [t for t, _ in events]
            start = kinds.index(after) + 1 if after in kinds else 0 if after is None else len(kinds)
            return kind in kinds[start:]
        with arrived:
            assert arrived.wait_for(arrived_in_order, 10), f"no {kind} after {after} in {events}"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for(server, lambda: server.store.watching(NODES.plural) >= 1, "the Python watch to open")
    api.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    wait_event("BOOKMARK", after="MODIFIED")  # the server sends one every 0.3 s
    assert w.resource_version == str(server.store.resource_version)  # client >= 36 takes it from bookmarks
    api.delete_node("n1")
    wait_event("DELETED")
    thread.join(timeout=10)
    assert [e for e in events if e[0] != "BOOKMARK"] == [("ADDED", "n1"), ("MODIFIED", "n1"), ("DELETED", "n1")]


def test_watch_from_a_compacted_version_raises_410(kubelet):
    with ApiServer(lifecycle=kubelet, history=3) as server:
        api = core(server)
        for i in range(6):
            add_node(server, f"n{i}")
        with pytest.raises(ApiException) as gone:
            for _ in watch.Watch().stream(api.list_node, resource_version="2", timeout_seconds=2):
                pass
        assert gone.value.status == 410
        # a fresh list gives a version the watch can start from
        rv = api.list_node().metadata.resource_version
        api.patch_node("n0", {"spec": {"unschedulable": True}})
        events = [(e["type"], e["object"].spec.unschedulable)
                  for e in watch.Watch().stream(api.list_node, resource_version=rv, timeout_seconds=1)]
        assert events == [("MODIFIED", True)]


@pytest.mark.parametrize("protocol", [None, V4_CHANNEL_PROTOCOL])
def test_exec_stream_returncode_and_channels(server, protocol):
    api = core(server)
    add_node(server, "n1")
    add_pod(server, "w", "n1", WORKER)
    headers = {"_headers": {"sec-websocket-protocol": protocol}} if protocol else {}
    resp = stream(api.connect_get_namespaced_pod_exec, "w", "default",
                  command=["sh", "-c", "echo out; echo err >&2; exit 3"], stderr=True, stdin=False, stdout=True,
                  tty=False, _preload_content=False, **headers)
    resp.run_forever(timeout=10)
    assert resp.subprotocol == (protocol or "v5.channel.k8s.io")
    assert resp.read_stdout() == "out\n"
    assert resp.read_stderr() == "err\n"
    assert resp.returncode == 3
    ok = stream(api.connect_get_namespaced_pod_exec, "w", "default", command=["echo", "fine"], stderr=True,
                stdin=False, stdout=True, tty=False, **headers)
    assert ok == "fine\n"
    killed = stream(api.connect_get_namespaced_pod_exec, "w", "default", command=["sh", "-c", "kill -KILL $$"],
                    stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False, **headers)
    killed.run_forever(timeout=10)
    assert killed.returncode == 137  # 128 + SIGKILL, as a container runtime reports it


def test_exec_stdin_closed_over_v5(server):
    api = core(server)
    add_node(server, "n1")
    add_pod(server, "w", "n1", WORKER)
    resp = stream(api.connect_get_namespaced_pod_exec, "w", "default", command=["sh", "-c", "cat; exit 4"],
                  stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
    resp.write_stdin("line one\n")
    resp.write_stdin("line two\n")
    resp.close_channel(0)
    resp.run_forever(timeout=10)
    assert resp.read_stdout() == "line one\nline two\n"
    assert resp.returncode == 4


def test_eviction_then_budget_refusal(kubelet):
    budget = DisruptionBudget("workers", "default", "ray.io/node-type=worker", max_unavailable=1)
    with ApiServer(lifecycle=kubelet, budgets=[budget]) as server:
        api = core(server)
        add_node(server, "n1")
        add_pod(server, "a", "n1", WORKER, command=TERM_IGNORER, grace=30)
        add_pod(server, "b", "n1", WORKER)
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name="a", namespace="default"),
                                 delete_options=client.V1DeleteOptions(grace_period_seconds=1))
        api.create_namespaced_pod_eviction("a", "default", body)
        terminating = server.store.get(PODS.plural, "default", "a")
        assert terminating["metadata"]["deletionGracePeriodSeconds"] == 1
        with pytest.raises(ApiException) as refused:  # a is terminating: b is the only healthy one left
            api.create_namespaced_pod_eviction("b", "default", client.V1Eviction(
                metadata=client.V1ObjectMeta(name="b", namespace="default")))
        assert refused.value.status == 429
        body = status_of(refused.value)
        assert body["reason"] == "TooManyRequests"
        assert body["details"]["causes"][0]["message"] == \
            "The disruption budget workers needs 1 healthy pods and has 1 currently"
        wait_for(server, lambda: pod_gone(server, "a"), "evicted pod a removed")
        with pytest.raises(ApiException) as missing:
            api.create_namespaced_pod_eviction("a", "default", client.V1Eviction(
                metadata=client.V1ObjectMeta(name="a")))
        assert missing.value.status == 404
        assert status_of(missing.value)["details"] == {"kind": "pods", "name": "a"}


def test_patch_node_labels_and_cordon(server):
    api = core(server)
    add_node(server, "n1", {"keep": "yes", "gone": "soon"})
    rv = int(server.store.get(NODES.plural, None, "n1")["metadata"]["resourceVersion"])
    node = api.patch_node("n1", {"metadata": {"labels": {"sagemaker.amazonaws.com/node-health-status":
                                                         "UnschedulablePendingReplacement", "gone": None}},
                                 "spec": {"unschedulable": True,
                                          "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}})
    assert node.metadata.labels == {"keep": "yes",
                                    "sagemaker.amazonaws.com/node-health-status": "UnschedulablePendingReplacement"}
    assert node.spec.unschedulable is True and [t.key for t in node.spec.taints] == ["k"]
    assert int(node.metadata.resource_version) > rv
    same = api.patch_node("n1", {"spec": {"unschedulable": True}})
    assert same.metadata.resource_version == node.metadata.resource_version  # a no-op patch keeps the version
    with pytest.raises(ApiException) as invalid:
        api.patch_node("n1", {"metadata": {"labels": {"bad key!": "x"}}})
    assert invalid.value.status == 422 and status_of(invalid.value)["reason"] == "Invalid"


def test_delete_with_grace_zero_and_positive(server, kubelet):
    api = core(server)
    add_node(server, "n1")
    add_pod(server, "now", "n1", WORKER)
    add_pod(server, "later", "n1", WORKER, command=TERM_IGNORER, grace=30)
    api.delete_namespaced_pod("now", "default", grace_period_seconds=0)
    assert pod_gone(server, "now")
    pod = api.delete_namespaced_pod("later", "default", grace_period_seconds=1)
    assert pod.metadata.deletion_grace_period_seconds == 1 and pod.metadata.deletion_timestamp is not None
    assert api.read_namespaced_pod("later", "default").metadata.deletion_timestamp is not None
    wait_for(server, lambda: pod_gone(server, "later"), "pod later removed once SIGKILLed after 1 s")
    with pytest.raises(ApiException) as missing:
        api.read_namespaced_pod("later", "default")
    assert missing.value.status == 404
    assert status_of(missing.value)["message"] == 'pods "later" not found'


def test_create_generate_name_and_conflicts(server):
    api = core(server)
    body = {"metadata": {"generateName": "rc-g-worker-", "labels": WORKER},
            "spec": {"containers": [{"name": "ray", "image": "x"}]}}
    first = api.create_namespaced_pod("default", body)
    assert first.metadata.name.startswith("rc-g-worker-") and len(first.metadata.name) == len("rc-g-worker-") + 5
    assert first.status.phase == "Pending" and first.metadata.uid
    with pytest.raises(ApiException) as dup:
        api.create_namespaced_pod("default", {**body, "metadata": {"name": first.metadata.name}})
    assert dup.value.status == 409 and status_of(dup.value)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as no_ns:
        api.create_namespaced_pod("nowhere", body)
    assert no_ns.value.status == 404
    api.delete_namespaced_pod(first.metadata.name, "default")  # unscheduled: gone at once whatever the grace
    assert pod_gone(server, first.metadata.name)


def test_rbac_refusal_names_the_missing_permission(kubelet):
    rbac = Rbac((Rule(("get", "list", "watch"), ("pods", "nodes")),), user="system:serviceaccount:ray:harness")
    with ApiServer(lifecycle=kubelet, rbac=rbac) as server:
        api = core(server)
        add_node(server, "n1")
        add_pod(server, "w", "n1", WORKER)
        assert [p.metadata.name for p in api.list_namespaced_pod("default").items] == ["w"]
        with pytest.raises(ApiException) as denied:
            api.delete_namespaced_pod("w", "default", grace_period_seconds=0)
        assert denied.value.status == 403
        assert status_of(denied.value)["message"] == (
            'pods "w" is forbidden: User "system:serviceaccount:ray:harness" cannot delete resource "pods" '
            'in API group "" in the namespace "default"')
        with pytest.raises(ApiException) as evict:
            api.create_namespaced_pod_eviction("w", "default",
                                               client.V1Eviction(metadata=client.V1ObjectMeta(name="w")))
        assert 'cannot create resource "pods/eviction"' in status_of(evict.value)["message"]
        with pytest.raises(ApiException) as patch:
            api.patch_node("n1", {"spec": {"unschedulable": True}})
        assert status_of(patch.value)["message"].endswith('cannot patch resource "nodes" in API group "" '
                                                          'at the cluster scope')
