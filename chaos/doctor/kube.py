"""doctor on Kubernetes: may the profile's identity do what the enabled fault kinds do, and
would the xid fault's node-shell pod be admitted — asked, never done.

RBAC is asked with one SelfSubjectAccessReview per permission (what ``kubectl auth can-i``
sends), so a narrow Role is found before a night's first fault rather than by a 403 in the
middle of it; admission with a server-side dry run of the very manifest the xid fault
creates (``chaos.faults.kube.node_shell_pod``), so a namespace whose Pod Security level
refuses privileged pods is reported with the server's own words.  Neither changes anything.

The permissions are those the code calls (chaos/faults/kube.py, chaos/faults/xid.py,
chaos/transport/kube*.py, chaos/backends/kubernetes.py); examples/kubernetes/chaos-cronjob.yaml's
Role and ClusterRole grant all of them (tests/kube/test_doctor_kube.py).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterable

from kubernetes import client
from kubernetes.client.rest import ApiException

from chaos.doctor.check import Check
from chaos.errors import ClusterError
from chaos.faults import catalog
from chaos.transport.kube_access import CONNECTION_ERRORS, KubeAccess, server_message

if TYPE_CHECKING:
    from chaos.profile import Profile

SUBJECT = "kubernetes"
EXAMPLE_ROLE = "examples/kubernetes/chaos-cronjob.yaml"


@dataclasses.dataclass(frozen=True)
class Permission:
    """One RBAC permission: ``verb`` on ``resource`` (RBAC's name, ``pods/exec``) of API
    ``group``, in the RayCluster's namespace or at cluster scope (every namespace)."""

    verb: str
    resource: str
    group: str = ""
    cluster: bool = False

    def scope(self, namespace: str) -> str:
        return "at cluster scope" if self.cluster else f"in namespace {namespace}"

    def describe(self, namespace: str) -> str:
        qualified = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{self.verb} {qualified} {self.scope(namespace)}"

    def rule(self, namespace: str) -> str:
        """The Role (or ClusterRole) rule that grants it."""
        where = "a ClusterRole" if self.cluster else f"a Role in namespace {namespace}"
        return (f'{where}: {{apiGroups: ["{self.group}"], resources: [{self.resource}], verbs: [{self.verb}]}}')


def _p(verb: str, resource: str, group: str = "", cluster: bool = False) -> Permission:
    return Permission(verb, resource, group, cluster)


# What the backend does for every kind: find the Ray pods and their nodes, read the RayCluster.
BACKEND = (_p("list", "pods"), _p("get", "pods"), _p("get", "nodes", cluster=True),
           _p("get", "rayclusters", "ray.io"))
# Kinds that act inside a Ray pod (signals, the shim's delivery, the kernel log by transport): exec,
# authorized as create over WebSocket (Kubernetes >= 1.31; older servers asked get).
EXEC = _p("create", "pods/exec")
NODE_RECOVERY = (_p("list", "nodes", cluster=True), _p("watch", "nodes", cluster=True),
                 _p("patch", "nodes", cluster=True), _p("list", "pods", cluster=True))
BY_KIND: dict[str, tuple[Permission, ...]] = {
    "pod-delete": (_p("delete", "pods"),),
    "pod-delete-graceful": (_p("delete", "pods"),),
    "pod-evict": (_p("create", "pods/eviction"),),
    # cordon (patch), the node's pods in every namespace, their evictions; the revert lists nodes
    "drain": (_p("patch", "nodes", cluster=True), _p("list", "nodes", cluster=True),
              _p("list", "pods", cluster=True), _p("create", "pods/eviction", cluster=True)),
    "hyperpod-reboot": NODE_RECOVERY,
    "node-replace": NODE_RECOVERY,
    # the node-shell pod: created, watched to its end, its log read, deleted; the agent's node watch
    "xid": (_p("create", "pods"), _p("watch", "pods"), _p("get", "pods/log"), _p("delete", "pods"),
            _p("list", "nodes", cluster=True), _p("watch", "nodes", cluster=True)),
}


def needs_exec(kind: str) -> bool:
    """A kind that works on its target's host, which on Kubernetes is its Ray pod, reached by exec."""
    return catalog.KINDS[kind].needs is None


def permissions(kinds: Iterable[str]) -> dict[Permission, tuple[str, ...]]:
    """{permission: the enabled kinds that use it}; () for the backend's own (every kind)."""
    needed: dict[Permission, list[str]] = {p: [] for p in BACKEND}
    for kind in sorted(kinds):
        for p in BY_KIND.get(kind, ()) + ((EXEC,) if needs_exec(kind) else ()):
            if p in BACKEND:
                continue
            needed.setdefault(p, []).append(kind)
    return {p: tuple(ks) for p, ks in needed.items()}


def checks(profile: "Profile", kinds: set[str]) -> list[Check]:
    settings = profile.kubernetes
    try:
        kube = KubeAccess.from_settings(settings)
    except ClusterError as e:
        return [Check(SUBJECT, "API server", False, f"{e} (RBAC and admission not checked)",
                      "fix the profile's kubernetes section (kubeconfig, context, in_cluster) or the network, then run "
                      "doctor again")]
    try:
        out = [Check(SUBJECT, "API server", True, f"{kube.server} ({kube.server_version()}) as {kube.identity}")]
        out += access_checks(kube, kinds)
        if "xid" in kinds:
            out.append(node_shell_admission(kube, settings.node_shell_image))
        return out
    finally:
        kube.api_client.close()


def can_i(kube: KubeAccess, permission: Permission) -> client.V1SubjectAccessReviewStatus:
    resource, _, sub = permission.resource.partition("/")
    attrs = client.V1ResourceAttributes(verb=permission.verb, resource=resource, subresource=sub or None,
                                        group=permission.group, namespace=None if permission.cluster else kube.namespace)
    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attrs))
    return client.AuthorizationV1Api(kube.api_client).create_self_subject_access_review(
        review, _request_timeout=kube.request_timeout).status


def access_checks(kube: KubeAccess, kinds: Iterable[str]) -> list[Check]:
    """One ✔ line for the permissions granted, one ✗ line per permission refused, naming the
    rule to add and the kinds it stops."""
    granted, out = [], []
    for permission, users in permissions(kinds).items():
        what = f"RBAC: {permission.describe(kube.namespace)}"
        try:
            status = can_i(kube, permission)
        except (ApiException, *CONNECTION_ERRORS) as e:
            reason = server_message(e) if isinstance(e, ApiException) else f"{type(e).__name__}: {e}"
            return out + [Check(SUBJECT, "RBAC (SelfSubjectAccessReview)", False,
                                f"could not ask the API server at {kube.server}: {reason}",
                                "let the identity create selfsubjectaccessreviews.authorization.k8s.io (every "
                                "authenticated user may, through system:basic-user), then run doctor again")]
        if status.allowed:
            granted.append(permission.describe(kube.namespace))
            continue
        stops = ", ".join(users) if users else "every kind (the backend itself)"
        out.append(Check(SUBJECT, what, False, f"not allowed for {kube.identity}; needed by {stops}"
                         + (f" ({status.reason})" if status.reason else ""),
                         f"add to {permission.rule(kube.namespace)}, bound to {kube.identity} (the full set: "
                         f"{EXAMPLE_ROLE})", users))
    if granted:
        out.insert(0, Check(SUBJECT, f"RBAC: {len(granted)} permission(s) the enabled kinds use", True,
                            "; ".join(granted)))
    return out


def _shell_node(kube: KubeAccess) -> tuple[str, str]:
    """A node to aim the dry run at (a Ray worker's, as the fault would) and where it came from."""
    try:
        workers = [p for p in kube.ray_pods() if not p.is_head and p.node_name]
    except ClusterError as e:
        return "doctor-dry-run", f"no Ray worker's node ({e})"
    if not workers:
        return "doctor-dry-run", f"no Ray worker pod of {kube.cluster_ref} is bound to a node"
    return workers[0].node_name or "", f"Ray worker {workers[0].name}'s node"


def node_shell_admission(kube: KubeAccess, image: str) -> Check:
    """The xid fault's node-shell pod, created as a server-side dry run: admitted, or refused
    with the server's reason (RBAC, Pod Security) and its fix."""
    from chaos.faults.kube import node_shell_pod

    node, where = _shell_node(kube)
    what = f"admission of the xid node-shell pod (privileged, hostPID, {image}) in namespace {kube.namespace}"
    body = node_shell_pod(kube.namespace, node, image, ": ray-chaos doctor, a dry run", {})
    try:
        kube.core.create_namespaced_pod(kube.namespace, body, dry_run="All", _request_timeout=kube.request_timeout)
    except ApiException as e:
        message = server_message(e)
        if e.status == 403 and "PodSecurity" in message:
            fix = (f"let namespace {kube.namespace} admit privileged pods (kubectl label namespace {kube.namespace} "
                   "pod-security.kubernetes.io/enforce=privileged --overwrite), or leave xid out of the runs")
        elif e.status == 403:
            fix = f"add to {_p('create', 'pods').rule(kube.namespace)}, bound to {kube.identity}"
        else:
            fix = "see the server's reason; the xid fault creates exactly this pod"
        return Check(SUBJECT, what, False, f"refused ({e.status}): {message}", fix, ("xid",))
    except CONNECTION_ERRORS as e:
        return Check(SUBJECT, what, False, f"no answer from {kube.server}: {type(e).__name__}: {e}",
                     "make the API server reachable, then run doctor again", ("xid",))
    return Check(SUBJECT, what, True, f"admitted (server-side dry run on {where} {node}; nothing created)")
