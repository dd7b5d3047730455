"""The Kubernetes API as the harness uses it: one RayCluster's pods, their nodes, the
RayCluster object and (on HyperPod) the SageMaker API, through the official clients only.

Every failure becomes a ``ClusterError`` that says what was being done: an RBAC refusal names
the identity, the verb and the resource (the permission to grant), a 404 the object, an
unreachable server its URL.  ``api_error`` is that translation, for faults that call the
API themselves (``KubeAccess.core`` / ``policy`` / ``custom``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from chaos.errors import ClusterError

if TYPE_CHECKING:
    from chaos.profile.models import HyperPodSettings, KubernetesSettings

T = TypeVar("T")

# KubeRay's pod labels (ray-operator/controllers/ray/utils/constant.go)
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
RAY_GROUP, RAY_VERSION, RAYCLUSTERS = "ray.io", "v1", "rayclusters"

DEFAULT_KUBECONFIG = "~/.kube/config"


@dataclasses.dataclass(frozen=True)
class PodRef:
    """A Ray pod as the harness needs it: where it runs and which Ray node type it is."""

    namespace: str
    name: str
    uid: str
    node_name: str | None  # the Kubernetes node (None while Pending)
    ip: str | None  # status.podIP: the Ray node's IP
    labels: Mapping[str, str]
    node_type: str | None  # head / worker (ray.io/node-type)
    group: str | None  # ray.io/group
    phase: str | None = None
    ready: bool = False
    deleting: bool = False  # has a deletionTimestamp
    containers: tuple[str, ...] = ()  # the first is Ray's (KubeRay's RayContainerIndex)

    @classmethod
    def from_pod(cls, pod: client.V1Pod) -> "PodRef":
        meta, spec, status = pod.metadata, pod.spec, pod.status
        labels = dict(meta.labels or {})
        conditions = (status.conditions if status else None) or []
        return cls(namespace=meta.namespace, name=meta.name, uid=meta.uid, node_name=spec.node_name if spec else None,
                   ip=status.pod_ip if status else None, labels=labels, node_type=labels.get(NODE_TYPE_LABEL),
                   group=labels.get(GROUP_LABEL), phase=status.phase if status else None,
                   ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
                   deleting=meta.deletion_timestamp is not None,
                   containers=tuple(c.name for c in (spec.containers if spec else None) or []))

    @property
    def is_head(self) -> bool:
        return self.node_type == "head"

    def describe(self) -> str:
        return f"{self.namespace}/{self.name} ({self.node_type or '?'}, ip {self.ip or 'none'}, " \
               f"node {self.node_name or 'none'}, {self.phase or 'no phase'}{', ready' if self.ready else ''}" \
               f"{', terminating' if self.deleting else ''})"


def server_message(e: ApiException) -> str:
    """The message of the Status the server answered with (else the HTTP reason)."""
    try:
        body = json.loads(e.body) if e.body else {}
    except (TypeError, ValueError):
        body = {}
    return (body.get("message") if isinstance(body, dict) else None) or e.reason or "(no message)"


def _status_details(e: ApiException) -> dict:
    try:
        body = json.loads(e.body) if e.body else {}
    except (TypeError, ValueError):
        return {}
    return (body.get("details") or {}) if isinstance(body, dict) else {}


def api_error(e: BaseException, verb: str, resource: str, *, name: str | None = None, namespace: str | None = None,
              identity: str = "unknown identity", server: str = "the API server") -> ClusterError:
    """A ClusterError for a failed API call: ``verb`` on ``resource`` (RBAC's names:
    ``pods``, ``pods/eviction``, ``rayclusters.ray.io``), ``namespace`` None for cluster scope."""
    scope = f"in namespace {namespace}" if namespace else "at cluster scope"
    what = f"{resource} {namespace + '/' if namespace else ''}{name}" if name else f"{resource} {scope}"
    if isinstance(e, ApiException) and e.status:
        message = server_message(e)
        if e.status == 403:
            return ClusterError(f"RBAC: the profile's identity ({identity}) may not {verb} {resource} {scope}: "
                                f"{message}")
        if e.status == 401:
            return ClusterError(f"{server} rejected the credentials of {identity} (401 Unauthorized) while trying to "
                                f"{verb} {what}: {message}; refresh them (e.g. aws eks update-kubeconfig)")
        if e.status == 404:
            return ClusterError(f"{what} not found (trying to {verb} it): {message}")
        if e.status == 410:
            return ClusterError(f"{verb} {what}: the resource version is too old (410 Gone): {message}; "
                                "list again and start from the new version")
        return ClusterError(f"{verb} {what} failed: HTTP {e.status} {e.reason}: {message}")
    reason = e.reason if isinstance(e, ApiException) else f"{type(e).__name__}: {e}"
    return ClusterError(f"cannot reach {server} to {verb} {what}: {reason}")


# What the client raises when no HTTP answer came at all.
CONNECTION_ERRORS = (urllib3.exceptions.HTTPError, OSError)


def _kubeconfig_files(path: str | None) -> list[Path]:
    """The kubeconfig files to read: the profile's, else $KUBECONFIG (a ':' list), else ~/.kube/config."""
    if path:
        return [Path(path).expanduser()]
    listed = os.environ.get("KUBECONFIG")
    return [Path(p).expanduser() for p in (listed.split(os.pathsep) if listed else [DEFAULT_KUBECONFIG]) if p]


class KubeAccess:
    """One RayCluster through one API server connection (``api_client``).

    ``identity`` names who the server sees (the kubeconfig user), ``context`` the
    kubeconfig context, for messages and reports.  ``request_timeout`` bounds every call.
    """

    def __init__(self, api_client: client.ApiClient, namespace: str, ray_cluster: str, *,
                 hyperpod: "HyperPodSettings | None" = None, identity: str = "unknown identity",
                 context: str | None = None, request_timeout: float = 30.0):
        self.api_client = api_client
        self.namespace, self.ray_cluster = namespace, ray_cluster
        self.hyperpod = hyperpod
        self.identity, self.context = identity, context
        self.request_timeout = request_timeout
        self.core = client.CoreV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.exec_protocol: str | None = None  # learnt by chaos.transport.kube on the first exec

    @property
    def server(self) -> str:
        """The API server's URL."""
        return self.api_client.configuration.host

    @property
    def cluster_ref(self) -> str:
        return f"RayCluster {self.namespace}/{self.ray_cluster}"

    # -- building one from a profile ------------------------------------------------------------
    @classmethod
    def from_settings(cls, settings: "KubernetesSettings") -> "KubeAccess":
        """Load the kubeconfig and context (or the in-cluster service account) and check
        that the API server answers within ``settings.request_timeout_s``."""
        configuration = client.Configuration()
        if settings.in_cluster:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except ConfigException as e:
                raise ClusterError(f"kubernetes.in_cluster: true, but this process has no in-cluster service "
                                   f"account ({e}): run the harness in a pod, or give kubeconfig/context") from e
            identity, context = "the pod's service account (in-cluster)", None
        else:
            identity, context = cls._load_kubeconfig(settings, configuration)
        configuration.retries = urllib3.util.Retry(total=2, connect=2, read=0, status=0, other=0, redirect=0,
                                                   backoff_factor=0.1)
        access = cls(client.ApiClient(configuration), settings.namespace, settings.ray_cluster,
                     hyperpod=settings.hyperpod, identity=identity, context=context,
                     request_timeout=settings.request_timeout_s)
        access.server_version()  # reachable at all, within the deadline
        return access

    @staticmethod
    def _load_kubeconfig(settings: "KubernetesSettings", configuration: client.Configuration) -> tuple[str, str]:
        """Fill ``configuration`` from the kubeconfig; (identity, context) for messages."""
        files = _kubeconfig_files(settings.kubeconfig)
        present = [f for f in files if f.is_file()]
        if not present:
            where = (f"kubernetes.kubeconfig {files[0]}" if settings.kubeconfig else
                     f"$KUBECONFIG ({os.environ['KUBECONFIG']})" if os.environ.get("KUBECONFIG") else
                     f"the default kubeconfig {files[0]}")
            raise ClusterError(f"{where} does not exist: give the path of a kubeconfig for the cluster "
                               f"(e.g. from `aws eks update-kubeconfig`), or set in_cluster: true inside a pod")
        config_file = os.pathsep.join(str(f) for f in present)
        try:
            contexts, current = config.list_kube_config_contexts(config_file=config_file)
        except (ConfigException, OSError, ValueError) as e:
            raise ClusterError(f"kubeconfig {config_file} cannot be read: {e}") from e
        names = [c["name"] for c in contexts or []]
        wanted = settings.context or (current or {}).get("name")
        if wanted is None:
            raise ClusterError(f"kubeconfig {config_file} has no current-context: set kubernetes.context to one of "
                               f"{', '.join(names) or '(none: the file has no contexts)'}")
        if wanted not in names:
            raise ClusterError(f"context {wanted!r} is not in kubeconfig {config_file}; its contexts: "
                               f"{', '.join(names) or '(none)'}")
        try:
            config.load_kube_config(config_file=config_file, context=wanted, client_configuration=configuration,
                                    persist_config=False)
        except (ConfigException, OSError, ValueError) as e:
            raise ClusterError(f"kubeconfig {config_file}, context {wanted!r} cannot be used: {e}") from e
        entry = next(c for c in contexts if c["name"] == wanted)
        user = (entry.get("context") or {}).get("user")
        return (f"user {user} of context {wanted}" if user else f"context {wanted}"), wanted

    # -- calls ----------------------------------------------------------------------------------------
    def error(self, e: BaseException, verb: str, resource: str, name: str | None = None,
              namespaced: bool = True) -> ClusterError:
        """``api_error`` with this access's identity, server and namespace."""
        return api_error(e, verb, resource, name=name, namespace=self.namespace if namespaced else None,
                         identity=self.identity, server=f"the Kubernetes API server at {self.server}")

    def call(self, verb: str, resource: str, fn: Callable[..., T], *args: Any, name: str | None = None,
             namespaced: bool = True, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` with the request timeout; failures as ClusterError (see ``error``)."""
        kwargs.setdefault("_request_timeout", self.request_timeout)
        try:
            return fn(*args, **kwargs)
        except (ApiException, *CONNECTION_ERRORS) as e:
            raise self.error(e, verb, resource, name, namespaced) from e

    def server_version(self) -> str:
        """The server's gitVersion; a clear error when it does not answer."""
        try:
            info = client.VersionApi(self.api_client).get_code(_request_timeout=self.request_timeout)
        except ApiException as e:
            if e.status:
                raise self.error(e, "get", "version", namespaced=False) from e
            raise ClusterError(f"cannot reach the Kubernetes API server at {self.server}"
                               f"{f' (context {self.context})' if self.context else ''}: {e.reason}") from e
        except CONNECTION_ERRORS as e:
            raise ClusterError(f"cannot reach the Kubernetes API server at {self.server}"
                               f"{f' (context {self.context})' if self.context else ''} within "
                               f"{self.request_timeout:g}s: {type(e).__name__}: {e}") from e
        return info.git_version

    # -- the RayCluster's pods and nodes ---------------------------------------------------------------
    def ray_pods(self) -> list[PodRef]:
        """Every pod of the RayCluster (label ray.io/cluster), terminating ones included."""
        pods = self.call("list", "pods", self.core.list_namespaced_pod, self.namespace,
                         label_selector=f"{CLUSTER_LABEL}={self.ray_cluster}")
        return sorted((PodRef.from_pod(p) for p in pods.items), key=lambda p: p.name)

    def pod_for_ip(self, ip: str) -> PodRef:
        """The Ray pod whose IP is the Ray node's (a live pod before a terminating one)."""
        pods = self.ray_pods()
        matches = [p for p in pods if p.ip == ip]
        live = [p for p in matches if not p.deleting] or matches
        if len(live) == 1:
            return live[0]
        seen = ", ".join(f"{p.name}={p.ip or 'no IP'}" for p in pods) or "none"
        if not live:
            raise ClusterError(f"no pod of {self.cluster_ref} has IP {ip} (is the Ray node in this RayCluster?); "
                               f"pods seen: {seen}")
        raise ClusterError(f"{len(live)} pods of {self.cluster_ref} have IP {ip} (hostNetwork?), so the Ray node's "
                           f"pod is ambiguous: {', '.join(p.name for p in live)}")

    def pod(self, name: str) -> PodRef:
        return PodRef.from_pod(self.call("get", "pods", self.core.read_namespaced_pod, name, self.namespace,
                                         name=name))

    def node(self, name: str) -> dict:
        """The Kubernetes node object, as JSON (``metadata.labels``, ``spec``, ``status``)."""
        node = self.call("get", "nodes", self.core.read_node, name, name=name, namespaced=False)
        return self.api_client.sanitize_for_serialization(node)

    def raycluster(self) -> dict:
        """The RayCluster object; "not found" says whether the RayCluster, its namespace
        or the RayCluster API (the KubeRay CRD) is missing."""
        try:
            return self.custom.get_namespaced_custom_object(RAY_GROUP, RAY_VERSION, self.namespace, RAYCLUSTERS,
                                                            self.ray_cluster, _request_timeout=self.request_timeout)
        except ApiException as e:
            if e.status != 404:
                raise self.error(e, "get", f"{RAYCLUSTERS}.{RAY_GROUP}", self.ray_cluster) from e
            if not _status_details(e).get("name"):
                raise ClusterError(f"the Kubernetes API server at {self.server} does not serve "
                                   f"{RAYCLUSTERS}.{RAY_GROUP}/{RAY_VERSION}: is KubeRay (its RayCluster CRD) "
                                   f"installed? {server_message(e)}") from e
            raise self._missing_cluster() from e
        except CONNECTION_ERRORS as e:
            raise self.error(e, "get", f"{RAYCLUSTERS}.{RAY_GROUP}", self.ray_cluster) from e

    def _missing_cluster(self) -> ClusterError:
        try:
            self.core.read_namespace(self.namespace, _request_timeout=self.request_timeout)
        except ApiException as e:
            if e.status == 404:
                return ClusterError(f"namespace {self.namespace} not found on {self.server} (looking for "
                                    f"{self.cluster_ref}{f', context {self.context}' if self.context else ''})")
            return ClusterError(f"RayCluster {self.namespace}/{self.ray_cluster} not found (and namespace "
                                f"{self.namespace} could not be checked: {server_message(e)})")
        names = []
        try:
            listed = self.custom.list_namespaced_custom_object(RAY_GROUP, RAY_VERSION, self.namespace, RAYCLUSTERS,
                                                               _request_timeout=self.request_timeout)
            names = sorted(item["metadata"]["name"] for item in listed.get("items", []))
        except ApiException:
            pass  # only for the hint below
        return ClusterError(f"RayCluster {self.namespace}/{self.ray_cluster} not found; RayClusters in namespace "
                            f"{self.namespace}: {', '.join(names) or 'none'}")

    # -- HyperPod ---------------------------------------------------------------------------------------
    def sagemaker(self):
        """A boto3 ``sagemaker`` client for the profile's HyperPod cluster (credentials from
        the usual AWS chain; an emulated endpoint on loopback takes unsigned requests)."""
        if self.hyperpod is None:
            raise ClusterError(f"the profile's kubernetes section has no hyperpod: section (cluster_name, region), so "
                               f"{self.cluster_ref} has no SageMaker HyperPod API to call")
        return sagemaker_client(self.hyperpod, self.request_timeout)


def sagemaker_client(hp: "HyperPodSettings", timeout: float):
    """boto3's ``sagemaker`` client for a HyperPod cluster's settings (what the faults and
    ``ray-chaos doctor`` both call through)."""
    import boto3
    import botocore
    from botocore.config import Config

    session = boto3.session.Session(region_name=hp.region)
    options: dict[str, Any] = dict(connect_timeout=timeout, read_timeout=timeout,
                                   retries={"max_attempts": 2, "mode": "standard"})
    if unsigned_allowed(hp) and session.get_credentials() is None:
        options["signature_version"] = botocore.UNSIGNED
    return session.client("sagemaker", endpoint_url=hp.endpoint_url, config=Config(**options))


def unsigned_allowed(hp: "HyperPodSettings") -> bool:
    """An endpoint on loopback (the emulated one) takes unsigned requests when no credentials resolve."""
    return bool(hp.endpoint_url) and _loopback(hp.endpoint_url or "")


def _loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
