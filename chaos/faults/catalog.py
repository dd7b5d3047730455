"""The one catalog of fault kinds and retry-budget classes.

Profile validation, the pytest plugin's factories, ``Chaos.expect``, the verdicts and the
summary all read these tables, so a kind or a budget class is named in exactly one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# Ray Train V2's three retry budgets: the class name the recorder reports (from Ray's own
# ``[FailurePolicy]`` record) -> the FailureConfig field that limits it.
BUDGET_LIMIT_FIELDS: dict[str, str] = {
    "worker_group": "max_failures",
    "preemption": "max_preemption_failures",
    "controller": "controller_failure_limit",
}
BUDGET_CLASSES: tuple[str, ...] = tuple(BUDGET_LIMIT_FIELDS)
# The FailureConfig fields newer than the oldest supported Ray (2.58) that the recorder reports
# with the limits, each with the value a Ray without it behaves as (it reads them with getattr).
NEWER_FAILURE_CONFIG_FIELDS: dict[str, Any] = {"relax_collectives_on_preemption": False}  # new in 2.60

DEFAULT_SLO_DETECT_S = 30.0
DEFAULT_SLO_RECOVER_S = 120.0


@dataclasses.dataclass(frozen=True)
class FaultKind:
    """What every fault of one kind should cost and how fast recovery should be."""

    name: str
    budget_class: str | None  # None: no charge expected (the platform's own recovery)
    slo_detect_s: float = DEFAULT_SLO_DETECT_S
    slo_recover_s: float = DEFAULT_SLO_RECOVER_S
    # The class Ray may charge instead, by a race in Ray itself, and why; within-budget accepts
    # it only for a charge attributed to a fault of this kind, and says so.
    race_charge: str | None = None
    race_why: str = ""


KINDS: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("raylet-kill", "worker_group"),
    FaultKind("worker-kill", "worker_group"),
    FaultKind("node-reboot", "worker_group"),
    FaultKind("partition", "worker_group"),
    FaultKind("cuda", "worker_group"),
    FaultKind("preempt", "preemption"),
    # Kubernetes (chaos/faults/kube.py): a hard pod delete is a failure (rarely a preemption, by
    # the race below); a graceful one, an eviction or a drain SIGTERMs `ray start --block`,
    # which drains the node as PREEMPTION (what Ray 2.60 really charges: README, "Which budget
    # a fault costs").
    FaultKind("pod-delete", "worker_group", race_charge="preemption", race_why=(
        "the kubelet SIGTERMs a force-deleted pod 2 s (its minimum grace) before the SIGKILL, `ray start "
        "--block` drains its node as PREEMPTION on that SIGTERM, and a worker whose death the raylet reports "
        "while draining is called preempted (Ray >= 2.57; rare here: seen in one CI run)")),
    FaultKind("pod-delete-graceful", "preemption"),
    FaultKind("pod-evict", "preemption"),
    FaultKind("drain", "preemption"),
    # SageMaker HyperPod node recovery: every pod on the node is force-deleted.
    FaultKind("hyperpod-reboot", "worker_group"),
    FaultKind("node-replace", "worker_group"),
    # A GPU failure the node's health agent must see (Xid in the kernel log + every driver call
    # failing until the node reboots): detection is the agent's, recovery a node reboot or
    # replacement, the charge whatever Ray makes of both (timing-dependent: README).
    FaultKind("xid", None, slo_detect_s=60.0, slo_recover_s=600.0),
)}


def kind(name: str) -> FaultKind:
    """The catalog entry for ``name``; an unknown kind names the known ones."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown fault kind {name!r}; known kinds: {', '.join(KINDS)}") from None


def expected_charge(name: str, profile: Any = None) -> str | None:
    """The budget class a fault of kind ``name`` should be charged to: the profile's
    ``expected_budget`` for the kind (a platform that charges it elsewhere, declared), else
    the catalog's (None: no charge).  The one place this is derived — suites and campaigns
    size and judge budgets by it."""
    own = profile.faults.get(name) if profile is not None else None
    return own.expected_budget if own is not None and own.expected_budget else kind(name).budget_class


def limit_name(budget_class: str) -> str:
    """``max_failures`` for ``worker_group`` and so on (the class itself if unknown)."""
    return BUDGET_LIMIT_FIELDS.get(budget_class, budget_class)
