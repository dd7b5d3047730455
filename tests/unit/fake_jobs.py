"""A fake of Ray 2.60's Jobs API as the harness's cluster-side records use it (the SDK
client's methods, its errors, one job per submission id, submission times on the head's
clock, and its job monitor writing a stopped job anew as FAILED when it was deleted before
the monitor saw its supervisor go), and a store whose head clock the test sets."""

from __future__ import annotations

import types

from chaos.backends.jobs_store import JobsStore


class FakeJobs:
    """``clock``: the head's clock (seconds), read at each submission; a no-op entrypoint ends
    at once, anything else runs until stopped."""

    def __init__(self, clock=lambda: 1_000_000.0):
        self.jobs: dict[str, dict] = {}
        self.clock = clock
        self.submitted: list[str] = []
        self.down = False
        self.monitor_writes: list[str] = []  # jobs the monitor wrote anew after their deletion
        self._stopped_then_deleted: set[str] = set()

    def _up(self):
        if self.down:
            raise ConnectionError("Failed to connect to Ray at address: http://10.0.0.1:8265.")

    def submit_job(self, entrypoint, submission_id, metadata):
        self._up()
        if submission_id in self.jobs:
            raise RuntimeError(f"Request failed with status code 400: Traceback ... ValueError: Job with "
                               f"submission_id {submission_id} already exists. Please use a different submission_id..")
        self.submitted.append(submission_id)
        self.jobs[submission_id] = {"status": "SUCCEEDED" if entrypoint == "true" else "RUNNING",
                                    "metadata": dict(metadata), "entrypoint": entrypoint,
                                    "start_time": int(self.clock() * 1000)}

    def _job(self, job_id):
        self._up()
        if job_id in self._stopped_then_deleted:  # the monitor's next look: supervisor gone, job gone
            self._stopped_then_deleted.discard(job_id)
            self.monitor_writes.append(job_id)
            self.jobs[job_id] = {"status": "FAILED", "metadata": {}, "entrypoint": "", "start_time": None}
        if job_id not in self.jobs:
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")
        return self.jobs[job_id]

    def _info(self, job_id, job):
        return types.SimpleNamespace(submission_id=job_id, status=types.SimpleNamespace(value=job["status"]),
                                     metadata=job["metadata"], start_time=job["start_time"])

    def get_job_info(self, job_id):
        return self._info(job_id, self._job(job_id))

    def get_job_status(self, job_id):
        return types.SimpleNamespace(value=self._job(job_id)["status"])

    def list_jobs(self):
        self._up()
        return [self._info(k, v) for k, v in self.jobs.items()]

    def stop_job(self, job_id):
        job = self._job(job_id)
        job["status"], job["stopped"] = "STOPPED", True

    def delete_job(self, job_id):
        if self._job(job_id)["status"] not in ("SUCCEEDED", "FAILED", "STOPPED"):
            raise RuntimeError(f"Request failed with status code 400: Attempted to delete job {job_id} that is "
                               "not in a terminal state")
        if self.jobs.pop(job_id).get("stopped"):
            self._stopped_then_deleted.add(job_id)


class FakeStore(JobsStore):
    """A store on ``jobs`` whose head clock is ``jobs.clock``."""

    def __init__(self, jobs: FakeJobs):
        super().__init__("http://10.0.0.1:8265", client=jobs)
        self.jobs = jobs
        self.settle_s = 0.05

    def head_now(self) -> float:
        self.jobs._up()
        return self.jobs.clock()


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t
