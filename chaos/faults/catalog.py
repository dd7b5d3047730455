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

# The optional capabilities a backend declares (chaos.backends.base.Backend), which a kind may
# need: a session whose backend lacks it skips the kind's tests, saying which and why.
CAPABILITIES: dict[str, str] = {
    "kube": "the Kubernetes API of the cluster's platform",
    "head": "control of the cluster's head: its GCS, its machine and its Redis (the harness's own cluster)",
    "object_storage": "S3 storage for checkpoints (a profile's s3:// storage.path with its storage.s3 settings; the "
                      "embedded cluster runs its own moto server)",
    "storage_proxy": "the storage fault proxy the S3 endpoint is reached through (storage.s3.fault_proxy; the "
                     "embedded cluster runs its own)",
}

# What a kind does on a host that needs more than the login user's own rights, over SSH: each is
# run as root (the login user, or through the profile's ``ssh.become``).  ``ray-chaos doctor``
# checks them per host and a session refuses a kind whose privileges a host lacks before any
# injection.  Kinds that act through Ray's own API, the Kubernetes API or the storage proxy
# need none of these.
PRIVILEGES: dict[str, str] = {
    "signal-ray": "send signals to Ray's processes (kill), which run as another user on most clusters",
    "reboot": "reboot the machine (systemctl reboot, or reboot)",
    "iptables": "add and remove iptables chains (the partition's cut)",
    "kmsg": "write the kernel log (/dev/kmsg), as a GPU driver's Xid line",
}

# Why a kind is never drawn into a seeded campaign (chaos.campaign): a closed list, so that a
# new kind states one of these or its draw.
NOT_DRAWN: dict[str, str] = {
    "arms-the-run": "it arms the run's environment when the run is submitted (the shim's control file, the stub "
                    "CUDA driver) and needs the stub-CUDA workload: one such fault per run",
    "unknown-window": "its drain window is the pod's grace period, which a schedule cannot know, and Ray 2.60 "
                      "charges a node killed inside it to max_failures (README)",
    "loses-the-run": "it takes the run's driver or the whole cluster with it: a campaign follows one run to its end",
    "planned": "nothing injects it yet",
    "needs-s3-run": "it needs the run's checkpoints on S3 storage (chaos.workload(storage='s3')), which a campaign's "
                    "run does not use",
}


@dataclasses.dataclass(frozen=True)
class Draw:
    """How a campaign draws a kind: the values each parameter is drawn from (a replayed
    schedule may use only these), what it always passes, and which drawn parameter is the
    notice (seconds) the run gets before the node goes."""

    params: dict[str, tuple] = dataclasses.field(default_factory=dict)
    fixed: dict[str, Any] = dataclasses.field(default_factory=dict)
    notice_param: str | None = None

    def notice_s(self, params: dict) -> float:
        return float(params[self.notice_param]) if self.notice_param else 0.0


@dataclasses.dataclass(frozen=True)
class FaultKind:
    """What every fault of one kind should cost, how fast recovery should be, what it needs
    and how a campaign draws it.  The Fault class that injects it declares ``kind = name``
    (chaos.faults.registry finds it; ``Fault.build`` is its factory)."""

    name: str
    budget_class: str | None  # None: no charge expected (the platform's own recovery)
    slo_detect_s: float = DEFAULT_SLO_DETECT_S
    slo_recover_s: float = DEFAULT_SLO_RECOVER_S
    # The class Ray may charge instead, by a race in Ray itself, and why; within-budget accepts
    # it only for a charge attributed to a fault of this kind, and says so.
    race_charge: str | None = None
    race_why: str = ""
    needs: str | None = None  # a key of CAPABILITIES the session's backend must have
    # Its charge depends on how the platform or the fault's window plays out (a node's recovery,
    # the retries an S3 client makes): it claims every failure while it lasts, and suites assert
    # the charges measured on the pinned Ray (chaos.expect(charge_outcomes=[...])); budget_class is
    # then the class such a charge goes to, not a charge every fault of the kind makes.
    charge_measured: bool = False
    draw: Draw | None = None  # how a campaign draws it; None: never, for the reason below
    not_drawn: str | None = None  # a key of NOT_DRAWN
    privileges: tuple[str, ...] = ()  # keys of PRIVILEGES it needs on the target host over SSH

    def __post_init__(self):
        for p in self.privileges:
            if p not in PRIVILEGES:
                raise ValueError(f"fault kind {self.name}: privilege {p!r} is none of {', '.join(PRIVILEGES)}")
        if self.needs is not None and self.needs not in CAPABILITIES:
            raise ValueError(f"fault kind {self.name}: needs {self.needs!r}, not a capability ({', '.join(CAPABILITIES)})")
        if (self.draw is None) == (self.not_drawn is None):
            raise ValueError(f"fault kind {self.name}: give exactly one of draw= and not_drawn=")
        if self.not_drawn is not None and self.not_drawn not in NOT_DRAWN:
            raise ValueError(f"fault kind {self.name}: not_drawn {self.not_drawn!r} is none of {', '.join(NOT_DRAWN)}")


KINDS: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("raylet-kill", "worker_group", draw=Draw(), privileges=("signal-ray",)),
    FaultKind("worker-kill", "worker_group", draw=Draw(), privileges=("signal-ray",)),
    FaultKind("node-reboot", "worker_group", draw=Draw(), privileges=("reboot",)),
    FaultKind("partition", "worker_group", draw=Draw(), privileges=("iptables",)),
    FaultKind("cuda", "worker_group", not_drawn="arms-the-run"),
    # Ray's own drain request: a node killed while draining is charged to the preemption budget
    # (deterministic); via="sigterm" is not drawn (its charge races: README).
    FaultKind("preempt", "preemption",
              draw=Draw({"deadline_s": (5.0, 8.0)}, fixed={"via": "drain"}, notice_param="deadline_s"),
              privileges=("signal-ray",)),
    # Kubernetes (chaos/faults/kube.py): a hard pod delete is a failure (rarely a preemption, by
    # the race below); a graceful one, an eviction or a drain SIGTERMs `ray start --block`,
    # which drains the node as PREEMPTION (what Ray 2.60 really charges: README, "Which budget
    # a fault costs").
    FaultKind("pod-delete", "worker_group", race_charge="preemption", race_why=(
        "the kubelet SIGTERMs a force-deleted pod 2 s (its minimum grace) before the SIGKILL, `ray start "
        "--block` drains its node as PREEMPTION on that SIGTERM, and a worker whose death the raylet reports "
        "while draining is called preempted (Ray >= 2.57; rare here: seen in one CI run)"),
              needs="kube", draw=Draw()),
    FaultKind("pod-delete-graceful", "preemption", needs="kube", not_drawn="unknown-window"),
    FaultKind("pod-evict", "preemption", needs="kube", not_drawn="unknown-window"),
    FaultKind("drain", "preemption", needs="kube", not_drawn="unknown-window"),
    # SageMaker HyperPod node recovery: every pod on the node is force-deleted.
    FaultKind("hyperpod-reboot", "worker_group", needs="kube", draw=Draw({"via": ("label", "boto3")})),
    FaultKind("node-replace", "worker_group", needs="kube", draw=Draw({"via": ("label", "boto3")})),
    # A GPU failure the node's health agent must see (Xid in the kernel log + every driver call
    # failing until the node reboots): detection is the agent's, recovery a node reboot or
    # replacement, the charge whatever Ray makes of both (timing-dependent: README).
    FaultKind("xid", None, slo_detect_s=60.0, slo_recover_s=600.0, charge_measured=True, not_drawn="arms-the-run",
              privileges=("kmsg",)),
    # The head (chaos/faults/head.py): no budget is charged — with GCS fault tolerance the run
    # is lost with its driver and resubmitted, without it the cluster is lost (README).
    FaultKind("gcs-kill", None, needs="head", not_drawn="loses-the-run"),
    FaultKind("head-reboot", None, needs="head", not_drawn="loses-the-run"),
    FaultKind("redis-restart", None, needs="head", not_drawn="loses-the-run"),
    # Storage (chaos/faults/storage.py): a window on the S3 endpoint.  An upload (or a restore)
    # that the S3 client's and Ray's own retries do not absorb fails its rank: a worker-group
    # failure.  Whether one happens depends on the window, so suites assert the charges measured
    # on Ray 2.60 (README, "Which budget a fault costs"); a window the retries absorb costs nothing.
    # Detection is the upload's failure: each request times out (the S3 client's and Ray's retries
    # in turn) — measured 36 s on Ray 2.60.
    FaultKind("storage-partition", "worker_group", slo_detect_s=90.0, slo_recover_s=180.0,
              needs="object_storage", charge_measured=True, not_drawn="needs-s3-run"),
    FaultKind("storage-errors", "worker_group", needs="storage_proxy", charge_measured=True, not_drawn="needs-s3-run"),
    FaultKind("storage-slow", None, needs="storage_proxy", charge_measured=True, not_drawn="needs-s3-run"),
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


def measured_kinds() -> tuple[str, ...]:
    """The kinds whose charge suites assert as measured outcomes (``charge_measured``)."""
    return tuple(k for k, entry in KINDS.items() if entry.charge_measured)


def limit_name(budget_class: str) -> str:
    """``max_failures`` for ``worker_group`` and so on (the class itself if unknown)."""
    return BUDGET_LIMIT_FIELDS.get(budget_class, budget_class)
