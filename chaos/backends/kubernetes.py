"""A KubeRay RayCluster on a real Kubernetes cluster (EKS, SageMaker HyperPod EKS), as a
profile's ``kubernetes`` section names it.

Ray is reached as in the ssh backend (the profile's ``ray`` addresses); everything else goes
through the Kubernetes API (``kube``, a KubeAccess): a Ray node's host is its *pod* (found by
the node's IP), commands run in it by exec, and the safety rules see the labels of the pod
and of the Kubernetes node under it, so an allowlist can select e.g.
``node.kubernetes.io/instance-type`` or a HyperPod label.  A recreated pod is a new host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ray

from chaos.backends.base import Backend, Host, profile_view, ray_node_info
from chaos.cluster import ClusterView, Node, Target
from chaos.errors import ClusterError, ProfileError, TransportError
from chaos.safety import NodeInfo
from chaos.transport.kube import KubeExecTransport
from chaos.transport.kube_access import KubeAccess, PodRef
from chaos.waits import poll_until

if TYPE_CHECKING:
    from chaos.embedded.kubernetes import EmbeddedKubernetes

COMMAND_TIMEOUT_S = 60.0


class KubernetesBackend(Backend):
    name = "kubernetes"

    @classmethod
    def serves(cls, profile) -> bool:
        return profile is not None and profile.kubernetes is not None

    @property
    def external_drains(self) -> bool:
        """A real cluster's platform may drain; the embedded one only by the harness's faults."""
        return self.embedded_kubernetes is None

    def __init__(self, profile, kube: KubeAccess | None = None,
                 embedded_kubernetes: "EmbeddedKubernetes | None" = None):
        """``kube``: an API connection to use instead of the one the profile's
        kubernetes section describes (opened on first use); ``embedded_kubernetes``: the
        harness's own emulated cluster that ``profile`` describes (--chaos-kubernetes)."""
        super().__init__(profile=profile)
        hosts = profile.hosts
        given = ([("hosts.defaults.transport", hosts.defaults.transport)]
                 if "transport" in hosts.defaults.model_fields_set else [])
        given += [(f"hosts.overrides[{i}].transport", o.transport) for i, o in enumerate(hosts.overrides)
                  if o.transport]
        other = [f"{where}: {transport}" for where, transport in given if transport != "k8s"]
        if other:
            raise ProfileError(f"profile {profile.name!r}: the kubernetes backend reaches every Ray pod by exec "
                               f"through the API server; {', '.join(other)} cannot be served (use transport: k8s)")
        self._kube = kube
        self._given_kube = kube is not None
        self._baseline = 0  # alive Ray workers when the session started
        self._pod_baseline = 0  # Running+Ready worker pods then
        self.embedded_kubernetes = embedded_kubernetes

    @property
    def kube(self) -> KubeAccess:
        """The API: the session's, or outside one (``ray-chaos sweep``) the one the profile
        describes, opened on first use."""
        if self._kube is None:
            self._kube = KubeAccess.from_settings(self.profile.kubernetes)
        return self._kube

    @property
    def label(self) -> str:
        return f"kubernetes:{self.profile.name}"

    @property
    def storage_path(self) -> str:
        return self.profile.storage.path

    def _open(self) -> ClusterView:
        settings = self.profile.kubernetes
        version = self.kube.server_version()
        raycluster = self.kube.raycluster()
        view = profile_view(self.profile, f"{self.kube.cluster_ref} (profile {self.profile.name!r})")
        self._baseline = len(view.alive_workers())
        self._pod_baseline = len(self._worker_pods()[1])
        state = (raycluster.get("status") or {}).get("state")
        self.properties = {
            "ray.version": ray.__version__, "cluster": f"profile {self.profile.name}",
            "kubernetes.server": f"{self.kube.server} ({version})",
            "kubernetes.context": self.kube.context or ("in-cluster" if settings.in_cluster else "(none)"),
            "kubernetes.namespace": self.kube.namespace,
            "raycluster": f"{self.kube.namespace}/{self.kube.ray_cluster}" + (f" ({state})" if state else ""),
            "nodes": f"{self._baseline} workers alive at start, {self._pod_baseline} worker pods Running+Ready",
            "dashboard": self.profile.ray.dashboard_url}
        if settings.hyperpod is not None:
            self.properties["hyperpod"] = f"{settings.hyperpod.cluster_name} ({settings.hyperpod.region})"
        return view

    def _close(self) -> None:
        if self._kube is not None and not self._given_kube:
            self._kube.api_client.close()
            self._kube = None

    # -- facts ------------------------------------------------------------------------------------
    def pod_of(self, target: "Target") -> PodRef:
        """The pod a fault's target node runs in."""
        return self.kube.pod_for_ip(target.node_ip)

    def node_info(self, node_id: str) -> NodeInfo | None:
        """Ray's facts, with the labels of the pod and of its Kubernetes node (and k8s.pod,
        k8s.node); the head is the head by Ray's table or by the pod's ray.io/node-type.
        A Ray node without exactly one pod of this RayCluster on its IP is not a node of
        this cluster (None: refused)."""
        info = ray_node_info(self.cluster, node_id)
        if info is None:
            return None
        on_ip = [p for p in self.kube.ray_pods() if p.ip == info.ip]
        live = [p for p in on_ip if not p.deleting] or on_ip
        if len(live) != 1:  # no pod, or several (hostNetwork): nothing certain to decide on
            return None
        pod = live[0]
        node_labels = self.kube.node(pod.node_name)["metadata"].get("labels") or {} if pod.node_name else {}
        labels = {**info.labels, **node_labels, **pod.labels, "k8s.pod": pod.name,
                  **({"k8s.node": pod.node_name} if pod.node_name else {})}
        return NodeInfo(node_id=node_id, ip=info.ip, hostname=info.hostname or pod.name, labels=labels,
                        is_head=info.is_head or pod.is_head)

    def host_key(self, node: Node) -> str:
        return self.kube.pod_for_ip(node.ip).name

    def connect(self, key: str) -> KubeExecTransport:
        try:
            pod = self.kube.pod(key)
        except ClusterError as e:  # e.g. the pod is gone: for callers, the host does not answer
            raise TransportError(f"pod {self.kube.namespace}/{key}: cannot be reached: {e}") from e
        return KubeExecTransport(self.kube, key, container=pod.containers[0] if pod.containers else None,
                                 command_timeout=COMMAND_TIMEOUT_S)

    def _reach(self, key: str, node: Node | None) -> Host:
        pod = next((p for p in self.kube.ray_pods() if p.name == key), None)
        labels = {"k8s.pod": key, "k8s.namespace": self.kube.namespace}
        if pod is not None and pod.node_name:
            labels["k8s.node"] = pod.node_name
        container = pod.containers[0] if pod is not None and pod.containers else None
        name = f"pod {self.kube.namespace}/{key}" + (f" on node {pod.node_name}" if pod and pod.node_name else "")
        return Host(key=key, name=name, labels=labels,
                    transport=KubeExecTransport(self.kube, key, container=container, command_timeout=COMMAND_TIMEOUT_S))

    # -- health -------------------------------------------------------------------------------------
    def _worker_pods(self) -> tuple[list[PodRef], list[PodRef]]:
        """(every worker pod, those Running, Ready and not terminating)."""
        workers = [p for p in self.kube.ray_pods() if not p.is_head]
        return workers, [p for p in workers if p.phase == "Running" and p.ready and not p.deleting]

    def healthy_workers(self) -> tuple[bool, str]:
        workers, ready = self._worker_pods()
        alive = len(self.cluster.alive_workers())
        unready = [f"{p.name}:{p.phase or '?'}{'/terminating' if p.deleting else '' if p.ready else '/not ready'}"
                   for p in workers if p not in ready]
        ok = not unready and len(ready) >= self._pod_baseline and alive >= self._baseline
        return ok, (f"{len(ready)} of {self._pod_baseline} worker pods Running+Ready"
                    + (f" (not: {', '.join(unready)})" if unready else "")
                    + f"; {alive} of {self._baseline} Ray worker nodes alive")

    def wait_healed(self, timeout: float) -> None:
        poll_until(self.healthy_workers, timeout,
                   f"every worker pod of {self.kube.cluster_ref} Running+Ready and {self._baseline} Ray worker "
                   f"nodes alive", interval=0.5)
