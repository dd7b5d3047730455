"""Which Ray releases the harness supports, and the checks that refuse any other.

Why a range and not one release: teams run the harness against the Ray their clusters run,
so ``pyproject.toml`` accepts every release whose Ray Train V2 has what the harness needs
(``constraints.txt`` pins the one ``make setup`` installs by default and the contract tier
was recorded on).  Why refuse the rest at start-up: outside the range the harness does not
fail cleanly, it misjudges.  Below the floor Ray Train has no separate preemption budget:
``FailureConfig.max_preemption_failures`` and ``ray.train.get_preemption_info()`` are new in
2.58 (checked in the 2.55.1-2.59.0 wheels), the recorder (``chaos/train/recorder.py``) reads
the first in the Train controller and the reference workload sets it.  Above the ceiling
nobody has checked the Train V2 internals the recorder relies on
(``tests/unit/test_ray_contracts.py`` pins them against the installed Ray).

And the cluster must run the harness's own Ray: Ray's driver refuses any other version,
the Jobs SDK (the head-loss runs' only channel) does not check, and the harness's
version-gated behaviour (``chaos.faults.preempt.require_preemption_budget``: preemption
faults need 2.58; SIGTERM drains since 2.57) reads the harness's ``ray.__version__``,
which only stands for the cluster when the two are the same release.

``SUPPORTED`` below is the one place the range is written; a unit test checks that
``pyproject.toml``'s Ray requirement says the same.  Each check takes the version as a
string (default: the installed Ray), so it can be tested without installing another Ray.
"""

from __future__ import annotations

import json
import urllib.request

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from chaos.errors import ChaosError

# The supported Ray releases, as pip reads them (pyproject.toml repeats it; a test compares).
SUPPORTED = ">=2.58,<2.61"
# What sets the floor (the feature, and the release that added it).
FLOOR_REASON = ("Ray Train's separate preemption budget, FailureConfig.max_preemption_failures, and "
                "ray.train.get_preemption_info() are new in Ray 2.58; the harness's recorder and reference "
                "workload use them")

_SPEC = SpecifierSet(SUPPORTED)


def _bound(op: str) -> Version:
    (spec,) = [s for s in _SPEC if s.operator == op]
    return Version(spec.version)


FLOOR = _bound(">=")  # lowest supported release (inclusive)
CEILING = _bound("<")  # first release not supported (exclusive)


class RayVersionError(ChaosError):
    """The installed Ray, or the cluster's, is one the harness cannot judge runs on."""


def installed_ray_version() -> str:
    """From the distribution's metadata: no ``import ray`` (a second) at pytest's start."""
    import importlib.metadata

    return importlib.metadata.version("ray")


def unsupported_reason(version: str) -> str | None:
    """Why Ray ``version`` is outside the supported range (None: inside it).

    Release candidates and dev builds count as what pip makes of them: ``2.60.0rc1`` is
    inside ``>=2.58,<2.61``; ``2.58.0rc1`` is below 2.58 and ``2.61.0rc1`` not below 2.61
    (PEP 440); Ray's nightly ``3.0.0.dev0`` is above the ceiling.
    """
    try:
        parsed = Version(version)
    except InvalidVersion:
        return f"Ray {version!r} is not a version number this harness can compare with its supported range {SUPPORTED}"
    if _SPEC.contains(parsed, prereleases=True):
        return None
    if parsed < FLOOR:
        return (f"Ray {version} is older than this harness supports (Ray {SUPPORTED}; the floor is {FLOOR}: "
                f"{FLOOR_REASON})")
    return (f"Ray {version} is newer than this harness supports (Ray {SUPPORTED}): the Ray Train internals "
            f"its recorder relies on are checked up to {CEILING.major}.{CEILING.minor - 1}.x only "
            "(tests/unit/test_ray_contracts.py)")


def check_supported(version: str | None = None) -> str:
    """Raise RayVersionError unless Ray ``version`` (default: the installed one) is supported;
    returns the version checked."""
    version = installed_ray_version() if version is None else version
    reason = unsupported_reason(version)
    if reason:
        raise RayVersionError(f"{reason}. Install a supported Ray, e.g. `make setup` (constraints.txt pins the "
                              f"default) or pip install 'ray[train,default]{SUPPORTED}'.")
    return version


def cluster_mismatch(cluster_version: str, harness_version: str | None = None, where: str = "the cluster") -> str | None:
    """Why a cluster running Ray ``cluster_version`` cannot be tested by a harness running
    ``harness_version`` (default: the installed Ray); None when they are the same release.

    Same release means the same version string, as Ray's own driver check compares them."""
    harness_version = installed_ray_version() if harness_version is None else harness_version
    cluster_version, harness_version = str(cluster_version).strip(), str(harness_version).strip()
    if cluster_version == harness_version:
        return None
    message = (f"{where} runs Ray {cluster_version}, this harness runs Ray {harness_version}: the harness must run "
               "the cluster's Ray (Ray's driver refuses another version, and the harness's version gates read its "
               "own Ray).")
    outside = unsupported_reason(cluster_version)
    if outside:
        message += f" {outside}."
    else:
        message += f" Install it in the harness's environment: pip install 'ray[train,default]=={cluster_version}'."
    return message


def require_same_ray(cluster_version: str, harness_version: str | None = None, where: str = "the cluster") -> None:
    """Raise RayVersionError when the cluster's Ray differs from the harness's."""
    message = cluster_mismatch(cluster_version, harness_version, where)
    if message:
        raise RayVersionError(message)


def dashboard_ray_version(dashboard_url: str, timeout: float = 10.0) -> str:
    """The Ray version a cluster's dashboard reports (``GET /api/version``: ``ray_version``),
    for callers that reach the cluster over HTTP only (the Jobs SDK) before anything else."""
    url = f"{dashboard_url.rstrip('/')}/api/version"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(json.load(response)["ray_version"])
    except (OSError, ValueError, KeyError) as e:
        raise RayVersionError(f"could not read the cluster's Ray version from {url}: {e}") from e
