"""The fault ledger: every fault is written, with how to revert it, BEFORE it is injected.

Append-only JSON lines (one record per state change, fsync'ed), so a session killed at
any point leaves enough behind for ``ray-chaos sweep`` to finish the job.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path


class Ledger:
    def __init__(self, path: Path, session: str | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.session = session or f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
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
        """Write the intent; returns the entry id.  Call before injecting.  ``group``: the id
        shared by the members of one correlated fault (one entry per member)."""
        entry_id = uuid.uuid4().hex[:12]
        self._append({"id": entry_id, "t": time.time(), "session": self.session, "state": "pending",
                      "fault": fault, "target": target, "revert": revert, "test": test,
                      **({"group": group} if group else {})})
        return entry_id

    def mark(self, entry_id: str, state: str, **details) -> None:
        """state: injected | reverted | failed | nothing-to-revert."""
        self._append({"id": entry_id, "t": time.time(), "session": self.session, "state": state, **details})

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
        return [e for e in self.entries().values() if e["state"] in ("pending", "injected", "failed")]

    def lines(self, session_only: bool = True) -> list[dict]:
        if not self.path.exists():
            return []
        out = [json.loads(l) for l in self.path.read_text().splitlines() if l.strip()]
        return [r for r in out if not session_only or r.get("session") == self.session]


def sweep(ledger: Ledger, backend, say=print) -> list[dict]:
    """Revert every fault a killed session left armed; returns what could not be reverted.

    Each entry's fault kind reverts it from the ``revert`` plan written before its
    injection (``Fault.sweep``), reaching hosts through ``backend`` (a chaos.backends.Backend).
    """
    from chaos.faults.registry import fault_class

    left = []
    for entry in ledger.open_entries():
        plan = entry.get("revert") or {}
        try:
            did = fault_class(entry["fault"]).sweep(plan, backend)
            ledger.mark(entry["id"], "reverted" if did else "nothing-to-revert", by="sweep")
            say(f"swept {entry['fault']} ({entry['id']}) on {entry.get('target', {}).get('node_ip')}: "
                f"{plan.get('action', 'none')}")
        except Exception as e:  # keep going: one stuck entry must not block the others
            ledger.mark(entry["id"], "failed", by="sweep", error=str(e))
            left.append(entry | {"error": str(e)})
            say(f"could not sweep {entry['fault']} ({entry['id']}): {e}")
    return left
