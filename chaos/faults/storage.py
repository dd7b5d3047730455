"""Storage faults: the S3 endpoint a run checkpoints to made unreachable, erroring or slow for
a window, then healed — only on a run whose checkpoints go to the S3 storage the profile names,
and only on an endpoint it names (``storage.s3``: ``endpoint_url`` and the fault proxy's
``upstream``; the embedded cluster's own moto server behind its proxy).

* ``storage-partition``: the host of rank r's node cut off from the endpoint — iptables over
  the host's transport, a chain of its own dropping TCP to the endpoint's address and port and
  nothing else (the node stays in the cluster); the host heals itself shortly after the window
  whatever becomes of the harness (a timer started there first), and ``ray-chaos sweep`` heals
  it from the ledger.  ``chaos.correlated(chaos.storage_partition, ranks=[0, 1])`` cuts every
  rank's node at once.
* ``storage-errors``: the endpoint answers 503 ``SlowDown`` (or 500 ``InternalError``) — a
  rule of the fault proxy (chaos.storage.proxy) for the requests of rank r's node (``scope=
  "node"``) or of every client (``"endpoint"``), on checkpoint objects by default.
* ``storage-slow``: the same requests held ``latency_s`` before they are passed on.

Each lasts ``duration_s`` from its injection: a timer ends it (the harness lifts it; the proxy
and the host's own timer would too) and records ``storage_window_ended``.  Detection is a rank
failing or, as much, the window ending with nothing failed: a fault the S3 client's and Ray's
retries absorb is an outcome (charged nothing, the checkpoint committed late), not a miss.
"""

from __future__ import annotations

import logging
import shlex
import threading
import uuid
from typing import ClassVar

from chaos.cluster import Target
from chaos.errors import InjectionError
from chaos.faults.base import Fault, FaultContext, Injection, placement_target
from chaos.safety import TargetRefused
from chaos.timeline import Event

log = logging.getLogger(__name__)

#: the objects a proxy rule hits by default: Ray Train's checkpoint folders (checkpoint_<time>/),
#: not the controller's checkpoint_manager_snapshot.json beside them
CHECKPOINT_KEYS = "*/checkpoint_*/*"
SCOPES = ("node", "endpoint")
STARTS = ("now", "next-upload")


def named_endpoint(kind: str, endpoint: str | None, store) -> str:
    """``endpoint`` (default: the one the nodes use) if the profile names it, else refused."""
    named = store.endpoints()
    chosen = (endpoint or named[0]).rstrip("/")
    if chosen not in named:
        raise TargetRefused(f"{kind} refused: endpoint {chosen} is not one the profile names "
                            f"({', '.join(named)}): a storage fault targets only storage.s3's endpoints", "storage.s3")
    return chosen


def _run_storage(kind: str, ctx: FaultContext, store) -> None:
    """The run under test checkpoints to ``store``: a storage fault anywhere else tests nothing."""
    started = [e for e in ctx.timeline.of("controller_started")]
    path = str(started[-1].data.get("storage_path") or "") if started else ""
    if not path.startswith(store.path):
        raise InjectionError(f"{kind}: the run checkpoints to {path or 'an unknown storage path'}, not to the S3 "
                             f"storage {store.path} (chaos.workload(storage='s3'))")


class StorageWindow:
    """What every storage fault shares — its target, its window and how it ends (a mixin: each
    kind's class is ``(StorageWindow, Fault)`` or ``(ProxyRule, Fault)``)."""

    kills_node = False

    def __init__(self, rank: int = 0, duration_s: float = 10.0, endpoint: str | None = None):
        """``rank``: the rank whose node the fault hits; ``duration_s``: the window, from the
        injection; ``endpoint``: one the profile names (default: the one the nodes use)."""
        if not 0 < duration_s <= 3600:
            raise ValueError(f"{self.kind}: duration_s must be > 0 and <= 3600, got {duration_s}")
        self.rank, self.duration_s, self.endpoint = rank, duration_s, endpoint

    def resolve(self, ctx: FaultContext) -> Target:
        store = ctx.backend.object_storage
        if store is None:
            raise InjectionError(f"{self.kind} needs S3 storage: backend {ctx.backend.label} checkpoints to "
                                 f"{ctx.backend.storage_path}")
        self._endpoint = named_endpoint(self.kind, self.endpoint, store)
        _run_storage(self.kind, ctx, store)
        target = placement_target(ctx, self.rank)
        self._check(ctx, target)
        return target

    def _check(self, ctx: FaultContext, target: Target) -> None:
        """What the kind needs of the target's host, refused before anything is recorded."""

    def detection(self, target: Target) -> str:
        return f"Train to see a rank fail, or the {self.duration_s:g} s window to end with nothing failed"

    def detected(self, events: list[Event], target: Target, fault_t: float) -> Event | None:
        return next((e for e in events if e.t >= fault_t and (
            e.kind in ("worker_error", "failure_decision")
            or (e.kind == "storage_window_ended" and e.data.get("fault") == self.kind))), None)

    def detect_timeout(self, base_s: float) -> float:
        return max(base_s, self.duration_s + 60)

    # -- the window ---------------------------------------------------------------------
    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        details = self.arm(ctx, inj)
        inj.handles.update(lock=threading.Lock(), stop=threading.Event())
        watch = threading.Thread(target=self._watch, args=(ctx, inj), name=f"{self.kind}-window", daemon=True)
        inj.handles["watch"] = watch
        watch.start()
        return {**details, "duration_s": self.duration_s}

    def _watch(self, ctx: FaultContext, inj: Injection) -> None:
        """Wait out the window (``window``), then end it — unless a revert ended it first."""
        try:
            facts = self.window(ctx, inj, inj.handles["stop"])
        except Exception as e:
            log.warning("%s: watching the window failed (revert ends it): %s", self.kind, e)
            return
        if not inj.handles["stop"].is_set():
            self._end(ctx, inj, early=False, **facts)

    def _end(self, ctx: FaultContext, inj: Injection, early: bool, **facts) -> bool:
        """Lift the fault and record the window's end, once; whether it was still armed."""
        with inj.handles["lock"]:
            if inj.handles.get("ended"):
                return self.lift(ctx, inj)  # lifted already: again (idempotent) to be sure
            try:
                lifted = self.lift(ctx, inj)
            except Exception as e:
                log.warning("%s: lifting at the window's end failed (revert tries again): %s", self.kind, e)
                if early:
                    raise
                return False
            inj.handles["ended"] = True
            ctx.timeline.emit("fault", "storage_window_ended", fault=self.kind, ledger_id=inj.ledger_id,
                              duration_s=self.duration_s, cut_short=early, **facts)
            return lifted

    def revert(self, ctx: FaultContext, inj: Injection) -> bool:
        stop = inj.handles.get("stop")
        if stop is None:  # never armed (the injection failed before): lift whatever half-happened
            return self.lift(ctx, inj)
        stop.set()
        return self._end(ctx, inj, early=True)

    def window(self, ctx: FaultContext, inj: Injection, stop: threading.Event) -> dict:
        """Block until the window is over (or ``stop`` is set); facts about it for the timeline."""
        stop.wait(self.duration_s)  # the window itself: the fault lasts this long
        return {"started": inj.t}

    def arm(self, ctx: FaultContext, inj: Injection) -> dict:
        raise NotImplementedError

    def lift(self, ctx: FaultContext, inj: Injection) -> bool:
        """Undo ``arm`` (idempotent); whether anything was still armed."""
        raise NotImplementedError


# -- storage-partition ---------------------------------------------------------------------
# Over the host's transport: the self-healing timer first, then the cut (its own chain).
CUT = r"""
set -e
command -v iptables >/dev/null || {{ echo "refused: no iptables on $(hostname)" >&2; exit 3; }}
heal='{heal}'
setsid nohup sh -c "sleep {self_heal_s}; $heal" >/dev/null 2>&1 < /dev/null &
timer=$!
iptables -w 5 -N {chain}
iptables -w 5 -A {chain} -p tcp -d {address} --dport {port} -j DROP
iptables -w 5 -I OUTPUT 1 -j {chain}
echo "cut $timer"
"""
HEAL = ("while iptables -w 5 -D OUTPUT -j {chain} 2>/dev/null; do :; done; "
        "iptables -w 5 -F {chain} 2>/dev/null; iptables -w 5 -X {chain} 2>/dev/null; true")
CUT_NOW = ("rules=$(iptables -w 5 -S) || exit 4; "
           "printf '%s\\n' \"$rules\" | grep -qE -- '(^-N |-j ){chain}$' && echo cut || echo healed")


class StoragePartition(StorageWindow, Fault):
    kind = "storage-partition"

    def describe(self) -> str:
        return f"storage partition: the node of rank {self.rank} cut off from its S3 endpoint for {self.duration_s:g} s"

    def _check(self, ctx: FaultContext, target: Target) -> None:
        from chaos.transport.local import LocalTransport

        if isinstance(ctx.backend.host(target.node_id).transport, LocalTransport):
            raise InjectionError(f"{self.kind}: node {target.node_id[:8]} runs on this machine (the plain embedded "
                                 "cluster), whose network every node shares: cutting it would cut them all; use test "
                                 "hosts (--chaos-hosts namespaces, as root) or a profile's SSH hosts")

    def revert_plan(self, inj: Injection) -> dict:
        chain = inj.evidence.setdefault("chain", f"chaos-{uuid.uuid4().hex[:8]}-s3")
        return {"action": "heal-storage-partition", "host": inj.host.key, "chain": chain,
                "why": f"the host heals itself {self._self_heal_s():.0f} s after the cut; until then over its "
                       "transport"}

    def _self_heal_s(self) -> float:
        return self.duration_s + 60

    def arm(self, ctx: FaultContext, inj: Injection) -> dict:
        from chaos.storage.access import endpoint_address

        address, port = endpoint_address(self._endpoint)
        chain = inj.evidence["chain"]  # named in the ledger's plan, written before this
        result = inj.host.transport.run(CUT.format(chain=chain, heal=HEAL.format(chain=chain), address=shlex.quote(
            address), port=port, self_heal_s=int(self._self_heal_s())), timeout=30)
        words = result.stdout.split()
        if not result.ok or words[:1] != ["cut"]:
            _heal(inj.host.transport, chain)
            raise InjectionError(f"{inj.host.name or inj.host.key}: cutting it off from {self._endpoint} failed (exit "
                                 f"{result.exit_code}): {(result.stderr or result.stdout).strip()[-500:]}")
        inj.evidence.update(timer_pid=int(words[1]), endpoint=self._endpoint)
        return {"chain": chain, "endpoint": self._endpoint, "dropped": f"tcp to {address}:{port}",
                "self_heal_s": self._self_heal_s()}

    def lift(self, ctx: FaultContext, inj: Injection) -> bool:
        chain = inj.evidence.get("chain")
        if chain is None or not _cut_now(inj.host.transport, chain):
            return False
        if _heal(inj.host.transport, chain):
            raise InjectionError(f"{self.kind}: chain {chain} is still on {inj.host.name or inj.host.key} after heal")
        if inj.evidence.get("timer_pid"):  # its own process group (setsid); kept while the cut was there
            inj.host.transport.run(f"kill -- -{int(inj.evidence['timer_pid'])} 2>/dev/null; true", timeout=30)
        return True

    @classmethod
    def sweep(cls, plan: dict, backend) -> bool:
        transport = backend.connect(plan["host"])
        try:
            if not _cut_now(transport, plan["chain"]):
                return False
            if _heal(transport, plan["chain"]):
                raise InjectionError(f"chain {plan['chain']} still on {plan['host']}")
            return True
        finally:
            transport.close()


def _cut_now(transport, chain: str) -> bool:
    return transport.run(CUT_NOW.format(chain=chain), timeout=30).check().stdout.strip() == "cut"


def _heal(transport, chain: str) -> bool:
    """Remove the chain; whether the cut is still there after."""
    transport.run(HEAL.format(chain=chain), timeout=30)
    return _cut_now(transport, chain)


# -- storage-errors, storage-slow: rules of the fault proxy ------------------------------------
class ProxyRule(StorageWindow):
    """A rule of the fault proxy the S3 endpoint is reached through (``storage.s3.fault_proxy``)."""

    rule_kind: ClassVar[str] = ""

    def __init__(self, rank: int = 0, duration_s: float = 10.0, scope: str = "node", keys: str = CHECKPOINT_KEYS,
                 methods: tuple[str, ...] = (), at: str = "now", wait_s: float = 120.0, endpoint: str | None = None):
        """``scope``: ``node`` (the requests of rank ``rank``'s node) or ``endpoint`` (every
        client's); ``keys``: a glob on ``bucket/key`` (default: checkpoint objects);
        ``methods``: HTTP methods (default: all); ``at``: the window begins ``now`` or at the
        first request it matches (``next-upload``: the start of the next checkpoint upload, as
        the proxy sees it — a report reaches the harness too late to aim at one), which must come
        within ``wait_s``."""
        super().__init__(rank, duration_s, endpoint)
        if scope not in SCOPES:
            raise ValueError(f"{self.kind}: scope {scope!r} is none of {', '.join(SCOPES)}")
        if at not in STARTS:
            raise ValueError(f"{self.kind}: at {at!r} is none of {', '.join(STARTS)}")
        if wait_s <= 0:
            raise ValueError(f"{self.kind}: wait_s must be > 0, got {wait_s}")
        self.scope, self.keys, self.methods = scope, keys, tuple(m.upper() for m in methods)
        self.at, self.wait_s = at, wait_s

    @property
    def _for_s(self) -> float:
        """How long the rule may live on the proxy: its window, and the wait for its first match."""
        return self.duration_s + (self.wait_s if self.at == "next-upload" else 0.0)

    def detect_timeout(self, base_s: float) -> float:
        return max(base_s, self._for_s + 60)

    def _when(self) -> str:
        return f"for {self.duration_s:g} s" + (" from the next checkpoint upload" if self.at == "next-upload" else "")

    def _check(self, ctx: FaultContext, target: Target) -> None:
        proxy = ctx.backend.storage_proxy
        if proxy is None:
            raise InjectionError(f"{self.kind} needs the storage fault proxy (storage.s3.fault_proxy): backend "
                                 f"{ctx.backend.label} names none")
        self._admin_url = proxy.url
        if self.scope == "node":
            from chaos.transport.local import LocalTransport

            if isinstance(ctx.backend.host(target.node_id).transport, LocalTransport):
                raise InjectionError(f"{self.kind}: scope 'node' tells a node's requests by its address, and the plain "
                                     "embedded cluster's nodes all reach the endpoint from 127.0.0.1: use "
                                     "scope='endpoint' or test hosts (--chaos-hosts namespaces, as root)")

    def revert_plan(self, inj: Injection) -> dict:
        rule = inj.evidence.setdefault("rule", f"chaos-{uuid.uuid4().hex[:8]}")
        return {"action": "lift-storage-rule", "admin_url": self._admin_url, "rule": rule,
                "why": f"the proxy lifts it itself at the latest {self._for_s:g} s after the injection"}

    def rule_fields(self) -> dict:
        raise NotImplementedError

    def arm(self, ctx: FaultContext, inj: Injection) -> dict:
        from chaos.storage.proxy import ProxyAdmin

        clients = [inj.target.node_ip] if self.scope == "node" else []
        window = {"window_s": self.duration_s} if self.at == "next-upload" else {}
        armed = ProxyAdmin(self._admin_url).arm(inj.evidence["rule"], self.rule_kind, self._for_s, keys=self.keys,
                                                methods=list(self.methods), clients=clients, **window,
                                                **self.rule_fields())
        inj.evidence.update(endpoint=self._endpoint, clients=clients or "every client", keys=self.keys, at=self.at)
        return {"rule": armed["id"], "endpoint": self._endpoint, "clients": clients or "every client",
                "keys": self.keys, "at": self.at, **self.rule_fields()}

    def window(self, ctx: FaultContext, inj: Injection, stop: threading.Event) -> dict:
        """Until the proxy has dropped the rule (its window over, or lifted): when it began to
        match (None: it never met a request)."""
        from chaos.errors import WaitTimeout
        from chaos.storage.proxy import ProxyAdmin
        from chaos.waits import poll_until

        admin, rule, seen = ProxyAdmin(self._admin_url), inj.evidence["rule"], {"started": None}

        def over():
            armed = next((r for r in admin.rules() if r["id"] == rule), None)
            if armed is not None and armed.get("started"):
                seen["started"] = armed["started"]
            return armed is None, "armed" + (f", matching since {armed['started']:.1f}" if armed and armed.get(
                "started") else ", waiting for its first request" if armed else "")

        try:
            poll_until(over, self._for_s + 30, f"the proxy to drop rule {rule}", interval=0.25, stop=stop)
        except WaitTimeout:
            pass  # stopped by a revert, or the proxy kept it past its time: the revert lifts it
        if self.at == "now":
            return {"started": inj.t}
        return {"started": seen["started"], "met_a_request": seen["started"] is not None}

    def lift(self, ctx: FaultContext, inj: Injection) -> bool:
        from chaos.storage.proxy import ProxyAdmin

        return ProxyAdmin(self._admin_url).lift(inj.evidence["rule"])

    @classmethod
    def sweep(cls, plan: dict, backend) -> bool:
        from chaos.storage.proxy import ProxyAdmin

        admin = ProxyAdmin(plan["admin_url"])
        if not admin.reachable():
            return False  # the proxy is gone, and its rules with it
        return admin.lift(plan["rule"])


class StorageErrors(ProxyRule, Fault):
    kind = "storage-errors"
    rule_kind = "errors"

    def __init__(self, rank: int = 0, duration_s: float = 10.0, status: int = 503, **kwargs):
        """``status``: 503 (``SlowDown``) or 500 (``InternalError``)."""
        super().__init__(rank, duration_s, **kwargs)
        from chaos.storage.proxy import S3_ERRORS

        if status not in S3_ERRORS:
            raise ValueError(f"{self.kind}: status {status} is none of {', '.join(map(str, S3_ERRORS))}")
        self.status = status

    def describe(self) -> str:
        who = f"rank {self.rank}'s node" if self.scope == "node" else "every client"
        return f"storage errors: S3 answers {who} {self.status} {self._when()}"

    def rule_fields(self) -> dict:
        return {"status": self.status}


class StorageSlow(ProxyRule, Fault):
    kind = "storage-slow"
    rule_kind = "slow"

    def __init__(self, rank: int = 0, duration_s: float = 10.0, latency_s: float = 2.0, **kwargs):
        super().__init__(rank, duration_s, **kwargs)
        if not 0 < latency_s <= 600:
            raise ValueError(f"{self.kind}: latency_s must be > 0 and <= 600, got {latency_s}")
        self.latency_s = latency_s

    def describe(self) -> str:
        who = f"rank {self.rank}'s node" if self.scope == "node" else "every client"
        return f"storage latency: S3 requests of {who} held {self.latency_s:g} s {self._when()}"

    def rule_fields(self) -> dict:
        return {"latency_s": self.latency_s}
