"""Cleanup from any runner: revert what lost sessions left armed and release a lost holder's
lock, never touching a live session's.

What is open comes from both ledgers, merged by entry id (chaos.ledger): this runner's file
(if it has one) and, on a profile's cluster, the entries kept there.  Whose they are decides
what is done: a live session's entries are left alone — the session holding the cluster's
lock with a fresh heartbeat, or a process of this machine that still runs — and every other
session's are reverted by their fault kind's ``sweep`` from the plan written before the
injection, then closed here and on the cluster.  A lock whose holder is gone (its process
on this machine ended, its heartbeat stopped, its job expired) is released after its faults
were reverted.  What could not be checked (the cluster unreachable, the lock unreadable) is
reported as such: the sweep then fails, it never reads silence as "nothing left".
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from chaos.backends.lock import ClusterLock, Holder, runner_alive
from chaos.errors import ClusterError
from chaos.ledger import CLOSED, ClusterLedger, Ledger


@dataclasses.dataclass
class Swept:
    """What a sweep did and could not do."""

    reverted: list[str] = dataclasses.field(default_factory=list)
    left: list[dict] = dataclasses.field(default_factory=list)  # reverts that failed
    kept: list[str] = dataclasses.field(default_factory=list)  # a live session's, left alone
    unchecked: list[str] = dataclasses.field(default_factory=list)  # what could not be looked at

    @property
    def ok(self) -> bool:
        return not self.left and not self.unchecked


@dataclasses.dataclass
class Cluster:
    """The cluster-side half of a sweep (a profile's cluster): its lock and its ledger entries."""

    lock: ClusterLock
    ledger: ClusterLedger


@dataclasses.dataclass
class LockSeen:
    """The cluster's lock as the sweep found it: ``checked`` False when it could not be read
    (or there is no cluster-side lock: the embedded cluster)."""

    checked: bool = False
    holder: Holder | None = None
    live_owner: str | None = None  # the holder's session, while it is alive


def sweep(backend, ledger: Ledger, cluster: Cluster | None, say: Callable[[str], None] = print) -> Swept:
    """Revert every open fault of a session that is gone, then release a lost holder's lock."""
    done = Swept()
    seen = _lock(cluster, done, say)
    for entry in _open_entries(ledger, cluster, done, say):
        alive, why = _alive(entry, seen, cluster is not None)
        if alive is None:
            done.unchecked.append(f"fault {entry['fault']} ({entry['id']}) of session {entry.get('session')}: {why}")
            say(f"sweep: could not tell whether session {entry.get('session')} is alive ({why}): left "
                f"{entry['fault']} ({entry['id']}) alone")
        elif alive:
            done.kept.append(entry["id"])
            say(f"sweep: left {entry['fault']} ({entry['id']}) alone: its session {entry.get('session')} is alive "
                f"({why})")
        else:
            _revert(entry, backend, ledger, cluster, done, say)
    if seen.holder is not None and seen.live_owner is None:
        if done.ok:
            say(f"sweep: {_release(cluster.lock, seen.holder)}")
        else:  # its faults may still be armed: no session may start meanwhile
            say(f"sweep: kept the lost session's lock ({seen.holder.describe()}) until its faults are reverted")
    return done


def _lock(cluster: Cluster | None, done: Swept, say) -> LockSeen:
    if cluster is None:
        return LockSeen()
    try:
        holder = cluster.lock.holder()
    except ClusterError as e:
        done.unchecked.append(f"the cluster's lock: {e}")
        say(f"sweep: could not check the cluster's lock: {e}")
        return LockSeen()
    if holder is None:
        say("sweep: no cluster lock held")
        return LockSeen(checked=True)
    alive, why = holder.alive()
    if alive:
        say(f"sweep: left the cluster lock in place: held by a live session ({holder.describe()}: {why})")
        return LockSeen(True, holder, holder.owner)
    say(f"sweep: the cluster lock's holder is gone ({holder.describe()}: {why})")
    return LockSeen(True, holder)


def _open_entries(ledger: Ledger, cluster: Cluster | None, done: Swept, say) -> list[dict]:
    """Open entries of both ledgers by id; a cluster-side entry this runner's file closed is
    removed from the cluster (a session that could not remove it)."""
    local = ledger.entries()
    found = {e["id"]: e for e in local.values() if e["state"] not in CLOSED}
    if cluster is None:
        return list(found.values())
    try:
        remote = cluster.ledger.entries()
    except ClusterError as e:
        done.unchecked.append(f"the ledger entries kept on the cluster: {e}")
        say(f"sweep: could not read the ledger entries kept on the cluster: {e}")
        return list(found.values())
    for entry_id, entry in remote.items():
        if local.get(entry_id, {}).get("state") not in CLOSED:
            found.setdefault(entry_id, entry)
            continue
        try:
            cluster.ledger.close(entry_id)
            say(f"sweep: removed {entry['fault']} ({entry_id}) from the cluster: already {local[entry_id]['state']}")
        except ClusterError as e:
            done.unchecked.append(f"removing closed entry {entry_id} from the cluster: {e}")
            say(f"sweep: could not remove {entry['fault']} ({entry_id}), already {local[entry_id]['state']}, from "
                f"the cluster: {e}")
    return list(found.values())


def _alive(entry: dict, seen: LockSeen, on_cluster: bool) -> tuple[bool | None, str]:
    """Whether the session that wrote ``entry`` is alive (None: cannot tell), and why.  No
    session injects without the cluster's lock, so on a cluster whose lock was read, only its
    live holder (or a process of this machine that still runs) is alive."""
    session = entry.get("session")
    if seen.live_owner is not None and session == seen.live_owner:
        return True, "it holds the cluster's lock with a fresh heartbeat"
    local = runner_alive(entry.get("runner") or {})
    if local is not None:
        return local, "its process runs on this machine" if local else "it ran on this machine and is gone"
    if seen.holder is not None and session == seen.holder.owner:
        return False, seen.holder.alive()[1]
    if seen.checked:
        return False, "it does not hold the cluster's lock, without which no session injects"
    if not on_cluster and not entry.get("runner"):  # written before entries named their runner
        return False, "its entry names no runner, and the embedded cluster it ran on is this machine's"
    return None, ("the cluster's lock, which tells live sessions, could not be read" if on_cluster
                  else "it ran on another machine")


def _revert(entry: dict, backend, ledger: Ledger, cluster: Cluster | None, done: Swept, say) -> None:
    from chaos.faults.registry import fault_class

    plan = entry.get("revert") or {}
    where = (entry.get("target") or {}).get("node_ip")
    try:
        did = fault_class(entry["fault"]).sweep(plan, backend)
    except Exception as e:  # keep going: one stuck entry must not block the others
        ledger.adopt(entry, "failed", by="sweep", error=str(e))
        done.left.append(entry | {"error": str(e)})
        say(f"sweep: could not revert {entry['fault']} ({entry['id']}) on {where}: {e}")
        return
    ledger.adopt(entry, "reverted" if did else "nothing-to-revert", by="sweep")
    done.reverted.append(entry["id"])
    say(f"sweep: reverted {entry['fault']} ({entry['id']}) of session {entry.get('session')} on {where}: "
        f"{plan.get('action', 'none')}" + ("" if did else " (nothing was left armed)"))
    if cluster is not None:
        try:
            cluster.ledger.close(entry["id"])
        except ClusterError as e:
            done.unchecked.append(f"removing reverted entry {entry['id']} from the cluster: {e}")
            say(f"sweep: reverted {entry['id']} but could not remove it from the cluster: {e}")


def _release(lock: ClusterLock, holder: Holder) -> str:
    try:
        return lock.release_lost(holder)
    except ClusterError as e:
        return f"could not release the lost session's lock: {e}"
