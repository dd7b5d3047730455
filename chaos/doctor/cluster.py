"""The cluster side of doctor: its dashboard and Ray version, its lock, the open ledger
entries kept on it, and which nodes the safety rules let a fault target.

Read-only: the lock is read (``ClusterLock.holder``), never taken, and the Jobs API is only
listed and read — no job is submitted.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from chaos.cluster import Node
from chaos.doctor.check import Check
from chaos.errors import ChaosError, ProfileError
from chaos.ray_support import SUPPORTED, RayVersionError, cluster_mismatch, dashboard_ray_version, unsupported_reason

if TYPE_CHECKING:
    from chaos.backends.base import Backend
    from chaos.backends.jobs_store import JobsStore
    from chaos.profile import Profile


@dataclasses.dataclass
class Seen:
    """What the cluster side found: its checks, and whether the cluster answered with the
    harness's Ray (only then are its nodes and hosts read)."""

    checks: list[Check]
    reachable: bool


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """A host doctor checks: a node running there, and whether a fault may target it (else
    only the CUDA shim is put there, on every live worker's host)."""

    node: Node
    target: bool


def checks(profile: "Profile", store: "JobsStore | None" = None, timeout: float = 10.0) -> Seen:
    """The dashboard, the Ray version, the lock and the ledger entries of ``profile``'s cluster
    (``store``: its Jobs API, made from the profile when not given)."""
    from chaos.backends.jobs_store import ClusterLedger, JobsStore
    from chaos.backends.lock import ClusterLock

    url = profile.ray.dashboard_url
    out = []
    try:
        profile.ensure_not_protected()
    except ProfileError as e:
        out.append(Check("safety", "profile", False, str(e), "set protected: false only if this cluster may be "
                                                             "disrupted"))
    try:
        version = dashboard_ray_version(url, timeout=timeout)
    except RayVersionError as e:
        out.append(Check("cluster", "Ray dashboard", False, str(e).removeprefix("could not read the cluster's Ray "
                                                                                  "version from "),
                         f"make {url} reachable from this machine (the head's `ray start --dashboard-host 0.0.0.0`, "
                         "its firewall), or correct ray.dashboard_url"))
        return Seen(out, False)
    mismatch = cluster_mismatch(version, where=f"the cluster at {url}")
    if mismatch:
        out.append(Check("cluster", "Ray version", False, mismatch,
                         f"run a supported Ray ({SUPPORTED}) on the cluster" if unsupported_reason(version) else
                         f"pip install 'ray[train,default]=={version}' in the harness's environment"))
        return Seen(out, False)
    out.append(Check("cluster", "Ray dashboard", True, f"{url} answers: Ray {version}, the harness's own "
                                                       f"(supported: {SUPPORTED})"))
    store = store or JobsStore(url)
    try:
        holder = ClusterLock(url, store=store).holder()
        entries = ClusterLedger(store).entries()
    except ChaosError as e:
        out.append(Check("cluster", "Jobs API", False, str(e),
                         "the head's dashboard must serve the Jobs API (Ray installed with ray[default] there)"))
        return Seen(out, False)
    out.append(_lock(holder, profile))
    live = holder.owner if holder is not None and not holder.record.ended and holder.alive()[0] else None
    out.append(_ledger(entries, profile, live))
    return Seen(out, True)


def _lock(holder, profile: "Profile") -> Check:
    what = "the cluster's lock"
    if holder is None:
        return Check("lock", what, True, "free")
    if holder.record.ended:
        return Check("lock", what, True, f"free to take: the last holder's lock job ended ({holder.record.status})")
    alive, why = holder.alive()
    if alive:
        return Check("lock", what, False, f"another ray-chaos session holds this cluster's lock: {holder.describe()} "
                                          f"({why})",
                     "wait until that session ends: two sessions never inject into one cluster at once")
    return Check("lock", what, False, f"held by a session that is gone: {holder.describe()} ({why})",
                 f"ray-chaos sweep --profile {_profile_arg(profile)} reverts its open faults and releases the lock")


def _ledger(entries: dict[str, dict], profile: "Profile", live: str | None = None) -> Check:
    """``live``: the session holding the lock, alive: its own entries are its faults now, which
    it reverts itself."""
    what = "open ledger entries on the cluster"
    if not entries:
        return Check("lock", what, True, "none")
    if live is not None and all(e.get("session") == live for e in entries.values()):
        return Check("lock", what, False, f"{len(entries)} fault(s) live now, of session {live} that holds the lock: "
                     + "; ".join(f"{e.get('fault')} on {(e.get('target') or {}).get('node_ip')}"
                                 for e in entries.values()),
                     "wait until that session ends: it reverts its own faults")
    listed = "; ".join(f"{e.get('fault')} ({entry_id}) on {(e.get('target') or {}).get('node_ip')} by session "
                       f"{e.get('session')}" for entry_id, e in entries.items())
    return Check("lock", what, False, f"{len(entries)} fault(s) not reverted: {listed}",
                 f"ray-chaos sweep --profile {_profile_arg(profile)} reverts them (a session is refused until then)")


def _profile_arg(profile: "Profile") -> str:
    return profile.source or f"{profile.name}.yaml"


def targets(backend: "Backend") -> tuple[Check, dict[str, HostPlan]]:
    """Which live nodes the safety rules let a fault target, and the hosts doctor checks:
    every target's, and every live worker's (the CUDA shim goes to each).  ``backend`` is
    observing the cluster (``Backend.observe``)."""
    try:
        alive = [n for n in backend.cluster.nodes() if n.alive]
        infos = {n.node_id: backend.node_info(n.node_id) for n in alive}
    except ChaosError as e:
        return Check("safety", "targetable nodes", False, f"the node table could not be read: {e}",
                     "the dashboard's state API must answer (ray[default] on the head)"), {}
    eligible, refused = backend.safety.split(i for i in infos.values() if i is not None)
    allowed = {i.node_id for i in eligible}
    hosts: dict[str, HostPlan] = {}
    for n in alive:
        if n.node_id in allowed or not n.is_head:
            hosts.setdefault(backend.host_key(n), HostPlan(n, n.node_id in allowed))
    seen = f"{len(eligible)} of {len(alive)} live nodes" + (f" ({', '.join(i.ip for i in eligible)})" if eligible else "")
    if not eligible:
        why = "; ".join(f"{i.ip}: {reason}" for i, reason in refused) or "no live node"
        return Check("safety", "targetable nodes", False, f"{seen}: {why}",
                     "allow the workers faults may hit: safety.allowlist (address, hostname or label selectors) "
                     "or safety.allow_all_workers: true"), hosts
    return Check("safety", "targetable nodes", True, seen), hosts
