"""Correlated failures: one fault kind on several ranks' nodes in the same instant, as when a
rack or a power domain goes.

A `Correlated` holds one member fault per rank.  The experiment resolves and safety-checks
every member before anything is injected (one refusal: nothing is), writes each member's
ledger entry and takes its live-fault slot, then `fan_out` injects the members from a
thread pool behind a barrier, so they start together.  Each member keeps the ordinary
timeline events (``fault_injected`` … ``fault_reverted``) with a ``group`` id that ties
them into one fault, which the metrics count as one recovery.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Callable, Iterable, Sequence

from chaos.cluster import Target
from chaos.errors import InjectionError
from chaos.faults.base import Fault, Injection

log = logging.getLogger(__name__)


class Correlated:
    """``members`` (one fault kind, one member per rank) injected in one instant.

    Stands where a Fault stands in a suite's ``faults`` list: it has a fault's kind, budget
    class and detection traits, taken from its members."""

    def __init__(self, members: Sequence[Fault], start_timeout_s: float = 30.0):
        members = list(members)
        if not members:
            raise ValueError("a correlated fault needs at least one member fault")
        kinds = sorted({m.kind for m in members})
        if len(kinds) > 1:
            raise ValueError(f"a correlated fault is one fault kind on several targets; got kinds {kinds}")
        if start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0, got {start_timeout_s}")
        self.members = members
        self.start_timeout_s = start_timeout_s
        self.kind = members[0].kind
        # One charge for the whole group, not one per member: measured on Ray 2.60, the
        # controller's one poll sees every dead rank and raises one WorkerGroupError.
        self.budget_class = members[0].budget_class
        self.kills_node = members[0].kills_node
        self.one_shot = members[0].one_shot

    @classmethod
    def on_ranks(cls, make: Callable[..., Fault], ranks: Iterable[int], **kwargs) -> "Correlated":
        """``make(rank=r)`` for every rank in ``ranks``, e.g. ``Correlated.on_ranks(RayletKill, [0, 1])``."""
        ranks = list(ranks)
        repeated = sorted({r for r in ranks if ranks.count(r) > 1})
        if repeated:
            raise ValueError(f"ranks {ranks}: rank(s) {repeated} named twice; each member hits its own rank")
        return cls([make(rank=r) for r in ranks], **kwargs)

    def describe(self) -> str:
        return f"{len(self.members)} faults at once: " + "; ".join(m.describe() for m in self.members)

    def run_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for m in self.members:
            env.update(m.run_env())
        return env

    @staticmethod
    def check_distinct(targets: Sequence[Target]) -> None:
        """Each member must hit its own node: two ranks sharing a node would hit it twice."""
        seen: dict[str, Target] = {}
        for t in targets:
            if t.node_id in seen:
                raise InjectionError(f"correlated fault: {seen[t.node_id].describe()} and {t.describe()} are on the "
                                     "same node; each member must hit a node of its own (pick ranks on other nodes)")
            seen[t.node_id] = t


@dataclasses.dataclass
class MemberResult:
    """What one member's injection did on its host."""

    inj: Injection
    ok: bool
    issued_t: float | None  # when its injection was issued (None: never issued)
    took_s: float | None
    details: dict = dataclasses.field(default_factory=dict)
    error: str | None = None

    @property
    def host(self) -> str:
        return self.inj.host.name or self.inj.target.host or self.inj.target.node_ip

    def to_json(self) -> dict:
        return {"host": self.host, "rank": self.inj.target.rank, "node_id": self.inj.target.node_id,
                "ok": self.ok, "issued_t": self.issued_t,
                "took_s": None if self.took_s is None else round(self.took_s, 4),
                **({"details": self.details} if self.ok else {"error": self.error})}

    def line(self) -> str:
        took = "" if self.took_s is None else f" in {self.took_s:.3f} s"
        what = f"ok{took}: {self.details}" if self.ok else f"FAILED{took}: {self.error}"
        return f"{self.host} (rank {self.inj.target.rank}): {what}"


def fan_out(injections: Sequence[Injection], inject: Callable[[Injection], dict],
            start_timeout_s: float) -> list[MemberResult]:
    """``inject(inj)`` for every member at once: one thread each, released together by a
    barrier.  Before the barrier each thread opens its host's shared connection (a
    transport with ``connect()``, e.g. SSH), so the handshakes run in parallel and outside
    the instant (measured: bench/bench_fanout.py); one that fails is left to the injection,
    which connects again if it needs the host and fails with its own error.  Never raises
    for a member: each result says ok or why not (a member whose thread never reached the
    barrier in ``start_timeout_s`` breaks it, and none is issued)."""
    barrier = threading.Barrier(len(injections), timeout=start_timeout_s)

    def one(inj: Injection) -> MemberResult:
        connect = getattr(inj.host.transport, "connect", None)
        if connect is not None:
            try:
                connect()
            except Exception as e:  # not every fault kind needs the connection (a gRPC raylet kill)
                log.info("%s: could not connect before the start (%s); its injection will try again",
                         inj.host.name or inj.host.key, e)
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return MemberResult(inj, False, None, None, error="not injected: the members did not all reach the start "
                                f"barrier within {start_timeout_s:.0f} s")
        issued, start = time.time(), time.monotonic()
        try:
            details = inject(inj)
        except Exception as e:
            return MemberResult(inj, False, issued, time.monotonic() - start, error=f"{type(e).__name__}: {e}")
        return MemberResult(inj, True, issued, time.monotonic() - start, details=details or {})

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(injections), thread_name_prefix="chaos-fan-out") as pool:
        return list(pool.map(one, injections))


def spread_s(results: Sequence[MemberResult]) -> float | None:
    """How far apart the members' injections were issued (the "same instant", measured)."""
    issued = [r.issued_t for r in results if r.issued_t is not None]
    return max(issued) - min(issued) if issued else None
