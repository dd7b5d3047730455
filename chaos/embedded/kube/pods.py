"""Pod deletion as the apiserver and kubelet share it: grace periods, deletionTimestamp, finalizers.

Follows the generic registry (``rest.BeforeDelete``, ``Store.Delete``): a delete first writes
``deletionTimestamp`` + ``deletionGracePeriodSeconds`` (watchers see MODIFIED); with grace 0
(``--grace-period=0 --force``, Chaos Mesh pod-kill) the object is then removed at once
(DELETED) and the kubelet is left to kill the processes.  With grace > 0 the object stays —
still counted by controllers such as KubeRay — until the kubelet, its containers gone,
deletes it with grace 0 (MODIFIED to 0, then DELETED).  A later delete may only shorten the
grace; a finalizer keeps the object until it is removed.  Pods not bound to a node, and
finished pods, get grace 0 whatever was asked, and a negative grace counts as 1 (the pod
strategy's ``CheckGracefulDelete``).
"""

from __future__ import annotations

import datetime
from typing import Callable

from chaos.embedded.kube.lifecycle import PodLifecycle
from chaos.embedded.kube.resources import PODS
from chaos.embedded.kube.status import ApiError, conflict, invalid
from chaos.embedded.kube.store import REMOVE, Store

_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def _parse(timestamp: str) -> datetime.datetime:
    return datetime.datetime.strptime(timestamp, _FORMAT).replace(tzinfo=datetime.timezone.utc)


def _mark_deleting(pod: dict, grace: int | None) -> bool:
    """Set or shorten the pod's deletion as ``rest.BeforeDelete`` does; False: nothing to change."""
    meta, spec = pod["metadata"], pod["spec"]
    requested = None if grace is None else 1 if grace < 0 else grace
    if meta.get("deletionTimestamp"):
        current = meta.get("deletionGracePeriodSeconds") or 0
        if requested is None or requested >= current or current == 0:
            return False  # pending: only a shorter grace changes anything
        moment = _parse(meta["deletionTimestamp"]) - datetime.timedelta(seconds=current - requested)
        if moment < _now():
            moment = _now()
            requested = 1 if requested else 0
    else:
        requested = spec.get("terminationGracePeriodSeconds", 30) if requested is None else requested
        if not spec.get("nodeName") or pod["status"].get("phase") in ("Succeeded", "Failed"):
            requested = 0
        moment = _now() + datetime.timedelta(seconds=requested)
    meta["deletionTimestamp"] = moment.strftime(_FORMAT)
    meta["deletionGracePeriodSeconds"] = requested
    return True


class Pods:
    def __init__(self, store: Store, lifecycle: PodLifecycle):
        self.store, self.lifecycle = store, lifecycle
        lifecycle.attach(self)

    def create(self, pod: dict) -> dict:
        pod = self.store.create(PODS.plural, pod)
        self.lifecycle.pod_added(pod)
        return pod

    def delete(self, namespace: str, name: str, grace: int | None = None, uid: str | None = None) -> dict:
        """Delete with ``grace`` seconds (None: the pod's terminationGracePeriodSeconds); returns the pod."""
        changed = False

        def change(pod: dict) -> dict | None:
            nonlocal changed
            meta = pod["metadata"]
            if uid is not None and meta["uid"] != uid:
                raise conflict("Pod", name, f"the UID in the precondition ({uid}) does not match the UID in record "
                                            f"({meta['uid']}). The object might have been deleted and then recreated")
            changed = _mark_deleting(pod, grace)
            return pod if changed else None

        pod = self.store.update(PODS.plural, namespace, name, change)
        meta = pod["metadata"]
        if meta.get("deletionGracePeriodSeconds") == 0 and not meta.get("finalizers"):
            removed = self._unless_gone(lambda: self.store.update(
                PODS.plural, namespace, name, lambda p: REMOVE if p["metadata"]["uid"] == meta["uid"] else None))
            if removed is not None:
                self.lifecycle.pod_removed(removed)
                return removed
        if changed:
            self.lifecycle.pod_terminating(pod, meta["deletionGracePeriodSeconds"])
        return pod

    def bind(self, namespace: str, name: str, binding: dict) -> dict:
        """``POST pods/<p>/binding`` as a scheduler sends it: set ``spec.nodeName`` once (the
        registry's ``assignPod``: a bound or terminating pod is a 409), add PodScheduled=True,
        then tell the lifecycle, which starts the containers as a kubelet does on a new bound pod."""
        node = ((binding or {}).get("target") or {}).get("name")
        if (binding.get("metadata") or {}).get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "name in URL does not match name in Binding object", {})
        if not node:
            raise invalid("Binding", name, "target.name", "Required value")

        def change(pod: dict) -> dict:
            if pod["metadata"].get("deletionTimestamp"):
                raise conflict("pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host")
            if pod["spec"].get("nodeName"):
                raise conflict("pods/binding", name,
                               f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"')
            pod["spec"]["nodeName"] = node
            conditions = [c for c in pod["status"].get("conditions", []) if c.get("type") != "PodScheduled"]
            pod["status"]["conditions"] = conditions + [{"type": "PodScheduled", "status": "True"}]
            return pod

        pod = self.store.update(PODS.plural, namespace, name, change)
        self.lifecycle.pod_added(pod)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}

    def containers_stopped(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's last word on a terminating pod, its processes gone: delete it with grace 0."""
        pod = self.store.get(PODS.plural, namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid or not pod["metadata"].get("deletionTimestamp"):
            return
        try:
            self.delete(namespace, name, 0, uid)
        except ApiError as err:
            if err.code not in (404, 409):  # gone already, or another pod of that name now
                raise

    def finish_if_done(self, namespace: str, name: str) -> None:
        """Remove a pod whose containers are gone once its last finalizer is (after any update)."""
        def done(pod: dict) -> dict | None:
            meta = pod["metadata"]
            finished = meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds") == 0
            return REMOVE if finished and not meta.get("finalizers") else None

        self._unless_gone(lambda: self.store.update(PODS.plural, namespace, name, done))

    @staticmethod
    def _unless_gone(call: Callable[[], dict]) -> dict | None:
        """``call()``, or None when the pod is already gone (removed by whoever got there first)."""
        try:
            return call()
        except ApiError as err:
            if err.code == 404:
                return None
            raise

    def set_status(self, namespace: str, name: str, status: dict, uid: str | None = None) -> dict | None:
        """Merge ``status`` into the pod's status (the kubelet's status update); None if the pod is gone."""
        def change(pod: dict) -> dict | None:
            if uid is not None and pod["metadata"]["uid"] != uid:
                return None
            merged = {**pod.get("status", {}), **status}
            if merged == pod.get("status"):
                return None
            pod["status"] = merged
            return pod

        return self._unless_gone(lambda: self.store.update(PODS.plural, namespace, name, change))
