"""A KubeRay-like RayCluster reconciler (and the one-Ray-pod-per-node scheduler it needs).

Like the real operator this is a *client* of the API server: it talks to it only through the
official ``kubernetes`` Python client (an ``ApiClient`` pointed at the emulated server).  It
list-watches ``ray.io/v1`` ``rayclusters``, Ray pods (``ray.io/is-ray-node=yes``) and nodes;
each watch resumes from the last resource version it saw, re-lists on a 410 Expired and
re-watches when the stream ends or drops.  Events only say *which* cluster to look at: a
reconcile reads the cluster and its pods afresh (``ray.io/cluster=<name>``), so a pod it just
created is never created twice.  Nothing runs on a timer except the requeue of a failed
reconcile (2 s, KubeRay's ``DefaultRequeueDuration``).

What KubeRay v1.7 does and this does too (shared notes, kubernetes.md §3):

* one head and ``replicas`` workers per group, with KubeRay's labels, ``generateName``
  ``<cluster>-head-`` / ``<cluster>-<group>-worker-`` (prefix cut to 50), an owner reference
  to the RayCluster and the generated ``ray start`` command (``BuildPod``);
* pods with a ``deletionTimestamp`` still count, so a gracefully deleted worker is replaced
  only once its object is gone; a force-deleted one at the next reconcile; Failed/Succeeded
  pods are deleted first and replaced on a later reconcile; a missing head is recreated;
* ``status`` (ready/available/desired worker replicas, ``state: ready``) through the
  ``rayclusters/status`` subresource.

What Kubernetes would do and the emulated server does not, done here instead: scheduling
(bind each new pod through ``pods/<p>/binding`` to a Ready, schedulable node carrying no
other Ray pod; none free → Pending with ``PodScheduled=False``/``Unschedulable`` until a node
frees) and garbage collection of the pods of a deleted RayCluster.  Every action is logged
(logger ``chaos.embedded.kube.kuberay``) with pod names, and kept in ``actions``.
"""

from __future__ import annotations

import collections
import copy
import json
import logging
import math
import re
import string
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from chaos import hyperpod

log = logging.getLogger("chaos.embedded.kube.kuberay")

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"
# KubeRay v1.7 label keys and values (ray-operator/controllers/ray/utils/constant.go).
RAY_NODE = "ray.io/is-ray-node"
CLUSTER = "ray.io/cluster"
NODE_TYPE = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
IDENTIFIER = "ray.io/identifier"
APP_NAME = "app.kubernetes.io/name"
CREATED_BY = "app.kubernetes.io/created-by"
HEAD_GROUP = "headgroup"
OVERWRITE_CMD = "ray.io/overwrite-container-cmd"
GEN_CMD_ENV = "KUBERAY_GEN_RAY_START_CMD"
HYPERPOD_HEALTH = hyperpod.HEALTH_LABEL
DEFAULT_REQUEUE_S = 2.0  # KubeRay's DefaultRequeueDuration
_MAX_PREFIX = 50  # utils.PodName: 63 - len("-worker-") - 5 generated chars


@dataclass(frozen=True)
class Action:
    """One thing the reconciler did or saw, in order (``actions``): for reports of pod names."""

    at: float  # time.monotonic()
    cluster: str  # namespace/name
    what: str  # created, bound, unschedulable, deleted-finished, deleted-extra, gone, status
    pod: str
    detail: str = ""


# --- what KubeRay's BuildPod generates -------------------------------------------------------

def pod_prefix(cluster: str, node_type: str, group: str | None = None) -> str:
    """``utils.PodName(prefix, nodeType, true)``: the ``generateName`` of a head or worker pod."""
    prefix = cluster if node_type == "head" else f"{cluster}-{group}"
    return f"{prefix[:_MAX_PREFIX]}-{node_type}-".lower()


def _check_label(value: str) -> str:
    """``utils.CheckLabel``: keep the last 63 characters, no leading punctuation."""
    value = value[-63:]
    return "r" + value[1:] if value and value[0] in string.punctuation else value


def ray_labels(cluster: str, node_type: str, group: str, template_labels: dict | None) -> dict:
    """``labelPod``: KubeRay's labels; the template may add others but not override type/group/cluster."""
    labels = {RAY_NODE: "yes", CLUSTER: cluster, NODE_TYPE: node_type, GROUP_LABEL: group,
              IDENTIFIER: _check_label(f"{cluster}-{node_type}"), APP_NAME: "kuberay",
              CREATED_BY: "kuberay-operator"}
    for key, value in (template_labels or {}).items():
        if key not in (NODE_TYPE, GROUP_LABEL, CLUSTER):
            labels[key] = value
    return labels


_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": 1e-3}


def quantity_value(quantity: Any) -> int:
    """A resource quantity as ``resource.Quantity.Value()`` gives it: rounded up to an integer."""
    text = str(quantity).strip()
    match = re.fullmatch(r"([0-9.eE+-]+?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?", text)
    if not match:
        raise ValueError(f"not a resource quantity: {quantity!r}")
    return math.ceil(float(match.group(1)) * _SUFFIXES.get(match.group(2) or "", 1) - 1e-9)


def _param_map(params: dict) -> str:
    """``convertParamMap``: flags sorted by name, ``true`` as a bare flag, ``false`` dropped."""
    out = ""
    for option in sorted(params):
        value = str(params[option])
        if value.lower() in ("true", "false") and option not in ("log-color", "include-dashboard",
                                                               "include-log-monitor"):
            if value.lower() == "true":
                out += f" --{option} "
        else:
            out += f" --{option}={value} "
    return out


def ray_start_command(node_type: str, params: dict, resources: dict | None, head_address: str,
                      head_port: str = "6379") -> str:
    """``setMissingRayStartParams`` + ``generateRayStartCommand`` (KubeRay v1.7), spacing included."""
    params = {k: str(v) for k, v in (params or {}).items()}
    if node_type == "worker":
        params.setdefault("address", f"{head_address}:{head_port}")
    else:
        params.setdefault("dashboard-host", "0.0.0.0")
    params.setdefault("metrics-export-port", "8080")
    params["block"] = "true"
    params.setdefault("dashboard-agent-listen-port", "52365")
    limits, requests = (resources or {}).get("limits") or {}, (resources or {}).get("requests") or {}
    if "num-cpus" not in params:
        cpu = limits.get("cpu") or requests.get("cpu")
        if cpu and quantity_value(cpu):
            params["num-cpus"] = str(quantity_value(cpu))
    if "memory" not in params and limits.get("memory") and quantity_value(limits["memory"]):
        params["memory"] = str(quantity_value(limits["memory"]))
    if "num-gpus" not in params:
        for key, value in limits.items():
            if key.endswith("gpu") and quantity_value(value):
                params["num-gpus"] = str(quantity_value(value))
                break
    return f"ray start --head {_param_map(params)}" if node_type == "head" else f"ray start {_param_map(params)}"


def build_pod(cluster: dict, node_type: str, group_spec: dict, head_address: str) -> dict:
    """The pod KubeRay's ``BuildPod`` makes for the head group or a worker group (no probes,
    init containers or volumes: the emulated kubelet runs none of them)."""
    meta = cluster["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    template = copy.deepcopy(group_spec.get("template") or {})
    template_meta, spec = template.get("metadata") or {}, template.get("spec") or {}
    group = HEAD_GROUP if node_type == "head" else group_spec["groupName"]
    annotations = dict(template_meta.get("annotations") or {})
    if str((meta.get("annotations") or {}).get(OVERWRITE_CMD, "")).lower() == "true":
        annotations[OVERWRITE_CMD] = "true"  # initTemplateAnnotations
    params = dict(group_spec.get("rayStartParams") or {})
    head_port = str(params.get("port", "6379")) if node_type == "head" else \
        str(((cluster["spec"].get("headGroupSpec") or {}).get("rayStartParams") or {}).get("port", "6379"))
    containers = spec.get("containers") or [{"name": "ray-head" if node_type == "head" else "ray-worker"}]
    ray = containers[0]
    command = ray_start_command(node_type, params, ray.get("resources"), head_address, head_port)
    user = "".join(f" {part} " for part in (ray.get("command") or []) + (ray.get("args") or []))
    if annotations.get(OVERWRITE_CMD, "").lower() != "true" and "ray start" not in user:
        generated = f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {command}"
        ray["command"] = ["/bin/bash", "-c", "--"]
        ray["args"] = [f"{user} && {generated}" if user else generated]
    env = [e for e in ray.get("env") or [] if e.get("name") != GEN_CMD_ENV]
    env.append({"name": GEN_CMD_ENV, "value": command})
    if not any(e.get("name") == "RAY_PORT" for e in env):
        env.append({"name": "RAY_PORT", "value": head_port})
    ray["env"] = env
    spec["containers"] = containers
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": pod_prefix(name, node_type, group), "namespace": namespace,
                         "labels": ray_labels(name, node_type, group, template_meta.get("labels")),
                         "annotations": annotations,
                         "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "RayCluster",
                                              "name": name, "uid": meta["uid"], "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": spec}


# --- scheduling: one Ray pod per Ready, schedulable node --------------------------------------

def _tolerated(taint: dict, tolerations: Iterable[dict]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol["key"] == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def node_unfit(node: dict, pod: dict) -> str | None:
    """Why ``pod`` may not go to ``node`` (scheduler-like wording), or None if it may."""
    labels = node["metadata"].get("labels") or {}
    spec, status = node.get("spec") or {}, node.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    if not ready:
        return "node(s) were not ready"
    if spec.get("unschedulable"):
        return "node(s) were unschedulable"
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, tolerations):
            return "node(s) had untolerated taint(s)"
    if labels.get(HYPERPOD_HEALTH, "Schedulable") != "Schedulable":
        return f"node(s) were {HYPERPOD_HEALTH}!=Schedulable"
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return "node(s) didn't match Pod's node affinity/selector"
    return None


def _finished(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _running_ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


class _Expired(Exception):
    """A watch answered 410 Expired: re-list."""


class KubeRayReconciler:
    """``with KubeRayReconciler(api_client): ...`` — reconciles RayClusters until stopped.

    ``head_address``: the host workers' ``ray start --address`` points at — a string, or a
    callable given the RayCluster object; default KubeRay's head Service FQDN
    ``<cluster>-head-svc.<ns>.svc.cluster.local`` (there is no Service DNS in the emulator).
    ``namespace``: watch one namespace (default: all).  ``watch_timeout_s`` is the server-side
    ``timeoutSeconds`` of each watch, after which it is resumed; ``bookmarks`` asks for BOOKMARK
    events (they advance the resume version, as client-go reflectors do).
    """

    def __init__(self, api_client: client.ApiClient, *, namespace: str | None = None,
                 head_address: str | Callable[[dict], str] | None = None,
                 requeue_s: float = DEFAULT_REQUEUE_S, watch_timeout_s: int = 300, bookmarks: bool = True):
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace, self.head_address = namespace, head_address
        self.requeue_s, self.watch_timeout_s, self.bookmarks = requeue_s, watch_timeout_s, bookmarks
        self.request_timeout_s = 30.0  # every request but the watches
        self.actions: list[Action] = []
        # per resource: "listed", "expired" (410 → re-list), "ended" (stream closed → re-watch), "error"
        self.watch_stats: collections.Counter[tuple[str, str]] = collections.Counter()
        self.status_supported: bool | None = None  # None until the first status write
        self.reconciles = 0
        self._clusters: set[tuple[str, str]] = set()
        self._node_shapes: dict[str, str] = {}
        self._cond = threading.Condition()
        self._queue: dict[tuple[str, str], float] = {}  # key -> due (monotonic)
        self._stopping = threading.Event()
        self._responses: set[Any] = set()
        self._threads: list[threading.Thread] = []
        self._synced: set[str] = set()
        self._busy = False

    @classmethod
    def from_kubeconfig(cls, path: str | Path, **options: Any) -> "KubeRayReconciler":
        return cls(config.new_client_from_config(config_file=str(path)), **options)

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> "KubeRayReconciler":
        for resource in (PLURAL, "pods", "nodes"):
            self._threads.append(threading.Thread(target=self._watch_loop, args=(resource,),
                                                  name=f"kuberay-watch-{resource}", daemon=True))
        self._threads.append(threading.Thread(target=self._work_loop, name="kuberay-worker", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping.set()
            responses = list(self._responses)
            self._cond.notify_all()
        for resp in responses:
            self._shutdown(resp)
        for thread in self._threads:
            thread.join(timeout=10)
            if thread.is_alive():
                log.error("kuberay: thread %s did not stop within 10 s", thread.name)
        self._threads = []

    def __enter__(self) -> "KubeRayReconciler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def idle(self) -> bool:
        """Nothing queued (requeues included) and no reconcile running."""
        with self._cond:
            return not self._queue and not self._busy

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` holds, re-checked after every reconcile; False on timeout."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def wait_synced(self, timeout: float = 10.0) -> None:
        """Block until all three watches have listed once (so a test's next change is seen)."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._synced) == 3 or self._stopping.is_set(), timeout):
                raise TimeoutError(f"kuberay: waited {timeout}s for the initial lists; listed {sorted(self._synced)}")

    # --- watches ---------------------------------------------------------------------------------

    def _list_call(self, resource: str) -> Callable[..., Any]:
        if resource == PLURAL:
            if self.namespace:
                return lambda **kw: self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                              PLURAL, **kw)
            return lambda **kw: self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kw)
        if resource == "pods":
            if self.namespace:
                return lambda **kw: self.core.list_namespaced_pod(self.namespace, label_selector=f"{RAY_NODE}=yes",
                                                                  **kw)
            return lambda **kw: self.core.list_pod_for_all_namespaces(label_selector=f"{RAY_NODE}=yes", **kw)
        return self.core.list_node

    def _watch_loop(self, resource: str) -> None:
        call, rv = self._list_call(resource), None
        while not self._stopping.is_set():
            try:
                if rv is None:
                    listing = json.loads(call(_preload_content=False, _request_timeout=self.request_timeout_s).data)
                    rv = listing["metadata"]["resourceVersion"]
                    self.watch_stats[(resource, "listed")] += 1
                    self._on_list(resource, listing["items"])
                    with self._cond:
                        self._synced.add(resource)
                        self._cond.notify_all()
                rv = self._watch(resource, call, rv)
                if not self._stopping.is_set():
                    self.watch_stats[(resource, "ended")] += 1
                    log.info("kuberay: %s watch ended at resourceVersion %s; watching again from it", resource, rv)
            except _Expired as err:
                self.watch_stats[(resource, "expired")] += 1
                log.info("kuberay: %s watch from resourceVersion %s expired (%s); listing again", resource, rv, err)
                rv = None
            except Exception as err:  # the server went away, a dropped connection, a bad answer
                if self._stopping.is_set():
                    return
                self.watch_stats[(resource, "error")] += 1
                log.warning("kuberay: %s list/watch failed (%s: %s); retrying in %.1fs from resourceVersion %s",
                            resource, type(err).__name__, err, self.requeue_s, rv)
                self._stopping.wait(self.requeue_s)

    def _watch(self, resource: str, call: Callable[..., Any], rv: str) -> str:
        resp = call(watch=True, resource_version=rv, allow_watch_bookmarks=self.bookmarks or None,
                    timeout_seconds=self.watch_timeout_s, _preload_content=False)
        with self._cond:
            if self._stopping.is_set():
                self._shutdown(resp)
                return rv
            self._responses.add(resp)
        try:
            for line in iter_resp_lines(resp):
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event["type"] == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired(obj.get("message", "Expired"))
                    raise ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
                rv = obj["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    self._on_event(resource, event["type"], obj)
        finally:
            with self._cond:
                self._responses.discard(resp)
            resp.close()
            resp.release_conn()
        return rv

    @staticmethod
    def _shutdown(resp: Any) -> None:
        try:
            resp.shutdown()  # urllib3 ≥ 2.3: unblocks a read in progress on another thread
        except Exception:  # noqa: BLE001 - already closed
            pass

    def _on_list(self, resource: str, items: list[dict]) -> None:
        if resource == PLURAL:
            keys = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in items}
            with self._cond:
                vanished = self._clusters - keys
                self._clusters = set(keys)
            for key in keys | vanished:
                self.enqueue(key)
        elif resource == "nodes":
            self._node_shapes = {n["metadata"]["name"]: self._node_shape(n) for n in items}
            self._enqueue_all()
        else:
            for pod in items:
                self._on_event("pods", "ADDED", pod)

    def _on_event(self, resource: str, kind: str, obj: dict) -> None:
        meta = obj["metadata"]
        if resource == PLURAL:
            key = (meta["namespace"], meta["name"])
            with self._cond:
                (self._clusters.discard if kind == "DELETED" else self._clusters.add)(key)
            self.enqueue(key)
        elif resource == "pods":
            cluster = (meta.get("labels") or {}).get(CLUSTER)
            if kind == "DELETED":
                self._record(f"{meta['namespace']}/{cluster}", "gone", meta["name"],
                             f"node {obj['spec'].get('nodeName') or '-'}")
                self._enqueue_all()  # its node may be free for another cluster's pending pod
            elif cluster:
                self.enqueue((meta["namespace"], cluster))
        else:
            shape = self._node_shape(obj) if kind != "DELETED" else None
            if self._node_shapes.get(meta["name"]) != shape:
                self._enqueue_all()  # first: once the new shape is visible, the reconcile is queued
                if shape is None:
                    self._node_shapes.pop(meta["name"], None)
                else:
                    self._node_shapes[meta["name"]] = shape

    @staticmethod
    def _node_shape(node: dict) -> str:
        """What of a node matters to scheduling (heartbeats and other status changes do not)."""
        status = node.get("status") or {}
        ready = [c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"]
        return json.dumps([node["metadata"].get("labels"), (node.get("spec") or {}).get("unschedulable"),
                           (node.get("spec") or {}).get("taints"), ready], sort_keys=True)

    # --- the work queue --------------------------------------------------------------------------

    def enqueue(self, key: tuple[str, str], delay: float = 0.0) -> None:
        due = time.monotonic() + delay
        with self._cond:
            self._queue[key] = min(self._queue.get(key, due), due)
            self._cond.notify_all()

    def _enqueue_all(self) -> None:
        with self._cond:
            keys = list(self._clusters)
        for key in keys:
            self.enqueue(key)

    def _next(self) -> tuple[str, str] | None:
        with self._cond:
            while not self._stopping.is_set():
                now = time.monotonic()
                if self._queue:
                    key, due = min(self._queue.items(), key=lambda kv: kv[1])
                    if due <= now:
                        del self._queue[key]
                        self._busy = True
                        self.reconciles += 1
                        return key
                    self._cond.wait(due - now)  # the requeue timer: the only timed wait
                else:
                    self._cond.wait()
            return None

    def _work_loop(self) -> None:
        while (key := self._next()) is not None:
            try:
                requeue = self.reconcile(*key)
            except Exception as err:  # noqa: BLE001 - requeued, as controller-runtime does
                if self._stopping.is_set():
                    return
                log.warning("kuberay: reconcile of %s/%s failed (%s: %s); requeue in %.1fs",
                            key[0], key[1], type(err).__name__, err, self.requeue_s)
                requeue = True
            if requeue:
                self.enqueue(key, self.requeue_s)
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    # --- API calls -------------------------------------------------------------------------------

    def _json(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
        """One request (not a watch), its JSON answer as a dict; bounded so ``stop()`` cannot hang."""
        return json.loads(call(*args, _preload_content=False, _request_timeout=self.request_timeout_s,
                               **kwargs).data)

    def _record(self, cluster: str, what: str, pod: str, detail: str = "") -> None:
        self.actions.append(Action(time.monotonic(), cluster, what, pod, detail))
        if pod == "-":
            log.info("kuberay: %s: %s %s", cluster, what, detail)
        else:
            log.info("kuberay: %s: %s pod %s%s", cluster, what, pod, f" ({detail})" if detail else "")

    def _address(self, cluster: dict) -> str:
        if callable(self.head_address):
            return self.head_address(cluster)
        if self.head_address:
            return self.head_address
        meta = cluster["metadata"]
        service = ((cluster["spec"].get("headGroupSpec") or {}).get("headService") or {}).get("metadata", {}) \
            .get("name") or f"{meta['name']}-head-svc"
        return f"{service}.{meta['namespace']}.svc.cluster.local"

    # --- one reconcile -----------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> bool:
        """Bring one RayCluster's pods to its spec; True asks for a requeue."""
        ref = f"{namespace}/{name}"
        try:
            cluster = self._json(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as err:
            if err.status != 404:
                raise
            self._collect_garbage(namespace, name)
            return False
        pods = self._cluster_pods(namespace, name)
        finished = [p for p in pods if _finished(p) and not p["metadata"].get("deletionTimestamp")]
        for pod in finished:  # shouldDeletePod: a finished pod never restarts; replace on a later pass
            self._delete(pod, ref, "deleted-finished", f"phase {pod['status']['phase']}")
        if finished:
            return True
        spec = cluster.get("spec") or {}
        heads = [p for p in pods if p["metadata"]["labels"].get(NODE_TYPE) == "head"]
        if not heads:
            self._create(cluster, "head", spec.get("headGroupSpec") or {}, ref)
        for group in spec.get("workerGroupSpecs") or []:
            members = [p for p in pods if p["metadata"]["labels"].get(NODE_TYPE) == "worker"
                       and p["metadata"]["labels"].get(GROUP_LABEL) == group["groupName"]]
            desired = 0 if group.get("suspend") else int(group.get("replicas", 1) or 0)
            for _ in range(desired - len(members)):  # terminating pods still count (kept in ``members``)
                self._create(cluster, "worker", group, ref)
            # KubeRay (no autoscaler): delete the first ``len - desired`` pods in list order; a
            # terminating one among them is already on its way (its delete would change nothing)
            for pod in members[:max(len(members) - desired, 0)]:
                if not pod["metadata"].get("deletionTimestamp"):
                    self._delete(pod, ref, "deleted-extra", f"group {group['groupName']} wants {desired}")
        self._schedule(namespace, name, ref)
        self._update_status(cluster, ref)
        return False

    def _cluster_pods(self, namespace: str, name: str) -> list[dict]:
        return self._json(self.core.list_namespaced_pod, namespace, label_selector=f"{CLUSTER}={name}")["items"]

    def _create(self, cluster: dict, node_type: str, group_spec: dict, ref: str) -> None:
        body = build_pod(cluster, node_type, group_spec, self._address(cluster))
        pod = self._json(self.core.create_namespaced_pod, cluster["metadata"]["namespace"], body)
        group = body["metadata"]["labels"][GROUP_LABEL]
        self._record(ref, "created", pod["metadata"]["name"], f"{node_type}, group {group}")

    def _delete(self, pod: dict, ref: str, what: str, why: str) -> None:
        meta = pod["metadata"]
        try:
            self._json(self.core.delete_namespaced_pod, meta["name"], meta["namespace"])
        except ApiException as err:
            if err.status != 404:
                raise
        self._record(ref, what, meta["name"], why)

    def _collect_garbage(self, namespace: str, name: str) -> None:
        """The RayCluster is gone: delete the pods it owned (Kubernetes' garbage collector would)."""
        for pod in self._cluster_pods(namespace, name):
            owners = pod["metadata"].get("ownerReferences") or []
            if any(o.get("kind") == "RayCluster" and o.get("name") == name for o in owners) \
                    and not pod["metadata"].get("deletionTimestamp"):
                self._delete(pod, f"{namespace}/{name}", "deleted-orphan", "RayCluster gone")

    def _schedule(self, namespace: str, name: str, ref: str) -> None:
        """Bind this cluster's unbound pods (head first, then oldest) to free, fitting nodes."""
        ray_pods = self._json(self.core.list_pod_for_all_namespaces, label_selector=f"{RAY_NODE}=yes")["items"]
        pending = [p for p in ray_pods if p["metadata"]["namespace"] == namespace
                   and p["metadata"]["labels"].get(CLUSTER) == name and not p["spec"].get("nodeName")
                   and not p["metadata"].get("deletionTimestamp") and not _finished(p)]
        if not pending:
            return
        occupied = {p["spec"]["nodeName"] for p in ray_pods if p["spec"].get("nodeName") and not _finished(p)}
        nodes = sorted(self._json(self.core.list_node)["items"], key=lambda n: n["metadata"]["name"])
        pending.sort(key=lambda p: (p["metadata"]["labels"].get(NODE_TYPE) != "head",
                                    p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
        for pod in pending:
            pname = pod["metadata"]["name"]
            reasons: collections.Counter[str] = collections.Counter()
            chosen = None
            for node in nodes:
                why = "node(s) already had a Ray pod" if node["metadata"]["name"] in occupied else node_unfit(node, pod)
                if why is None:
                    chosen = node["metadata"]["name"]
                    break
                reasons[why] += 1
            if chosen is not None:
                body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pname, "namespace": namespace},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": chosen}}
                try:
                    self.core.create_namespaced_pod_binding(pname, namespace, body, _preload_content=False,
                                                            _request_timeout=self.request_timeout_s)
                except ApiException as err:
                    if err.status not in (404, 409):  # gone, or deleted/bound meanwhile
                        raise
                    continue
                occupied.add(chosen)
                self._record(ref, "bound", pname, f"node {chosen}")
                continue
            message = f"0/{len(nodes)} nodes are available: " + ", ".join(
                f"{count} {why}" for why, count in sorted(reasons.items())) + "."
            condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            current = [c for c in pod["status"].get("conditions") or [] if c.get("type") == "PodScheduled"]
            if current and {k: current[0].get(k) for k in condition} == condition:
                continue
            try:
                self._json(self.core.patch_namespaced_pod_status, pname, namespace,
                           {"status": {"conditions": [condition]}},
                           _content_type="application/strategic-merge-patch+json")
            except ApiException as err:
                if err.status != 404:
                    raise
                continue
            self._record(ref, "unschedulable", pname, message)

    def _update_status(self, cluster: dict, ref: str) -> None:
        if self.status_supported is False:
            return
        meta, spec = cluster["metadata"], cluster.get("spec") or {}
        pods = self._cluster_pods(meta["namespace"], meta["name"])
        workers = [p for p in pods if p["metadata"]["labels"].get(NODE_TYPE) == "worker"]
        desired = sum(0 if g.get("suspend") else int(g.get("replicas", 1) or 0)
                      for g in spec.get("workerGroupSpecs") or [])
        status = {"readyWorkerReplicas": sum(1 for p in workers if _running_ready(p)),
                  "availableWorkerReplicas": sum(1 for p in workers if p["status"].get("phase") == "Running"),
                  "desiredWorkerReplicas": desired}
        old = cluster.get("status") or {}
        if len(pods) == desired + 1 and all(_running_ready(p) for p in pods):
            status["state"] = "ready"
        elif old.get("state"):
            status["state"] = old["state"]  # KubeRay leaves the state as it was until it has a reason
        if all(old.get(k) == v for k, v in status.items()):
            return
        try:
            self._json(self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, meta["namespace"],
                       PLURAL, meta["name"], {"status": status}, _content_type="application/merge-patch+json")
        except ApiException as err:
            if err.status == 404 and self._exists(meta["namespace"], meta["name"]):
                self.status_supported = False
                log.warning("kuberay: the server has no rayclusters/status subresource; status is not written")
                return
            if err.status in (404, 409):  # gone, or changed meanwhile: the next event reconciles again
                return
            raise
        self.status_supported = True
        self._record(ref, "status", "-", json.dumps(status, sort_keys=True))

    def _exists(self, namespace: str, name: str) -> bool:
        try:
            self._json(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
            return True
        except ApiException:
            return False
