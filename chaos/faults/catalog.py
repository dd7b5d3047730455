"""The one catalog of fault kinds and retry-budget classes.

Profile validation, the pytest plugin's factories, ``Chaos.expect``, the verdicts and the
summary all read these tables, so a kind or a budget class is named in exactly one place.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

# Ray Train V2's three retry budgets: the class name the recorder reports (from Ray's own
# ``[FailurePolicy]`` record) -> the FailureConfig field that limits it.
BUDGET_LIMIT_FIELDS: dict[str, str] = {
    "worker_group": "max_failures",
    "preemption": "max_preemption_failures",
    "controller": "controller_failure_limit",
}
BUDGET_CLASSES: tuple[str, ...] = tuple(BUDGET_LIMIT_FIELDS)

DEFAULT_SLO_DETECT_S = 30.0
DEFAULT_SLO_RECOVER_S = 120.0


@dataclasses.dataclass(frozen=True)
class FaultKind:
    """What every fault of one kind should cost and how fast recovery should be."""

    name: str
    budget_class: str | None  # None: no charge expected (the platform's own recovery)
    slo_detect_s: float = DEFAULT_SLO_DETECT_S
    slo_recover_s: float = DEFAULT_SLO_RECOVER_S
    # "module.Class" of the Fault that injects it; None: profiles may configure the kind,
    # no fault module injects it yet.
    impl: str | None = None

    def fault_class(self) -> type:
        """The Fault class of this kind (imported on demand: the catalog imports no fault module)."""
        if self.impl is None:
            raise ValueError(f"fault kind {self.name!r} has no implementation yet")
        module, _, cls = self.impl.rpartition(".")
        return getattr(importlib.import_module(module), cls)


KINDS: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("raylet-kill", "worker_group", impl="chaos.faults.raylet.RayletKill"),
    FaultKind("worker-kill", "worker_group", impl="chaos.faults.worker.TrainWorkerKill"),
    FaultKind("node-reboot", "worker_group", impl="chaos.faults.reboot.NodeReboot"),
    FaultKind("partition", "worker_group", impl="chaos.faults.partition.Partition"),
    FaultKind("cuda", "worker_group", impl="chaos.faults.cuda.CudaFault"),
    FaultKind("preempt", "preemption", impl="chaos.faults.preempt.Preempt"),
    # Kubernetes (chaos/faults/kube.py): a hard pod delete is a failure; a graceful one, an
    # eviction or a drain SIGTERMs `ray start --block`, which drains the node as PREEMPTION
    # (what Ray 2.60 really charges: README, "Which budget a fault costs").
    FaultKind("pod-delete", "worker_group", impl="chaos.faults.kube.PodDelete"),
    FaultKind("pod-delete-graceful", "preemption", impl="chaos.faults.kube.GracefulPodDelete"),
    FaultKind("pod-evict", "preemption", impl="chaos.faults.kube.PodEvict"),
    FaultKind("drain", "preemption", impl="chaos.faults.kube.NodeDrain"),
    # SageMaker HyperPod node recovery: every pod on the node is force-deleted.
    FaultKind("hyperpod-reboot", "worker_group", impl="chaos.faults.kube.HyperPodReboot"),
    FaultKind("node-replace", "worker_group", impl="chaos.faults.kube.HyperPodReplace"),
    # A GPU failure the node's health agent must see (Xid in the kernel log + every driver call
    # failing until the node reboots): detection is the agent's, recovery a node reboot or
    # replacement, the charge whatever Ray makes of both (timing-dependent: README).
    FaultKind("xid", None, slo_detect_s=60.0, slo_recover_s=600.0, impl="chaos.faults.xid.Xid"),
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
