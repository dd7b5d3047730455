"""A HyperPod-like node-recovery agent: a client of the (emulated) API server, in a thread.

SageMaker HyperPod on EKS recovers a faulty node when its label
``sagemaker.amazonaws.com/node-health-status`` becomes ``UnschedulablePendingReboot`` or
``UnschedulablePendingReplacement`` — whether its health agent set it, an operator ran
``kubectl label node ... --overwrite``, or ``BatchReboot/ReplaceClusterNodes`` was called
("both methods activate the same recovery processes": AWS's resiliency-manual page,
https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-eks-resiliency-manual.html).  This agent
does the same against any API server, through the official ``kubernetes`` client only:

* It watches nodes (list, then watch from the list's resourceVersion with bookmarks; a
  dropped stream is re-watched from the last version seen; a 410 Expired re-lists).
* Reboot: cordon (``spec.unschedulable`` + a NoSchedule taint), ``Hosts.power_off(node)`` — the
  host goes down and every process on it, every pod's container included, dies at once —, mark
  the node NotReady, force-delete (grace 0) every pod bound to the node (its kubelet has no
  process left to signal), ``Hosts.reboot(node)`` (blocks until the host is up in a new boot),
  then label ``Schedulable``, Ready, taint removed, uncordoned.
* Replace: cordon, power off, NotReady, force-delete the pods, delete the Node object,
  ``Hosts.replace(node)`` (removes the old host, blocks until a new one is up), create a Node
  for the new host (new name and uid, ``Schedulable``, Ready).

What HyperPod really does to pods (evict, delete or leave them to the NotReady taint), in which
order it takes the host down, and which taint it sets were not found (notes §9): powering the
host off before deleting the pods, the force delete and the standard
``node.kubernetes.io/unschedulable:NoSchedule`` taint (the one Kubernetes' node lifecycle
controller puts on a cordoned node) are this emulator's choices.  The host goes first so that
every pod dies at once: a pod deleted first is SIGTERMed by its kubelet and SIGKILLed only after
the 2 s minimum grace, and ``ray start --block`` drains its node as PREEMPTION on SIGTERM, so Ray
Train could charge the loss to ``max_preemption_failures`` instead of ``max_failures``.  A real
reboot is an OS shutdown, which may SIGTERM the containers before the power goes, so that race
may well be real on HyperPod.  Every step is recorded with its time (``history(node)``).
Kubernetes Events are not emitted: the emulated API server does not store ``events``.

Health monitoring, like HyperPod's health-monitoring agent (HMA), is what
sets that label without an operator: a ``HealthMonitor`` (health.py) follows every worker node's
kernel log (``Hosts.kernel_log``) and, on an Xid line its table maps, the agent sets a node
condition and then the labels; its own label watch then recovers the node.  Emulated from AWS's
documentation: the HMA detection event as condition ``NvidiaErrorReboot``, reason
``XidHardwareFailure``, the NVRM line as message; the node-health label values; fault-type and
fault-reason labels (their keys as AWS's HyperPod debugging material spells them).  The
emulator's choices: the Xid -> reboot/replace table (HMA's is not public; health.py cites what
informs it), ``NvidiaErrorReplace``, the label values ``XidHardwareFailure`` / ``Xid<N>``, one
detection per node until its recovery starts, and, after a reboot, the condition going False
(``NoXidSinceReboot``) with the fault labels dropped.  Not emulated: DCGM, ``nvidia-smi``, EC2
platform logs, GPU counts, HMA's taint and ``fault-details`` annotation, CloudWatch events.
"""

from __future__ import annotations

import abc
import collections
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from chaos.embedded.kube.health import DEFAULT_XID_ACTIONS, REBOOT, REPLACE, HealthMonitor, Xid
from chaos.hyperpod import (COMPUTE_TYPE_LABEL, HEALTH_LABEL, INSTANCE_GROUP_LABEL, INSTANCE_ID_LABEL,
                            NVIDIA_ERROR_REBOOT, NVIDIA_ERROR_REPLACE, PENDING_REBOOT, PENDING_REPLACEMENT, SCHEDULABLE,
                            instance_id_of)

log = logging.getLogger(__name__)

# The HyperPod node labels and their values live in chaos/hyperpod.py (the harness uses them too).
# Kubernetes' taint for a cordoned node (node lifecycle controller); HyperPod's own taint: not found.
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}

ACTIONS = {PENDING_REBOOT: REBOOT, PENDING_REPLACEMENT: REPLACE}

# Health monitoring (see the module docstring).  AWS's documented HMA detection event is node
# condition NvidiaErrorReboot with reason XidHardwareFailure and the NVRM line as message (notes);
# NvidiaErrorReplace and NoXidSinceReboot are this emulator's names (chaos.hyperpod).
XID_CONDITIONS = {REBOOT: NVIDIA_ERROR_REBOOT, REPLACE: NVIDIA_ERROR_REPLACE}
XID_HARDWARE_FAILURE = "XidHardwareFailure"  # the condition's reason, and our fault-types value
NO_XID_SINCE_REBOOT = "NoXidSinceReboot"  # the reason once a reboot cleared the condition
# AWS's label doc names fault-type / fault-reason labels without their keys; these keys are how
# AWS's own HyperPod debugging material (awslabs/agent-plugins) spells them.  The values,
# XID_HARDWARE_FAILURE and "Xid<N>", are this emulator's.
FAULT_TYPES_LABEL = "sagemaker.amazonaws.com/fault-types"
FAULT_REASONS_LABEL = "sagemaker.amazonaws.com/fault-reasons"


@dataclass(frozen=True)
class HostInfo:
    """A (new) host as ``Hosts.replace`` reports it; ``node_name`` defaults to ``hyperpod-<instance_id>``."""

    instance_id: str
    node_name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    addresses: tuple[dict[str, str], ...] = ()


class Hosts(abc.ABC):
    """Host control: the embedded cluster powers test hosts off and on (a new boot id); tests use a fake.

    A recovery calls ``power_off``, then (the node's pods deleted) ``reboot`` or ``replace``.
    Each call blocks until done (or raises); the agent makes them on its own recovery thread,
    one per node.  Health monitoring reads ``kernel_log`` every poll.
    """

    @abc.abstractmethod
    def kernel_log(self, node_name: str) -> str | None:
        """The path, on this machine, of the node's kernel log in its current boot (a new file after
        each reboot), as an agent DaemonSet sees the host's ``/dev/kmsg`` through a hostPath; None
        while the host is down or when the node has no log of its own."""

    @abc.abstractmethod
    def power_off(self, node_name: str) -> None:
        """The node's host goes down now; return once every process on it is dead."""

    @abc.abstractmethod
    def reboot(self, node_name: str) -> dict[str, Any] | None:
        """Boot the node's host (powered off) again; return once it is up in a new boot (optional
        facts, e.g. its new boot id)."""

    @abc.abstractmethod
    def replace(self, node_name: str) -> HostInfo:
        """Terminate the node's (powered-off) host and bring up a new one; return it once it is up."""


@dataclass(frozen=True)
class Transition:
    """One step of one recovery, for reports: ``at`` is wall time (epoch s), ``mono`` monotonic."""

    node: str  # the node the recovery was for (a replacement keeps the old name here)
    action: str  # reboot | replace (| none: an Xid that xid_actions does not map)
    step: str
    at: float
    mono: float
    detail: dict[str, Any] = field(default_factory=dict)


# The steps, in order.  A failed recovery ends with "failed" (detail: error) instead.  A detection
# by health monitoring comes first: "xid_seen" (every Xid line; detail "ignored" says why when
# nothing follows), "condition_set", "labelled" (or "failed"); then the label starts the recovery.
DETECT_STEPS = ("xid_seen", "condition_set", "labelled")
REBOOT_STEPS = ("requested", "cordoned", "host_down", "not_ready", "pods_killed", "host_rebooting", "host_back",
                "schedulable")
REPLACE_STEPS = ("requested", "cordoned", "host_down", "not_ready", "pods_killed", "node_deleted", "host_replacing",
                 "host_replaced", "node_created")


def api_client_for(url: str, token: str = "emulated-token") -> client.ApiClient:
    config = client.Configuration(host=url, api_key={"authorization": token},
                                  api_key_prefix={"authorization": "Bearer"})
    return client.ApiClient(config)


class HyperPodAgent:
    """``with HyperPodAgent(api_client, hosts) as agent:`` — watches nodes and recovers them.

    ``history(node)`` is what it did; ``wait_for(node, step, timeout)`` waits for a step;
    ``request(node, action)`` labels a node as an operator would (the SageMaker endpoint's
    path).  ``relists`` / ``watches`` count list and watch calls (for tests and reports).

    Health monitoring follows every worker node's kernel log (``poll_s``) and acts on the Xid
    lines ``xid_actions`` maps (default ``health.DEFAULT_XID_ACTIONS``), ``detect_delay_s`` after
    seeing them; ``set_health_monitoring(False)`` stops the acting, not the following.
    """

    def __init__(self, api: client.ApiClient, hosts: Hosts, *, instance_group: str = "workers",
                 instance_type: str = "ml.g5.8xlarge", watch_timeout_s: int = 300, health_monitoring: bool = True,
                 xid_actions: dict[int, str] | None = None, poll_s: float = 0.2, detect_delay_s: float = 0.0):
        self.xid_actions = dict(DEFAULT_XID_ACTIONS if xid_actions is None else xid_actions)
        wrong = {xid: action for xid, action in self.xid_actions.items() if action not in (REBOOT, REPLACE)}
        if wrong:
            raise ValueError(f"xid_actions: each action must be {REBOOT!r} or {REPLACE!r}, got {wrong}")
        self.detect_delay_s = detect_delay_s
        self.api = api
        self.core = client.CoreV1Api(api)
        self.hosts = hosts
        self.instance_group, self.instance_type = instance_group, instance_type
        self.watch_timeout_s = watch_timeout_s
        self._stop = threading.Event()
        self._lock = threading.Condition()
        self._history: list[Transition] = []
        self._active: dict[str, tuple[str, str | None]] = {}  # node name -> (action, instance id) in progress
        self._threads: list[threading.Thread] = []
        # After a recovery the watch may still deliver the agent's own earlier updates (label still
        # Pending...): those must not start it again.  node -> what ends the stale stretch: the final
        # update's resourceVersion (reboot) or the node's DELETED event (replace).  A re-list clears it.
        self._settling: dict[str, str] = {}
        self._seen: dict[str, collections.deque[str]] = {}  # node -> versions (or DELETED) the watch delivered
        self._monitoring = health_monitoring
        self._workers: set[str] = set()  # nodes with a node-health label: those whose kernel log is followed
        # Nodes whose Xid is being acted on, until the watch delivers the label that starts the recovery.
        self._detecting: set[str] = set()
        self._raised: dict[str, set[str]] = {}  # node -> Xid conditions set True since its last reboot
        self.monitor = HealthMonitor(hosts, self._worker_nodes, self._xid, self._stop, poll_s)
        self._thread: threading.Thread | None = None
        self._response: urllib3.HTTPResponse | None = None
        self.relists = 0
        self.watches = 0
        self.ready = threading.Event()  # set after the first list: the agent sees every later change

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> "HyperPodAgent":
        self._thread = threading.Thread(target=self._run, name="hyperpod-agent", daemon=True)
        self._thread.start()
        self.monitor.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # unblocks the watch read
            except Exception:  # noqa: BLE001 - already closed
                pass
        if self._thread is not None:
            self._thread.join(timeout)
        self.monitor.join(timeout)
        for thread in list(self._threads):
            thread.join(timeout)

    def __enter__(self) -> "HyperPodAgent":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- queries ---------------------------------------------------------------------
    def history(self, node: str | None = None) -> list[Transition]:
        """Every recorded step (oldest first), or those of recoveries of ``node`` (or that created it)."""
        with self._lock:
            return [t for t in self._history
                    if node is None or t.node == node or t.detail.get("new_node") == node]

    def steps(self, node: str) -> list[str]:
        return [t.step for t in self.history(node)]

    def active(self) -> dict[str, tuple[str, str | None]]:
        """The recoveries in progress: node name -> (action, its instance id)."""
        with self._lock:
            return dict(self._active)

    def wait_for(self, node: str, step: str, timeout: float = 15.0, since: float | None = None) -> Transition:
        """Block until a recovery of ``node`` records ``step`` (or "failed"), at or after the monotonic
        time ``since`` if given; raise saying what was seen."""
        def found() -> Transition | None:
            for t in self._history:
                if since is not None and t.mono < since:
                    continue
                if (t.node == node or t.detail.get("new_node") == node) and t.step in (step, "failed"):
                    return t
            return None

        with self._lock:
            self._lock.wait_for(lambda: found() is not None, timeout)
            hit = found()
        if hit is None:
            raise TimeoutError(f"waited {timeout}s for step {step!r} of node {node}; saw steps "
                               f"{self.steps(node)}")
        if hit.step == "failed" and step != "failed":
            raise RuntimeError(f"recovery of {node} failed: {hit.detail}")
        return hit

    # ---- the operator's / endpoint's way in ------------------------------------------
    def request(self, node: str, action: str) -> None:
        """Label ``node`` for ``action`` (reboot|replace), as ``kubectl label --overwrite`` does."""
        value = PENDING_REBOOT if action == REBOOT else PENDING_REPLACEMENT
        self.core.patch_node(node, {"metadata": {"labels": {HEALTH_LABEL: value}}})

    def nodes(self) -> list[dict]:
        """The current Node objects, as dicts (for the SageMaker endpoint)."""
        return _raw(self.core.list_node)["items"] or []

    # ---- health monitoring -------------------------------------------------------------
    @property
    def health_monitoring(self) -> bool:
        return self._monitoring

    def set_health_monitoring(self, enabled: bool) -> None:
        """Act on Xid lines (True) or only follow the logs (False), so that a suite can show what
        happens when nobody acts; lines read while off stay ignored once it is back on."""
        with self._lock:
            self._monitoring = enabled

    def _worker_nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._workers)

    def _xid(self, name: str, xid: Xid) -> None:
        """The monitor saw an Xid line in ``name``'s kernel log: recorded, and acted on (on a thread
        of its own) if mapped, monitoring is on and the node is not being recovered already."""
        action = self.xid_actions.get(xid.xid)
        with self._lock:
            if action is None:
                ignored = "not in xid_actions"
            elif not self._monitoring:
                ignored = "health monitoring off"
            elif name in self._active or name in self._detecting:
                ignored = "node already being recovered"
            else:
                ignored = None
                self._detecting.add(name)
            self._record(name, action or "none", "xid_seen", xid=xid.xid, device=xid.device, message=xid.message,
                         ignored=ignored)
        if ignored is None:
            self._spawn(self._detect, (name, action, xid), f"hyperpod-health:{name}")

    def _detect(self, name: str, action: str, xid: Xid) -> None:
        """What HMA does on a fault: a node condition, then the labels; the watch then sees the
        node-health label and starts the recovery."""
        if self.detect_delay_s and self._stop.wait(self.detect_delay_s):
            with self._lock:  # stopped while "detecting"
                self._detecting.discard(name)
            return
        try:
            kind = XID_CONDITIONS[action]
            self.core.patch_node_status(name, {"status": {"conditions": [{
                "type": kind, "status": "True", "reason": XID_HARDWARE_FAILURE, "message": xid.message,
                "lastTransitionTime": _now(), "lastHeartbeatTime": _now()}]}})
            with self._lock:
                self._raised.setdefault(name, set()).add(kind)
                self._record(name, action, "condition_set", type=kind, reason=XID_HARDWARE_FAILURE)
            labels = {HEALTH_LABEL: PENDING_REBOOT if action == REBOOT else PENDING_REPLACEMENT,
                      FAULT_TYPES_LABEL: XID_HARDWARE_FAILURE, FAULT_REASONS_LABEL: f"Xid{xid.xid}"}
            # Under the lock: the watch must not start the recovery before "labelled" is recorded.
            with self._lock:
                self.core.patch_node(name, {"metadata": {"labels": labels}})
                self._record(name, action, "labelled", labels=labels)
        except Exception as err:  # noqa: BLE001 - recorded; a later Xid line may try again
            log.exception("acting on Xid %s of node %s failed", xid.xid, name)
            with self._lock:
                self._detecting.discard(name)
                self._record(name, action, "failed", error=f"{type(err).__name__}: {err}")

    # ---- the watch -------------------------------------------------------------------
    def _run(self) -> None:
        rv: str | None = None
        backoff = 0.05
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                    self.ready.set()
                rv = self._watch(rv)
                backoff = 0.05
            except _Expired as err:
                log.info("node watch from resourceVersion %s expired (%s): re-listing", rv, err)
                rv = None
            except ApiException as err:
                if err.status == 410:
                    rv = None
                    continue
                log.warning("node list/watch failed (%s %s); retrying in %.2fs", err.status, err.reason, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as err:
                if self._stop.is_set():
                    break
                log.info("node watch dropped (%s); re-watching from %s in %.2fs", err, rv, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception:  # noqa: BLE001 - an unexpected answer must not end the agent: re-list
                log.exception("node watch failed; re-listing in %.2fs", backoff)
                rv = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _relist(self) -> str:
        listed = _raw(self.core.list_node)
        self.relists += 1
        with self._lock:
            self._settling.clear()  # a list is the current state: nothing in it is stale
        items = listed.get("items") or []
        for node in items:
            self._consider(node)
        with self._lock:  # nodes deleted while no watch ran (the list just re-added the others)
            self._workers &= {node["metadata"]["name"] for node in items}
        return listed["metadata"]["resourceVersion"]

    def _watch(self, rv: str) -> str:
        response = self.core.list_node(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                       timeout_seconds=self.watch_timeout_s, _preload_content=False)
        self._response = response
        self.watches += 1
        try:
            if self._stop.is_set():
                return rv
            buffer = b""
            for chunk in response.stream(amt=None, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        rv = self._event(json.loads(line), rv)
                if self._stop.is_set():
                    break
            return rv
        finally:
            self._response = None
            response.release_conn()

    def _event(self, event: dict, rv: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired(obj.get("message", ""))
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        rv = obj.get("metadata", {}).get("resourceVersion") or rv
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._consider(obj, kind)
        return rv

    def _consider(self, node: dict, kind: str = "ADDED") -> None:
        meta = node.get("metadata", {})
        name, labels = meta["name"], meta.get("labels") or {}
        action = None if kind == "DELETED" else ACTIONS.get(labels.get(HEALTH_LABEL, ""))
        with self._lock:
            if kind != "DELETED" and HEALTH_LABEL in labels:
                self._workers.add(name)
            else:
                self._workers.discard(name)
            if action is not None or kind == "DELETED":
                self._detecting.discard(name)  # a detection's label arrived (or its node went)
            self._seen.setdefault(name, collections.deque(maxlen=256)).append(
                "DELETED" if kind == "DELETED" else meta.get("resourceVersion", ""))
            until = self._settling.get(name)
            if until is not None:
                if until == ("DELETED" if kind == "DELETED" else meta.get("resourceVersion")):
                    del self._settling[name]
                return  # an event from before the end of the last recovery
            if action is None or self._stop.is_set() or name in self._active:
                return  # (already recovering: the agent's own updates arrive here too)
            self._active[name] = (action, instance_id_of(node))
            self._record(name, action, "requested", uid=meta.get("uid"), resource_version=meta.get("resourceVersion"))
        self._spawn(self._recover, (name, action), f"hyperpod-{action}:{name}")

    def _spawn(self, target: Callable[..., None], args: tuple, name: str) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    # ---- recoveries ------------------------------------------------------------------
    def _record(self, node: str, action: str, step: str, done: bool = False, settle: str | None = None,
                **detail: Any) -> None:
        """Append a step; ``done``: the recovery's last one (it leaves ``active()`` in the same instant,
        and the watch ignores the node's events until ``settle``)."""
        with self._lock:
            self._history.append(Transition(node, action, step, time.time(), time.monotonic(), detail))
            if done:
                self._active.pop(node, None)
                if settle is not None and settle not in self._seen.get(node, ()):
                    self._settling[node] = settle  # (versions are opaque: compared for equality only)
            self._lock.notify_all()

    def _recover(self, name: str, action: str) -> None:
        try:
            self._cordon(name)
            self._record(name, action, "cordoned", taint=UNSCHEDULABLE_TAINT["key"])
            # The host first, then the pods: its processes all die at once (SIGKILL), so the
            # kubelet has none left to SIGTERM (see the module docstring).
            self.hosts.power_off(name)
            self._record(name, action, "host_down")
            # No kubelet heartbeats here to go stale: the agent says what a kubelet would.
            self._set_ready(name, False, "NodeRebooting" if action == REBOOT else "NodeReplacing",
                            f"HyperPod-like agent: host powered off for {action}")
            self._record(name, action, "not_ready")
            self._record(name, action, "pods_killed", pods=self._kill_pods(name))
            if action == REBOOT:
                self._reboot(name)
            else:
                self._replace(name)
        except Exception as err:  # noqa: BLE001 - recorded; the node stays as it is, like a stuck recovery
            log.exception("%s of node %s failed", action, name)
            try:  # the node stays as the failure left it; only a later change may start it again
                settle = _raw(self.core.read_node, name)["metadata"]["resourceVersion"]
            except ApiException as gone:
                settle = "DELETED" if gone.status == 404 else None
            except Exception:  # noqa: BLE001 - the API server itself may be what failed
                settle = None
            self._record(name, action, "failed", done=True, settle=settle, error=f"{type(err).__name__}: {err}")

    def _update_node(self, name: str, change: Callable[[dict], None]) -> str:
        """Read-modify-write of a node with its resourceVersion as precondition (retried on 409);
        returns the new resourceVersion."""
        for _ in range(10):
            node = _raw(self.core.read_node, name)
            change(node)
            try:
                return self.core.replace_node(name, node).metadata.resource_version
            except ApiException as err:
                if err.status != 409:
                    raise
        raise RuntimeError(f"node {name}: 10 conflicting updates in a row")

    def _cordon(self, name: str) -> None:
        def cordon(node: dict) -> None:
            spec = node.setdefault("spec", {})
            spec["unschedulable"] = True
            taints = [t for t in spec.get("taints") or [] if t.get("key") != UNSCHEDULABLE_TAINT["key"]]
            spec["taints"] = taints + [{**UNSCHEDULABLE_TAINT, "timeAdded": _now()}]

        self._update_node(name, cordon)

    def _kill_pods(self, name: str) -> list[str]:
        """Force-delete (grace 0) every pod bound to the (powered-off) node, all before waiting on any."""
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
        killed = []
        for pod in pods:
            try:
                self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0,
                                                body=client.V1DeleteOptions(grace_period_seconds=0))
                killed.append(f"{pod.metadata.namespace}/{pod.metadata.name}")
            except ApiException as err:
                if err.status != 404:
                    raise
        return killed

    def _set_ready(self, name: str, ready: bool, reason: str, message: str) -> None:
        condition = {"type": "Ready", "status": "True" if ready else "False", "reason": reason, "message": message,
                     "lastTransitionTime": _now(), "lastHeartbeatTime": _now()}
        self.core.patch_node_status(name, {"status": {"conditions": [condition]}})

    def _reboot(self, name: str) -> None:
        self._record(name, REBOOT, "host_rebooting")
        facts = self.hosts.reboot(name) or {}
        self._record(name, REBOOT, "host_back", **facts)
        self._set_ready(name, True, "KubeletReady", "kubelet is posting ready status")
        cleared = self._clear_xid_conditions(name)

        def restore(node: dict) -> None:
            labels = node["metadata"].setdefault("labels", {})
            labels[HEALTH_LABEL] = SCHEDULABLE
            labels.pop(FAULT_TYPES_LABEL, None)
            labels.pop(FAULT_REASONS_LABEL, None)
            spec = node.setdefault("spec", {})
            spec.pop("unschedulable", None)
            spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != UNSCHEDULABLE_TAINT["key"]]
            if not spec["taints"]:
                spec.pop("taints")

        final = self._update_node(name, restore)
        self._record(name, REBOOT, "schedulable", done=True, settle=final, conditions_cleared=cleared)

    def _clear_xid_conditions(self, name: str) -> list[str]:
        """After a reboot, the Xid conditions set before it (by this agent, or True on the node) go
        False, as node-problem-detector-style agents reset theirs when the node comes back."""
        with self._lock:
            kinds = self._raised.pop(name, set())
        conditions = _raw(self.core.read_node, name).get("status", {}).get("conditions") or []
        kinds |= {c["type"] for c in conditions
                  if c.get("type") in XID_CONDITIONS.values() and c.get("status") == "True"}
        if kinds:
            self.core.patch_node_status(name, {"status": {"conditions": [{
                "type": kind, "status": "False", "reason": NO_XID_SINCE_REBOOT,
                "message": "no Xid in the kernel log since the node rebooted",
                "lastTransitionTime": _now(), "lastHeartbeatTime": _now()} for kind in sorted(kinds)]}})
        return sorted(kinds)

    def _replace(self, name: str) -> None:
        old = _raw(self.core.read_node, name)
        self.core.delete_node(name)
        with self._lock:
            self._raised.pop(name, None)  # the new node has no conditions of the old one
        self._record(name, REPLACE, "node_deleted", uid=old["metadata"].get("uid"))
        self._record(name, REPLACE, "host_replacing")
        host = self.hosts.replace(name)
        new_name = host.node_name or f"hyperpod-{host.instance_id}"
        self._record(name, REPLACE, "host_replaced", instance_id=host.instance_id, new_node=new_name)
        labels = {k: v for k, v in (old["metadata"].get("labels") or {}).items()
                  if not k.startswith("sagemaker.amazonaws.com/") and k not in (INSTANCE_ID_LABEL,
                                                                                "kubernetes.io/hostname")}
        labels.update({INSTANCE_GROUP_LABEL: (old["metadata"].get("labels") or {}).get(INSTANCE_GROUP_LABEL,
                                                                                      self.instance_group),
                       COMPUTE_TYPE_LABEL: "hyperpod", "kubernetes.io/hostname": new_name,
                       INSTANCE_ID_LABEL: host.instance_id, HEALTH_LABEL: SCHEDULABLE, **host.labels})
        created = self.core.create_node({"apiVersion": "v1", "kind": "Node",
                                         "metadata": {"name": new_name, "labels": labels}, "spec": {}})
        status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                                  "message": "kubelet is posting ready status",
                                                  "lastTransitionTime": _now(), "lastHeartbeatTime": _now()}]}
        if host.addresses:
            status["addresses"] = [dict(a) for a in host.addresses]
        self.core.patch_node_status(new_name, {"status": status})
        self._record(name, REPLACE, "node_created", done=True, settle="DELETED", new_node=new_name,
                     uid=created.metadata.uid, instance_id=host.instance_id)


class _Expired(Exception):
    """The watch's resourceVersion is older than the server's history (in-stream 410)."""


def _raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
    """An API call's JSON body as sent (no model round trip, which rewrites timestamps)."""
    response = call(*args, _preload_content=False, **kwargs)
    return json.loads(response.data)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
