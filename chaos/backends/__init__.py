"""Backends by name: how the harness reaches a cluster (see base.Backend).

No profile means the embedded cluster; a profile is run by the one registered backend
that serves it.  A new backend is one module here plus one line in BACKENDS.
"""

from __future__ import annotations

from chaos.backends.base import Backend, Host
from chaos.backends.embedded import EmbeddedBackend
from chaos.backends.kubernetes import KubernetesBackend
from chaos.backends.ssh import SSHBackend
from chaos.errors import ProfileError

BACKENDS: dict[str, type[Backend]] = {
    "embedded": EmbeddedBackend,
    "ssh": SSHBackend,
    "kubernetes": KubernetesBackend,
}


def for_profile(profile) -> Backend:
    """The backend for the cluster ``profile`` describes."""
    serving = [name for name, cls in BACKENDS.items() if cls.serves(profile)]
    if not serving:
        transports = sorted({profile.hosts.defaults.transport, *(o.transport for o in profile.hosts.overrides
                                                                   if o.transport)})
        raise ProfileError(f"profile {profile.name!r}: no backend reaches hosts over {', '.join(transports)} "
                           f"(backends: {', '.join(BACKENDS)})")
    if len(serving) > 1:
        raise ProfileError(f"profile {profile.name!r}: several backends would run it ({', '.join(serving)})")
    return BACKENDS[serving[0]](profile)


__all__ = ["BACKENDS", "Backend", "EmbeddedBackend", "Host", "KubernetesBackend", "SSHBackend", "for_profile"]
