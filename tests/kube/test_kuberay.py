"""The KubeRay-like reconciler against the emulated API server, through the official client.

Pods run as local processes (local_kubelet); the container command is the template's (the
RayCluster carries ``ray.io/overwrite-container-cmd: "true"``, so no Ray starts) and the
generated ``ray start`` command is checked in ``KUBERAY_GEN_RAY_START_CMD`` and in
``build_pod`` directly.  Waits are on the store's change condition, with a deadline.
"""

from __future__ import annotations

import re
import time

import pytest
from kubernetes import client

from chaos.embedded.kube import ApiServer, write_kubeconfig
from chaos.embedded.kube.kuberay import KubeRayReconciler, build_pod, pod_prefix
from chaos.embedded.kube.resources import NAMESPACES, NODES, PODS, RAYCLUSTERS, prepare_new
from chaos.waits import poll_until
import local_kubelet
from kube_helpers import SLEEPER, TERM_IGNORER, pod_gone, pod_ready, wait_for

HEAD_ADDRESS = "10.1.2.3"
SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]{5}"


def ready_node(server: ApiServer, name: str, labels: dict | None = None, spec: dict | None = None,
               ready: bool = True) -> dict:
    node = {"metadata": {"name": name, "labels": labels or {}}, "spec": spec or {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    return server.store.create(NODES.plural, prepare_new(NODES, node, None))


def raycluster(name: str = "rc", replicas: int = 2, command: list[str] = SLEEPER, grace: int = 30,
               worker_selector: dict | None = None) -> dict:
    def template(container: str, selector: dict | None = None) -> dict:
        return {"spec": {"containers": [{"name": container, "image": "rayproject/ray:2.58.0", "command": command}],
                         "terminationGracePeriodSeconds": grace, **({"nodeSelector": selector} if selector else {})}}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "annotations": {"ray.io/overwrite-container-cmd": "true"}},
            "spec": {"headGroupSpec": {"rayStartParams": {}, "template": template("ray-head")},
                     "workerGroupSpecs": [{"groupName": "g", "replicas": replicas, "rayStartParams": {},
                                           "template": template("ray-worker", worker_selector)}]}}


def ray_pods(server: ApiServer, cluster: str = "rc") -> list[dict]:
    items, _ = server.store.list(PODS.plural, "default")
    return [p for p in items if p["metadata"]["labels"].get("ray.io/cluster") == cluster]


def by_type(server: ApiServer, node_type: str, cluster: str = "rc") -> list[dict]:
    return [p for p in ray_pods(server, cluster) if p["metadata"]["labels"]["ray.io/node-type"] == node_type]


def names(pods: list[dict]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods)


def all_running(server: ApiServer, count: int, cluster: str = "rc") -> bool:
    pods = ray_pods(server, cluster)
    return len(pods) == count and all(p["spec"].get("nodeName") and pod_ready(server, p["metadata"]["name"])
                                      and not p["metadata"].get("deletionTimestamp") for p in pods)


def cluster_status(server: ApiServer, name: str = "rc") -> dict:
    return (server.store.get(RAYCLUSTERS.plural, "default", name) or {}).get("status", {})


def api_client(server: ApiServer, tmp_path) -> client.ApiClient:
    from kubernetes import config
    return config.new_client_from_config(config_file=str(write_kubeconfig(tmp_path / "kuberay-kubeconfig",
                                                                          server.url)))


@pytest.fixture
def operator(server, tmp_path):
    with KubeRayReconciler.from_kubeconfig(write_kubeconfig(tmp_path / "kuberay-kubeconfig", server.url),
                                           head_address=HEAD_ADDRESS) as reconciler:
        reconciler.wait_synced()
        yield reconciler


def create_cluster(server: ApiServer, tmp_path, body: dict) -> dict:
    custom = client.CustomObjectsApi(api_client(server, tmp_path))
    return custom.create_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", body)


def core(server: ApiServer, tmp_path) -> client.CoreV1Api:
    return client.CoreV1Api(api_client(server, tmp_path))


def test_raycluster_gets_head_and_workers_with_kuberay_labels_names_nodes_and_status(server, operator, kubectl,
                                                                                     tmp_path):
    for name in ("n1", "n2", "n3", "n4"):
        ready_node(server, name)
    created = create_cluster(server, tmp_path, raycluster(replicas=2))
    wait_for(server, lambda: all_running(server, 3), "head + 2 workers bound and Ready",
             seen=lambda: [(p["metadata"]["name"], p["spec"].get("nodeName"), p["status"]) for p in ray_pods(server)])
    head, = by_type(server, "head")
    workers = by_type(server, "worker")
    assert len(workers) == 2
    common = {"ray.io/is-ray-node": "yes", "ray.io/cluster": "rc", "app.kubernetes.io/name": "kuberay",
              "app.kubernetes.io/created-by": "kuberay-operator"}
    assert head["metadata"]["labels"] == {**common, "ray.io/node-type": "head", "ray.io/group": "headgroup",
                                          "ray.io/identifier": "rc-head"}
    assert re.fullmatch(f"rc-head-{SUFFIX}", head["metadata"]["name"])
    assert head["metadata"]["generateName"] == "rc-head-"
    for worker in workers:
        assert worker["metadata"]["labels"] == {**common, "ray.io/node-type": "worker", "ray.io/group": "g",
                                                "ray.io/identifier": "rc-worker"}
        assert re.fullmatch(f"rc-g-worker-{SUFFIX}", worker["metadata"]["name"])
        assert worker["metadata"]["generateName"] == "rc-g-worker-"
    nodes = [p["spec"]["nodeName"] for p in [head, *workers]]
    assert len(set(nodes)) == 3 and set(nodes) <= {"n1", "n2", "n3", "n4"}
    for pod in (head, *workers):
        assert pod["metadata"]["ownerReferences"] == [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc",
                                                       "uid": created["metadata"]["uid"], "controller": True,
                                                       "blockOwnerDeletion": True}]
        assert pod["spec"]["containers"][0]["command"] == SLEEPER  # overwrite-container-cmd: the template's
        bound = next(e.obj for e in server.store.events(PODS.plural)
                     if e.obj["metadata"]["name"] == pod["metadata"]["name"] and e.obj["spec"].get("nodeName"))
        # the binding's own write (the test kubelet later replaces the conditions with its own)
        assert bound["status"] == {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    env = {e["name"]: e["value"] for e in workers[0]["spec"]["containers"][0]["env"]}
    assert env["KUBERAY_GEN_RAY_START_CMD"].split() == [
        "ray", "start", f"--address={HEAD_ADDRESS}:6379", "--block", "--dashboard-agent-listen-port=52365",
        "--metrics-export-port=8080"]
    head_env = {e["name"]: e["value"] for e in head["spec"]["containers"][0]["env"]}
    assert head_env["KUBERAY_GEN_RAY_START_CMD"].split() == [
        "ray", "start", "--head", "--block", "--dashboard-agent-listen-port=52365", "--dashboard-host=0.0.0.0",
        "--metrics-export-port=8080"]
    wait_for(server, lambda: cluster_status(server).get("state") == "ready", "RayCluster status ready",
             seen=lambda: cluster_status(server))
    assert cluster_status(server) == {"readyWorkerReplicas": 2, "availableWorkerReplicas": 2,
                                      "desiredWorkerReplicas": 2, "state": "ready"}
    # The server stores the status before it answers the reconciler's PATCH, which the
    # reconciler then takes as "status supported": wait for that too (a race seen under load;
    # no store change follows it, so polled with a deadline).
    poll_until(lambda: (operator.status_supported is True, f"status_supported={operator.status_supported}"), 15,
               "the reconciler to see its status write succeed", interval=0.05)
    listed = kubectl.run("get", "pods", "-l", "ray.io/cluster=rc", "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert sorted(listed.stdout.split()) == [f"pod/{n}" for n in names([head, *workers])]


def test_build_pod_generates_kubeays_command_and_cuts_long_prefixes():
    cluster = {"metadata": {"name": "c" * 60, "namespace": "ns", "uid": "u"}, "spec": {}}
    group = {"groupName": "gpu", "rayStartParams": {"num-gpus": "1"},
             "template": {"spec": {"containers": [{"name": "ray", "args": ["echo hi"],
                                                   "resources": {"limits": {"cpu": "500m", "memory": "2Gi"}}}]}}}
    pod = build_pod(cluster, "worker", group, "head.example")
    assert pod["metadata"]["generateName"] == "c" * 50 + "-worker-" == pod_prefix("c" * 60, "worker", "gpu")
    assert pod["metadata"]["labels"]["ray.io/identifier"] == ("c" * 60 + "-worker")[-63:]
    ray = pod["spec"]["containers"][0]
    assert ray["command"] == ["/bin/bash", "-c", "--"]
    assert ray["args"] == [" echo hi  && ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; ray start  "
                           "--address=head.example:6379  --block  --dashboard-agent-listen-port=52365  "
                           "--memory=2147483648  --metrics-export-port=8080  --num-cpus=1  --num-gpus=1 "]
    head = build_pod({"metadata": {"name": "rc", "namespace": "ns", "uid": "u"}, "spec": {}}, "head",
                     {"rayStartParams": {"port": "6380"}, "template": {"spec": {"containers": [{"name": "h"}]}}},
                     "ignored")
    assert head["spec"]["containers"][0]["args"][0].split()[-8:] == [
        "ray", "start", "--head", "--block", "--dashboard-agent-listen-port=52365", "--dashboard-host=0.0.0.0",
        "--metrics-export-port=8080", "--port=6380"]


def test_graceful_worker_delete_is_replaced_only_after_the_object_is_gone(server, operator, tmp_path):
    for name in ("n1", "n2", "n3"):
        ready_node(server, name)
    create_cluster(server, tmp_path, raycluster(replicas=1, command=TERM_IGNORER, grace=2))
    wait_for(server, lambda: all_running(server, 2), "head + 1 worker Ready")
    old, = by_type(server, "worker")
    old_name = old["metadata"]["name"]
    since = server.store.resource_version
    started = time.monotonic()
    core(server, tmp_path).delete_namespaced_pod(old_name, "default", grace_period_seconds=2)
    wait_for(server, lambda: pod_gone(server, old_name), f"{old_name} gone after its 2 s grace", timeout=10)
    gone_after = time.monotonic() - started
    wait_for(server, lambda: all_running(server, 2), "a Ready replacement worker",
             seen=lambda: names(ray_pods(server)))
    new, = by_type(server, "worker")
    assert new["metadata"]["name"] != old_name
    assert re.fullmatch(f"rc-g-worker-{SUFFIX}", new["metadata"]["name"])
    events = [(e.type, e.obj["metadata"]["name"]) for e in server.store.events(PODS.plural, since)]
    deleted_at = events.index(("DELETED", old_name))
    added = [i for i, (kind, _) in enumerate(events) if kind == "ADDED"]
    assert added and all(i > deleted_at for i in added), events  # nothing created while it terminated
    assert events[added[0]] == ("ADDED", new["metadata"]["name"])
    assert gone_after >= 1.5  # the TERM-ignoring worker lived out its grace, counted all along
    whats = [(a.what, a.pod) for a in operator.actions]
    assert whats.index(("gone", old_name)) < whats.index(("created", new["metadata"]["name"]))


def test_force_deleted_worker_and_deleted_head_are_recreated(server, operator, kubelet, tmp_path, monkeypatch):
    monkeypatch.setattr(local_kubelet, "KUBELET_MIN_GRACE_S", 10)  # the old process outlives the replacement
    for name in ("n1", "n2", "n3"):
        ready_node(server, name)
    create_cluster(server, tmp_path, raycluster(replicas=1, command=TERM_IGNORER))
    wait_for(server, lambda: all_running(server, 2), "head + 1 worker Ready")
    api = core(server, tmp_path)
    worker, = by_type(server, "worker")
    api.delete_namespaced_pod(worker["metadata"]["name"], "default", grace_period_seconds=0)
    wait_for(server, lambda: len(by_type(server, "worker")) == 1
             and by_type(server, "worker")[0]["metadata"]["name"] != worker["metadata"]["name"],
             "a replacement for the force-deleted worker", timeout=5, seen=lambda: names(ray_pods(server)))
    # at once: the old (SIGTERM-ignoring) process still runs, until the kubelet's kill floor
    assert kubelet.procs[worker["metadata"]["uid"]].poll() is None
    head, = by_type(server, "head")
    api.delete_namespaced_pod(head["metadata"]["name"], "default", grace_period_seconds=0)
    wait_for(server, lambda: len(by_type(server, "head")) == 1
             and by_type(server, "head")[0]["metadata"]["name"] != head["metadata"]["name"], "a new head",
             seen=lambda: names(ray_pods(server)))
    wait_for(server, lambda: all_running(server, 2), "new head and worker Ready")
    new_head, = by_type(server, "head")
    assert re.fullmatch(f"rc-head-{SUFFIX}", new_head["metadata"]["name"])


def test_replacement_stays_pending_while_every_free_node_is_cordoned(server, operator, tmp_path):
    for name in ("n1", "n2", "n3"):
        ready_node(server, name)
    create_cluster(server, tmp_path, raycluster(replicas=1))
    wait_for(server, lambda: all_running(server, 2), "head + 1 worker Ready")
    api = core(server, tmp_path)
    worker, = by_type(server, "worker")
    free = sorted({"n1", "n2", "n3"} - {p["spec"]["nodeName"] for p in ray_pods(server)})
    head_node = by_type(server, "head")[0]["spec"]["nodeName"]
    for node in [worker["spec"]["nodeName"], *free]:
        api.patch_node(node, {"spec": {"unschedulable": True}})
    api.delete_namespaced_pod(worker["metadata"]["name"], "default", grace_period_seconds=0)

    def pending() -> dict | None:
        workers = by_type(server, "worker")
        if len(workers) == 1 and workers[0]["metadata"]["name"] != worker["metadata"]["name"]:
            conditions = workers[0]["status"].get("conditions", [])
            if any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions):
                return workers[0]
        return None
    wait_for(server, pending, "the replacement marked PodScheduled=False", seen=lambda: by_type(server, "worker"))
    replacement = pending()
    assert "nodeName" not in replacement["spec"] and replacement["status"]["phase"] == "Pending"
    condition, = [c for c in replacement["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["reason"] == "Unschedulable"
    assert condition["message"] == ("0/3 nodes are available: 1 node(s) already had a Ray pod, "
                                    "2 node(s) were unschedulable.")
    before = operator.reconciles
    api.patch_node(head_node, {"metadata": {"labels": {"touched": "yes"}}})  # a node event: it looks again
    assert operator.wait(lambda: '"touched"' in operator._node_shapes.get(head_node, "")
                         and operator.reconciles > before and operator.idle, 10), "no reconcile after the label"
    assert "nodeName" not in server.store.get(PODS.plural, "default", replacement["metadata"]["name"])["spec"]
    api.patch_node(free[0], {"spec": {"unschedulable": False}})
    wait_for(server, lambda: all_running(server, 2), "the replacement bound after uncordon")
    assert by_type(server, "worker")[0]["spec"]["nodeName"] == free[0]
    assert by_type(server, "worker")[0]["metadata"]["name"] == replacement["metadata"]["name"]


def test_unhealthy_tainted_not_ready_and_unselected_nodes_are_not_used(server, operator, tmp_path):
    ready_node(server, "n1-reboot", {"sagemaker.amazonaws.com/node-health-status": "UnschedulablePendingReboot"})
    ready_node(server, "n2-tainted", spec={"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]})
    ready_node(server, "n3-notready", ready=False)
    ready_node(server, "n4", {"sagemaker.amazonaws.com/node-health-status": "Schedulable"})
    ready_node(server, "n5")
    ready_node(server, "n6-gpu", {"pool": "gpu"})
    create_cluster(server, tmp_path, raycluster(replicas=1, worker_selector={"pool": "gpu"}))
    wait_for(server, lambda: all_running(server, 2), "head + 1 worker Ready")
    assert by_type(server, "head")[0]["spec"]["nodeName"] == "n4"
    assert by_type(server, "worker")[0]["spec"]["nodeName"] == "n6-gpu"


def test_failed_worker_is_replaced_and_a_deleted_cluster_loses_its_pods(server, operator, tmp_path):
    for name in ("n1", "n2", "n3"):
        ready_node(server, name)
    create_cluster(server, tmp_path, raycluster(replicas=1))
    wait_for(server, lambda: all_running(server, 2), "head + 1 worker Ready")
    worker, = by_type(server, "worker")
    server.pods.set_status("default", worker["metadata"]["name"], {"phase": "Failed"})
    wait_for(server, lambda: pod_gone(server, worker["metadata"]["name"]), "the Failed worker deleted")
    wait_for(server, lambda: all_running(server, 2), "a Ready replacement")
    assert ("deleted-finished", worker["metadata"]["name"]) in [(a.what, a.pod) for a in operator.actions]
    custom = client.CustomObjectsApi(api_client(server, tmp_path))  # the garbage collector's part
    custom.delete_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", "rc")
    wait_for(server, lambda: not ray_pods(server), "the deleted RayCluster's pods gone",
             seen=lambda: names(ray_pods(server)))


@pytest.fixture
def small_history_server(kubelet):
    with ApiServer(lifecycle=kubelet, history=40) as api:
        yield api


def test_watches_survive_a_dropped_stream_and_a_410(small_history_server, tmp_path):
    server = small_history_server
    for name in ("n1", "n2", "n3"):
        ready_node(server, name)
    with KubeRayReconciler(api_client(server, tmp_path), head_address=HEAD_ADDRESS) as operator:
        operator.wait_synced()
        create_cluster(server, tmp_path, raycluster(replicas=1))
        wait_for(server, lambda: cluster_status(server).get("state") == "ready", "status ready",
                 seen=lambda: cluster_status(server))
        resources = ("rayclusters", "pods", "nodes")
        watching = lambda: [server.store.watching(r) for r in resources]  # noqa: E731
        assert watching() == [1, 1, 1]
        listed = {r: operator.watch_stats[(r, "listed")] for r in resources}

        server.store.close_watches()  # a dropped stream: resume from the last version, no re-list
        wait_for(server, lambda: all(operator.watch_stats[(r, "ended")] == 1 for r in resources)
                 and watching() == [1, 1, 1], "all three watches resumed", seen=lambda: operator.watch_stats)
        assert {r: operator.watch_stats[(r, "listed")] for r in resources} == listed
        assert not any(operator.watch_stats[(r, "expired")] for r in resources)

        for i in range(60):  # unrelated changes push every watched version out of the history
            server.store.create(NAMESPACES.plural, prepare_new(NAMESPACES, {"metadata": {"name": f"ns{i}"}}, None))
        server.store.close_watches()
        wait_for(server, lambda: all(operator.watch_stats[(r, "expired")] == 1 for r in resources)
                 and watching() == [1, 1, 1], "410 on every resume, then a re-list and a new watch",
                 seen=lambda: operator.watch_stats)
        assert {r: operator.watch_stats[(r, "listed")] for r in resources} == {r: n + 1 for r, n in listed.items()}

        worker, = by_type(server, "worker")  # and it still acts on events
        core(server, tmp_path).delete_namespaced_pod(worker["metadata"]["name"], "default", grace_period_seconds=0)
        wait_for(server, lambda: all_running(server, 2) and by_type(server, "worker")[0]["metadata"]["name"]
                 != worker["metadata"]["name"], "a replacement after the re-list", seen=lambda: names(ray_pods(server)))
    wait_for(server, lambda: [server.store.watching(r) for r in resources] == [0, 0, 0],
             "the server to see the stopped reconciler's watches close")


def test_lowered_replicas_delete_an_extra_worker(server, operator, tmp_path):
    for name in ("n1", "n2", "n3"):
        ready_node(server, name)
    create_cluster(server, tmp_path, raycluster(replicas=2))
    wait_for(server, lambda: all_running(server, 3), "head + 2 workers Ready")
    before = names(by_type(server, "worker"))
    body = raycluster(replicas=1)
    custom = client.CustomObjectsApi(api_client(server, tmp_path))
    custom.patch_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", "rc",
                                          {"spec": {"workerGroupSpecs": body["spec"]["workerGroupSpecs"]}},
                                          _content_type="application/merge-patch+json")
    wait_for(server, lambda: all_running(server, 2) and cluster_status(server).get("desiredWorkerReplicas") == 1,
             "one worker left and desiredWorkerReplicas 1", seen=lambda: (names(ray_pods(server)),
                                                                         cluster_status(server)))
    left = names(by_type(server, "worker"))
    deleted = [a.pod for a in operator.actions if a.what == "deleted-extra"]
    assert len(left) == 1 and left[0] in before and deleted == [n for n in before if n not in left]
    assert not [a for a in operator.actions if a.what == "created" and a.pod not in before
                and a.pod.startswith("rc-g-worker-")]  # scaled down, not replaced


def test_binding_sets_the_node_once_and_refuses_bound_or_terminating_pods(tmp_path):
    with ApiServer() as server:  # NullRuntime: a bound pod is Running at once
        api = core(server, tmp_path)
        pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        api.create_namespaced_pod("default", pod)
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
        answer = api.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
        assert answer.status == 201
        stored = server.store.get(PODS.plural, "default", "p")
        assert stored["spec"]["nodeName"] == "n1" and stored["status"]["phase"] == "Running"
        with pytest.raises(client.ApiException) as again:
            api.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
        assert again.value.status == 409
        assert json_of(again.value)["message"] == ('Operation cannot be fulfilled on pods/binding "p": '
                                                   'pod p is already assigned to node "n1"')
        api.create_namespaced_pod("default", {**pod, "metadata": {"name": "q", "finalizers": ["x/keep"]}})
        api.delete_namespaced_pod("q", "default")  # unbound: grace 0, but the finalizer keeps it
        with pytest.raises(client.ApiException) as terminating:
            api.create_namespaced_pod_binding("q", "default", {**binding, "metadata": {"name": "q"}},
                                              _preload_content=False)
        assert terminating.value.status == 409 and "is being deleted" in json_of(terminating.value)["message"]


def test_status_is_skipped_when_the_server_has_no_status_subresource(monkeypatch, tmp_path):
    monkeypatch.delitem(RAYCLUSTERS.subresources, "status")
    with ApiServer() as server, KubeRayReconciler(api_client(server, tmp_path)) as operator:
        operator.wait_synced()
        for name in ("n1", "n2"):
            ready_node(server, name)
        create_cluster(server, tmp_path, raycluster(replicas=1))
        wait_for(server, lambda: all_running(server, 2), "head + worker Running under NullRuntime")
        assert operator.wait(lambda: operator.status_supported is False, 10), operator.status_supported
        assert cluster_status(server) == {}


def json_of(err: client.ApiException) -> dict:
    import json
    return json.loads(err.body)
