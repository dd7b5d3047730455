"""Safety rules: which nodes may be hit, how many faults at once, when to stop (docs/profiles.md,
"Safety rules").

Pure logic: no Ray import, no I/O except ``scan_for_secrets`` reading the files it is given.

- ``Safety.check_target(node)`` refuses the head (unless ``safety.allow_head``) and every
  worker not selected by ``safety.allowlist`` (unless ``safety.allow_all_workers``).
- ``LiveFaults`` caps the faults live at once (``safety.max_live_faults``).
- ``HealthGuard`` says when to abort: the cluster has had fewer than ``min_alive_nodes``
  alive for longer than ``unhealthy_for_s``.
- ``scan_for_secrets`` proves that reports and the ledger contain no secret.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from chaos.errors import ChaosError, InjectionError
from chaos.profile import SafetySettings
from chaos.secrets import TEXT_PATTERNS


class TargetRefused(InjectionError):
    """A safety rule refused a fault; ``rule`` names the profile setting that decided it."""

    def __init__(self, message: str, rule: str, node: "NodeInfo | None" = None):
        super().__init__(message)
        self.rule = rule
        self.node = node


class GuardAbort(ChaosError):
    """The cluster stayed below safety.min_alive_nodes for too long: stop injecting, abort the tests."""


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    node_id: str
    ip: str
    hostname: str | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    is_head: bool = False

    def describe(self, with_labels: bool = False) -> str:
        role = "head node" if self.is_head else "worker node"
        extra = [f"hostname {self.hostname}"] if self.hostname else []
        if self.node_id:
            extra.append(f"node {self.node_id[:8]}")
        if with_labels:
            extra.append("labels " + (", ".join(f"{k}={v}" for k, v in sorted(self.labels.items())) or "none"))
        return f"{role} {self.ip}" + (f" ({', '.join(extra)})" if extra else "")


class Safety:
    """Target checks from a profile's ``safety`` section (a SafetySettings, a dict, or None = defaults)."""

    def __init__(self, settings: SafetySettings | Mapping | None = None):
        if settings is None:
            settings = SafetySettings()
        elif not isinstance(settings, SafetySettings):
            settings = SafetySettings.model_validate(dict(settings))
        self.settings = settings

    def refusal(self, node: NodeInfo) -> TargetRefused | None:
        """The TargetRefused for this node, or None when it may be targeted."""
        s = self.settings
        if node.is_head:
            if s.allow_head:
                return None
            return TargetRefused(f"{node.describe()} is never targeted unless safety.allow_head: true "
                                 f"(a fault on the head takes the whole cluster down)", "safety.allow_head", node)
        if s.allow_all_workers:
            return None
        for sel in s.allowlist:
            if sel.matches(node.ip, node.hostname, node.labels):
                return None
        how = ("add a selector for it to safety.allowlist (address: IP or CIDR, hostname: glob, "
               "label: key=value), or set safety.allow_all_workers: true")
        if not s.allowlist:
            return TargetRefused(f"{node.describe()} is not targetable: safety.allowlist is empty, so nothing is; "
                                 f"{how}", "safety.allowlist", node)
        listed = ", ".join(sel.describe() for sel in s.allowlist)
        return TargetRefused(f"{node.describe(with_labels=True)} matches none of safety.allowlist [{listed}]; "
                             f"{how}", "safety.allowlist", node)

    def check_target(self, node: NodeInfo) -> None:
        """Raise TargetRefused unless the profile allows a fault on this node."""
        refused = self.refusal(node)
        if refused is not None:
            raise refused

    def is_allowed(self, node: NodeInfo) -> bool:
        return self.refusal(node) is None

    def split(self, nodes: Iterable[NodeInfo]) -> tuple[list[NodeInfo], list[tuple[NodeInfo, str]]]:
        """(targetable, [(refused, why)]) — what a dry run prints."""
        ok, refused = [], []
        for n in nodes:
            r = self.refusal(n)
            if r is None:
                ok.append(n)
            else:
                refused.append((n, str(r)))
        return ok, refused


class LiveFaults:
    """At most ``max_live`` faults live at once; thread-safe.

    ``with live.slot("raylet-kill on 10.0.0.5"):`` for a fault that lives inside a block, or
    ``token = live.acquire(desc)`` … ``live.release(token)`` when inject and revert are apart.
    """

    def __init__(self, max_live: int = 1):
        if max_live < 1:
            raise ValueError(f"max_live must be >= 1, got {max_live}")
        self.max_live = max_live
        self._lock = threading.Lock()
        self._live: dict[int, str] = {}
        self._ids = itertools.count(1)

    def acquire(self, fault_desc: str) -> int:
        with self._lock:
            if len(self._live) >= self.max_live:
                noun = "fault" if self.max_live == 1 else "faults"
                raise TargetRefused(
                    f"refusing {fault_desc}: at most {self.max_live} {noun} may be live at once "
                    f"(safety.max_live_faults); live now: {'; '.join(self._live.values())}",
                    "safety.max_live_faults")
            token = next(self._ids)
            self._live[token] = fault_desc
            return token

    def release(self, token: int) -> None:
        with self._lock:
            self._live.pop(token, None)

    @contextlib.contextmanager
    def slot(self, fault_desc: str) -> Iterator[int]:
        token = self.acquire(fault_desc)
        try:
            yield token
        finally:
            self.release(token)

    def live(self) -> list[str]:
        with self._lock:
            return list(self._live.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)


class HealthGuard:
    """Stop condition: fewer than ``min_alive`` nodes alive for longer than ``unhealthy_for_s``.

    Call ``observe()`` periodically (e.g. on every node-state event and on a tick); it returns
    None, or the abort reason once the cluster has been below the minimum for too long.
    Back at or above the minimum, the clock starts over.  ``count_alive`` raising counts as
    0 alive (an unreachable cluster is not a healthy one).
    """

    def __init__(self, min_alive: int, unhealthy_for_s: float, count_alive: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic):
        self.min_alive = min_alive
        self.unhealthy_for_s = unhealthy_for_s
        self.count_alive = count_alive
        self.clock = clock
        self.below_since: float | None = None
        self.last_alive: int | None = None
        self.abort_reason: str | None = None  # the first reason observe() returned

    @classmethod
    def from_settings(cls, settings: SafetySettings, count_alive: Callable[[], int],
                      clock: Callable[[], float] = time.monotonic) -> "HealthGuard":
        return cls(settings.min_alive_nodes, settings.unhealthy_for_s, count_alive, clock)

    def observe(self) -> str | None:
        now = self.clock()
        error = None
        try:
            alive = int(self.count_alive())
        except Exception as e:  # noqa: BLE001 - any failure to count is "not healthy"
            alive, error = 0, f"{type(e).__name__}: {e}"
        self.last_alive = alive
        if alive >= self.min_alive:
            self.below_since = None
            return None
        if self.below_since is None:
            self.below_since = now
        below = now - self.below_since
        if below > self.unhealthy_for_s or (self.unhealthy_for_s == 0):
            seen = f"could not count alive nodes ({error})" if error else f"{alive} node(s) alive"
            reason = (f"cluster unhealthy: {seen}, fewer than safety.min_alive_nodes={self.min_alive}, for "
                      f"{below:.1f} s (> safety.unhealthy_for_s={self.unhealthy_for_s:g} s); aborting chaos tests")
            if self.abort_reason is None:
                self.abort_reason = reason
            return reason
        return None

    def hold(self) -> None:
        """No look now: the count needs the head's node table, which a head fault has taken
        away (its own deadlines bound that); the clock starts over."""
        self.below_since = None

    def check(self) -> None:
        """observe(), raising GuardAbort when it says abort."""
        reason = self.observe()
        if reason:
            raise GuardAbort(reason)


# -- secret scan --------------------------------------------------------------------------------
class SecretHit(NamedTuple):
    path: Path
    line: int
    kind: str  # never the secret itself


def _variants(secret: str) -> set[str]:
    """The secret as it appears raw and inside JSON strings."""
    out = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    return {v for v in out if v}


def _files(paths: Sequence[Path | str]) -> Iterator[Path]:
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(f for f in p.rglob("*") if f.is_file())
        elif p.is_file():
            yield p


def scan_for_secrets(paths: Sequence[Path | str], secrets: Sequence[str] = ()) -> list[SecretHit]:
    """(path, line, kind) for every given secret and generic secret pattern found in the files.

    Directories are scanned recursively.  Given secrets are found raw and JSON-escaped; kind
    is ``secret[i]`` (its index in ``secrets``), so the result can be printed safely.  Files
    with NUL bytes (images) are searched only for the given secrets.
    """
    wanted = [(i, _variants(s)) for i, s in enumerate(secrets) if s and s.strip()]
    hits: set[SecretHit] = set()
    for path in _files(paths):
        data = path.read_bytes()
        binary = b"\0" in data[:8192]
        for i, variants in wanted:
            for v in variants:
                needle = v.encode("utf-8")
                start = data.find(needle)
                while start != -1:
                    hits.add(SecretHit(path, data.count(b"\n", 0, start) + 1, f"secret[{i}]"))
                    start = data.find(needle, start + 1)
        if binary:
            continue
        text = data.decode("utf-8", errors="replace")
        for kind, pattern in TEXT_PATTERNS:
            for m in pattern.finditer(text):
                hits.add(SecretHit(path, text.count("\n", 0, m.start()) + 1, kind))
    return sorted(hits, key=lambda h: (str(h.path), h.line, h.kind))
