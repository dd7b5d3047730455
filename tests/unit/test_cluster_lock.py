"""The cluster lock through the Jobs API (chaos.backends.lock) against a fake Jobs API that
answers as Ray 2.60's does: one job per submission id, errors as the SDK raises them."""

from __future__ import annotations

import os
import subprocess
import types

import pytest

from chaos.backends.lock import LOCK_ID, ClusterLock
from chaos.errors import ClusterError


class FakeJobs:
    """Ray's JobSubmissionClient as the lock uses it; ``stopped`` ends a job as stop_job would."""

    def __init__(self):
        self.jobs: dict[str, dict] = {}

    def submit_job(self, entrypoint, submission_id, metadata):
        if submission_id in self.jobs:
            raise RuntimeError(f"Request failed with status code 400: Traceback ... ValueError: Job with "
                               f"submission_id {submission_id} already exists. Please use a different submission_id..")
        self.jobs[submission_id] = {"status": "RUNNING", "metadata": dict(metadata), "entrypoint": entrypoint}

    def _job(self, job_id):
        if job_id not in self.jobs:
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")
        return self.jobs[job_id]

    def get_job_info(self, job_id):
        job = self._job(job_id)
        return types.SimpleNamespace(status=types.SimpleNamespace(value=job["status"]), metadata=job["metadata"])

    def get_job_status(self, job_id):
        return types.SimpleNamespace(value=self._job(job_id)["status"])

    def stop_job(self, job_id):
        self._job(job_id)["status"] = "STOPPED"

    def delete_job(self, job_id):
        if self._job(job_id)["status"] not in ("SUCCEEDED", "FAILED", "STOPPED"):
            raise RuntimeError(f"Request failed with status code 400: Attempted to delete job {job_id} that is "
                               "not in a terminal state")
        del self.jobs[job_id]


def lock(jobs, ttl_s=3600):
    return ClusterLock("http://127.0.0.1:1", ttl_s=ttl_s, client=jobs)


def test_a_second_session_is_refused_naming_the_holder_and_its_expiry():
    jobs = FakeJobs()
    first = lock(jobs)
    first.acquire()
    assert jobs.jobs[LOCK_ID]["entrypoint"] == "sleep 3600"
    with pytest.raises(ClusterError, match=rf"another ray-chaos session holds this cluster's lock: pid {os.getpid()} "
                                           rf"on {os.uname().nodename} since .*, expires "):
        lock(jobs).acquire()
    first.release()
    assert LOCK_ID not in jobs.jobs


def test_twin_after_the_holder_released_the_next_session_takes_it():
    jobs = FakeJobs()
    first = lock(jobs)
    first.acquire()
    first.release()
    second = lock(jobs)
    second.acquire()
    assert second.held and jobs.jobs[LOCK_ID]["status"] == "RUNNING"


def test_an_expired_lock_is_taken_over():
    jobs = FakeJobs()
    lock(jobs).acquire()
    jobs.jobs[LOCK_ID]["status"] = "SUCCEEDED"  # its `sleep <ttl>` ended
    taker = lock(jobs)
    taker.acquire()
    assert taker.held and jobs.jobs[LOCK_ID]["metadata"]["pid"] == str(os.getpid())


def test_sweep_releases_the_lock_of_a_session_of_this_machine_that_is_gone_and_leaves_a_live_ones():
    jobs = FakeJobs()
    gone = subprocess.Popen(["true"])
    gone.wait()
    lock(jobs).acquire()
    jobs.jobs[LOCK_ID]["metadata"]["pid"] = str(gone.pid)
    assert lock(jobs).release_if_orphaned().startswith(f"released the cluster lock of a session that is gone "
                                                       f"(pid {gone.pid} on ")
    assert LOCK_ID not in jobs.jobs
    assert lock(jobs).release_if_orphaned() == "no cluster lock held"

    lock(jobs).acquire()  # this very process: alive
    assert lock(jobs).release_if_orphaned().startswith("left the cluster lock in place: held by a live session")
    jobs.jobs[LOCK_ID]["metadata"]["host"] = "another-runner"
    jobs.jobs[LOCK_ID]["metadata"]["pid"] = str(gone.pid)
    assert lock(jobs).release_if_orphaned().startswith("left the cluster lock in place")
    assert jobs.jobs[LOCK_ID]["status"] == "RUNNING"


def test_a_jobs_api_that_refuses_otherwise_is_named():
    class Broken(FakeJobs):
        def submit_job(self, **kw):
            raise RuntimeError("Request failed with status code 500: boom")

    with pytest.raises(ClusterError, match=r"cannot take the cluster's lock through the Jobs API at "
                                           r"http://127.0.0.1:1: Request failed with status code 500: boom"):
        lock(Broken()).acquire()


def test_a_release_that_fails_is_logged_not_raised(caplog):
    jobs = FakeJobs()
    held = lock(jobs)
    held.acquire()
    del jobs.jobs[LOCK_ID]  # someone removed it by hand
    held.release()
    assert "could not release the cluster's lock job ray-chaos-lock" in caplog.text


def test_an_unreachable_dashboard_is_a_cluster_error_naming_it():
    with pytest.raises(ClusterError, match=r"cannot reach the Jobs API at http://127.0.0.1:9 for the cluster's lock"):
        ClusterLock("http://127.0.0.1:9").release_if_orphaned()
