"""The fault ledger: every fault is written, with how to revert it, BEFORE it is injected.

Kept in two places, merged by entry id:

* on the runner, ``reports/ledger.jsonl``: append-only JSON lines (one record per state
  change, fsync'ed), which the report reads;
* on the cluster, for a profile's cluster, each open entry that leaves something to revert
  (chaos.backends.jobs_store.ClusterLedger: a no-op job ``ray-chaos-ledger-<id>`` of the Jobs
  API whose metadata is the entry with its revert plan), removed once it is reverted — so that
  ``ray-chaos sweep`` on any other machine finds what a lost runner left (chaos.sweep).

A fault whose entry cannot be written on the cluster is not injected.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path

from chaos.backends.jobs_store import ClusterLedger
from chaos.backends.lock import this_runner
from chaos.errors import ClusterError

log = logging.getLogger(__name__)

OPEN = ("pending", "injected", "failed")  # injected, or may have been, and not reverted
CLOSED = ("reverted", "nothing-to-revert")


def armed(entry: dict) -> bool:
    """Whether the entry's fault leaves something a revert must undo."""
    return (entry.get("revert") or {}).get("action", "none") != "none"


class Ledger:
    """The runner's ledger file, mirrored on the cluster once ``cluster`` is set (a session
    holding a profile's cluster's lock sets it)."""

    def __init__(self, path: Path, session: str | None = None, cluster: ClusterLedger | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.session = session or f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.cluster = cluster
        self._mirrored: set[str] = set()
        self._lock = threading.Lock()

    def _append(self, record: dict) -> None:
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)

    def record(self, fault: str, target: dict, revert: dict, test: str | None = None, group: str | None = None) -> str:
        """Write the intent (here, then on the cluster when the fault leaves something to
        revert); returns the entry id.  Call before injecting.  ``group``: the id shared by
        the members of one correlated fault (one entry per member)."""
        entry = {"id": uuid.uuid4().hex[:12], "t": time.time(), "session": self.session, "state": "pending",
                 "fault": fault, "target": target, "revert": revert, "test": test, "runner": this_runner(),
                 **({"group": group} if group else {})}
        self._append(entry)
        if self.cluster is not None and armed(entry):
            try:
                self.cluster.open(json.loads(json.dumps(entry, default=str)))
            except ClusterError as e:
                self.mark(entry["id"], "nothing-to-revert", error=f"not injected: the entry could not be written on "
                                                                  f"the cluster: {e}")
                raise ClusterError(f"{fault}: not injected: its ledger entry could not be written on the cluster, so "
                                   f"no other runner could revert it: {e}") from e
            self._mirrored.add(entry["id"])
        return entry["id"]

    def mark(self, entry_id: str, state: str, **details) -> None:
        """state: injected | reverted | failed | nothing-to-revert.  A closed entry leaves the
        cluster (a failure to remove it is logged: a later sweep finds it closed here, or
        reverts it again, which every fault's sweep may do)."""
        self._append({"id": entry_id, "t": time.time(), "session": self.session, "state": state, **details})
        if state in CLOSED and entry_id in self._mirrored and self.cluster is not None:
            try:
                self.cluster.close(entry_id)
                self._mirrored.discard(entry_id)
            except ClusterError as e:
                log.warning("ledger entry %s stays on the cluster (a sweep removes it): %s", entry_id, e)

    def cluster_gone(self, why: str) -> None:
        """The cluster stopped answering (``why``): its entries stay there for a sweep, and no
        close waits on it meanwhile."""
        if self.cluster is not None:
            self.cluster.store.silence(why)

    def adopt(self, entry: dict, state: str, **details) -> None:
        """Record here the final state of an entry another session wrote (a sweep's)."""
        self._append({**entry, "t": time.time(), "state": state, **details})

    def entries(self) -> dict[str, dict]:
        """Latest merged view of every entry, keyed by id."""
        merged: dict[str, dict] = {}
        if not self.path.exists():
            return merged
        for line in self.path.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            merged.setdefault(rec["id"], {}).update(rec)
        return merged

    def open_entries(self) -> list[dict]:
        """Faults that were (or may have been) injected and are not reverted yet."""
        return [e for e in self.entries().values() if e["state"] in OPEN]

    def lines(self, session_only: bool = True) -> list[dict]:
        if not self.path.exists():
            return []
        out = [json.loads(l) for l in self.path.read_text().splitlines() if l.strip()]
        return [r for r in out if not session_only or r.get("session") == self.session]
