"""Backends by name: how the harness reaches a cluster (see base.Backend).

Every backend, the embedded one included, is chosen the same way: by the one registered
class that serves the profile (None: the embedded cluster).  A new backend is one module
here plus its class in BACKENDS, keyed by the class's own ``name``.
"""

from __future__ import annotations

from chaos.backends.base import Backend, Host
from chaos.backends.embedded import EmbeddedBackend
from chaos.backends.kubernetes import KubernetesBackend
from chaos.backends.ssh import SSHBackend
from chaos.errors import ProfileError

BACKENDS: dict[str, type[Backend]] = {cls.name: cls for cls in (EmbeddedBackend, SSHBackend, KubernetesBackend)}


def for_profile(profile, **options) -> Backend:
    """The backend for the cluster ``profile`` describes (None: the embedded cluster), built
    with ``options``, the chosen class's own keyword arguments."""
    serving = [name for name, cls in BACKENDS.items() if cls.serves(profile)]
    if not serving:
        transports = sorted({profile.hosts.defaults.transport, *(o.transport for o in profile.hosts.overrides
                                                                   if o.transport)})
        raise ProfileError(f"profile {profile.name!r}: no backend reaches hosts over {', '.join(transports)} "
                           f"(backends: {', '.join(BACKENDS)})")
    if len(serving) > 1:
        raise ProfileError(f"profile {profile.name!r}: several backends would run it ({', '.join(serving)})")
    return BACKENDS[serving[0]](profile, **options)


__all__ = ["BACKENDS", "Backend", "EmbeddedBackend", "Host", "KubernetesBackend", "SSHBackend", "for_profile"]
