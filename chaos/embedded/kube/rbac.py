"""An optional allow-list of verbs on resources, refusing everything else with 403 Forbidden.

Real clusters the harness targets often grant a narrow Role; the harness must say which
permission is missing.  The 403 body here has the wording of the apiserver's
authorization filter (``User "u" cannot delete resource "pods" in API group "" in the
namespace "ns"``), so that message can be tested against this server.  Subresources are
named as RBAC names them: ``pods/eviction``, ``pods/exec``; ``*`` matches any verb or resource.

``access_review`` answers a ``SelfSubjectAccessReview`` from the same rules, so a client can
ask before it acts (``kubectl auth can-i``, ``ray-chaos doctor``) and get the answer the
request itself would get.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Any

from chaos.embedded.kube.status import ApiError, invalid


@dataclass(frozen=True)
class Rule:
    verbs: tuple[str, ...]
    resources: tuple[str, ...]
    namespaces: tuple[str, ...] | None = None  # None: every namespace and the cluster scope

    def allows(self, verb: str, resource: str, namespace: str | None) -> bool:
        return (("*" in self.verbs or verb in self.verbs)
                and ("*" in self.resources or resource in self.resources)
                and (self.namespaces is None or namespace in self.namespaces))

    def describe(self) -> str:
        scope = ",".join(self.namespaces) if self.namespaces is not None else "any namespace and the cluster scope"
        return f"verbs [{','.join(self.verbs)}] on [{','.join(self.resources)}] in {scope}"


@dataclass(frozen=True)
class Rbac:
    rules: tuple[Rule, ...]
    user: str = "system:serviceaccount:default:chaos-harness"

    def rule_for(self, verb: str, resource: str, subresource: str, namespace: str | None) -> Rule | None:
        """The first rule that allows the request (None: refused)."""
        full = f"{resource}/{subresource}" if subresource else resource
        return next((rule for rule in self.rules if rule.allows(verb, full, namespace)), None)

    def check(self, verb: str, resource: str, subresource: str, group: str, namespace: str | None,
              name: str | None) -> None:
        if self.rule_for(verb, resource, subresource, namespace) is not None:
            return
        full = f"{resource}/{subresource}" if subresource else resource
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        qualified = f"{resource}.{group}" if group else resource
        subject = f'{qualified} "{name}"' if name else qualified
        details = {"kind": resource, **({"name": name} if name else {}), **({"group": group} if group else {})}
        raise ApiError(403, "Forbidden", f'{subject} is forbidden: User "{self.user}" cannot {verb} resource '
                       f'"{full}" in API group "{group}" {scope}', details)


def access_review(rbac: Rbac | None, body: Any) -> dict:
    """The answered ``SelfSubjectAccessReview``: the body sent, with ``status``.

    Like the apiserver: any caller may ask; exactly one of ``resourceAttributes`` and
    ``nonResourceAttributes`` (else 422); allowed when a rule allows the request, else
    ``allowed: false`` with no reason (RBAC only ever allows; it never denies).  Without an
    allow-list everything is allowed, as every request is; non-resource URLs (``/version``,
    discovery) are always served, so they are always allowed.
    """
    kind = "SelfSubjectAccessReview.authorization.k8s.io"
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the body of a create must be a SelfSubjectAccessReview object")
    spec = body.get("spec") or {}
    attrs, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if attrs and non_resource:
        raise invalid(kind, "", "spec.nonResourceAttributes", "Invalid value: cannot be specified in combination "
                      "with resourceAttributes")
    if not attrs and not non_resource:
        raise invalid(kind, "", "spec.resourceAttributes", 'Invalid value: "null": exactly one of '
                      "nonResourceAttributes or resourceAttributes must be specified")
    status: dict[str, Any] = {"allowed": True}
    if attrs and rbac is not None:
        rule = rbac.rule_for(attrs.get("verb") or "", attrs.get("resource") or "", attrs.get("subresource") or "",
                             attrs.get("namespace") or None)
        status = ({"allowed": True, "reason": f"RBAC: allowed by the emulated allow-list's rule {rule.describe()}"}
                  if rule is not None else {"allowed": False})
    meta = dict(body.get("metadata") or {})
    meta.setdefault("creationTimestamp", None)
    return {**body, "kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "metadata": meta,
            "spec": spec, "status": status}
