"""`ray-chaos doctor`: a read-only preflight of a profile's cluster, one line per check.

Why: a team's first night should not end in a traceback per test.  Everything a session needs
before its first fault — the cluster reachable with the harness's Ray, the lock free, no open
faults of a lost session, nodes the safety rules allow, and on every host the login, the
privileges, tools and files each enabled fault kind uses — is checked up front, each failure
with what was seen and a one-line fix.  Nothing is submitted, locked, written or changed:
the cluster is read through its dashboard and Jobs API, the hosts by commands that only read.

A check's ``kinds`` are the enabled fault kinds that cannot run while it fails; ``()`` means
every kind (the cluster, the lock, the safety rules).  The exit rule: non-zero as soon as one
check fails, because every failing check stops at least one enabled kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

from chaos.doctor.check import Check
from chaos.faults import catalog

if TYPE_CHECKING:
    from chaos.backends.base import Backend
    from chaos.profile import Profile

OK, FAILED = 0, 1  # doctor's exit codes (2: the profile itself is invalid, from the CLI)

__all__ = ["Check", "FAILED", "OK", "blocked", "blocks_all", "enabled_kinds", "exit_code", "failed", "run", "table"]


def enabled_kinds(backend: "Backend") -> tuple[list[str], dict[str, str]]:
    """(the fault kinds a session on ``backend`` can inject, {kind left out: why}): every kind
    of the catalog but those needing a capability the backend lacks — what ``chaos.fault``
    skips (a protected profile refuses them all, checked on its own line)."""
    from chaos.errors import ChaosError

    def lacks(capability: str) -> bool:
        try:
            return getattr(backend, capability) is None
        except ChaosError:  # declared, and not reachable now (a kubeconfig): the platform's checks say why
            return False

    enabled, left_out = [], {}
    for name, entry in catalog.KINDS.items():
        if entry.needs is not None and lacks(entry.needs):
            left_out[name] = f"needs {entry.needs}"
        else:
            enabled.append(name)
    return enabled, left_out


def run(profile: "Profile", hosts: bool = True, say: Callable[[str], None] = lambda line: None,
        backend: "Backend | None" = None) -> list[Check]:
    """Every check of ``profile``'s cluster, read-only.  ``hosts`` False: the cluster side only
    (a dry run, which logs in nowhere).  ``say``: progress, one line per stage."""
    from chaos import backends
    from chaos.doctor import cluster

    backend = backend or backends.for_profile(profile)
    kinds, left_out = enabled_kinds(backend)
    lacking: dict[str, list[str]] = {}
    for k, why in left_out.items():
        lacking.setdefault(why, []).append(k)
    out = [Check("profile", "enabled fault kinds", True, ", ".join(kinds) + "".join(
        f"; not {', '.join(ks)}: this backend lacks {why.removeprefix('needs ')}" for why, ks in lacking.items()))]
    say(f"doctor: reading the cluster at {profile.ray.dashboard_url}")
    seen = cluster.checks(profile)
    out += seen.checks
    if seen.reachable and not profile.protected:
        out += _nodes_and_hosts(backend, kinds if hosts and profile.kubernetes is None else [], say)
    if profile.kubernetes is not None:
        # The Kubernetes and HyperPod checks (chaos/doctor/kube.py, hyperpod.py): RBAC per verb the
        # enabled kinds use, the node-shell pod's admission, HyperPod credentials.
        out += _platform_checks(profile, set(kinds))
    return out


def _nodes_and_hosts(backend: "Backend", kinds: list[str], say: Callable[[str], None]) -> list[Check]:
    """The targetable nodes, and each host's checks for ``kinds`` (none: no host is logged in to)."""
    from chaos.doctor import cluster, ssh
    from chaos.errors import ChaosError
    from chaos.report import Reporter

    try:
        with backend.observe(Reporter(echo=lambda line: None)) as observed:
            check, plans = cluster.targets(observed)
            if not kinds or not plans:
                return [check]
            say(f"doctor: checking {len(plans)} host(s) over their transports")
            return [check, *ssh.checks(observed, plans, kinds)]
    except ChaosError as e:  # the dashboard went away since it answered
        return [Check("cluster", "node table", False, str(e), "make the dashboard reachable, then run doctor again")]


def _platform_checks(profile: "Profile", kinds: set[str]) -> list[Check]:
    """The platform's own checks where the profile names one: chaos.doctor.kube (RBAC per verb
    the enabled kinds use, the node-shell pod's admission) and chaos.doctor.hyperpod (its
    credentials and cluster)."""
    from chaos.doctor import hyperpod, kube

    out = kube.checks(profile, kinds)
    if profile.kubernetes is not None and profile.kubernetes.hyperpod is not None:
        out += hyperpod.checks(profile, kinds)
    return out


def failed(checks: Iterable[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]


def blocked(checks: Iterable[Check]) -> dict[str, list[Check]]:
    """{kind: the failing checks that stop it} for the checks that stop some kinds only."""
    out: dict[str, list[Check]] = {}
    for c in failed(checks):
        for k in c.kinds:
            out.setdefault(k, []).append(c)
    return out


def blocks_all(checks: Iterable[Check]) -> list[Check]:
    """The failing checks that stop every kind (the cluster, the lock, the safety rules)."""
    return [c for c in failed(checks) if not c.kinds]


def exit_code(checks: Iterable[Check]) -> int:
    return FAILED if failed(checks) else OK


def table(checks: list[Check]) -> str:
    """✔/✗ per check, what was seen, and under a ✗ the kinds it stops and its fix; then a
    summary line."""
    width = max((len(c.subject) for c in checks), default=0)
    lines = []
    for c in checks:
        lines.append(f"{'✔' if c.ok else '✗'} {c.subject:<{width}}  {c.what}: {c.detail}")
        if not c.ok:
            pad = " " * (width + 4)
            lines.append(f"{pad}stops: {', '.join(c.kinds) if c.kinds else 'every fault kind'}")
            lines.append(f"{pad}fix: {c.fix}")
    bad = failed(checks)
    if not bad:
        lines.append(f"doctor: all {len(checks)} checks passed")
    else:
        stopped = "every fault kind" if blocks_all(checks) else ", ".join(sorted(blocked(checks)))
        lines.append(f"doctor: {len(bad)} of {len(checks)} checks failed; cannot run: {stopped}")
    return "\n".join(lines)
