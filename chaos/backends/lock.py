"""One harness session per cluster at a time, held on the cluster through its Jobs API, with
a heartbeat, so that a runner that is lost can be told from one that is alive by any other.

The lock is a job with a fixed submission id (``LOCK_ID``): the Jobs API refuses a second
job with that id, so taking it is atomic on any cluster whose dashboard the harness reaches.
Its metadata names its owner (the session id its ledger entries carry), the machine and
process that took it (host, boot id, PID namespace, PID and that process's start time), its
heartbeat interval and after how long without a beat it counts as stale; its entrypoint is
``sleep <ttl>``, a last resort for a lock nobody sweeps.

While the session runs it beats: every ``heartbeat_s`` a no-op job
``ray-chaos-heartbeat-<owner>-<n>`` (the previous one removed), whose submission time is
the head's clock.  A holder is alive while its lock runs and: on the sweeping machine, its
process still runs (exact, at once); elsewhere, its latest beat (or the lock itself) is
younger than ``stale_after_s`` by the head's clock.  ``ray-chaos sweep`` reverts a stale
holder's open faults and releases its lock (chaos.sweep); a live holder's are never touched.
Each beat also checks the lock is still this session's: a session whose lock was taken
(its beats could not land for too long) is told, and stops injecting.

Cost: a beat is one job submission, ~2 CPU s on the head (measured, chaos.backends.jobs_store);
at the default 60 s that is ~3 % of one head core.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from pathlib import Path

import psutil

from chaos.backends.jobs_store import JobsStore, Record
from chaos.errors import ClusterError

log = logging.getLogger(__name__)

LOCK_ID = "ray-chaos-lock"  # the lock job's submission id
BEAT_PREFIX = "ray-chaos-heartbeat-"
DEFAULT_TTL_S = 6 * 3600  # longer than any nightly session: a lock nobody sweeps ends after it
DEFAULT_HEARTBEAT_S = 60.0
DEFAULT_STALE_AFTER_S = 300.0


class LockLost(ClusterError):
    """The cluster's lock is no longer this session's (taken over after its heartbeat could
    not reach the cluster, or removed by hand)."""


def this_runner() -> dict[str, str]:
    """Who this process is, so that a sweep on this same machine can tell for certain whether
    it still runs: a PID means nothing in another machine or PID namespace, and may be reused."""
    me = psutil.Process()
    return {"host": os.uname().nodename, "boot_id": _read("/proc/sys/kernel/random/boot_id"),
            "pid_ns": _link("/proc/self/ns/pid"), "pid": str(me.pid), "started": f"{me.create_time():.2f}"}


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def runner_alive(runner: dict) -> bool | None:
    """Whether the process ``runner`` (``this_runner()`` of some session) still runs; None when
    it ran on another machine or PID namespace, which only its heartbeat can tell."""
    me = this_runner()
    if not runner.get("boot_id") or not runner.get("pid_ns") or \
            (runner.get("boot_id"), runner.get("pid_ns")) != (me["boot_id"], me["pid_ns"]):
        return None
    try:
        started = psutil.Process(int(runner["pid"])).create_time()
    except (psutil.NoSuchProcess, ValueError, KeyError):
        return False
    return abs(started - float(runner.get("started") or 0)) < 1.0


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


@dataclasses.dataclass(frozen=True)
class Holder:
    """The lock as the cluster holds it, with its latest heartbeat, judged at ``head_now``."""

    record: Record
    last_beat: float | None  # head clock: the latest heartbeat's submission, else the lock's own
    head_now: float

    @property
    def meta(self) -> dict:
        return self.record.metadata

    @property
    def owner(self) -> str:
        return self.meta.get("owner", "?")

    def describe(self) -> str:
        m = self.meta
        beat = (f", last heartbeat {self.head_now - self.last_beat:.0f} s ago" if self.last_beat is not None else "")
        return (f"session {self.owner} (pid {m.get('pid', '?')} on {m.get('host', '?')}) since {m.get('since', '?')}"
                f"{beat}, expires {m.get('expires', '?')}")

    def alive(self) -> tuple[bool, str]:
        """(whether the holder still runs, why we think so)."""
        if self.record.ended:
            return False, f"its lock job ended ({self.record.status}: expired or stopped)"
        local = runner_alive(self.meta)
        if local is not None:
            return local, ("its process runs on this machine" if local else "it ran on this machine and is gone")
        stale_after = float(self.meta.get("stale_after_s") or 0)
        if not stale_after or self.last_beat is None:
            return True, "it runs elsewhere and has no heartbeat to judge it by: it ends at its expiry"
        age = self.head_now - self.last_beat
        if age > stale_after:
            return False, f"no heartbeat for {age:.0f} s (stale after {stale_after:g} s)"
        return True, f"its heartbeat is {age:.0f} s old (stale after {stale_after:g} s)"


class ClusterLock:
    """The cluster's lock for session ``owner`` (its ledger's session id).  ``heartbeat_s``
    None: no heartbeat (a cluster that ends with its session, the embedded one)."""

    def __init__(self, dashboard_url: str, owner: str = "", ttl_s: int = DEFAULT_TTL_S,
                 heartbeat_s: float | None = DEFAULT_HEARTBEAT_S, stale_after_s: float = DEFAULT_STALE_AFTER_S,
                 client=None, store: JobsStore | None = None):
        self.store = store or JobsStore(dashboard_url, client=client)
        self.dashboard_url = dashboard_url
        self.owner = owner or f"{os.getpid()}"
        self.ttl_s, self.heartbeat_s, self.stale_after_s = int(ttl_s), heartbeat_s, stale_after_s
        self.held = False
        self._beats = 0

    def acquire(self) -> None:
        """Take the lock, or raise ClusterError naming its holder (and, for a stale one, how
        to release it)."""
        since = _now()
        meta = {"holder": "ray-chaos", "owner": self.owner, **this_runner(), "since": since.isoformat(),
                "expires": (since + datetime.timedelta(seconds=self.ttl_s)).isoformat(),
                **({"heartbeat_s": f"{self.heartbeat_s:g}", "stale_after_s": f"{self.stale_after_s:g}"}
                   if self.heartbeat_s else {})}
        for _ in range(3):  # an ended lock job is removed and the submission tried again
            if self.store.put(LOCK_ID, meta, entrypoint=f"sleep {self.ttl_s}"):
                self.held = True
                return
            holder = self.holder()
            if holder is None:
                continue  # released meanwhile
            alive, why = holder.alive()
            if not holder.record.ended:
                stale = "" if alive else (f"; it looks lost ({why}): `ray-chaos sweep --profile <profile>` reverts "
                                          "its open faults and releases it")
                raise ClusterError(f"another ray-chaos session holds this cluster's lock: {holder.describe()}; two "
                                   f"sessions never inject into one cluster at the same time{stale}")
            self.store.remove(LOCK_ID)  # expired: free to take
        raise ClusterError(f"could not take the cluster's lock at {self.dashboard_url}: another session took and "
                           "released it three times meanwhile")

    def holder(self) -> Holder | None:
        """Who holds the lock now, with their latest heartbeat (None: free)."""
        record = self.store.get(LOCK_ID)
        if record is None:
            return None
        owner = record.metadata.get("owner", "")
        beats = [b.start_time for b in self.store.list(f"{BEAT_PREFIX}{owner}-") if b.start_time] if owner else []
        last = max([*beats, record.start_time or 0]) or None
        return Holder(record, last, self.store.head_now())

    def state(self) -> str:
        """Read-only, for a dry run's plan: ``free``, or who holds the lock and whether alive."""
        holder = self.holder()
        if holder is None:
            return "free"
        alive, why = holder.alive()
        if holder.record.ended:
            return f"ended ({holder.record.status}), not yet removed: free to take ({holder.describe()})"
        return (f"held by {holder.describe()}: " + ("a session now would be refused" if alive else
                                                  f"looks lost ({why}): `ray-chaos sweep` releases it"))

    def beat(self) -> None:
        """One heartbeat: check the lock is still this session's, submit the next beat and
        remove the one before.  Raises LockLost, or ClusterError when the cluster did not
        answer (the next beat tries again)."""
        record = self.store.get(LOCK_ID)
        if record is None or record.ended or record.metadata.get("owner") != self.owner:
            self.held = False
            who = "nobody" if record is None else f"session {record.metadata.get('owner', '?')} ({record.status})"
            raise LockLost(f"the cluster's lock at {self.dashboard_url} is no longer this session's ({self.owner}): "
                           f"it is held by {who}")
        self._beats += 1
        self.store.put(f"{BEAT_PREFIX}{self.owner}-{self._beats}", {"owner": self.owner, "beat": self._beats})
        if self._beats > 1:
            previous = self.store.get(f"{BEAT_PREFIX}{self.owner}-{self._beats - 1}")
            if previous is not None and previous.ended:  # one still running goes at the release
                self.store.remove(previous.submission_id)

    def release(self) -> None:
        """Give the lock back (its job stopped and removed, its heartbeats too); a failure is
        logged, not raised: the lock then ends when its heartbeat is seen stopped."""
        if not self.held:
            return
        self.held = False
        try:
            record = self.store.get(LOCK_ID)
            if record is not None and record.metadata.get("owner") == self.owner:
                self.store.remove(LOCK_ID)
            self.remove_beats(self.owner)
        except ClusterError as e:
            log.warning("could not release the cluster's lock job %s at %s (a sweep releases it once its heartbeat "
                        "is seen stopped; it ends at its expiry otherwise): %s", LOCK_ID, self.dashboard_url, e)

    def release_lost(self, holder: Holder) -> str:
        """For a sweep: release the lock of ``holder``, a session that is gone (``Holder.alive``
        false), unless someone else took the lock meanwhile.  Returns what was done."""
        record = self.store.get(LOCK_ID)
        if record is None or record.metadata.get("owner") != holder.owner:
            return "the lost session's lock was already gone"
        self.store.remove(LOCK_ID)
        self.remove_beats(holder.owner)
        return f"released the cluster lock of a session that is gone ({holder.describe()}: {holder.alive()[1]})"

    def remove_beats(self, owner: str) -> int:
        """Remove every heartbeat job of session ``owner``; how many there were."""
        beats = self.store.list(f"{BEAT_PREFIX}{owner}-")
        for b in beats:
            self.store.remove(b.submission_id)
        return len(beats)
