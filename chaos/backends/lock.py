"""One harness session per cluster at a time, held through the Jobs API: no Ray driver.

The lock is a job with a fixed submission id: the Jobs API refuses a second job with the
same id, so taking the lock is atomic on any cluster whose dashboard the harness reaches.
Its entrypoint is ``sleep <ttl>``, so a session that dies without releasing it (SIGKILL, a
lost CI runner) holds the cluster for at most the ttl; ``ray-chaos sweep`` releases such a
lock sooner when its holder was a process of the sweeping machine that is gone.  Its
metadata names the holder and the expiry, and a refusal repeats them.
"""

from __future__ import annotations

import datetime
import logging
import os

import psutil

from chaos.errors import ClusterError
from chaos.waits import poll_until

log = logging.getLogger(__name__)

LOCK_ID = "ray-chaos-lock"  # the lock job's submission id
DEFAULT_TTL_S = 6 * 3600  # longer than any nightly session: a killed session's lock expires after it
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


class ClusterLock:
    def __init__(self, dashboard_url: str, ttl_s: int = DEFAULT_TTL_S, client=None):
        self.dashboard_url, self.ttl_s = dashboard_url, int(ttl_s)
        self._client = client
        self.held = False

    @property
    def client(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            try:
                self._client = JobSubmissionClient(self.dashboard_url)
            except Exception as e:  # noqa: BLE001 - requests' and Ray's own errors alike
                raise ClusterError(f"cannot reach the Jobs API at {self.dashboard_url} for the cluster's lock: "
                                   f"{e}") from e
        return self._client

    def acquire(self) -> None:
        """Take the lock, or raise ClusterError naming its holder."""
        since = _now()
        who = {"holder": "ray-chaos", "pid": str(os.getpid()), "host": os.uname().nodename,
               "since": since.isoformat(), "expires": (since + datetime.timedelta(seconds=self.ttl_s)).isoformat()}
        for _ in range(3):  # an ended lock job is removed and the submission tried again
            try:
                self.client.submit_job(entrypoint=f"sleep {self.ttl_s}", submission_id=LOCK_ID, metadata=who)
                self.held = True
                return
            except RuntimeError as e:
                if "already exists" not in str(e):
                    raise ClusterError(f"cannot take the cluster's lock through the Jobs API at {self.dashboard_url}: "
                                       f"{e}") from e
            status, holder = self.holder()
            if status not in TERMINAL:
                raise ClusterError(f"another ray-chaos session holds this cluster's lock: {holder}; two sessions "
                                   "never inject into one cluster at the same time (a lock its session could not "
                                   f"release ends at its expiry, or `ray-chaos sweep` releases it)")
            self._delete()  # expired, or released but not removed: free to take
        raise ClusterError(f"could not take the cluster's lock at {self.dashboard_url}: another session took and "
                           "released it three times meanwhile")

    def holder(self) -> tuple[str, str]:
        """(the lock job's status, who holds it), read from the Jobs API."""
        info = self.client.get_job_info(LOCK_ID)
        meta = info.metadata or {}
        who = (f"pid {meta.get('pid', '?')} on {meta.get('host', '?')} since {meta.get('since', '?')}, "
               f"expires {meta.get('expires', '?')}")
        return str(info.status.value), who

    def state(self) -> str:
        """Read-only: ``free``, or who holds the lock and its job's status."""
        try:
            status, who = self.holder()
        except RuntimeError as e:
            if "does not exist" in str(e):
                return "free"
            raise ClusterError(f"cannot read the cluster's lock at {self.dashboard_url}: {e}") from e
        return f"held ({status}) by {who}: a session now would be refused" if status not in TERMINAL else \
            f"ended ({status}), not yet removed: free to take ({who})"

    def release(self) -> None:
        """Give the lock back (stop the job and remove it); a failure is logged, not raised:
        the lock then ends at its expiry."""
        if not self.held:
            return
        self.held = False
        try:
            self._stop_and_delete()
        except Exception as e:  # noqa: BLE001 - the Jobs API raises RuntimeError and requests errors
            log.warning("could not release the cluster's lock job %s at %s (it ends at its expiry): %s", LOCK_ID,
                        self.dashboard_url, e)

    def release_if_orphaned(self) -> str:
        """For ``ray-chaos sweep``: release a lock whose holder was a process of this machine that
        is gone; otherwise leave it.  Returns what was found and done."""
        try:
            info = self.client.get_job_info(LOCK_ID)
        except RuntimeError as e:
            if "does not exist" in str(e):
                return "no cluster lock held"
            raise ClusterError(f"cannot read the cluster's lock at {self.dashboard_url}: {e}") from e
        status, who = self.holder()
        meta = info.metadata or {}
        if status in TERMINAL:
            self._delete()
            return f"removed an ended cluster lock ({who})"
        pid = int(meta.get("pid", "0") or 0)
        if meta.get("host") == os.uname().nodename and pid and not psutil.pid_exists(pid):
            self._stop_and_delete()
            return f"released the cluster lock of a session that is gone ({who})"
        return f"left the cluster lock in place: held by a live session or another machine ({who})"

    def _stop_and_delete(self) -> None:
        self.client.stop_job(LOCK_ID)
        poll_until(lambda: ((s := str(self.client.get_job_status(LOCK_ID).value)) in TERMINAL, f"status {s}"), 30,
                   f"the lock job {LOCK_ID} to stop", interval=0.2)
        self._delete()

    def _delete(self) -> None:
        try:
            self.client.delete_job(LOCK_ID)
        except RuntimeError as e:
            if "does not exist" not in str(e):  # another session removed it first
                raise
