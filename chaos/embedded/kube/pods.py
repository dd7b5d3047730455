"""Pod deletion as the apiserver and kubelet share it: grace periods, deletionTimestamp, finalizers.

A delete with grace 0 (``--grace-period=0 --force``, Chaos Mesh pod-kill) removes the object
at once and leaves the kubelet to kill the processes.  A delete with grace > 0 only marks the
object (``deletionTimestamp``, ``deletionGracePeriodSeconds``; watchers see MODIFIED) and the
object stays — still counted by controllers such as KubeRay — until the kubelet reports its
containers gone and no finalizer remains; then watchers see DELETED.  A second delete may
shorten the grace, never lengthen it.  Pods not bound to a node, and finished pods, are
deleted at once whatever grace was asked (the apiserver's pod strategy does the same).
"""

from __future__ import annotations

import datetime

from chaos.embedded.kube.lifecycle import PodLifecycle
from chaos.embedded.kube.resources import PODS
from chaos.embedded.kube.status import ApiError
from chaos.embedded.kube.store import Store


def _timestamp(after_seconds: int) -> str:
    moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=after_seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Pods:
    def __init__(self, store: Store, lifecycle: PodLifecycle):
        self.store, self.lifecycle = store, lifecycle
        lifecycle.attach(self)

    def create(self, pod: dict) -> dict:
        pod = self.store.create(PODS.plural, pod)
        self.lifecycle.pod_added(pod)
        return pod

    def delete(self, namespace: str, name: str, grace: int | None = None, uid: str | None = None) -> dict:
        """Delete with ``grace`` seconds (None: the pod's terminationGracePeriodSeconds)."""
        removed_now: dict | None = None
        started = False

        def change(pod: dict) -> dict | None:
            nonlocal removed_now, started
            meta, spec = pod["metadata"], pod["spec"]
            if uid is not None and meta["uid"] != uid:
                raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, "
                               f"UID in object meta: {meta['uid']}", {"name": name, "kind": "pods"})
            period = spec.get("terminationGracePeriodSeconds", 30) if grace is None else grace
            period = 1 if period < 0 else period
            if not spec.get("nodeName") or pod["status"].get("phase") in ("Succeeded", "Failed"):
                period = 0
            if meta.get("deletionTimestamp") and period >= meta.get("deletionGracePeriodSeconds", 0):
                return None
            meta["deletionTimestamp"] = _timestamp(period)
            meta["deletionGracePeriodSeconds"] = period
            if period == 0 and not meta.get("finalizers"):
                removed_now = pod
                return None
            started = True
            return pod

        pod = self.store.update(PODS.plural, namespace, name, change)
        if removed_now is not None:
            pod = self.store.remove(PODS.plural, namespace, name)
            self.lifecycle.pod_removed(pod)
        elif started:
            self.lifecycle.pod_terminating(pod, pod["metadata"]["deletionGracePeriodSeconds"])
        return pod

    def containers_stopped(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's last word on a terminating pod: its processes are gone."""
        pod = self.store.get(PODS.plural, namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid or not pod["metadata"].get("deletionTimestamp"):
            return

        def finished(p: dict) -> dict | None:
            if p["metadata"].get("deletionGracePeriodSeconds") == 0:
                return None
            p["metadata"]["deletionGracePeriodSeconds"] = 0
            return p

        self.store.update(PODS.plural, namespace, name, finished)
        self.finish_if_done(namespace, name)

    def finish_if_done(self, namespace: str, name: str) -> None:
        """Remove a pod whose containers are gone once its last finalizer is (after any update)."""
        pod = self.store.get(PODS.plural, namespace, name)
        meta = pod["metadata"] if pod else {}
        if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds") == 0 \
                and not meta.get("finalizers"):
            self.store.remove(PODS.plural, namespace, name)

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

        try:
            return self.store.update(PODS.plural, namespace, name, change)
        except ApiError as err:
            if err.code == 404:
                return None
            raise
