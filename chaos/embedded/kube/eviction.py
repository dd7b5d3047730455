"""The pods/eviction subresource and the disruption budgets it honours.

``kubectl drain`` and HyperPod-like flows evict rather than delete: an eviction that a
budget allows answers 201 with a Success ``Status`` and then deletes the pod gracefully
(``deleteOptions.gracePeriodSeconds`` honoured); one that would leave fewer healthy pods
than a budget needs answers 429 TooManyRequests, which drain retries every 5 s.  Budgets
are configured in Python (``DisruptionBudget``), not stored as PodDisruptionBudget objects.
Pods that are Pending, finished or already terminating are evicted without a budget check,
as the apiserver's eviction REST does; healthy means Ready and not terminating, as the
disruption controller counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaos.embedded.kube.pods import Pods
from chaos.embedded.kube.resources import PODS
from chaos.embedded.kube.selectors import labels_match, parse_label_selector
from chaos.embedded.kube.status import ApiError, bad_request, status

EVICTION_VERSIONS = ("policy/v1", "policy/v1beta1")


@dataclass(frozen=True)
class DisruptionBudget:
    """A PodDisruptionBudget: exactly one of ``min_available`` / ``max_unavailable``."""

    name: str
    namespace: str
    selector: str
    min_available: int | None = None
    max_unavailable: int | None = None

    def __post_init__(self) -> None:
        if (self.min_available is None) == (self.max_unavailable is None):
            raise ValueError(f"budget {self.name}: give exactly one of min_available, max_unavailable")

    def covers(self, pod: dict) -> bool:
        return (pod["metadata"]["namespace"] == self.namespace
                and labels_match(parse_label_selector(self.selector), pod["metadata"].get("labels")))


def _healthy(pod: dict) -> bool:
    """Counted as the disruption controller counts: Ready and not being deleted."""
    ready = {"type": "Ready", "status": "True"}
    return not pod["metadata"].get("deletionTimestamp") and any(
        {k: c.get(k) for k in ready} == ready for c in pod["status"].get("conditions") or [])


def _budget_applies(pod: dict) -> bool:
    """Pending, finished and terminating pods are evicted without a budget check (canIgnorePDB)."""
    return (pod["status"].get("phase") not in ("Pending", "Succeeded", "Failed")
            and not pod["metadata"].get("deletionTimestamp"))


class Evictions:
    def __init__(self, pods: Pods, budgets: list[DisruptionBudget]):
        self.pods, self.budgets = pods, list(budgets)

    def evict(self, namespace: str, name: str, body: dict) -> dict:
        if body.get("kind", "Eviction") != "Eviction" or body.get("apiVersion", "policy/v1") not in EVICTION_VERSIONS:
            raise bad_request(f"the body must be an Eviction of {' or '.join(EVICTION_VERSIONS)}, "
                              f"got {body.get('apiVersion')}/{body.get('kind')}")
        if (body.get("metadata") or {}).get("name", name) != name:
            raise bad_request("name in URL does not match name in Eviction object")
        options = body.get("deleteOptions") or {}
        pod = self.pods.store.require(PODS.plural, namespace, name)
        if _budget_applies(pod):
            self._check_budgets(pod)
        self.pods.delete(namespace, name, options.get("gracePeriodSeconds"),
                         (options.get("preconditions") or {}).get("uid"))
        return status(201, "", "", ok=True)

    def _check_budgets(self, pod: dict) -> None:
        budgets = [b for b in self.budgets if b.covers(pod)]
        if len(budgets) > 1:
            raise ApiError(500, "InternalError",
                           "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                           "does not support.")
        if not budgets:
            return
        budget = budgets[0]
        covered = [p for p in self.pods.store.list(PODS.plural, budget.namespace)[0] if budget.covers(p)]
        healthy = sum(1 for p in covered if _healthy(p))
        desired = (budget.min_available if budget.min_available is not None
                   else len(covered) - budget.max_unavailable)
        if healthy - desired < 1:
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                           {"causes": [{"reason": "DisruptionBudget",
                                        "message": f"The disruption budget {budget.name} needs {desired} healthy "
                                                   f"pods and has {healthy} currently"}]})
