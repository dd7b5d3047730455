"""The embedded Kubernetes cluster: a KubeRay RayCluster on HyperPod-like nodes, with the
control plane emulated and everything under it real.

Nodes: one ``head`` node backed by this machine (the
head needs no test host of its own: no fault here takes the head) and one test host per worker, named ``hyperpod-<instance
id>`` and labelled as HyperPod EKS labels its nodes.  On them: the emulated API server
(``chaos.embedded.kube``) with the kubelet running pods as real process trees, the
KubeRay-like reconciler creating the Ray pods from a RayCluster, the HyperPod-like agent
rebooting or replacing test hosts on the node-health label (which its health monitoring sets
on an Xid line in a host's kernel log, ``/dev/kmsg`` inside the host), and the SageMaker
endpoint for boto3.  The harness reaches it all through a profile (``profile()``) served by the
``kubernetes`` backend, exactly as it would reach a real KubeRay cluster on HyperPod EKS.

Every Ray container gets its own Ray temp dir (``RAY_TMPDIR``, from the pod's uid): on a
real cluster each container has its own ``/tmp``; here the test hosts share this machine's.
The container command is the user-style override KubeRay supports (annotation
``ray.io/overwrite-container-cmd``: run ``$KUBERAY_GEN_RAY_START_CMD`` after a setup line).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import ray
from kubernetes import client, config as kube_config

from chaos.cluster import ClusterView
from chaos.embedded.cluster import (HealthChecks, SlotClaim, claim_slot, free_bridge, free_port,
                                    one_start_at_a_time, port_slice)
from chaos.embedded.kube.hyperpod import HyperPodAgent
from chaos.embedded.kube.kubeconfig import write_kubeconfig
from chaos.embedded.kube.kubelet import HostMachine, Kubelet, ThisMachine
from chaos.embedded.kube.kuberay import GEN_CMD_ENV, GROUP, OVERWRITE_CMD, PLURAL, VERSION, KubeRayReconciler
from chaos.embedded.kube.server import ApiServer
from chaos.embedded.kube.testhost_hosts import TestHostHosts, new_instance_id
from chaos.embedded.sagemaker import SageMakerEndpoint
from chaos.errors import ClusterError
from chaos.hyperpod import (COMPUTE_TYPE_LABEL, HEALTH_LABEL, INSTANCE_GROUP_LABEL, INSTANCE_ID_LABEL, INSTANCE_TYPE_LABEL,
                            SCHEDULABLE)

log = logging.getLogger(__name__)

ROLE_LABEL = "chaos.ray.io/role"  # head | worker: which node a RayCluster group is scheduled on
WORKER_GROUP = "workers"
INSTANCE_TYPE = "ml.g5.8xlarge"
# The containers' commands: their own Ray temp dir, then KubeRay's generated `ray start ... --block`
# (exec, so the kubelet's SIGTERM reaches `ray start` itself, as with KubeRay's own command).
# Workers first wait for the head's GCS port, as KubeRay's injected `wait-gcs-ready` init
# container does (init containers are not run by the emulated kubelet), and name their temp
# dir explicitly: without --temp-dir a Ray worker node takes the head's.
_TMP = 'export RAY_TMPDIR=$RAY_TMP_ROOT/${POD_UID:0:8}; mkdir -p "$RAY_TMPDIR"; '
HEAD_SCRIPT = _TMP + f"exec ${GEN_CMD_ENV}"
WORKER_SCRIPT = (_TMP + "until (exec 3<>/dev/tcp/$HEAD_IP/$RAY_PORT) 2>/dev/null; do sleep 0.5; done; "
                 f"exec ${GEN_CMD_ENV} --node-ip-address=$POD_IP --temp-dir=$RAY_TMPDIR")


@dataclasses.dataclass
class KubeClusterConfig:
    workers: int = 3
    base_dir: Path = Path("reports/embedded-k8s")
    namespace: str = "ray"
    ray_cluster: str = "raytrain"
    hyperpod_cluster: str = "ml-cluster"
    region: str = "us-west-2"
    #: RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S of every Ray container, and the pods'
    #: terminationGracePeriodSeconds.  The grace ends inside the window on purpose: the
    #: kubelet's SIGKILL then always comes first, which Ray 2.60 charges deterministically
    #: (max_failures); with the window ending first (KubeRay's advice: drain just under the
    #: grace) the charge is a race inside Ray (docs/verdicts.md, "Which budget a fault costs").
    drain_window_s: float = 10.0
    grace_period_s: int = 8
    boot_delay_s: float = 1.0
    start_timeout_s: float = 180.0
    object_store_mb: int = 150
    slot: int | None = None  # as EmbeddedConfig.slot
    #: The HyperPod agent acts on Xid lines in the workers' kernel logs (agent.set_health_monitoring
    #: switches it at run time).
    health_monitoring: bool = True
    #: ... this long after the line: a real agent takes seconds (or minutes), and the rank then meets
    #: its dead GPU before its node goes down, as on a real cluster.
    health_detect_delay_s: float = 1.0
    health: HealthChecks = dataclasses.field(default_factory=HealthChecks)

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"the embedded Kubernetes cluster needs at least 1 worker node, got workers={self.workers}")
        if self.drain_window_s <= 0 or self.grace_period_s < 0:
            raise ValueError(f"drain_window_s must be > 0 and grace_period_s >= 0, got {self.drain_window_s}, "
                             f"{self.grace_period_s}")


class EmbeddedKubernetes:
    """``EmbeddedKubernetes(cfg).up()`` … ``down()``; ``profile()`` describes it for the harness."""

    def __init__(self, config: KubeClusterConfig | None = None):
        self.config = config or KubeClusterConfig()
        self.base_dir = Path(self.config.base_dir).resolve()
        self.network = None
        self.kubelet: Kubelet | None = None
        self.server: ApiServer | None = None
        self.reconciler: KubeRayReconciler | None = None
        self.agent: HyperPodAgent | None = None
        self.sagemaker: SageMakerEndpoint | None = None
        self.api: client.ApiClient | None = None
        self.kubeconfig = self.base_dir / "kubeconfig"
        self.head_ip = ""
        self.gcs_port = self.dashboard_port = 0
        self._claim: SlotClaim | None = None
        # Short on purpose: Ray puts unix sockets under it (108-byte path limit).
        self.ray_tmp_root = Path(f"/tmp/rck-{os.getpid()}")

    @property
    def gcs_address(self) -> str:
        return f"{self.head_ip}:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.head_ip}:{self.dashboard_port}"

    @property
    def storage_path(self) -> Path:
        return self.base_dir / "storage"

    # -- lifecycle ---------------------------------------------------------------------------
    def up(self) -> "EmbeddedKubernetes":
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.storage_path.mkdir(parents=True, exist_ok=True)
        self._claim = claim_slot(self.config.slot, bridge=True)
        self.config = dataclasses.replace(self.config, slot=self._claim.slot)
        try:
            with one_start_at_a_time(f"embedded Kubernetes cluster (slot {self._claim.slot})"):
                self._hosts()
                self._control_plane()
                self._raycluster()
                self.wait_ready(self.config.start_timeout_s)
        except BaseException:
            self.down()
            raise
        return self

    def _hosts(self) -> None:
        from chaos.embedded.testhost import TestHostNetwork, require_testhosts

        require_testhosts()
        bridge, subnet = free_bridge(self.config.slot)
        self.network = TestHostNetwork(state_dir=Path("/tmp") / f"rck-{os.getpid()}-hosts", bridge=bridge,
                                       subnet=subnet, boot_delay=self.config.boot_delay_s).up()
        self.head_ip = self.network.head_address
        self.kubelet = Kubelet(self.base_dir / "pods", env=self._env())
        self.kubelet.add_node("head", ThisMachine(self.head_ip), {ROLE_LABEL: "head"})
        for _ in range(self.config.workers):
            instance = new_instance_id()
            name = f"hyperpod-{instance}"
            host = self.network.add_host(name)
            host.boot(wait=True)
            self.kubelet.add_node(name, HostMachine(host), {
                ROLE_LABEL: "worker", HEALTH_LABEL: SCHEDULABLE, INSTANCE_GROUP_LABEL: WORKER_GROUP,
                INSTANCE_ID_LABEL: instance, INSTANCE_TYPE_LABEL: INSTANCE_TYPE,
                COMPUTE_TYPE_LABEL: "hyperpod"})

    def _control_plane(self) -> None:
        self.server = ApiServer(lifecycle=self.kubelet, host="127.0.0.1", port=free_port(self._ports()))
        self.server.start()
        write_kubeconfig(self.kubeconfig, self.server.url, namespace=self.config.namespace)
        self.api = kube_config.new_client_from_config(config_file=str(self.kubeconfig))
        client.CoreV1Api(self.api).create_namespace({"metadata": {"name": self.config.namespace}})
        self.reconciler = KubeRayReconciler(self.api, namespace=self.config.namespace,
                                            head_address=self.head_ip).start()
        self.agent = HyperPodAgent(self.api, TestHostHosts(self.network, self.kubelet), instance_group=WORKER_GROUP,
                                   instance_type=INSTANCE_TYPE,
                                   health_monitoring=self.config.health_monitoring,
                                   detect_delay_s=self.config.health_detect_delay_s).start()
        self.sagemaker = SageMakerEndpoint(self.agent, cluster_name=self.config.hyperpod_cluster,
                                           port=free_port(self._ports()))
        self.sagemaker.start()

    def _ports(self) -> range:
        return port_slice(self.config.slot)

    def _env(self) -> dict[str, str]:
        env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
               "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(self.config.drain_window_s),
               "NO_PROXY": "127.0.0.0/8,localhost", "no_proxy": "127.0.0.0/8,localhost",
               "PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/sbin", "/usr/local/bin",
                                        "/usr/sbin", "/usr/bin", "/sbin", "/bin"])}
        env.update(self.config.health.env())
        return env

    def _raycluster(self) -> None:
        ports = self._ports()
        self.gcs_port, self.dashboard_port = free_port(ports), free_port(ports)
        store = str(self.config.object_store_mb * 1024 * 1024)
        head_params = {
            "port": self.gcs_port, "dashboard-port": self.dashboard_port, "dashboard-host": self.head_ip,
            "node-ip-address": self.head_ip, "num-cpus": "0", "num-gpus": "0", "object-store-memory": store,
            **{flag: free_port(ports) for flag in (
                "metrics-export-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                "node-manager-port", "object-manager-port", "runtime-env-agent-port", "ray-client-server-port")}}

        def template(role: str, container: str, script: str) -> dict:
            env = [{"name": k, "value": v} for k, v in {
                "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(self.config.drain_window_s),
                "RAY_TMP_ROOT": str(self.ray_tmp_root), "HEAD_IP": self.head_ip,
                # torch.distributed's Gloo binds the interface its hostname resolves to, which
                # is loopback in a test host; GPU KubeRay pods commonly pin eth0 the same way.
                **({"GLOO_SOCKET_IFNAME": "eth0"} if role == "worker" else {})}.items()]
            env += [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
                    for name, path in (("POD_UID", "metadata.uid"), ("POD_IP", "status.podIP"))]
            return {"spec": {
                "nodeSelector": {ROLE_LABEL: role},
                "terminationGracePeriodSeconds": self.config.grace_period_s,
                "containers": [{"name": container, "image": f"rayproject/ray:{ray.__version__}",
                                "command": ["/bin/bash", "-c", "--"], "args": [script], "env": env}]}}

        body = {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "RayCluster",
            "metadata": {"name": self.config.ray_cluster, "namespace": self.config.namespace,
                         "annotations": {OVERWRITE_CMD: "true"}},
            "spec": {
                "rayVersion": ray.__version__,
                "headGroupSpec": {"rayStartParams": {k: str(v) for k, v in head_params.items()},
                                  "template": template("head", "ray-head", HEAD_SCRIPT)},
                "workerGroupSpecs": [{
                    "groupName": WORKER_GROUP, "replicas": self.config.workers, "minReplicas": self.config.workers,
                    "maxReplicas": self.config.workers,
                    "rayStartParams": {"num-cpus": "1", "object-store-memory": store},
                    "template": template("worker", "ray-worker", WORKER_SCRIPT)}]}}
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            GROUP, VERSION, self.config.namespace, PLURAL, body)

    def wait_ready(self, timeout: float) -> None:
        """Until the head's dashboard answers and every worker pod's Ray node is alive."""
        deadline = time.monotonic() + timeout
        view = ClusterView(self.dashboard_url, self.gcs_address)
        view.wait_until(lambda nodes: nodes or None, timeout, f"the Ray head pod's dashboard at {self.dashboard_url}")
        view.wait_alive_workers(self.config.workers, max(1.0, deadline - time.monotonic()))

    def down(self) -> None:
        """Stop everything it started, in reverse order; the first error is raised at the end."""
        errors = []
        for what, stop in (("SageMaker endpoint", lambda: self.sagemaker and self.sagemaker.stop()),
                           ("HyperPod agent", lambda: self.agent and self.agent.stop()),
                           ("reconciler", lambda: self.reconciler and self.reconciler.stop()),
                           ("kubelet", lambda: self.kubelet and self.kubelet.close()),
                           ("API server", lambda: self.server and self.server.stop()),
                           ("test hosts", lambda: self.network and self.network.close())):
            try:
                stop()
            except Exception as e:  # keep stopping the rest
                errors.append(f"{what}: {e}")
        hosts_dir = self.network.state_dir if self.network is not None else None
        self.sagemaker = self.agent = self.reconciler = self.kubelet = self.server = self.network = None
        shutil.rmtree(self.ray_tmp_root, ignore_errors=True)
        if hosts_dir is not None and not errors:  # its SSH key and host keys; kept if hosts may still run
            shutil.rmtree(hosts_dir, ignore_errors=True)
        if errors:
            raise ClusterError("embedded Kubernetes teardown incomplete: " + "; ".join(errors))
        if self._claim is not None:  # kept while anything of the cluster may be left on the slot
            self._claim.release()

    # -- what the harness is given ---------------------------------------------------------------
    def profile(self, name: str = "embedded-kubernetes") -> dict:
        """The profile of this cluster for the ``kubernetes`` backend: every HyperPod worker node
        allowlisted by its instance-group label, the head pod never."""
        return {
            "name": name, "protected": False,
            "ray": {"dashboard_url": self.dashboard_url, "gcs_address": self.gcs_address},
            "storage": {"path": str(self.storage_path)},
            "nodes": {"discovery": "ray"},
            "hosts": {"defaults": {"transport": "k8s"}},
            "kubernetes": {"kubeconfig": str(self.kubeconfig), "namespace": self.config.namespace,
                           "ray_cluster": self.config.ray_cluster,
                           "hyperpod": {"cluster_name": self.config.hyperpod_cluster, "region": self.config.region,
                                        "endpoint_url": self.sagemaker.url}},
            "safety": {"allow_head": False, "allowlist": [{"label": f"{INSTANCE_GROUP_LABEL}={WORKER_GROUP}"}],
                       "allow_node_replacement": True,
                       "max_live_faults": self.config.workers, "min_alive_nodes": 1, "unhealthy_for_s": 600.0},
        }
