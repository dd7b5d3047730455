"""Profiles: one YAML file describing one target cluster (no profile = the embedded cluster).

A profile says how to reach Ray (dashboard, GCS), where checkpoints go, how to reach each
host (SSH settings with per-host overrides, or Kubernetes), which workload to run, the
SLO and the retry budget each fault kind should consume, and the safety limits.

Every problem is reported as ``FILE:LINE: FIELD: PROBLEM``: the models below validate the
data, and the line comes from the YAML node the error's ``loc`` points at, e.g.::

    staging.yaml:14: hosts.defaults.ssh.port: Input should be a valid integer, got 'twenty-two'

Profiles never hold secrets: ``key_file`` is a path, and any field named like a password,
token or secret is refused before validation.  docs/profiles.md documents every field.
"""

from __future__ import annotations

import difflib
import fnmatch
import ipaddress
import logging
import os
import re
import types
import typing
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator,
                      model_validator)

from chaos.errors import ProfileError

log = logging.getLogger(__name__)

KNOWN_FAULT_KINDS: tuple[str, ...] = (
    "raylet-kill", "worker-kill", "node-reboot", "node-replace", "drain", "cuda", "partition", "xid",
)
BUDGETS: tuple[str, ...] = ("worker_group", "preemption", "controller")
# The budget class each fault should be charged to when the profile does not say (DESIGN §5).
DEFAULT_BUDGET: dict[str, str | None] = {
    "raylet-kill": "worker_group", "worker-kill": "worker_group", "node-reboot": "worker_group",
    "node-replace": "worker_group", "drain": "preemption", "cuda": "worker_group", "partition": "worker_group",
    "xid": None,  # whatever recovery the platform does
}
DEFAULT_SLO_DETECT_S = 30.0
DEFAULT_SLO_RECOVER_S = 120.0

SECRET_HINT = "put secrets in your SSH agent or key file, not in the profile"
# Key names refused anywhere in a profile, matched on words (TOKENIZERS_PARALLELISM is fine).
_SECRET_WORDS = {"password", "passwd", "passphrase", "token", "tokens", "secret", "secrets", "apikey",
                 "bearer"}
_SECRET_PAIRS = {("api", "key"), ("private", "key"), ("access", "token"), ("auth", "token"), ("client", "secret")}
_SECRET_VALUES = (
    (re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"), "a PEM private key"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "an AWS access key id"),
)


def _words(name: str) -> list[str]:
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", name.lower()) if w]


def is_secret_name(name: str) -> bool:
    """True for field names that hold secrets: password, ssh_passphrase, HF_TOKEN, apiKey, ..."""
    words = _words(name)
    return any(w in _SECRET_WORDS for w in words) or any(p in _SECRET_PAIRS for p in zip(words, words[1:]))


def secret_in_command(command: str) -> str | None:
    """What looks like a secret in a command line (``HF_TOKEN=…``, ``--api-key …``, a PEM or
    AWS key), or None.  Commands end up in reports, which are meant to be shared."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if eq and value and is_secret_name(name.lstrip("-")):
            return f"{name}=… (a secret-looking value)"
        if word.startswith("--") and not eq and is_secret_name(word[2:]) and i + 1 < len(words):
            return f"{word} … (a secret-looking argument)"
    for pattern, what in _SECRET_VALUES:
        if pattern.search(command):
            return what
    return None


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
def _host_port(value: str, what: str) -> tuple[str, int]:
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
    _host_port(value, "gcs_address")
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


def _check_ip(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ValueError(f"must be an IP address of this machine, e.g. 10.0.0.5; got {value!r}") from None


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
IPAddressStr = Annotated[str, AfterValidator(_check_ip)]
JumpHost = Annotated[str, AfterValidator(_check_jump)]
FilePath = Annotated[str, AfterValidator(_check_path)]
Transport = Literal["ssh", "local", "k8s"]
Budget = Literal["worker_group", "preemption", "controller"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- ray, storage, nodes -----------------------------------------------------------------------
class RaySettings(_Model):
    dashboard_url: DashboardUrl
    gcs_address: GcsAddress
    driver_ip: IPAddressStr | None = None

    @property
    def gcs_host(self) -> str:
        return _host_port(self.gcs_address, "gcs_address")[0]


class StorageSettings(_Model):
    path: str

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

    @property
    def is_local_path(self) -> bool:
        return self.path.startswith("/")


class NodesSettings(_Model):
    discovery: Literal["ray"] = "ray"


# -- host access ------------------------------------------------------------------------------
class SSHSettings(_Model):
    user: str = "root"
    port: Port = 22
    key_file: FilePath | None = None
    known_hosts: FilePath = "~/.ssh/known_hosts"
    trust_on_first_use: bool = False
    jump_host: JumpHost | None = None
    connect_timeout_s: Seconds = 10.0
    command_timeout_s: Seconds = 60.0
    use_agent: bool = True

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
    port: Port | None = None
    key_file: FilePath | None = None
    known_hosts: FilePath | None = None
    trust_on_first_use: bool | None = None
    jump_host: JumpHost | None = None
    connect_timeout_s: Seconds | None = None
    command_timeout_s: Seconds | None = None
    use_agent: bool | None = None


class Selector(_Model):
    """Exactly one of: address (exact IP or CIDR), hostname (glob), label ("key=value")."""

    address: str | None = None
    hostname: str | None = None
    label: str | None = None

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
    ssh: SSHSettings = Field(default_factory=SSHSettings)
    #: the host's network namespace on the harness machine: an out-of-band console for healing
    #: a partition (embedded test hosts only; real hosts have none)
    netns: str | None = None


class HostOverride(_Model):
    match: Selector
    transport: Transport | None = None
    ssh: SSHOverride = Field(default_factory=SSHOverride)
    netns: str | None = None


class HostsSettings(_Model):
    defaults: HostAccess = Field(default_factory=HostAccess)
    overrides: list[HostOverride] = Field(default_factory=list)


# -- kubernetes ------------------------------------------------------------------------------
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class KubernetesSettings(_Model):
    namespace: str = "default"
    ray_cluster: str
    kubeconfig: FilePath | None = None
    context: str | None = None

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


# -- workload -------------------------------------------------------------------------------
class ReferenceWorkload(_Model):
    steps: int = Field(30, ge=1)
    checkpoint_every: int = Field(5, ge=1)
    step_time: float = Field(0.3, ge=0)
    num_workers: int = Field(2, ge=1)
    max_failures: int = Field(3, ge=-1)
    max_preemption_failures: int = Field(-1, ge=-1)
    device: Literal["cpu", "cuda"] = "cpu"

    @model_validator(mode="after")
    def _checkpoints(self) -> "ReferenceWorkload":
        if self.checkpoint_every > self.steps:
            raise ValueError(f"checkpoint_every ({self.checkpoint_every}) > steps ({self.steps}): "
                             f"the run would never commit a checkpoint to resume from")
        return self


class WorkloadSettings(_Model):
    reference: ReferenceWorkload | None = None
    entrypoint: str | None = None
    working_dir: str | None = None
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    step_metric: str = "step"

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
            extra = [k for k, unset in (("working_dir", None), ("runtime_env", {}), ("step_metric", "step"))
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
    slo_detect_s: Seconds = DEFAULT_SLO_DETECT_S
    slo_recover_s: Seconds = DEFAULT_SLO_RECOVER_S


class FaultSLO(_Model):
    slo_detect_s: Seconds | None = None
    slo_recover_s: Seconds | None = None
    expected_budget: Budget | None = None

    @model_validator(mode="after")
    def _order(self) -> "FaultSLO":
        if self.slo_detect_s and self.slo_recover_s and self.slo_recover_s < self.slo_detect_s:
            raise ValueError(f"slo_recover_s ({self.slo_recover_s}) < slo_detect_s ({self.slo_detect_s}): both are "
                             f"measured from the injection, and recovery comes after detection")
        return self


def _attr(kind: str) -> str:
    return kind.replace("-", "_")


class FaultsSettings(_Model):
    defaults: FaultDefaults = Field(default_factory=FaultDefaults)
    raylet_kill: FaultSLO | None = Field(None, alias="raylet-kill")
    worker_kill: FaultSLO | None = Field(None, alias="worker-kill")
    node_reboot: FaultSLO | None = Field(None, alias="node-reboot")
    node_replace: FaultSLO | None = Field(None, alias="node-replace")
    drain: FaultSLO | None = None
    cuda: FaultSLO | None = None
    partition: FaultSLO | None = None
    xid: FaultSLO | None = None

    def get(self, kind: str) -> FaultSLO | None:
        if kind not in KNOWN_FAULT_KINDS:
            raise ProfileError(f"unknown fault kind {kind!r}; known kinds: {', '.join(KNOWN_FAULT_KINDS)}")
        return getattr(self, _attr(kind))


assert {_attr(k) for k in KNOWN_FAULT_KINDS} <= set(FaultsSettings.model_fields)


# -- safety ---------------------------------------------------------------------------------
class SafetySettings(_Model):
    allow_head: bool = False
    allowlist: list[Selector] = Field(default_factory=list)
    allow_all_workers: bool = False
    max_live_faults: int = Field(1, ge=1)
    min_alive_nodes: int = Field(1, ge=0)
    unhealthy_for_s: float = Field(60.0, ge=0)


# -- the profile ------------------------------------------------------------------------------
class Profile(_Model):
    name: str
    protected: bool = False
    ray: RaySettings
    storage: StorageSettings
    nodes: NodesSettings = Field(default_factory=NodesSettings)
    hosts: HostsSettings = Field(default_factory=HostsSettings)
    kubernetes: KubernetesSettings | None = None
    workload: WorkloadSettings = Field(default_factory=lambda: WorkloadSettings(reference=ReferenceWorkload()))
    faults: FaultsSettings = Field(default_factory=FaultsSettings)
    safety: SafetySettings = Field(default_factory=SafetySettings)

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
                                            _problem_text(err) + " (after merging with hosts.defaults.ssh)"))
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

    def ssh_for(self, node_ip: str, hostname: str | None = None,
                labels: Mapping[str, str] | None = None) -> SSHSettings:
        return self.access_for(node_ip, hostname, labels).ssh

    def slo_for(self, kind: str) -> tuple[float, float]:
        """(slo_detect_s, slo_recover_s) for a fault kind: its own entry over faults.defaults."""
        own = self.faults.get(kind)
        d = self.faults.defaults
        return ((own.slo_detect_s if own and own.slo_detect_s else d.slo_detect_s),
                (own.slo_recover_s if own and own.slo_recover_s else d.slo_recover_s))

    def budget_for(self, kind: str) -> str | None:
        """The budget class the fault should be charged to (None: whatever the platform does)."""
        own = self.faults.get(kind)
        return own.expected_budget if own and own.expected_budget else DEFAULT_BUDGET[kind]

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


# -- loading ----------------------------------------------------------------------------------
def _problem_text(err: Mapping) -> str:
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


def _unwrap(annotation) -> list:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _unwrap(arg)]
    return [annotation]


def _model_at(loc: Sequence) -> type[BaseModel] | None:
    """The model class whose fields live at ``loc`` in a Profile (list indices skipped)."""
    cls: Any = Profile
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            return None
        field = next((f for n, f in cls.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return None
        nxt = None
        for cand in _unwrap(field.annotation):
            if typing.get_origin(cand) in (list, tuple):
                cand = typing.get_args(cand)[0]
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                nxt = cand
        cls = nxt
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _extra_text(loc: Sequence) -> str:
    key = str(loc[-1])
    cls = _model_at(loc[:-1])
    known = [f.alias or n for n, f in cls.model_fields.items()] if cls else []
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if cls is FaultsSettings:
        return f"unknown fault kind {key!r}{hint}; known kinds: {', '.join(KNOWN_FAULT_KINDS)} (and defaults)"
    return f"unknown field {key!r}{hint}" + (f"; allowed here: {', '.join(known)}" if known else "")


class _TooBig(Exception):
    def __init__(self, line: int):
        self.line = line


class _Index:
    """loc → line, from the composed YAML node tree; also finds duplicate keys and secrets."""

    MAX_NODES = 100_000  # a profile is small; more means aliases expanding without end

    def __init__(self):
        self.lines: dict[tuple, int] = {}
        self.problems: list[Problem] = []
        self.visited = 0

    def walk(self, node: yaml.Node, path: tuple = (), stack: frozenset = frozenset()) -> None:
        if id(node) in stack:
            return
        self.visited += 1
        if self.visited > self.MAX_NODES:
            raise _TooBig(node.start_mark.line + 1)
        stack = stack | {id(node)}
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, value_node in node.value:
                key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
                line = key_node.start_mark.line + 1
                if key == "<<":  # merge key: its entries count as this mapping's, explicit keys win
                    for merged in (value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]):
                        self.walk(merged, path, stack)
                    continue
                if key in seen:
                    self.problems.append(Problem(path + (key,), f"duplicate key (first given on line {seen[key]}); "
                                                                f"YAML would silently keep only the last", line))
                seen.setdefault(key, line)
                if not (isinstance(key_node, yaml.ScalarNode) and key_node.tag == "tag:yaml.org,2002:str"):
                    kind = key_node.tag.rsplit(":", 1)[-1] if isinstance(key_node, yaml.ScalarNode) else "collection"
                    self.problems.append(Problem(path + (key,), f"YAML reads this key as {'an' if kind[:1] in 'aeiou' else 'a'} {kind}, not a name; "
                                                                f"quote it: '{key}':", line))
                if is_secret_name(key):
                    self.problems.append(Problem(path + (key,), f"looks like a secret; {SECRET_HINT}", line))
                self.lines[path + (key,)] = line
                self.walk(value_node, path + (key,), stack)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.lines[path + (i,)] = item.start_mark.line + 1
                self.walk(item, path + (i,), stack)
        elif isinstance(node, yaml.ScalarNode) and isinstance(node.value, str):
            for pattern, what in _SECRET_VALUES:
                if pattern.search(node.value):
                    self.problems.append(Problem(path, f"the value contains {what}; {SECRET_HINT}",
                                                 node.start_mark.line + 1))

    def line_for(self, loc: Sequence) -> int | None:
        loc = tuple(p if isinstance(p, int) else str(p) for p in loc)
        for n in range(len(loc), -1, -1):
            if loc[:n] in self.lines:
                return self.lines[loc[:n]]
        return None


def parse_profile(text: str, source: str | os.PathLike = "<profile>") -> Profile:
    """Validate profile YAML text; ``source`` names it in messages."""
    source = str(source)
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = f":{mark.line + 1}" if mark else ""
            what = " ".join(x for x in (e.context, e.problem) if x)
            raise ProfileError(f"{source}{line}: not valid YAML: {what}") from None
        if root is None or (isinstance(root, yaml.ScalarNode) and root.tag.endswith(":null")):
            raise ProfileError(f"{source}: the profile is empty; it needs at least name, ray and storage "
                               f"(see examples/profiles/)")
        if not isinstance(root, yaml.MappingNode):
            kind = "a list" if isinstance(root, yaml.SequenceNode) else f"a single value ({root.value!r})"
            raise ProfileError(f"{source}:{root.start_mark.line + 1}: the profile must be a mapping of "
                               f"field: value at the top level, got {kind}")
        index = _Index()
        try:
            index.walk(root)
        except _TooBig as e:
            raise ProfileError(f"{source}:{e.line}: the profile expands to more than {_Index.MAX_NODES} values "
                               f"(anchors/aliases nested too deep?)") from None
        if index.problems:
            raise ProfileInvalid(index.problems, source)
        try:
            data = loader.construct_document(root)
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            raise ProfileError(f"{source}{f':{mark.line + 1}' if mark else ''}: not valid YAML: {e.problem}") from None
    finally:
        loader.dispose()
    return _validate(data, source, index)


def _validate(data: Any, source: str | None, index: _Index | None = None) -> Profile:
    try:
        profile = Profile.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = tuple(err["loc"])
            if err["type"] == "extra_forbidden":
                text = _extra_text(loc)
            elif err["type"] == "missing":
                text = f"required field {loc[-1]!r} is missing" if loc else "required field is missing"
            else:
                text = _problem_text(err)
            line = index.line_for(loc[:-1] if err["type"] == "missing" else loc) if index else None
            problems.append(Problem(loc, text, line))
        raise ProfileInvalid(problems, source) from None
    except ProfileInvalid as e:  # cross-field checks: add source and lines
        problems = [p._replace(line=index.line_for(p.loc) if index else None) for p in e.problems]
        raise ProfileInvalid(problems, source) from None
    profile._source = source
    return profile


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and validate a profile; raises ProfileError naming file, line, field and problem."""
    p = Path(path)
    try:
        text = p.expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{path}: profile file not found (looked at {p.expanduser().resolve()})") from None
    except IsADirectoryError:
        raise ProfileError(f"{path}: is a directory; give the profile's YAML file") from None
    except PermissionError:
        raise ProfileError(f"{path}: profile file is not readable (permission denied)") from None
    except UnicodeDecodeError as e:
        raise ProfileError(f"{path}: not a text file (not UTF-8 at byte {e.start}); a profile is YAML") from None
    profile = parse_profile(text, path)
    for note in profile.notes():
        log.warning("%s: %s", path, note)
    return profile


def profile_from_dict(data: Mapping, source: str | None = None) -> Profile:
    """Validate a profile given as a dict (messages name fields, without lines)."""
    return _validate(dict(data), source)


# -- embedded profiles ------------------------------------------------------------------------
def embedded_profile(gcs_address: str, dashboard_url: str, storage_path: str, hosts: list[dict], *,
                     name: str = "embedded", driver_ip: str | None = None) -> dict:
    """The profile (as a dict) of an already-running embedded cluster.

    ``hosts``: one dict per worker host: ``address`` (required), ``hostname``, ``transport``
    (``local`` — the default — or ``ssh``) and, for ssh, ``ssh`` with SSHSettings fields
    (user, port, key_file, known_hosts, ...).  Every host is allowlisted by address; the
    head never is.  Raises ProfileError when the result would not validate.
    """
    host = _host_port(gcs_address, "gcs_address")[0]
    if driver_ip is None:
        try:
            driver_ip = str(ipaddress.ip_address(host))
        except ValueError:
            driver_ip = None
    overrides, allow = [], []
    for i, h in enumerate(hosts):
        unknown = set(h) - {"address", "hostname", "transport", "ssh", "netns"}
        if unknown or "address" not in h:
            raise ProfileError(f"embedded_profile: hosts[{i}] needs address and may have hostname, transport, ssh; "
                               f"got {sorted(h)}")
        transport = h.get("transport", "local")
        if transport not in ("local", "ssh"):
            raise ProfileError(f"embedded_profile: hosts[{i}].transport must be local or ssh, got {transport!r}")
        override: dict[str, Any] = {"match": {"address": h["address"]}, "transport": transport}
        if h.get("ssh"):
            override["ssh"] = dict(h["ssh"])
        if h.get("netns"):
            override["netns"] = h["netns"]
        overrides.append(override)
        allow.append({"address": h["address"]})
    data: dict[str, Any] = {
        "name": name,
        "protected": False,
        "ray": {"dashboard_url": dashboard_url, "gcs_address": gcs_address,
                **({"driver_ip": driver_ip} if driver_ip else {})},
        "storage": {"path": str(storage_path)},
        "nodes": {"discovery": "ray"},
        "hosts": {"defaults": {"transport": "local"}, "overrides": overrides},
        "safety": {"allow_head": False, "allowlist": allow, "max_live_faults": 1,
                   "min_alive_nodes": 1, "unhealthy_for_s": 60.0},
    }
    profile_from_dict(data, "embedded_profile()")
    return data


def dump_profile(profile: Mapping | Profile, path: str | os.PathLike) -> Path:
    """Write a profile (dict or Profile) as YAML after validating it; returns the path."""
    if isinstance(profile, Profile):
        data = profile.model_dump(mode="json", by_alias=True, exclude_unset=True)
    else:
        data = dict(profile)
        profile_from_dict(data, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = ("# ray-chaos-harness profile, written by the harness; see docs/profiles.md\n"
            + yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
