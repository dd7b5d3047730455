"""An optional allow-list of verbs on resources, refusing everything else with 403 Forbidden.

Real clusters the harness targets often grant a narrow Role; the harness must say which
permission is missing.  The 403 body here has the wording of the apiserver's
authorization filter (``User "u" cannot delete resource "pods" in API group "" in the
namespace "ns"``), so that message can be tested against this server.  Subresources are
named as RBAC names them: ``pods/eviction``, ``pods/exec``; ``*`` matches any verb or resource.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaos.embedded.kube.status import ApiError


@dataclass(frozen=True)
class Rule:
    verbs: tuple[str, ...]
    resources: tuple[str, ...]
    namespaces: tuple[str, ...] | None = None  # None: every namespace and the cluster scope

    def allows(self, verb: str, resource: str, namespace: str | None) -> bool:
        return (("*" in self.verbs or verb in self.verbs)
                and ("*" in self.resources or resource in self.resources)
                and (self.namespaces is None or namespace in self.namespaces))


@dataclass(frozen=True)
class Rbac:
    rules: tuple[Rule, ...]
    user: str = "system:serviceaccount:default:chaos-harness"

    def check(self, verb: str, resource: str, subresource: str, group: str, namespace: str | None,
              name: str | None) -> None:
        full = f"{resource}/{subresource}" if subresource else resource
        if any(rule.allows(verb, full, namespace) for rule in self.rules):
            return
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        qualified = f"{resource}.{group}" if group else resource
        subject = f'{qualified} "{name}"' if name else qualified
        details = {"kind": resource, **({"name": name} if name else {}), **({"group": group} if group else {})}
        raise ApiError(403, "Forbidden", f'{subject} is forbidden: User "{self.user}" cannot {verb} resource '
                       f'"{full}" in API group "{group}" {scope}', details)
