"""The profile's data model: every field, its default and its check (pydantic).

Each field's docstring is its description in docs/reference/profile.md (chaos.docgen).
Loading YAML into these models, with every problem named as ``FILE:LINE: FIELD: PROBLEM``,
is chaos.profile.loading's job; the fault kinds, budget classes and default SLOs come from
chaos.faults.catalog.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import re
import typing
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, create_model,
                      field_validator, model_validator)

from chaos import hyperpod
from chaos.errors import ProfileError
from chaos.faults import catalog

SECRET_HINT = "put secrets in your SSH agent or key file, not in the profile"


# -- errors --------------------------------------------------------------------------------
class Problem(typing.NamedTuple):
    loc: tuple  # path into the profile data: ("hosts", "defaults", "ssh", "port")
    message: str
    line: int | None = None


def field_path(loc: Sequence) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


class ProfileInvalid(ProfileError):
    """One or more problems in a profile; ``problems`` holds them, the message lists them."""

    def __init__(self, problems: Sequence[Problem], source: str | os.PathLike | None = None):
        self.problems = sorted(problems, key=lambda p: (p.line or 0, field_path(p.loc)))
        self.source = str(source) if source is not None else None
        lines = [self.render(p) for p in self.problems]
        head = f"{self.source or 'profile'}: {len(lines)} problems:\n" if len(lines) > 1 else ""
        super().__init__(head + "\n".join(lines))

    def render(self, p: Problem) -> str:
        where = self.source or "profile"
        if p.line is not None:
            where += f":{p.line}"
        return f"{where}: {field_path(p.loc)}: {p.message}" if p.loc else f"{where}: {p.message}"


# -- field types -----------------------------------------------------------------------------
def host_port(value: str, what: str) -> tuple[str, int]:
    """Split 'host:port' / '[v6]:port'; the port is required."""
    if "://" in value:
        raise ValueError(f"{what} is host:port without a scheme, e.g. 10.0.0.1:6379; got {value!r}")
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\s\[\]/]+):(\d+)", value.strip())
    if not m:
        raise ValueError(f"{what} must be host:port, e.g. 10.0.0.1:6379; got {value!r}")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"{what}: port {port} is out of range 1-65535")
    return host, int(port)


def _check_gcs(value: str) -> str:
    host_port(value, "gcs_address")
    return value.strip()


def _check_dashboard(value: str) -> str:
    u = urllib.parse.urlsplit(value.strip())
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"dashboard_url must be http://host:port (or https://...), got {value!r}")
    try:
        u.port
    except ValueError:
        raise ValueError(f"dashboard_url has an invalid port: {value!r}") from None
    if u.username or u.password:
        raise ValueError(f"dashboard_url must not carry credentials; {SECRET_HINT}")
    return value.strip().rstrip("/")


def parse_jump_host(value: str) -> tuple[str | None, str, int]:
    """'[user@]host[:port]' → (user, host, port); port defaults to 22."""
    m = re.fullmatch(r"(?:([^@\s:]+)@)?(\[[0-9A-Fa-f:.]+\]|[^@\s:\[\]/]+)(?::(\d+))?", value.strip())
    if not m:
        raise ValueError(f"jump_host must be [user@]host[:port], e.g. ops@bastion.example.com:22; got {value!r}")
    port = int(m.group(3) or 22)
    if not 1 <= port <= 65535:
        raise ValueError(f"jump_host: port {port} is out of range 1-65535")
    return m.group(1), m.group(2).strip("[]"), port


def _check_jump(value: str) -> str:
    parse_jump_host(value)
    return value.strip()


def _check_path(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a file path, got an empty string")
    if "\n" in value or "-----BEGIN" in value:
        raise ValueError(f"must be the path of a file, not its contents; {SECRET_HINT}")
    return value.strip()


Port = Annotated[int, Field(ge=1, le=65535)]
Seconds = Annotated[float, Field(gt=0)]
GcsAddress = Annotated[str, AfterValidator(_check_gcs)]
DashboardUrl = Annotated[str, AfterValidator(_check_dashboard)]
JumpHost = Annotated[str, AfterValidator(_check_jump)]
FilePath = Annotated[str, AfterValidator(_check_path)]
Transport = Literal["ssh", "local", "k8s"]
Budget = Literal[catalog.BUDGET_CLASSES]


class _Model(BaseModel):
    # Each field's docstring (the string under it) is its description: docs/reference/profile.md
    # is generated from them (python -m chaos.docgen), so a new field documents itself there.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


# -- ray, storage, nodes -----------------------------------------------------------------------
class RaySettings(_Model):
    dashboard_url: DashboardUrl
    """The Ray dashboard, `http://host:port` (or `https://`): the Jobs API and the state API. No credentials in the
    URL."""
    gcs_address: GcsAddress
    """The head's GCS, `host:port` (what `ray start --address` takes): drains (`preempt`) go there. IPv6 as
    `'[fd00::1]:6379'` (quoted: `[` starts a YAML list)."""
    # refused, not dropped, so a profile written for the harness that was a Ray driver does not
    # go on looking meaningful
    driver_ip: Any = None
    """No longer used, and refused with that reason: the harness is no Ray driver (it reaches the cluster through
    the dashboard, the Jobs API and its hosts' transports)."""

    @field_validator("driver_ip")
    @classmethod
    def _no_driver(cls, v):
        if v is not None:
            raise ValueError("is no longer used: the harness is no Ray driver (it reaches the cluster through the "
                             "dashboard, the Jobs API and its hosts' transports, from wherever it runs); remove it")
        return v

    @property
    def gcs_host(self) -> str:
        return host_port(self.gcs_address, "gcs_address")[0]


def _check_url(value: str, what: str) -> str:
    u = urllib.parse.urlsplit(value.strip())
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{what} must be http(s)://host[:port], got {value!r}")
    try:
        u.port
    except ValueError:
        raise ValueError(f"{what} has an invalid port: {value!r}") from None
    if u.username or u.password:
        raise ValueError(f"{what} must not carry credentials; {S3_SECRET_HINT}")
    return value.strip().rstrip("/")


S3_SECRET_HINT = ("name the environment variables that hold them (storage.s3.credentials.env), an AWS profile, "
                  "or let the nodes use their own (an instance role)")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class S3Credentials(_Model):
    """Where the job's S3 client finds its credentials — by reference only: ``env`` names
    variables of the harness's environment whose values the job's environment gets under the
    same names; ``aws_profile`` names a profile of an AWS credentials file on the nodes;
    ``nodes`` passes nothing (an instance role, IRSA, the nodes' own environment)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)

    source: Literal["env", "aws_profile", "nodes"] = Field("nodes", alias="from")
    """`env`: the variables `env` names are read from the harness's environment when a run is submitted and given
    to its job under the same names (their values then travel in the job's runtime_env, which whoever reads the
    cluster's job table sees); `aws_profile`: the job gets `AWS_PROFILE` and `AWS_SHARED_CREDENTIALS_FILE`;
    `nodes`: nothing (an instance role, IRSA, the nodes' own environment). With `env` or `aws_profile` the job is
    told not to ask the instance metadata service (`AWS_EC2_METADATA_DISABLED=true`). Never a secret's value: the
    loader refuses a key or a value that looks like one."""
    env: list[str] = Field(default_factory=list)
    """With `from: env`: the NAMES of the variables, e.g. `[AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY]`."""
    aws_profile: str | None = None
    """With `from: aws_profile`: the profile's name in the nodes' AWS credentials file."""
    credentials_file: FilePath | None = None
    """With `from: aws_profile`: that file's path on the nodes (default: the SDK's, `~/.aws/credentials`)."""

    @field_validator("env")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not _ENV_NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"env lists the NAMES of environment variables (e.g. AWS_ACCESS_KEY_ID), not values; "
                             f"not a variable name: {', '.join(repr(b[:12] + '…' if len(b) > 12 else b) for b in bad)}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "S3Credentials":
        if self.source == "env" and not self.env:
            raise ValueError("from: env needs env: [the names of the variables], e.g. [AWS_ACCESS_KEY_ID, "
                             "AWS_SECRET_ACCESS_KEY]")
        if self.source == "aws_profile" and not self.aws_profile:
            raise ValueError("from: aws_profile needs aws_profile: <the profile's name in the nodes' AWS files>")
        stray = [k for k, used in (("env", self.source == "env"), ("aws_profile", self.source == "aws_profile"),
                                   ("credentials_file", self.source == "aws_profile"))
                 if getattr(self, k) and not used]
        if stray:
            raise ValueError(f"{', '.join(stray)} only apply with from: {'env' if stray == ['env'] else 'aws_profile'}"
                             f" (from is {self.source})")
        return self


class FaultProxySettings(_Model):
    """The storage fault proxy (chaos.storage.proxy) that ``endpoint_url`` points through:
    its admin API, and the endpoint behind it."""

    admin_url: str
    """The proxy's admin API, `http://host:port`: what `storage-errors` and `storage-slow` arm their rules through,
    and where the harness reads the requests it logged (the timeline's storage events)."""
    upstream: str
    """The S3 endpoint behind the proxy, `http(s)://host[:port]`. The proxy forwards every request to it unchanged,
    its Host header too: an upstream that checks signatures against its own name must accept the proxy's."""

    @field_validator("admin_url", "upstream")
    @classmethod
    def _url(cls, v: str, info) -> str:
        return _check_url(v, info.field_name)


class S3Settings(_Model):
    """How the nodes reach an ``s3://`` storage path: the endpoint (AWS's own when unset), the
    region, the credentials by reference, and the fault proxy the storage faults act through.
    These are the only storage endpoints a storage fault may target."""

    endpoint_url: str | None = None
    """The S3 endpoint the nodes use, `http(s)://host[:port]` (MinIO, a VPC endpoint, the fault proxy); unset:
    AWS's regional one. No credentials in the URL. A storage fault targets only this endpoint and the fault
    proxy's upstream: any other is refused, naming it."""
    region: str | None = None
    """An AWS region name, e.g. `us-west-2`."""
    credentials: S3Credentials = Field(default_factory=S3Credentials)
    """Where the job's S3 client finds its credentials, by reference only."""
    fault_proxy: FaultProxySettings | None = None
    """The storage fault proxy (`python -m chaos.storage.proxy`) `endpoint_url` points through; without it
    `storage-errors` and `storage-slow` are skipped."""

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        return None if v is None else _check_url(v, "endpoint_url")

    @field_validator("region")
    @classmethod
    def _region(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d+", v.strip()):
            raise ValueError(f"region must be an AWS region name like us-west-2, got {v!r}")
        return v.strip() if v else v

    @model_validator(mode="after")
    def _proxied(self) -> "S3Settings":
        if self.fault_proxy is not None and self.endpoint_url is None:
            raise ValueError("fault_proxy needs endpoint_url: the proxy's S3 address, which the nodes use")
        return self

    def endpoints(self) -> list[str]:
        """Every storage endpoint this profile names (what a storage fault may target)."""
        return [u for u in (self.endpoint_url, self.fault_proxy.upstream if self.fault_proxy else None) if u]


class StorageSettings(_Model):
    path: str
    """Ray Train's `storage_path`: an absolute path, or `s3://bucket/prefix`, `gs://bucket/prefix`. A local path
    must be one shared filesystem mounted at that path on every node (NFS, FSx, EFS): a node-local directory
    makes every restart resume from scratch, so the harness warns about it. The harness itself never reads it."""
    s3: S3Settings | None = None
    """How the nodes reach an `s3://` path (only with one): the endpoint, region and credentials every run's job
    environment then gets, as a user sets them (`AWS_ENDPOINT_URL_S3`, `AWS_DEFAULT_REGION`/`AWS_REGION`, the
    credentials' variables: what pyarrow's S3 client reads on every node), and the storage fault proxy."""

    @field_validator("path")
    @classmethod
    def _where(cls, v: str) -> str:
        v = v.strip()
        u = urllib.parse.urlsplit(v)
        if u.scheme in ("s3", "gs"):
            if not u.netloc:
                raise ValueError(f"{u.scheme}:// URI needs a bucket, e.g. {u.scheme}://my-bucket/chaos; got {v!r}")
            if u.username or u.password:
                raise ValueError(f"storage URI must not carry credentials; {SECRET_HINT}")
            return v.rstrip("/")
        if u.scheme and "://" in v:
            raise ValueError(f"storage URI scheme {u.scheme!r} is not supported; use an absolute path on a shared "
                             f"filesystem, s3://bucket/prefix or gs://bucket/prefix; got {v!r}")
        if not v.startswith("/"):
            raise ValueError(f"must be an absolute path on a filesystem shared by every node (e.g. /mnt/fsx/chaos), "
                             f"or an s3:// / gs:// URI; got {v!r}")
        return v.rstrip("/") or "/"

    @model_validator(mode="after")
    def _s3_for_s3(self) -> "StorageSettings":
        if self.s3 is not None and not self.path.startswith("s3://"):
            raise ValueError(f"s3: settings only apply to an s3:// path; path is {self.path}")
        return self

    @property
    def is_local_path(self) -> bool:
        return self.path.startswith("/")


class NodesSettings(_Model):
    discovery: Literal["ray"] = "ray"
    """`ray`: the nodes come from Ray's own node table (GCS). The only choice today."""


# -- host access ------------------------------------------------------------------------------
class SSHSettings(_Model):
    user: str = "root"
    """Login user."""
    port: Port = 22
    """SSH port."""
    key_file: FilePath | None = None
    """Path of the private key file (`~` expanded); never the key itself."""
    known_hosts: FilePath = "~/.ssh/known_hosts"
    """Host keys are verified against this file; an unknown or changed host key is refused."""
    trust_on_first_use: bool = False
    """`true`: accept an unknown host key and record it in `known_hosts` (a changed key is still refused). Only for
    freshly built test clusters."""
    jump_host: JumpHost | None = None
    """A bastion to tunnel through, `[user@]host[:port]` (port 22 by default), reached with the same key or agent
    and verified against the same `known_hosts`."""
    connect_timeout_s: Seconds = 10.0
    """Seconds for connecting, retries included."""
    command_timeout_s: Seconds = 60.0
    """Seconds for one command."""
    use_agent: bool = True
    """Also offer the keys of the running ssh-agent. With no `key_file` and `use_agent: false` there is no way to
    log in: an error."""
    become: Literal["sudo"] | None = None
    """`sudo`: run every privileged command (a fault kind's `privileges` in docs/reference/fault-kinds.md) through
    `sudo -n`, for a login user other than root with passwordless sudo. Unset: such commands run as the login user,
    which must then be root."""

    @model_validator(mode="after")
    def _can_authenticate(self) -> "SSHSettings":
        if self.key_file is None and not self.use_agent:
            raise ValueError("no way to authenticate: set key_file (a path) or use_agent: true")
        return self

    @property
    def key_path(self) -> Path | None:
        return Path(self.key_file).expanduser() if self.key_file else None

    @property
    def known_hosts_path(self) -> Path:
        return Path(self.known_hosts).expanduser()

    def jump(self) -> tuple[str | None, str, int] | None:
        """(user, host, port) of the jump host, or None."""
        return parse_jump_host(self.jump_host) if self.jump_host else None


class SSHOverride(_Model):
    """Like SSHSettings, every field optional: only what is given replaces the default."""

    user: str | None = None
    """Replaces `hosts.defaults.ssh.user` for the matched hosts."""
    port: Port | None = None
    """Replaces `hosts.defaults.ssh.port` for the matched hosts."""
    key_file: FilePath | None = None
    """Replaces `hosts.defaults.ssh.key_file` for the matched hosts."""
    known_hosts: FilePath | None = None
    """Replaces `hosts.defaults.ssh.known_hosts` for the matched hosts."""
    trust_on_first_use: bool | None = None
    """Replaces `hosts.defaults.ssh.trust_on_first_use` for the matched hosts."""
    jump_host: JumpHost | None = None
    """Replaces `hosts.defaults.ssh.jump_host` for the matched hosts."""
    connect_timeout_s: Seconds | None = None
    """Replaces `hosts.defaults.ssh.connect_timeout_s` for the matched hosts."""
    command_timeout_s: Seconds | None = None
    """Replaces `hosts.defaults.ssh.command_timeout_s` for the matched hosts."""
    use_agent: bool | None = None
    """Replaces `hosts.defaults.ssh.use_agent` for the matched hosts."""
    become: Literal["sudo"] | None = None
    """Replaces `hosts.defaults.ssh.become` for the matched hosts."""


class Selector(_Model):
    """Exactly one of: address (exact IP or CIDR), hostname (glob), label ("key=value")."""

    address: str | None = None
    """The node's IP, exact (`10.0.0.5`, `fd00::5`) or a CIDR range (`10.0.0.0/24`, host bits zero)."""
    hostname: str | None = None
    """A case-insensitive glob on the host name (`gpu-a100-*`); a node with no known hostname never matches."""
    label: str | None = None
    """`key=value` on the node's labels, e.g. `pool=spot`: its Ray labels (`ray start --labels`), and on Kubernetes
    its pod's and its Kubernetes node's labels."""

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            return str(ipaddress.ip_network(v.strip(), strict=True)) if "/" in v else str(ipaddress.ip_address(v.strip()))
        except ValueError as e:
            raise ValueError(f"must be an IP address or a CIDR range like 10.0.0.0/24 ({e}); "
                             f"use hostname: for names") from None

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("hostname glob is empty")
        return v.strip() if v else v

    @field_validator("label")
    @classmethod
    def _label(cls, v: str | None) -> str | None:
        if v is None:
            return v
        key, sep, _ = v.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"label selector must be key=value, e.g. ray.io/group=gpu-workers; got {v!r}")
        return v.strip()

    @model_validator(mode="after")
    def _exactly_one(self) -> "Selector":
        given = [k for k in ("address", "hostname", "label") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a selector has exactly one of address, hostname, label"
                             + (f"; got {', '.join(given)} (use one entry per selector)" if given else ""))
        return self

    def matches(self, ip: str | None, hostname: str | None = None, labels: Mapping[str, str] | None = None) -> bool:
        if self.address is not None:
            if not ip:
                return False
            try:
                addr = ipaddress.ip_address(ip)
            except ValueError:
                return False
            if "/" in self.address:
                net = ipaddress.ip_network(self.address)
                return addr.version == net.version and addr in net
            return addr == ipaddress.ip_address(self.address)
        if self.hostname is not None:
            return bool(hostname) and fnmatch.fnmatchcase(hostname.lower(), self.hostname.lower())
        key, _, value = self.label.partition("=")
        return (labels or {}).get(key.strip()) == value.strip()

    def describe(self) -> str:
        for k in ("address", "hostname", "label"):
            if getattr(self, k) is not None:
                return f"{k}={getattr(self, k)}" if k != "label" else f"label {self.label}"
        return "?"


class HostAccess(_Model):
    transport: Transport = "ssh"
    """`ssh` (paramiko), `local` (this machine: the embedded cluster; it refuses detached commands, so a reboot
    never hits the harness's machine) or `k8s` (exec into the Ray pods through the Kubernetes API; needs
    `kubernetes:`)."""
    ssh: SSHSettings = Field(default_factory=SSHSettings)
    """How to log in over SSH."""
    netns: str | None = None
    """The host's network namespace on the harness's machine: an out-of-band console through which a partition is
    healed. Only embedded test hosts have one (`python -m chaos.embedded up --profile-out` fills it in); without
    it a partition is cut over the host's transport with iptables, SSH kept."""


class HostOverride(_Model):
    match: Selector
    """Which hosts this override applies to: a selector (exactly one of `address`, `hostname`, `label`)."""
    transport: Transport | None = None
    """Transport for the matched hosts (unset: `hosts.defaults.transport`)."""
    ssh: SSHOverride = Field(default_factory=SSHOverride)
    """SSH fields that replace `hosts.defaults.ssh`'s for the matched hosts: only those given (`null` clears one,
    e.g. `jump_host: null`)."""
    netns: str | None = None
    """As `hosts.defaults.netns`, for the matched hosts."""


class HostsSettings(_Model):
    defaults: HostAccess = Field(default_factory=HostAccess)
    """Applies to every host."""
    overrides: list[HostOverride] = Field(default_factory=list)
    """Exceptions: the first override whose `match` selects a host is merged over the defaults."""


# -- kubernetes ------------------------------------------------------------------------------
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class HyperPodSettings(_Model):
    """The SageMaker HyperPod cluster whose EKS nodes run the RayCluster: node recovery
    (reboot, replace) goes through its ``sagemaker`` API with the usual AWS credentials
    (environment, ~/.aws, instance role), never credentials in the profile."""

    cluster_name: str
    """The HyperPod cluster's name, or its ARN."""
    region: str
    """The cluster's AWS region, e.g. `us-west-2`."""
    endpoint_url: str | None = None
    """Another SageMaker endpoint than AWS's (a VPC endpoint, or the emulated one on loopback)."""

    @field_validator("cluster_name")
    @classmethod
    def _cluster(cls, v: str) -> str:
        v = v.strip()
        if not (re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", v)
                or re.fullmatch(r"arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:\d{12}:cluster/[a-z0-9]{12}", v)):
            raise ValueError(f"cluster_name must be the HyperPod cluster's name (1-63 letters, digits, '-') or its "
                             f"ARN (arn:aws:sagemaker:<region>:<account>:cluster/<id>), got {v!r}")
        return v

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d+", v.strip()):
            raise ValueError(f"region must be an AWS region name like us-west-2, got {v!r}")
        return v.strip()

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is None:
            return v
        u = urllib.parse.urlsplit(v.strip())
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"endpoint_url must be http(s)://host[:port], got {v!r}")
        if u.username or u.password:
            raise ValueError("endpoint_url must not carry credentials; AWS credentials come from the environment, "
                             "~/.aws or the instance role, never from the profile")
        return v.strip().rstrip("/")


class NodeAgentSettings(_Model):
    """What the cluster's node health agent sets on a node it found faulty (the ``xid`` fault
    watches for it): condition types (status True), a label and its values, taint keys.
    Defaults: SageMaker HyperPod's health-monitoring agent; NVSentinel: its condition types
    and taint keys, ``label: null``."""

    conditions: list[str] = Field(default_factory=lambda: [hyperpod.NVIDIA_ERROR_REBOOT,
                                                           hyperpod.NVIDIA_ERROR_REPLACE])
    """Node condition types (status `True`) the agent sets on a faulty node."""
    label: str | None = hyperpod.HEALTH_LABEL
    """A label the agent sets on a faulty node; `null` for an agent without one."""
    label_values: list[str] = Field(default_factory=lambda: [hyperpod.PENDING_REBOOT, hyperpod.PENDING_REPLACEMENT])
    """The label's values that mean "recover this node"."""
    taints: list[str] = Field(default_factory=list)
    """Taint keys the agent sets on a faulty node (NVSentinel marks bad nodes with taints)."""

    @model_validator(mode="after")
    def _something(self) -> "NodeAgentSettings":
        if not (self.conditions or (self.label and self.label_values) or self.taints):
            raise ValueError("node_agent names nothing to watch: give conditions, a label with label_values, "
                             "or taints")
        return self


class KubernetesSettings(_Model):
    """Which RayCluster, and how the harness reaches its API server: a kubeconfig (and one of
    its contexts), or the pod's own service account when the harness runs in the cluster."""

    namespace: str = "default"
    """The RayCluster's namespace; pods outside it are never touched."""
    ray_cluster: str
    """The RayCluster's `metadata.name` (KubeRay's label `ray.io/cluster`); only its pods are targeted."""
    kubeconfig: FilePath | None = None
    """Path of the kubeconfig (unset: `$KUBECONFIG`, else `~/.kube/config`). Its credentials stay in it."""
    context: str | None = None
    """A context of the kubeconfig (unset: its current-context)."""
    in_cluster: bool = False
    """`true`: the service account of the pod the harness runs in (a Job in the cluster), instead of a kubeconfig."""
    request_timeout_s: Seconds = 30.0
    """Seconds for every API request, and for reaching the API server at the start."""
    hyperpod: HyperPodSettings | None = None
    """The SageMaker HyperPod cluster whose nodes run the RayCluster: `hyperpod-reboot` and `node-replace` through
    boto3 go to its SageMaker API."""
    node_agent: NodeAgentSettings = Field(default_factory=NodeAgentSettings)
    """What the cluster's node health agent sets on a node it found faulty: what the `xid` fault waits for (the
    *node-agent* verdict)."""
    node_shell_image: str = "busybox:1.36"
    """Image of the one-shot privileged pod (hostPID, the node's `/dev/kmsg`) that writes an `xid` fault's line to a
    node's kernel log. Creating it needs RBAC and Pod Security admission for privileged pods in `namespace`;
    without them the fault is refused with the server's reason."""

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str) -> str:
        if not _DNS_LABEL.fullmatch(v) or len(v) > 63:
            raise ValueError(f"namespace must be a DNS label (lower-case letters, digits, '-'), got {v!r}")
        return v

    @field_validator("ray_cluster")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", v) or len(v) > 253:
            raise ValueError(f"ray_cluster must be the RayCluster's metadata.name (lower-case DNS name), got {v!r}")
        return v

    @field_validator("context")
    @classmethod
    def _context(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("context is empty: name a context of the kubeconfig, or leave it out for its "
                             "current-context")
        return v.strip() if v else v

    @model_validator(mode="after")
    def _one_source(self) -> "KubernetesSettings":
        if self.in_cluster and (self.kubeconfig or self.context):
            given = ", ".join(k for k in ("kubeconfig", "context") if getattr(self, k))
            raise ValueError(f"in_cluster: true uses the pod's service account; {given} would be ignored: "
                             f"remove {given} or set in_cluster: false")
        return self


# -- workload -------------------------------------------------------------------------------
class ReferenceWorkload(_Model):
    steps: int = Field(30, ge=1)
    """Training steps."""
    checkpoint_every: int = Field(5, ge=1)
    """A checkpoint every N steps (at most `steps`)."""
    step_time: float = Field(0.3, ge=0)
    """Seconds per step."""
    num_workers: int | tuple[int, int] = 2
    """Ray Train workers (ranks): N, or `[min, max]` for an elastic run (`ScalingConfig(num_workers=(min, max))`:
    Train starts as many as the cluster has room for, and grows back when it can)."""
    resize_interval_s: Seconds | None = None
    """Elastic run only: seconds between Train's checks whether a healthy group can grow
    (`ScalingConfig.elastic_resize_monitor_interval_s`; unset: Ray's default, 60)."""
    max_failures: int = Field(3, ge=-1)
    """`FailureConfig(max_failures)`; -1: unlimited."""
    max_preemption_failures: int = Field(-1, ge=-1)
    """`FailureConfig(max_preemption_failures)`; -1: unlimited."""
    device: Literal["cpu", "cuda"] = "cpu"
    """`cpu` or `cuda`."""

    @model_validator(mode="after")
    def _checkpoints(self) -> "ReferenceWorkload":
        if self.checkpoint_every > self.steps:
            raise ValueError(f"checkpoint_every ({self.checkpoint_every}) > steps ({self.steps}): "
                             f"the run would never commit a checkpoint to resume from")
        return self

    @field_validator("num_workers", mode="before")
    @classmethod
    def _workers(cls, v: Any) -> Any:
        """One clear message for every wrong shape (a union's per-branch errors are not)."""
        counts = list(v) if isinstance(v, (list, tuple)) else [v]
        whole = all(isinstance(c, int) and not isinstance(c, bool) for c in counts)
        if not whole or len(counts) != (2 if isinstance(v, (list, tuple)) else 1):
            raise ValueError(f"{v!r}: give a number of workers N, or [min, max] for an elastic run")
        if min(counts) < 1:
            raise ValueError(f"{v!r}: must be greater than or equal to 1")
        if counts[0] > counts[-1]:
            raise ValueError(f"{v!r}: an elastic run's [min, max] needs min <= max")
        return v

    @model_validator(mode="after")
    def _resize_when_elastic(self) -> "ReferenceWorkload":
        if self.resize_interval_s is not None and not isinstance(self.num_workers, tuple):
            raise ValueError("resize_interval_s applies to an elastic run only: give num_workers as [min, max]")
        return self


class WorkloadSettings(_Model):
    reference: ReferenceWorkload | None = None
    """The harness's reference Ray Train workload, with these settings; a suite's own `chaos.workload(...)` arguments
    win where both are given. Exactly one of `reference` and `entrypoint`."""
    entrypoint: str | None = None
    """The command that starts your training (e.g. `python train.py --epochs 3`), run unchanged as a Ray job on the
    head node: `python` is the first on the PATH of the head's `ray start`, so start the head from the
    environment that has Ray and your packages, or name the interpreter (`/opt/venv/bin/python train.py`)."""
    working_dir: str | None = None
    """Directory shipped with the job as its `working_dir` (unset: the current directory)."""
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    """Extra Ray runtime_env fields (pip, env_vars, ...); `env_vars` values must be strings, and no secrets."""
    step_metric: str = "auto"
    """The reported metric that counts training steps, or a comma-separated list tried in order; `auto` tries `step`
    (what Ray's Hugging Face and Lightning callbacks report), `global_step`, `training_iteration`, `iteration`."""
    state_metric: str | None = "auto"
    """A metric a correct restore reproduces at a re-done step; `auto` takes the training loss (`loss`,
    `train_loss`, `training_loss`) when the script reports one."""
    deterministic: bool = False
    """The script gives the same metrics from the same state at the same step: a state value that does not reproduce
    then fails (*state not restored*); without it that is a warning (*state differs*)."""

    @field_validator("entrypoint")
    @classmethod
    def _entry(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("entrypoint is empty: give the command that starts your training script, "
                             "e.g. \"python train.py --epochs 3\"")
        return v

    @field_validator("runtime_env")
    @classmethod
    def _runtime_env(cls, v: dict) -> dict:
        env_vars = v.get("env_vars")
        if env_vars is not None:
            if not isinstance(env_vars, dict) or not all(isinstance(k, str) and isinstance(x, str)
                                                         for k, x in env_vars.items()):
                raise ValueError("runtime_env.env_vars must map names to strings (quote numbers: \"1\")")
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> "WorkloadSettings":
        if (self.reference is None) == (self.entrypoint is None):
            raise ValueError("give exactly one of reference: {...} (the harness's reference workload) or "
                             "entrypoint: \"python train.py ...\" (your own script)"
                             + ("; both are set" if self.reference is not None else "; neither is set"))
        if self.reference is not None:
            extra = [k for k, unset in (("working_dir", None), ("runtime_env", {}), ("step_metric", "auto"),
                                        ("state_metric", "auto"), ("deterministic", False))
                     if getattr(self, k) != unset]
            if extra:
                raise ValueError(f"{', '.join(extra)} only apply to an entrypoint workload, not to reference")
        if self.working_dir and "working_dir" in self.runtime_env:
            raise ValueError("working_dir is given twice (workload.working_dir and runtime_env.working_dir); keep one")
        return self

    @property
    def kind(self) -> str:
        return "reference" if self.reference is not None else "entrypoint"


# -- faults ---------------------------------------------------------------------------------
class FaultDefaults(_Model):
    slo_detect_s: Seconds = catalog.DEFAULT_SLO_DETECT_S
    """SLO for every kind without its own: seconds from the injection until the fault is detected (Ray marks the
    node dead, or Train sees the rank fail). Unset: each kind's own in the catalog."""
    slo_recover_s: Seconds = catalog.DEFAULT_SLO_RECOVER_S
    """SLO for every kind without its own: seconds from the injection until the first report of the next attempt.
    Unset: each kind's own in the catalog."""


class FaultSLO(_Model):
    slo_detect_s: Seconds | None = None
    """This kind's detection SLO (unset: `faults.defaults.slo_detect_s`, else the catalog's)."""
    slo_recover_s: Seconds | None = None
    """This kind's recovery SLO, at least its `slo_detect_s` (unset: `faults.defaults.slo_recover_s`, else the
    catalog's)."""
    expected_budget: Budget | None = None
    """The budget class this kind's failures must be charged to: `worker_group` (`max_failures`), `preemption`
    (`max_preemption_failures`) or `controller` (`controller_failure_limit`). Unset: the catalog's. Another class
    is a finding."""

    @model_validator(mode="after")
    def _order(self) -> "FaultSLO":
        if self.slo_detect_s and self.slo_recover_s and self.slo_recover_s < self.slo_detect_s:
            raise ValueError(f"slo_recover_s ({self.slo_recover_s}) < slo_detect_s ({self.slo_detect_s}): both are "
                             f"measured from the injection, and recovery comes after detection")
        return self


def _attr(kind: str) -> str:
    return kind.replace("-", "_")


class _FaultsBase(_Model):
    defaults: FaultDefaults = Field(default_factory=FaultDefaults)
    """SLOs for every kind without an entry of its own."""

    def get(self, kind: str) -> FaultSLO | None:
        """The profile's own entry for ``kind`` (None when it has none)."""
        if kind not in catalog.KINDS:
            raise ProfileError(f"unknown fault kind {kind!r}; known kinds: {', '.join(catalog.KINDS)}")
        return getattr(self, _attr(kind))


# One optional entry per kind in the catalog, keyed by the kind's name (``raylet-kill:``), so a
# new kind is configurable the moment the catalog names it.
FaultsSettings = create_model("FaultsSettings", __base__=_FaultsBase, __module__=__name__, **{
    _attr(kind): (FaultSLO | None, Field(None, alias=kind, description=f"Overrides for `{kind}` faults."))
    for kind in catalog.KINDS})


# -- safety ---------------------------------------------------------------------------------
class SafetySettings(_Model):
    allow_head: bool = False
    """`true`: the head node may be targeted (whatever the allowlist says); otherwise never."""
    allowlist: list[Selector] = Field(default_factory=list)
    """Selectors of the worker nodes that may be targeted; empty: none is."""
    allow_all_workers: bool = False
    """`true`: every worker node is targetable, allowlist or not."""
    allow_node_replacement: bool = False
    """Faults whose remediation replaces a node, destroying its volumes (an `xid` the agent answers with a
    replacement, e.g. Xid 79), are refused unless this is `true`."""
    max_live_faults: int = Field(1, ge=1)
    """At most this many faults live (injected and not yet reverted) at once."""
    min_alive_nodes: int = Field(1, ge=0)
    """The session aborts (its tests marked aborted, not failed; no more faults) when fewer worker nodes than this
    are alive for longer than `unhealthy_for_s`. Not being able to ask Ray counts as not alive."""
    unhealthy_for_s: float = Field(60.0, ge=0)
    """How long fewer than `min_alive_nodes` workers may be alive before the session aborts."""
    lock_heartbeat_s: float = Field(60.0, gt=0)
    """A session on this cluster beats on the cluster's lock this often (one no-op Jobs API job, ~2 CPU s on the
    head each), so that another runner can tell it is alive."""
    lock_stale_after_s: float = Field(300.0, gt=0)
    """A lock whose heartbeat stopped for longer than this (by the head's clock) belongs to a lost runner: `ray-chaos
    sweep` from any machine reverts its open faults and releases it. At least twice `lock_heartbeat_s`."""

    @model_validator(mode="after")
    def _stale_after_beats(self) -> "SafetySettings":
        if self.lock_stale_after_s < 2 * self.lock_heartbeat_s:
            raise ValueError(f"lock_stale_after_s ({self.lock_stale_after_s:g}) must be at least twice "
                             f"lock_heartbeat_s ({self.lock_heartbeat_s:g}): one late heartbeat must not make a live "
                             "session look lost to another runner's sweep")
        return self


# -- the profile ------------------------------------------------------------------------------
class Profile(_Model):
    name: str
    """The cluster's name, used in report titles and file names: 1-63 letters, digits, `.`, `_`, `-`."""
    protected: bool = False
    """`true`: the harness refuses to inject any fault into this cluster. Keep production profiles protected."""
    ray: RaySettings
    """How to reach Ray."""
    storage: StorageSettings
    """Where runs store their checkpoints."""
    nodes: NodesSettings = Field(default_factory=NodesSettings)
    """Where the node list comes from."""
    hosts: HostsSettings = Field(default_factory=HostsSettings)
    """How to reach the machine each Ray node runs on."""
    kubernetes: KubernetesSettings | None = None
    """The KubeRay RayCluster and how to reach its API server; needed when any host uses the `k8s` transport."""
    workload: WorkloadSettings = Field(default_factory=lambda: WorkloadSettings(reference=ReferenceWorkload()))
    """What to train under chaos: the reference workload (the default), or your own script."""
    faults: FaultsSettings = Field(default_factory=FaultsSettings)
    """SLOs and the expected budget class, per fault kind."""
    safety: SafetySettings = Field(default_factory=SafetySettings)
    """What may be targeted, how many faults at once, when to give up. The defaults refuse every target."""

    _source: str | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", v):
            raise ValueError(f"name must be 1-63 letters, digits, '.', '_' or '-' (it is used in report and file "
                             f"names), got {v!r}")
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> "Profile":
        problems: list[Problem] = []
        k8s_uses = []
        if self.hosts.defaults.transport == "k8s":
            k8s_uses.append(("hosts", "defaults", "transport"))
        for i, o in enumerate(self.hosts.overrides):
            if o.transport == "k8s":
                k8s_uses.append(("hosts", "overrides", i, "transport"))
            merged = {**self.hosts.defaults.ssh.model_dump(), **o.ssh.model_dump(exclude_unset=True)}
            try:
                SSHSettings.model_validate(merged)
            except ValidationError as e:
                for err in e.errors():
                    problems.append(Problem(("hosts", "overrides", i, "ssh", *err["loc"]),
                                            problem_text(err) + " (after merging with hosts.defaults.ssh)"))
        if self.kubernetes is None:
            for loc in k8s_uses:
                problems.append(Problem(loc, "transport k8s needs a kubernetes: section (namespace, ray_cluster)"))
        if problems:
            # Not a ValueError on purpose: pydantic lets it through with the exact locations intact.
            raise ProfileInvalid(problems, self._source)
        return self

    # -- what the harness asks a profile ---------------------------------------------------
    @property
    def source(self) -> str | None:
        """The file this profile was loaded from (None when built from a dict)."""
        return self._source

    def ensure_not_protected(self) -> None:
        """Raise ProfileError when the profile is marked protected: no fault may touch it."""
        if self.protected:
            where = f" ({self._source})" if self._source else ""
            raise ProfileError(
                f"profile {self.name!r}{where} is protected: the harness refuses to inject faults into this cluster. "
                f"Only set protected: false if the cluster may be disrupted.")

    def access_for(self, node_ip: str, hostname: str | None = None,
                   labels: Mapping[str, str] | None = None) -> HostAccess:
        """hosts.defaults merged with the first override whose match selects this host."""
        transport = self.hosts.defaults.transport
        ssh = self.hosts.defaults.ssh.model_dump()
        netns = self.hosts.defaults.netns
        for o in self.hosts.overrides:
            if o.match.matches(node_ip, hostname, labels):
                transport = o.transport or transport
                ssh.update(o.ssh.model_dump(exclude_unset=True))
                netns = o.netns or netns
                break
        return HostAccess(transport=transport, ssh=SSHSettings.model_validate(ssh), netns=netns)

    def slo_for(self, kind: str) -> tuple[float, float]:
        """(slo_detect_s, slo_recover_s) for a fault kind: its own entry, else faults.defaults
        where the profile sets them, else the catalog's SLOs for the kind."""
        own, defaults, in_catalog = self.faults.get(kind), self.faults.defaults, catalog.kind(kind)

        def pick(field: str) -> float:
            if own is not None and getattr(own, field) is not None:
                return getattr(own, field)
            return getattr(defaults if field in defaults.model_fields_set else in_catalog, field)

        return pick("slo_detect_s"), pick("slo_recover_s")

    def notes(self) -> list[str]:
        """Warnings that do not make the profile invalid but deserve a look."""
        out = []
        if self.storage.is_local_path:
            out.append(f"storage.path {self.storage.path} is a local path: it must be the same shared filesystem "
                       f"(NFS, FSx, EFS...) mounted at that path on every node and on this machine")
        s = self.safety
        if not s.allowlist and not s.allow_all_workers:
            out.append("safety.allowlist is empty and safety.allow_all_workers is false: no node is targetable, "
                       "every fault will be refused")
        if s.allowlist and s.allow_all_workers:
            out.append("safety.allow_all_workers: true makes safety.allowlist moot: every worker node is targetable")
        if s.allow_head:
            out.append("safety.allow_head: true: the head node may be targeted (faults there end the whole cluster)")
        ssh_all = [("hosts.defaults.ssh", self.hosts.defaults.ssh.model_dump())] + [
            (f"hosts.overrides[{i}].ssh", o.ssh.model_dump(exclude_unset=True))
            for i, o in enumerate(self.hosts.overrides)]
        for where, ssh in ssh_all:
            if ssh.get("trust_on_first_use"):
                out.append(f"{where}.trust_on_first_use: true: unknown host keys are accepted and recorded "
                           f"instead of refused")
            if ssh.get("key_file") and not Path(ssh["key_file"]).expanduser().exists():
                out.append(f"{where}.key_file {ssh['key_file']} does not exist on this machine")
        return out


def problem_text(err: Mapping) -> str:
    msg = err["msg"]
    if err["type"] in ("value_error", "assertion_error"):
        return msg.split(", ", 1)[1] if msg.startswith(("Value error, ", "Assertion failed, ")) else msg
    if err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        msg = "Input should be a mapping of field: value"
    if err["type"].endswith("_parsing"):  # "..., unable to parse string as an integer": the got says it
        msg = msg.split(", ", 1)[0]
    value = err.get("input")
    if err["type"] not in ("missing", "extra_forbidden") and (value is None or isinstance(value, (str, int, float))):
        msg += f", got {value!r}"
    elif isinstance(value, (list, dict)) and err["type"].endswith("_type"):
        msg += f", got a {'list' if isinstance(value, list) else 'mapping'}"
    return msg

