"""Faults through the Kubernetes API, aimed at the pod that runs the Ray node hosting a
rank (live placement → ``backend.pod_of`` → pod → its Kubernetes node):

- ``pod-delete``: the pod deleted with grace 0 — a worker failure (``max_failures``).
- ``pod-delete-graceful`` / ``pod-evict``: deleted with the pod's own grace (or a given
  one), or evicted through policy/v1 (a disruption budget's 429 is refused by name, or
  retried until a deadline).  The kubelet SIGTERMs ``ray start --block``, which on Ray ≥
  2.57 drains the node as PREEMPTION for ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``, and
  SIGKILLs it when the grace runs out.
- ``drain``: ``kubectl drain`` — cordon, then evict every pod on the node (DaemonSet and
  mirror pods skipped, 429s retried until a deadline); reverted by uncordoning.
- ``hyperpod-reboot`` / ``node-replace``: SageMaker HyperPod's node recovery, started by
  the node-health label or by boto3 ``BatchReboot/ReplaceClusterNodes``; after detection
  the node must come back (a new boot id) or be replaced (a new Node object).

Budgets, as ``preempt via=sigterm`` does it: the graceful kinds expect the preemption
budget and are refused on a Ray that would charge ``max_failures`` (< 2.58) or that does
not drain on SIGTERM (window ≤ 0); the ``preemption_notice`` deadline is the earlier of
the pod's grace and Ray's window.  Measured on Ray 2.60 (docs/verdicts.md): a SIGKILL inside
Ray's window is charged to ``max_failures`` — the harness reports that as a wrong budget
class, and the evidence says whether the grace ended inside the window.

What a fault arms on a node (a cordon, a health label) is marked with the annotation
``chaos.ray.io/fault: <kind>:<Ray node id>`` in the same patch, so the ledger's plan —
written before the node is even known — lets ``ray-chaos sweep`` find and undo it.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Callable, TypeVar

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from chaos.cluster import Target
from chaos.errors import InjectionError, WaitTimeout
from chaos.faults.base import Fault, FaultContext, Injection, placement_target
from chaos.faults.preempt import RAY_DEFAULT_DRAIN_WINDOW_S, emit_notice, require_preemption_budget
from chaos.hyperpod import HEALTH_LABEL, PENDING_REBOOT, PENDING_REPLACEMENT, SCHEDULABLE, instance_id_of
from chaos.transport.kube_access import CONNECTION_ERRORS, api_error, server_message
from chaos.waits import poll_until

MARK = "chaos.ray.io/fault"  # node annotation: which fault armed something on this node
DRAIN_WINDOW_ENV = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
DEFAULT_GRACE_S = 30  # Kubernetes' default terminationGracePeriodSeconds
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # static pods' API mirrors: drain skips them
KUBECTL_RETRY_S = 5.0  # kubectl drain re-POSTs a refused eviction every 5 s

T = TypeVar("T")


# -- shared plumbing ---------------------------------------------------------------
def kube_of(backend, kind: str):
    """The backend's Kubernetes API (API failures through it are ClusterErrors naming the verb,
    the resource and, for RBAC, the identity); a backend without one is refused by name."""
    if backend.kube is None:
        raise InjectionError(f"{kind} needs the Kubernetes API (a profile with a kubernetes: section); this "
                             f"session's backend {backend.label} has none")
    return backend.kube


def _mark(kind: str, target: Target) -> str:
    return f"{kind}:{target.node_id}"


def _read_pod(kube, pod) -> client.V1Pod:
    return kube.call("get", "pods", kube.core.read_namespaced_pod, pod.name, pod.namespace, name=pod.name)


# Nodes are read as JSON, not as client models: the models refuse a node whose
# status.nodeInfo lacks a field they require, and the faults need only a few fields.
def _read_node(kube, pod) -> dict:
    if not pod.node_name:
        raise InjectionError(f"pod {pod.namespace}/{pod.name} is not bound to a Kubernetes node (Pending?)")
    return json.loads(kube.call("get", "nodes", kube.core.read_node, pod.node_name, name=pod.node_name,
                                namespaced=False, _preload_content=False).data)


def _list_nodes(kube) -> dict:
    return json.loads(kube.call("list", "nodes", kube.core.list_node, namespaced=False, _preload_content=False).data)


def _pods_on(kube, node: str) -> list[client.V1Pod]:
    return kube.call("list", "pods", kube.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}",
                     namespaced=False).items


def _names(pods) -> list[str]:
    return sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pods)


def _group_pods(kube, group: str | None) -> list[str]:
    """The Ray pods of a worker group, for the evidence (KubeRay replaces a deleted one)."""
    return [p.name for p in kube.ray_pods() if p.group == group]


def _marked_nodes(kube, mark: str) -> list[dict]:
    return [n for n in _list_nodes(kube)["items"] if (n["metadata"].get("annotations") or {}).get(MARK) == mark]


def _patch_node(kube, name: str, patch: dict) -> None:
    kube.call("patch", "nodes", kube.core.patch_node, name, patch, name=name, namespaced=False,
              _preload_content=False)


def drain_window(pod: client.V1Pod) -> tuple[float, str]:
    """Ray's SIGTERM drain window for the pod's Ray container (KubeRay's first container) and
    where it was read; a window ≤ 0 — no drain, so no preemption — is refused."""
    container = pod.spec.containers[0]
    where = f"pod {pod.metadata.namespace}/{pod.metadata.name}"
    for var in container.env or []:
        if var.name != DRAIN_WINDOW_ENV:
            continue
        if var.value_from is not None:
            return RAY_DEFAULT_DRAIN_WINDOW_S, f"Ray's default assumed: {where} sets it through valueFrom (not read)"
        try:
            window = float(var.value)
        except (TypeError, ValueError):
            raise InjectionError(f"{where} sets {DRAIN_WINDOW_ENV}={var.value!r}: not a number of seconds") from None
        if window <= 0:
            raise InjectionError(f"{where} runs with {DRAIN_WINDOW_ENV}={var.value}: Ray does not drain it on "
                                 "SIGTERM, so a graceful deletion would be no preemption (nothing done)")
        return window, "the pod spec"
    if container.env_from:
        return RAY_DEFAULT_DRAIN_WINDOW_S, f"Ray's default assumed: not in {where}'s env (its envFrom is not read)"
    return RAY_DEFAULT_DRAIN_WINDOW_S, "Ray's default (not set in the pod spec)"


def _preemption(ctx: FaultContext, inj: Injection, pod_obj: client.V1Pod, grace_s: int | None, t: float,
                via: str) -> dict:
    """The notice for a graceful end of the target's pod: Ray drains until its window ends
    or the kubelet's SIGKILL at the end of the grace, whichever is first."""
    window_s, source = drain_window(pod_obj)
    own = pod_obj.spec.termination_grace_period_seconds
    grace = grace_s if grace_s is not None else (own if own is not None else DEFAULT_GRACE_S)
    emit_notice(ctx, inj, t, min(float(grace), window_s), via)
    facts = {"grace_s": grace, "window_s": window_s, "window_from": source,
             # Ray 2.60 charges a SIGKILL inside its drain window to max_failures (docs/verdicts.md)
             "sigkill_inside_window": grace < window_s}
    inj.evidence.update(facts)
    return facts


def evict(ctx: FaultContext, kube, namespace: str, name: str, uid: str | None, grace_s: int | None,
          retry_until: float | None, interval_s: float) -> tuple[float, int]:
    """POST the pod's policy/v1 Eviction; returns (when it was accepted, attempts).  A 429
    from a disruption budget is an InjectionError at once (``retry_until`` None), or retried
    every ``interval_s`` until the monotonic ``retry_until``.  Each refusal is an
    ``eviction_refused`` event."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                             delete_options=client.V1DeleteOptions(grace_period_seconds=grace_s,
                                                                   preconditions=client.V1Preconditions(uid=uid)))
    attempts = 0

    def attempt() -> tuple[float | None, str]:
        nonlocal attempts
        attempts += 1
        t = time.time()
        try:
            kube.core.create_namespaced_pod_eviction(name, namespace, body, _request_timeout=kube.request_timeout)
            return t, "evicted"
        except (ApiException, *CONNECTION_ERRORS) as err:
            if getattr(err, "status", None) != 429:
                raise api_error(err, "create", "pods/eviction", name=name, namespace=namespace,
                                identity=kube.identity, server=f"the Kubernetes API server at {kube.server}") from err
            refusal = server_message(err)
            ctx.timeline.emit("fault", "eviction_refused", pod=f"{namespace}/{name}", attempt=attempts,
                              reason=refusal)
            if retry_until is None:
                raise InjectionError(f"eviction of pod {namespace}/{name} refused (429): {refusal}; give retry_s "
                                     "to retry until a deadline, as kubectl drain does") from err
            return None, f"{attempts} attempt(s), the last refused (429): {refusal}"

    timeout = max(retry_until - time.monotonic(), 0.0) if retry_until is not None else 0.0
    try:
        return poll_until(attempt, timeout, f"the eviction of pod {namespace}/{name} to be allowed by its "
                          "disruption budget", interval=interval_s), attempts
    except WaitTimeout as err:
        raise InjectionError(str(err)) from err


def list_nodes_at(kube) -> tuple[dict[str, dict], str]:
    """The nodes by uid and the list's resourceVersion: a point a later ``wait_nodes`` can
    resume from, so that no change after it is missed."""
    listed = _list_nodes(kube)
    return {n["metadata"]["uid"]: n for n in listed["items"]}, listed["metadata"]["resourceVersion"]


def wait_nodes(kube, until: Callable[[dict[str, dict]], tuple[T | None, str]], timeout_s: float,
               what: str, resume: dict | None = None, stop: threading.Event | None = None) -> T:
    """Watch nodes until ``until(nodes by uid)`` returns (a value, what was seen) with a value;
    raise WaitTimeout naming ``what`` and the last thing seen.  An expired watch (410) re-lists.

    ``resume``: {"nodes", "rv"} to start from (e.g. ``list_nodes_at`` before a fault, so a
    short-lived change is replayed), updated on the way out for the next wait; ``stop``, once
    set, ends the wait within a few seconds (WaitTimeout)."""
    deadline = time.monotonic() + timeout_s
    resume = resume if resume is not None else {}
    rv = resume.get("rv")
    nodes: dict[str, dict] = dict(resume.get("nodes") or {})
    try:
        return _wait_nodes(kube, until, deadline, timeout_s, what, nodes, rv, resume, stop)
    finally:
        resume["nodes"] = nodes


def _wait_nodes(kube, until, deadline: float, timeout_s: float, what: str, nodes: dict, rv: str | None,
                resume: dict, stop: threading.Event | None):
    seen = "nothing yet"
    if rv is not None:
        hit, seen = until(nodes)
        if hit:
            return hit
    while True:
        if stop is not None and stop.is_set():
            raise WaitTimeout(f"stopped waiting for {what}; saw: {seen}")
        if rv is None:
            listed, rv = list_nodes_at(kube)
            nodes.clear()
            nodes.update(listed)
            resume["rv"] = rv
            hit, seen = until(nodes)
            if hit:
                return hit
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}; saw: {seen}")
        window = min(left, 5.0) if stop is not None else left  # a stop is seen at the window's end
        stream = watch.Watch()
        try:
            for event in stream.stream(kube.core.list_node, resource_version=rv, timeout_seconds=max(1, int(window))):
                if event["type"] not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                node = event["raw_object"]
                rv = resume["rv"] = node["metadata"].get("resourceVersion") or rv
                if event["type"] == "DELETED":
                    nodes.pop(node["metadata"]["uid"], None)
                else:
                    nodes[node["metadata"]["uid"]] = node
                hit, seen = until(nodes)
                if hit:
                    return hit
                if stop is not None and stop.is_set():
                    break
        except ApiException as err:
            if err.status != 410:
                raise kube.error(err, "watch", "nodes", namespaced=False) from err
            rv = None  # expired: re-list
        except CONNECTION_ERRORS as err:
            raise kube.error(err, "watch", "nodes", namespaced=False) from err
        finally:
            stream.stop()


def _ready(node: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def _health(node: dict) -> str | None:
    return (node["metadata"].get("labels") or {}).get(HEALTH_LABEL)


def _boot_id(node: dict) -> str | None:
    return ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID")


def _cordoned(node: dict) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


NODE_SHELL_LABELS = {"app.kubernetes.io/managed-by": "ray-chaos-harness", MARK: "xid"}


def delete_node_shells(kube) -> list[str]:
    """Delete every node-shell pod the harness left in its namespace (grace 0); their names."""
    selector = ",".join(f"{k}={v}" for k, v in NODE_SHELL_LABELS.items())
    pods = kube.core.list_namespaced_pod(kube.namespace, label_selector=selector).items
    for pod in pods:
        try:
            kube.core.delete_namespaced_pod(pod.metadata.name, kube.namespace, grace_period_seconds=0)
        except ApiException as err:
            if err.status != 404:
                raise
    return [p.metadata.name for p in pods]


def node_shell_pod(namespace: str, node: str, image: str, script: str, env: dict[str, str]) -> dict:
    """The one-shot privileged pod (hostPID, the node's ``/dev/kmsg`` mounted at the same path)
    that runs ``script`` as root on ``node``, as ``kubectl debug node/…`` does; ``ray-chaos
    doctor`` submits the same manifest as a server-side dry run."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "chaos-node-shell-", "namespace": namespace,
                         "labels": dict(NODE_SHELL_LABELS)},
            "spec": {"nodeName": node, "restartPolicy": "Never", "hostPID": True,
                     "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "shell", "image": image, "command": ["/bin/sh", "-c", script],
                                     "env": [{"name": k, "value": v} for k, v in env.items()],
                                     "securityContext": {"privileged": True},
                                     "volumeMounts": [{"name": "kmsg", "mountPath": "/dev/kmsg"}]}],
                     "volumes": [{"name": "kmsg", "hostPath": {"path": "/dev/kmsg"}}]}}


def write_by_node_pod(kube, node: str, image: str, script: str, env: dict[str, str], what: str,
                      timeout_s: float = 120.0) -> str:
    """Run ``script`` as root on ``node`` in the node-shell pod; return its output.  Refused by
    the API server (RBAC, Pod Security admission) or by the script: an InjectionError naming
    the node and the reason.  The pod is deleted on every path."""
    body = node_shell_pod(kube.namespace, node, image, script, env)
    try:
        pod = kube.core.create_namespaced_pod(kube.namespace, body)
    except ApiException as err:
        raise InjectionError(f"writing {what} on node {node}: a privileged pod was refused in namespace "
                             f"{kube.namespace} ({err.status}: {server_message(err)}); the harness needs to create "
                             "privileged pods there (KubeRay's Ray pods cannot write the kernel log)") from err
    name = pod.metadata.name
    try:
        # A watch, not reads: a node agent may act on what the pod wrote at once and delete every
        # pod on the node (HyperPod's reboot does) before a read could see it finish.
        phase, seen = None, "nothing yet"
        stream = watch.Watch()
        try:
            for event in stream.stream(kube.core.list_namespaced_pod, kube.namespace,
                                       field_selector=f"metadata.name={name}",
                                       resource_version=pod.metadata.resource_version, timeout_seconds=int(timeout_s)):
                obj = event["raw_object"]
                seen = f"pod {name} {event['type']} {(obj.get('status') or {}).get('phase')}"
                phase = (obj.get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed") or event["type"] == "DELETED":
                    break
        finally:
            stream.stop()
        if phase not in ("Succeeded", "Failed"):
            raise InjectionError(f"writing {what} on node {node}: the node-shell pod {name} did not finish within "
                                 f"{timeout_s:.0f} s; saw: {seen}")
        try:
            out = kube.core.read_namespaced_pod_log(name, kube.namespace).strip()
        except ApiException as err:
            if err.status != 404 or phase != "Succeeded":
                raise
            out = "written (its pod was deleted before its output could be read: the node went down)"
        if phase != "Succeeded":
            raise InjectionError(f"writing {what} on node {node} (pod {name}): {out or phase}")
        return out
    finally:
        try:
            kube.core.delete_namespaced_pod(name, kube.namespace, grace_period_seconds=0)
        except ApiException as err:
            if err.status != 404:
                raise


# -- pod faults ----------------------------------------------------------------------
class _PodFault:
    """What the pod faults share: the target, the pod, and the pods of its group before/after."""

    rank: int

    def resolve(self, ctx: FaultContext) -> Target:
        return placement_target(ctx, self.rank)

    def revert_plan(self, inj: Injection) -> dict:
        return {"action": "none", "why": f"{self.kind}: KubeRay recreates the pod; nothing is left armed"}

    def _pod(self, ctx: FaultContext, inj: Injection):
        kube = kube_of(ctx.backend, self.kind)
        pod = ctx.backend.pod_of(inj.target)
        inj.evidence.update(pod=f"{pod.namespace}/{pod.name}", pod_uid=pod.uid, node=pod.node_name,
                            group=pod.group, pods_before=_group_pods(kube, pod.group))
        return kube, pod

    def after_detect(self, ctx: FaultContext, inj: Injection) -> None:
        """The group's pods once Ray saw the node go (KubeRay's replacement, if it is there yet)."""
        inj.evidence["pods_after"] = _group_pods(kube_of(ctx.backend, self.kind), inj.evidence["group"])

    def _delete(self, kube, pod, grace_s: int | None) -> None:
        """Delete exactly the pod resolved (its uid as precondition: never a recreated namesake)."""
        options = client.V1DeleteOptions(grace_period_seconds=grace_s,
                                          preconditions=client.V1Preconditions(uid=pod.uid))
        kwargs = {"grace_period_seconds": grace_s} if grace_s is not None else {}
        kube.call("delete", "pods", kube.core.delete_namespaced_pod, pod.name, pod.namespace, name=pod.name,
                  body=options, **kwargs)


class PodDelete(_PodFault, Fault):
    """The pod deleted with grace 0: the object goes at once, the kubelet kills the
    containers within its 2 s floor — a hard failure, charged to ``max_failures`` (or, by a
    race in Ray on that SIGTERM, rarely to ``max_preemption_failures``: the catalog's
    ``race_charge``)."""

    kind = "pod-delete"

    def __init__(self, rank: int = 1):
        self.rank = rank

    def describe(self) -> str:
        return f"hard delete (grace 0) of the Ray pod hosting rank {self.rank}"

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        kube, pod = self._pod(ctx, inj)
        self._delete(kube, pod, 0)
        return {"pod": f"{pod.namespace}/{pod.name}", "uid": pod.uid, "node": pod.node_name, "grace_s": 0}


class GracefulPodDelete(_PodFault, Fault):
    """The pod deleted with its own grace (``terminationGracePeriodSeconds``) or ``grace_s``:
    SIGTERM to ``ray start --block`` (Ray drains the node as PREEMPTION), SIGKILL when the
    grace runs out."""

    kind = "pod-delete-graceful"

    def __init__(self, rank: int = 1, grace_s: int | None = None):
        require_preemption_budget(self.kind)
        if grace_s is not None and grace_s < 1:
            raise ValueError(f"pod-delete-graceful grace_s must be >= 1 second (grace 0 is a hard delete: "
                             f"pod-delete), got {grace_s}")
        self.rank = rank
        self.grace_s = grace_s

    def describe(self) -> str:
        grace = f"grace {self.grace_s} s" if self.grace_s is not None else "the pod's own grace"
        return f"graceful delete ({grace}) of the Ray pod hosting rank {self.rank}"

    def detect_timeout(self, base_s: float) -> float:
        # The node goes when the grace or Ray's window ends; without grace_s the pod's own grace
        # is not known here: Ray's default window (KubeRay's default grace is the same 30 s).
        return base_s + (self.grace_s if self.grace_s is not None else RAY_DEFAULT_DRAIN_WINDOW_S)

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        kube, pod = self._pod(ctx, inj)
        spec = _read_pod(kube, pod)
        drain_window(spec)  # a pod that would not drain is refused before it is deleted
        t = time.time()
        self._delete(kube, pod, self.grace_s)
        facts = _preemption(ctx, inj, spec, self.grace_s, t, "pod-delete")
        return {"pod": f"{pod.namespace}/{pod.name}", "uid": pod.uid, "node": pod.node_name, **facts}


class PodEvict(_PodFault, Fault):
    """The pod evicted through policy/v1 (what ``kubectl drain`` does per pod): a disruption
    budget may refuse it (429) — an InjectionError naming the budget, or retried every
    ``retry_interval_s`` until ``retry_s`` is up.  Then as a graceful delete."""

    kind = "pod-evict"

    def __init__(self, rank: int = 1, grace_s: int | None = None, retry_s: float | None = None,
                 retry_interval_s: float = KUBECTL_RETRY_S):
        require_preemption_budget(self.kind)
        if grace_s is not None and grace_s < 1:
            raise ValueError(f"pod-evict grace_s must be >= 1 second, got {grace_s}")
        if (retry_s is not None and retry_s <= 0) or retry_interval_s <= 0:
            raise ValueError(f"pod-evict retry_s and retry_interval_s must be > 0, got {retry_s}, {retry_interval_s}")
        self.rank = rank
        self.grace_s = grace_s
        self.retry_s = retry_s
        self.retry_interval_s = retry_interval_s

    def describe(self) -> str:
        retry = f", 429s retried for {self.retry_s:g} s" if self.retry_s else ""
        return f"eviction (policy/v1{retry}) of the Ray pod hosting rank {self.rank}"

    def detect_timeout(self, base_s: float) -> float:
        return base_s + (self.grace_s if self.grace_s is not None else RAY_DEFAULT_DRAIN_WINDOW_S)

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        kube, pod = self._pod(ctx, inj)
        spec = _read_pod(kube, pod)
        drain_window(spec)
        retry_until = time.monotonic() + self.retry_s if self.retry_s is not None else None
        t, attempts = evict(ctx, kube, pod.namespace, pod.name, pod.uid, self.grace_s, retry_until,
                            self.retry_interval_s)
        facts = _preemption(ctx, inj, spec, self.grace_s, t, "pod-evict")
        inj.evidence["eviction_attempts"] = attempts
        return {"pod": f"{pod.namespace}/{pod.name}", "uid": pod.uid, "node": pod.node_name,
                "eviction_attempts": attempts, **facts}


# -- node drain ----------------------------------------------------------------------
class NodeDrain(_PodFault, Fault):
    """``kubectl drain`` of the Kubernetes node under the target's pod: cordon (marked for
    the sweep), then evict every pod on it — DaemonSet and mirror pods skipped, 429s retried
    every ``retry_interval_s`` until ``timeout_s`` — so its Ray pod is preempted.  Reverted
    by uncordoning.  The node stays cordoned until then: a run recovers only where a
    replacement pod can be scheduled elsewhere (spare capacity)."""

    kind = "drain"

    def __init__(self, rank: int = 1, timeout_s: float = 60.0, retry_interval_s: float = KUBECTL_RETRY_S,
                 grace_s: int | None = None):
        require_preemption_budget(self.kind)
        if timeout_s <= 0 or retry_interval_s <= 0:
            raise ValueError(f"drain timeout_s and retry_interval_s must be > 0, got {timeout_s}, {retry_interval_s}")
        if grace_s is not None and grace_s < 1:
            raise ValueError(f"drain grace_s must be >= 1 second, got {grace_s}")
        self.rank = rank
        self.timeout_s = timeout_s
        self.retry_interval_s = retry_interval_s
        self.grace_s = grace_s

    def describe(self) -> str:
        return f"drain (cordon + evict every pod) of the Kubernetes node under rank {self.rank}'s Ray pod"

    def detect_timeout(self, base_s: float) -> float:
        return base_s + (self.grace_s if self.grace_s is not None else RAY_DEFAULT_DRAIN_WINDOW_S)

    def revert_plan(self, inj: Injection) -> dict:
        return {"action": "uncordon", "annotation": MARK, "mark": _mark(self.kind, inj.target),
                "why": "the drained node stays cordoned until uncordoned"}

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        kube, pod = self._pod(ctx, inj)
        node = _read_node(kube, pod)
        spec = _read_pod(kube, pod)
        drain_window(spec)  # refused before the node is touched
        deadline = time.monotonic() + self.timeout_s
        if _cordoned(node):
            inj.evidence["cordon"] = "was cordoned already: left as it was"
        else:
            _patch_node(kube, pod.node_name, {"metadata": {"annotations": {MARK: _mark(self.kind, inj.target)}},
                                              "spec": {"unschedulable": True}})
            inj.evidence["cordon"] = "cordoned"
        ctx.timeline.emit("fault", "node_cordoned", node=pod.node_name, ledger_id=inj.ledger_id)
        evicted, skipped, facts = [], {}, {}
        for p in _pods_on(kube, pod.node_name):
            name = f"{p.metadata.namespace}/{p.metadata.name}"
            why = _drain_skips(p)
            if why:
                skipped[name] = why
                continue
            t, _ = evict(ctx, kube, p.metadata.namespace, p.metadata.name, p.metadata.uid, self.grace_s, deadline,
                         self.retry_interval_s)
            evicted.append(name)
            if p.metadata.uid == pod.uid:
                facts = _preemption(ctx, inj, spec, self.grace_s, t, "drain")
        if not facts:
            raise InjectionError(f"drain of node {pod.node_name}: the target pod {pod.namespace}/{pod.name} was not "
                                 f"among its pods (evicted {evicted}, skipped {sorted(skipped)})")
        inj.evidence.update(evicted=evicted, skipped=skipped)
        return {"node": pod.node_name, "pod": f"{pod.namespace}/{pod.name}", "evicted": evicted,
                "skipped": skipped, **facts}

    def revert(self, ctx: FaultContext, inj: Injection) -> bool:
        return _uncordon_marked(kube_of(ctx.backend, self.kind), _mark(self.kind, inj.target))

    @classmethod
    def sweep(cls, plan: dict, backend) -> bool:
        if plan.get("action") != "uncordon":
            return super().sweep(plan, backend)
        return _uncordon_marked(kube_of(backend, cls.kind), plan["mark"])


def _drain_skips(pod: client.V1Pod) -> str | None:
    """Why ``kubectl drain --ignore-daemonsets`` leaves this pod alone (None: it is evicted)."""
    if MIRROR_ANNOTATION in (pod.metadata.annotations or {}):
        return "mirror pod (a static pod: the kubelet owns it)"
    if any(ref.kind == "DaemonSet" and ref.controller for ref in pod.metadata.owner_references or []):
        return "DaemonSet pod (its controller would put it back at once)"
    return None


def _uncordon_marked(kube, mark: str) -> bool:
    """Uncordon the nodes this fault cordoned (found by its mark) and drop the mark; returns
    whether any was still cordoned."""
    did = False
    for node in _marked_nodes(kube, mark):
        did = did or _cordoned(node)
        _patch_node(kube, node["metadata"]["name"], {"metadata": {"annotations": {MARK: None}},
                                               "spec": {"unschedulable": None}})
    return did


# -- SageMaker HyperPod node recovery -----------------------------------------------
class _NodeRecovery:
    """HyperPod's reboot or replacement of the node under the target's pod, asked for by
    the node-health label (``via="label"``, as ``kubectl label --overwrite``) or by boto3
    (``via="boto3"``, the instance id from the node).  HyperPod force-deletes every pod on
    the node: a hard failure.  After detection the node must be back Ready and
    ``Schedulable`` — with a new boot id (reboot) or as a new Node object (replace)."""

    VIAS = ("label", "boto3")
    action: str  # reboot | replace
    label_value: str
    boto3_call: str

    def __init__(self, rank: int = 1, via: str = "label", recover_timeout_s: float = 600.0):
        if via not in self.VIAS:
            raise ValueError(f"{self.kind} via={via!r} unknown; expected one of {self.VIAS}")
        if recover_timeout_s <= 0:
            raise ValueError(f"{self.kind} recover_timeout_s must be > 0, got {recover_timeout_s}")
        self.rank = rank
        self.via = via
        self.recover_timeout_s = recover_timeout_s  # AWS says "a few minutes"; no measured figures published

    def describe(self) -> str:
        how = f"label {HEALTH_LABEL}={self.label_value}" if self.via == "label" else f"boto3 {self.boto3_call}"
        return f"HyperPod {self.action} ({how}) of the node under rank {self.rank}'s Ray pod"

    def resolve(self, ctx: FaultContext) -> Target:
        return placement_target(ctx, self.rank)

    def revert_plan(self, inj: Injection) -> dict:
        return {"action": "restore-health-label", "annotation": MARK, "mark": _mark(self.kind, inj.target),
                "label": HEALTH_LABEL, "to": SCHEDULABLE,
                "why": f"a node still {self.label_value} (the recovery never ran) is labelled {SCHEDULABLE} again"}

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        kube = kube_of(ctx.backend, self.kind)
        pod = ctx.backend.pod_of(inj.target)
        node = _read_node(kube, pod)
        name = node["metadata"]["name"]
        if _health(node) in (PENDING_REBOOT, PENDING_REPLACEMENT):
            raise InjectionError(f"node {name} is already {_health(node)}: a recovery is pending, nothing done")
        boot_id = _boot_id(node)
        if self.action == "reboot" and not boot_id:
            raise InjectionError(f"node {name} reports no status.nodeInfo.bootID: its reboot could not be verified "
                                 "(nothing done)")
        instance = instance_id_of(node)
        uids = sorted(n["metadata"]["uid"] for n in _list_nodes(kube)["items"])
        inj.evidence.update(node=name, node_uid=node["metadata"]["uid"], instance_id=instance, boot_id_before=boot_id,
                            pod=f"{pod.namespace}/{pod.name}", pods_before=_names(_pods_on(kube, name)),
                            nodes_before=uids, via=self.via)
        cluster = self._boto3_cluster(kube, name, instance) if self.via == "boto3" else None
        mark = {"metadata": {"annotations": {MARK: _mark(self.kind, inj.target)}}}
        if self.via == "label":
            mark["metadata"]["labels"] = {HEALTH_LABEL: self.label_value}
        t = inj.evidence["requested_t"] = time.time()
        _patch_node(kube, name, mark)  # the label, and the mark the sweep finds it by
        details = ({"label": f"{HEALTH_LABEL}={self.label_value}"} if cluster is None
                   else self._boto3(kube, cluster, name, instance))
        ctx.timeline.emit("fault", "hyperpod_recovery_requested", t=t, node=name, action=self.action, via=self.via,
                          instance_id=instance, boot_id=boot_id, ledger_id=inj.ledger_id)
        return {"node": name, "instance_id": instance, "boot_id_before": boot_id, "via": self.via, **details}

    def _boto3_cluster(self, kube, node: str, instance: str | None) -> str:
        """The HyperPod cluster to call, once it is sure the call can be made."""
        if instance is None:
            raise InjectionError(f"node {node} has no instance id (no chaos.ray.io/instance-id label, and its name is "
                                 f"not hyperpod-<instance id>): {self.boto3_call} needs one (nothing done)")
        if kube.hyperpod is None:
            raise InjectionError(f"{self.kind} via='boto3' needs the HyperPod cluster: kubernetes.hyperpod "
                                 "(cluster_name, region) in the profile (nothing done)")
        return kube.hyperpod.cluster_name

    def _boto3(self, kube, cluster: str, node: str, instance: str) -> dict:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = getattr(kube.sagemaker(), self.boto3_call)(ClusterName=cluster, NodeIds=[instance])
        except (ClientError, BotoCoreError) as err:
            raise InjectionError(f"{self.boto3_call} of {instance} (node {node}) in {cluster} failed: {err}") from err
        if instance not in answer.get("Successful", []):
            failed = next((f for f in answer.get("Failed", []) if f.get("NodeId") == instance), {})
            raise InjectionError(f"{self.boto3_call} refused {instance} (node {node}) in {cluster}: "
                                 f"{failed.get('ErrorCode', '?')}: {failed.get('Message', answer)}")
        return {"call": self.boto3_call, "cluster": cluster, "successful": answer["Successful"]}

    def after_detect(self, ctx: FaultContext, inj: Injection) -> None:
        """Wait (on a node watch) until the node is back — Ready, ``Schedulable``, not cordoned —
        with a new boot id (reboot) or as a new Node object (replace)."""
        kube = kube_of(ctx.backend, self.kind)
        ev = inj.evidence
        node = (self._rebooted if self.action == "reboot" else self._replacement)(kube, ev)
        name = node["metadata"]["name"]
        ev.update(node_after=name, boot_id_after=_boot_id(node), pods_after=_names(_pods_on(kube, name)),
                  back_after_s=round(time.time() - ev["requested_t"], 3))
        if self.action == "replace":
            ev.update(new_node=name, new_instance_id=instance_id_of(node))
        ctx.timeline.emit("fault", "hyperpod_node_back", node=ev["node"], node_after=name, action=self.action,
                          boot_id_after=ev["boot_id_after"], ledger_id=inj.ledger_id)

    def _rebooted(self, kube, ev: dict) -> dict:
        def back(nodes: dict[str, dict]):
            node = nodes.get(ev["node_uid"])
            if node is None:
                return None, f"node {ev['node']} is gone"
            state = (f"{ev['node']}: {HEALTH_LABEL}={_health(node)}, Ready={_ready(node)}, "
                     f"unschedulable={_cordoned(node)}, bootID {_boot_id(node)}")
            ok = (_health(node) == SCHEDULABLE and _ready(node) and not _cordoned(node)
                  and _boot_id(node) not in (None, ev["boot_id_before"]))
            return (node if ok else None), state

        return wait_nodes(kube, back, self.recover_timeout_s,
                          f"node {ev['node']} to be back Ready and {SCHEDULABLE} with a new boot id "
                          f"(was {ev['boot_id_before']})")

    def _replacement(self, kube, ev: dict) -> dict:
        def replaced(nodes: dict[str, dict]):
            new = [n for uid, n in nodes.items() if uid not in ev["nodes_before"]]
            ready = [n for n in new if _health(n) == SCHEDULABLE and _ready(n) and not _cordoned(n)]
            state = (f"old node {ev['node']} {'still there' if ev['node_uid'] in nodes else 'gone'}; new nodes: "
                     + (", ".join(f"{n['metadata']['name']} ({_health(n)}, Ready={_ready(n)})" for n in new)
                        or "none"))
            return (ready[0] if ready and ev["node_uid"] not in nodes else None), state

        return wait_nodes(kube, replaced, self.recover_timeout_s,
                          f"node {ev['node']} to be replaced by a new node, Ready and {SCHEDULABLE}")

    def revert(self, ctx: FaultContext, inj: Injection) -> bool:
        return _restore_marked(kube_of(ctx.backend, self.kind), _mark(self.kind, inj.target))

    @classmethod
    def sweep(cls, plan: dict, backend) -> bool:
        if plan.get("action") != "restore-health-label":
            return super().sweep(plan, backend)
        return _restore_marked(kube_of(backend, cls.kind), plan["mark"])


def _restore_marked(kube, mark: str) -> bool:
    """Label ``Schedulable`` again a node this fault marked whose recovery never ran (still
    pending), and drop the mark; returns whether any label needed restoring."""
    did = False
    for node in _marked_nodes(kube, mark):
        pending = _health(node) in (PENDING_REBOOT, PENDING_REPLACEMENT)
        patch: dict = {"metadata": {"annotations": {MARK: None}}}
        if pending:
            patch["metadata"]["labels"] = {HEALTH_LABEL: SCHEDULABLE}
        _patch_node(kube, node["metadata"]["name"], patch)
        did = did or pending
    return did


class HyperPodReboot(_NodeRecovery, Fault):
    """HyperPod reboots the node under the target's pod (``via``: its node-health label set to
    ``UnschedulablePendingReboot``, or boto3's ``batch_reboot_cluster_nodes``): every pod on it
    force-deleted, the node back Ready with a new boot id within ``recover_timeout_s``."""

    kind = "hyperpod-reboot"
    action, label_value, boto3_call = "reboot", PENDING_REBOOT, "batch_reboot_cluster_nodes"


class HyperPodReplace(_NodeRecovery, Fault):
    """HyperPod replaces the node under the target's pod (``via``: its node-health label set to
    ``UnschedulablePendingReplacement``, or boto3's ``batch_replace_cluster_nodes``): every pod on
    it force-deleted, a new Node object in its place within ``recover_timeout_s``."""

    kind = "node-replace"
    action, label_value, boto3_call = "replace", PENDING_REPLACEMENT, "batch_replace_cluster_nodes"
