"""Small records kept on the cluster itself, as jobs of Ray's Jobs API.

The harness reaches every cluster through its dashboard's Jobs API and needs no other
privilege there, so what another runner must find after this one is lost (the lock, its
heartbeat, the open ledger entries) is kept as jobs: a record is a job whose submission id
names it, whose ``metadata`` (strings, written once) carries its content and whose
``start_time`` is the head's clock at its submission.  The Jobs API refuses a second job
with a taken id, which makes a put atomic.  Removing a record stops its job if it still
runs and deletes it.

Cost, measured on the embedded cluster's head (2 shared cores): a submission is ~20 ms for
the caller and ~2 CPU s on the head (Ray starts a JobSupervisor actor process per job); a
read or a delete ~20 ms and no process.  So records are written rarely: once per session
(the lock), once per heartbeat, once per fault that leaves something to revert.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from typing import Iterator

from chaos.errors import ClusterError, WaitTimeout
from chaos.waits import poll_until

log = logging.getLogger(__name__)

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
ENTRY_PREFIX = "ray-chaos-ledger-"
HTTP_TIMEOUT_S = 10.0
SETTLE_S = 2.5  # Ray's job monitor looks once a second: two looks and some
QUIET_S = 30.0  # how long a dashboard found silent is not asked again


@dataclasses.dataclass(frozen=True)
class Record:
    """One record: its job's submission id, status, metadata and submission time (the
    head's clock, Unix seconds; None if the Jobs API gave none)."""

    submission_id: str
    status: str
    metadata: dict
    start_time: float | None

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL


def _record(info) -> Record:
    start = getattr(info, "start_time", None)
    return Record(submission_id=info.submission_id, status=str(info.status.value), metadata=dict(info.metadata or {}),
                  start_time=start / 1000 if start else None)


class JobsStore:
    """Records on the cluster whose dashboard is ``dashboard_url`` (``client``: a Jobs SDK
    client to use instead of one made on first use).

    The SDK sets no timeout on its requests, so a head that drops packets would hold a call
    for minutes: each call here gets HTTP_TIMEOUT_S, and once one found the dashboard silent
    (or someone said so: ``silence``), the next ones fail at once for QUIET_S."""

    def __init__(self, dashboard_url: str, client=None):
        self.dashboard_url = dashboard_url.rstrip("/")
        self._client = client
        self.settle_s = SETTLE_S
        self._quiet_until = 0.0
        self._quiet_why = ""

    @property
    def silent(self) -> str | None:
        """Why the dashboard is taken for silent now (None: it is asked)."""
        return self._quiet_why if time.monotonic() < self._quiet_until else None

    def silence(self, why: str, for_s: float | None = None) -> None:
        """Take the dashboard for silent (``why``) for ``for_s`` seconds: calls fail at once."""
        self._quiet_until = time.monotonic() + (QUIET_S if for_s is None else for_s)
        self._quiet_why = why

    def _sdk(self, method: str, *args, **kwargs):
        """``client.<method>(...)`` within HTTP_TIMEOUT_S, in a thread of its own (left behind,
        a daemon, when it outlives that)."""
        if self.silent:
            raise ClusterError(f"cannot reach the Jobs API at {self.dashboard_url}: {self.silent}")
        box: list = []

        def call() -> None:
            try:
                box.append((True, getattr(self._connected(), method)(*args, **kwargs)))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread as is
                box.append((False, e))

        caller = threading.Thread(target=call, name=f"jobs-api {method}", daemon=True)
        caller.start()
        caller.join(HTTP_TIMEOUT_S)
        if not box:
            why = f"no answer to {method} within {HTTP_TIMEOUT_S:g} s"
            self.silence(why)
            raise ClusterError(f"cannot reach the Jobs API at {self.dashboard_url}: {why}")
        ok, value = box[0]
        if ok:
            return value
        if isinstance(value, (OSError, ClusterError)):  # requests' connection errors are OSErrors
            self.silence(str(value))
        raise value

    def _connected(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            try:
                self._client = JobSubmissionClient(self.dashboard_url)
            except Exception as e:  # noqa: BLE001 - requests' and Ray's own errors alike
                raise ClusterError(f"cannot reach the Jobs API at {self.dashboard_url}: {e}") from e
        return self._client

    def reachable(self) -> None:
        """Raise ClusterError unless the dashboard answers within HTTP_TIMEOUT_S."""
        self.head_now()

    @contextlib.contextmanager
    def _api(self, what: str) -> Iterator[None]:
        """Every failure of a Jobs API call as a ClusterError saying what was asked."""
        try:
            yield
        except ClusterError:
            raise
        except (RuntimeError, WaitTimeout) as e:  # the SDK's HTTP errors; a job that would not stop
            raise ClusterError(f"{what} at {self.dashboard_url}: {e}") from e
        except Exception as e:  # noqa: BLE001 - requests' connection errors: the cluster's, not ours
            raise ClusterError(f"cannot reach the Jobs API at {self.dashboard_url}: {e}") from e

    def put(self, submission_id: str, metadata: dict, entrypoint: str = "true") -> bool:
        """Create the record; False if one with this id exists (nothing changed)."""
        with self._api(f"the Jobs API refused job {submission_id}"):
            try:
                self._sdk("submit_job", entrypoint=entrypoint, submission_id=submission_id,
                          metadata={k: str(v) for k, v in metadata.items()})
            except RuntimeError as e:
                if "already exists" in str(e):
                    return False
                raise
        return True

    def get(self, submission_id: str) -> Record | None:
        with self._api(f"cannot read job {submission_id}"):
            try:
                return _record(self._sdk("get_job_info", submission_id))
            except RuntimeError as e:
                if "does not exist" in str(e):
                    return None
                raise

    def list(self, prefix: str) -> list[Record]:
        """Every record whose id starts with ``prefix``, oldest first."""
        with self._api("cannot list the jobs"):
            jobs = self._sdk("list_jobs")
        found = [_record(j) for j in jobs if (j.submission_id or "").startswith(prefix)]
        return sorted(found, key=lambda r: (r.start_time or 0, r.submission_id))

    def remove(self, submission_id: str, timeout: float = 30.0) -> bool:
        """Stop the record's job if it still runs and delete it; False if there was none."""
        record = self.get(submission_id)
        if record is None:
            return False
        with self._api(f"cannot remove job {submission_id}"):
            try:
                if not record.ended:
                    self._sdk("stop_job", submission_id)
                    poll_until(lambda: ((s := self.get(submission_id)) is None or s.ended, f"status {s and s.status}"),
                               timeout, f"job {submission_id} to stop", interval=0.2)
                self._sdk("delete_job", submission_id)
                if not record.ended:
                    self._settle(submission_id)
            except RuntimeError as e:
                if "does not exist" in str(e):  # someone removed it first
                    return False
                raise
        return True

    def _settle(self, submission_id: str) -> None:
        """Keep a just-stopped job deleted.  Ray's job monitor looks at its supervisor once a
        second; one that finds the supervisor gone and the job deleted writes the job anew as
        FAILED (measured on Ray 2.60: a stopped lock job came back that way).  So it is deleted
        again until it has stayed away for ``settle_s``."""
        absent_since: list[float] = []

        def settled() -> tuple[bool, str]:
            if self.get(submission_id) is not None:
                absent_since.clear()
                self._sdk("delete_job", submission_id)
                return False, "written anew by Ray's job monitor: deleted again"
            absent_since[:1] = absent_since[:1] or [time.monotonic()]
            return time.monotonic() - absent_since[0] >= self.settle_s, "deleted"

        poll_until(settled, 5 * self.settle_s, f"job {submission_id} to stay deleted", interval=self.settle_s / 10)

    def head_now(self) -> float:
        """The head's clock now (Unix seconds, from its dashboard's HTTP ``Date``), against
        which record ages are judged: never this machine's clock, which may be off."""
        from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

        if self.silent:
            raise ClusterError(f"cannot reach the Jobs API at {self.dashboard_url}: {self.silent}")
        url = f"{self.dashboard_url}/api/version"
        request = urllib.request.Request(url, headers=get_auth_headers_if_auth_enabled({}))
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
                date = response.headers.get("Date")
        except urllib.error.HTTPError as e:
            date = e.headers.get("Date")
        except (OSError, ValueError) as e:
            self.silence(str(e))
            raise ClusterError(f"cannot reach the Jobs API at {self.dashboard_url}: {e}") from e
        if not date:
            raise ClusterError(f"{url} answered without a Date header: the head's clock cannot be read")
        return email.utils.parsedate_to_datetime(date).timestamp()


class ClusterLedger:
    """The ledger's open entries kept on the cluster (chaos.ledger): one no-op job
    ``ray-chaos-ledger-<id>`` per entry, its metadata the entry with its revert plan, removed
    once the fault is reverted."""

    def __init__(self, store: JobsStore):
        self.store = store

    def open(self, entry: dict) -> None:
        """Write ``entry`` on the cluster (raise ClusterError: then the fault is not injected)."""
        if not self.store.put(ENTRY_PREFIX + entry["id"], {"ray-chaos": "ledger-entry", "entry": json.dumps(entry)}):
            raise ClusterError(f"ledger entry {entry['id']} already exists on the cluster")

    def close(self, entry_id: str) -> bool:
        """Remove the entry (its fault is reverted); False if it was not there."""
        return self.store.remove(ENTRY_PREFIX + entry_id)

    def entries(self) -> dict[str, dict]:
        """Every open entry on the cluster, by id; one whose metadata is not an entry is named
        by its job and left out."""
        found = {}
        for record in self.store.list(ENTRY_PREFIX):
            try:
                entry = json.loads(record.metadata["entry"])
                found[entry["id"]] = entry
            except (KeyError, ValueError, TypeError) as e:
                log.warning("job %s on the cluster is no ledger entry (%s): left alone", record.submission_id, e)
        return found
