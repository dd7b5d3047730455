"""A cluster a profile describes whose hosts are reached over SSH (or, for hosts on this
machine, locally), as the profile's ``hosts`` section says.

A host's key is its address: the profile's host access is keyed by address (or by the
hostname and labels of the node running there), and so is the ledger's record of it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import ray

from chaos.backends.base import Backend, Host, profile_view, ray_node_info
from chaos.cluster import ClusterView, Node
from chaos.errors import ChaosError
from chaos.privileges import Escalation, probe
from chaos.safety import NodeInfo
from chaos.transport.base import Transport
from chaos.transport.local import LocalTransport

if TYPE_CHECKING:
    from chaos.profile.models import HostAccess

TRANSPORTS = ("ssh", "local")


class SSHBackend(Backend):
    name = "ssh"

    @classmethod
    def serves(cls, profile) -> bool:
        if profile is None or profile.kubernetes is not None:  # pods are reached through the Kubernetes API
            return False
        hosts = profile.hosts
        return all(t in TRANSPORTS for t in [hosts.defaults.transport, *(o.transport for o in hosts.overrides)]
                   if t is not None)

    def __init__(self, profile):
        super().__init__(profile=profile)
        self._baseline = 0  # alive workers when the session started
        self._accesses: dict[str, HostAccess] = {}
        self._escalations: dict[str, Escalation] = {}  # per host, asked once a session
        self._escalations_lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"profile:{self.profile.name}"

    @property
    def storage_path(self) -> str:
        return self.profile.storage.path

    def _open(self) -> ClusterView:
        view = profile_view(self.profile, f"profile {self.profile.name!r}")
        self._baseline = len(view.alive_workers())
        self.properties = {"ray.version": ray.__version__, "cluster": f"profile {self.profile.name}",
                           "nodes": f"{self._baseline} workers alive at start",
                           "dashboard": self.profile.ray.dashboard_url}
        return view

    def _close(self) -> None:
        """Nothing was opened: the cluster is reached over its dashboard, the hosts per use."""

    def node_info(self, node_id: str) -> NodeInfo | None:
        return ray_node_info(self.cluster, node_id)

    def host_key(self, node: Node) -> str:
        return node.ip

    def _access(self, key: str, node: Node | None = None) -> HostAccess:
        """The profile's access settings for the host: matched on its address, and on the
        hostname and labels of the node running there when one is known (kept per host)."""
        if key not in self._accesses or node is not None:
            hostname = self.cluster.hostname(node.node_id) if node is not None else None
            self._accesses[key] = self.profile.access_for(key, hostname, node.labels if node is not None else None)
        return self._accesses[key]

    def connect(self, key: str) -> Transport:
        access = self._access(key)
        if access.transport == "local":
            return LocalTransport(key)
        if access.transport != "ssh":
            raise ChaosError(f"transport {access.transport!r} for {key} is not served by the ssh backend "
                             f"(profile {self.profile.name})")
        from chaos.transport.ssh import SSHTransport

        s = access.ssh
        common = dict(user=s.user, key_filename=str(s.key_path) if s.key_path else None,
                      known_hosts=str(s.known_hosts_path), trust_on_first_use=s.trust_on_first_use,
                      connect_timeout=s.connect_timeout_s, command_timeout=s.command_timeout_s,
                      use_agent=s.use_agent)
        via = None
        if s.jump() is not None:
            jump_user, jump_host, jump_port = s.jump()
            via = SSHTransport(jump_host, port=jump_port, **{**common, "user": jump_user or s.user})
        return SSHTransport(key, port=s.port, jump_host=via, become=s.become, **common)

    def _reach(self, key: str, node: Node | None) -> Host:
        access = self._access(key, node)
        console = None
        if access.netns:
            from chaos.embedded.netns import Console

            console = Console(access.netns)
        return Host(key=key, name=None, transport=self.connect(key), console=console)

    def escalation(self, host: Host) -> Escalation | None:
        """A host logged in to over SSH: asked once a session (chaos.privileges.probe, with the
        become its transport escalates through); a local one runs as the harness does."""
        from chaos.transport.ssh import SSHTransport

        transport = host.transport
        if not isinstance(transport, SSHTransport):
            return None
        with self._escalations_lock:
            if host.key not in self._escalations:
                self._escalations[host.key] = probe(transport, transport.become)
            return self._escalations[host.key]

    def healthy_workers(self) -> tuple[bool, str]:
        alive = len(self.cluster.alive_workers())
        return alive >= self._baseline, f"{alive} of {self._baseline} worker nodes alive"

    def wait_healed(self, timeout: float) -> None:
        self.cluster.wait_alive_workers(self._baseline, timeout)
