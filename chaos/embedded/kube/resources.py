"""The resources the emulated API server serves, and what the server fills in on create.

One table drives discovery (what ``/api/v1`` and ``/apis/...`` advertise, which kubectl reads
before every command), routing, field selectors and RBAC names, so the three cannot drift
apart.  Core ``pods``, ``nodes`` and ``namespaces`` and ``ray.io/v1`` ``rayclusters`` are stored;
``authorization.k8s.io/v1`` ``selfsubjectaccessreviews`` are answered, never stored.
"""

from __future__ import annotations

import datetime
import random
import uuid
from dataclasses import dataclass, field
from typing import Callable

from chaos.embedded.kube.status import invalid

# k8s.io/apiserver/pkg/storage/names: base cut to 58 chars + 5 chars from this alphabet.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_GENERATED_BASE = 58


def _get(path: str, default: str = "") -> Callable[[dict], str]:
    def value(obj: dict) -> str:
        node = obj
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        if isinstance(node, bool):
            return "true" if node else "false"
        return str(node)
    return value


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    namespaced: bool
    group: str = ""
    version: str = "v1"
    verbs: tuple[str, ...] = ("create", "delete", "get", "list", "patch", "update", "watch")
    short_names: tuple[str, ...] = ()
    subresources: dict[str, dict] = field(default_factory=dict)
    fields: dict[str, Callable[[dict], str]] = field(default_factory=dict)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()


_META_FIELDS = {"metadata.name": _get("metadata.name"), "metadata.namespace": _get("metadata.namespace")}

PODS = Resource(
    "pods", "Pod", True, short_names=("po",),
    subresources={
        "binding": {"kind": "Binding", "verbs": ["create"]},  # what a scheduler posts (kuberay.py)
        "eviction": {"kind": "Eviction", "group": "policy", "version": "v1", "verbs": ["create"]},
        "exec": {"kind": "PodExecOptions", "verbs": ["create", "get"]},
        "log": {"kind": "Pod", "verbs": ["get"]},
        "status": {"kind": "Pod", "verbs": ["get", "patch", "update"]},
    },
    fields={**_META_FIELDS, "spec.nodeName": _get("spec.nodeName"), "status.phase": _get("status.phase")},
)
NODES = Resource(
    "nodes", "Node", False, short_names=("no",),
    subresources={"status": {"kind": "Node", "verbs": ["get", "patch", "update"]}},
    fields={"metadata.name": _get("metadata.name"), "spec.unschedulable": _get("spec.unschedulable", "false")},
)
NAMESPACES = Resource(
    "namespaces", "Namespace", False, verbs=("create", "get", "list", "watch"), short_names=("ns",),
    fields={"metadata.name": _get("metadata.name"), "status.phase": _get("status.phase")},
)
RAYCLUSTERS = Resource("rayclusters", "RayCluster", True, group="ray.io", version="v1", fields=_META_FIELDS,
                       subresources={"status": {"kind": "RayCluster", "verbs": ["get", "patch", "update"]}})

# Not stored: a create answers whether the caller may do something (rbac.access_review).
SELF_SUBJECT_ACCESS_REVIEWS = Resource("selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
                                       group="authorization.k8s.io", verbs=("create",))

CORE = {r.plural: r for r in (PODS, NODES, NAMESPACES)}
# The API groups served besides the core group; "policy" exists for pods/eviction's Eviction kind.
GROUPS = {"policy": ("v1", []), "ray.io": ("v1", [RAYCLUSTERS]),
          "authorization.k8s.io": ("v1", [SELF_SUBJECT_ACCESS_REVIEWS])}


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def generated_name(base: str) -> str:
    return base[:_MAX_GENERATED_BASE] + "".join(random.choice(_NAME_ALPHABET) for _ in range(5))


def prepare_new(resource: Resource, obj: dict, namespace: str | None) -> dict:
    """Fill in what the apiserver sets on create: name from generateName, uid, timestamps, defaults."""
    obj = dict(obj)
    meta = dict(obj.get("metadata") or {})
    obj["kind"], obj["apiVersion"] = resource.kind, resource.api_version
    if not meta.get("name"):
        if not meta.get("generateName"):
            raise invalid(resource.kind, "", "metadata.name", "Required value: name or generateName is required")
        meta["name"] = generated_name(meta["generateName"])
    if resource.namespaced:
        if meta.get("namespace") not in (None, "", namespace):
            raise invalid(resource.kind, meta["name"], "metadata.namespace",
                          "the namespace of the provided object does not match the namespace sent on the request")
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    meta.update(uid=str(uuid.uuid4()), creationTimestamp=now())
    meta.pop("deletionTimestamp", None)
    meta.pop("deletionGracePeriodSeconds", None)
    obj["metadata"] = meta
    if resource is PODS:
        spec = dict(obj.get("spec") or {})
        if not spec.get("containers"):
            raise invalid("Pod", meta["name"], "spec.containers", "Required value")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("restartPolicy", "Always")
        obj["spec"] = spec
        obj["status"] = {"phase": "Pending"}  # a client-sent status is dropped, as PodStrategy does
    elif resource is NAMESPACES:
        obj["status"] = {"phase": "Active"}
    elif resource is NODES:
        obj.setdefault("spec", {})
        obj.setdefault("status", {})
    return obj
