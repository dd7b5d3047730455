"""The cluster lock through the Jobs API (chaos.backends.lock) against a fake Jobs API that
answers as Ray 2.60's does: one job per submission id, errors as the SDK raises them, job
submission times on the head's clock.  Whether a holder is alive: at once for a process of
this machine, by its heartbeat's age on the head's clock for one elsewhere."""

from __future__ import annotations

import os
import subprocess

import pytest

from chaos.backends.lock import BEAT_PREFIX, LOCK_ID, ClusterLock, LockLost, this_runner
from chaos.errors import ClusterError
from fake_jobs import Clock, FakeJobs, FakeStore


def lock(jobs, owner="s1", ttl_s=3600, heartbeat_s=60.0, stale_after_s=300.0):
    return ClusterLock("http://10.0.0.1:8265", owner=owner, ttl_s=ttl_s, heartbeat_s=heartbeat_s,
                       stale_after_s=stale_after_s, store=FakeStore(jobs))


def elsewhere(jobs, pid="4242"):
    """The lock's holder as a process of another machine (another boot, another PID namespace)."""
    jobs.jobs[LOCK_ID]["metadata"].update(host="ci-runner-7", boot_id="0" * 36, pid_ns="pid:[1]", pid=pid)


def test_a_second_session_is_refused_naming_the_holder_and_its_expiry():
    jobs = FakeJobs()
    first = lock(jobs)
    first.acquire()
    assert jobs.jobs[LOCK_ID]["entrypoint"] == "sleep 3600"
    meta = jobs.jobs[LOCK_ID]["metadata"]
    assert meta["owner"] == "s1" and meta["heartbeat_s"] == "60" and meta["stale_after_s"] == "300"
    assert {k: meta[k] for k in ("host", "boot_id", "pid_ns", "pid")} == \
        {k: this_runner()[k] for k in ("host", "boot_id", "pid_ns", "pid")}
    with pytest.raises(ClusterError, match=rf"another ray-chaos session holds this cluster's lock: session s1 \(pid "
                                           rf"{os.getpid()} on {os.uname().nodename}\) since .*, expires "):
        lock(jobs, owner="s2").acquire()
    first.release()
    assert LOCK_ID not in jobs.jobs


def test_twin_after_the_holder_released_the_next_session_takes_it():
    jobs = FakeJobs()
    first = lock(jobs)
    first.acquire()
    first.release()
    second = lock(jobs, owner="s2")
    second.acquire()
    assert second.held and jobs.jobs[LOCK_ID]["metadata"]["owner"] == "s2"


def test_an_expired_lock_is_taken_over():
    jobs = FakeJobs()
    lock(jobs).acquire()
    jobs.jobs[LOCK_ID]["status"] = "SUCCEEDED"  # its `sleep <ttl>` ended
    taker = lock(jobs, owner="s2")
    taker.acquire()
    assert taker.held and jobs.jobs[LOCK_ID]["metadata"]["owner"] == "s2"


def test_a_holder_of_this_machine_is_alive_while_its_process_runs_and_gone_at_once_after():
    jobs = FakeJobs()
    lock(jobs).acquire()
    assert lock(jobs).holder().alive() == (True, "its process runs on this machine")
    gone = subprocess.Popen(["true"])
    gone.wait()
    jobs.jobs[LOCK_ID]["metadata"]["pid"] = str(gone.pid)
    assert lock(jobs).holder().alive() == (False, "it ran on this machine and is gone")
    # a PID reused by another process is not the holder: its start time differs
    jobs.jobs[LOCK_ID]["metadata"].update(pid="1")
    assert lock(jobs).holder().alive()[0] is False


def test_a_holder_elsewhere_is_alive_while_its_heartbeat_is_fresh_and_lost_once_it_is_stale():
    clock = Clock()
    jobs = FakeJobs(clock)
    held = lock(jobs)
    held.acquire()
    elsewhere(jobs)
    clock.t += 200
    assert lock(jobs).holder().alive() == (True, "its heartbeat is 200 s old (stale after 300 s)")
    held.beat()  # a beat at t+200 makes it young again
    clock.t += 250
    assert lock(jobs).holder().alive() == (True, "its heartbeat is 250 s old (stale after 300 s)")
    clock.t += 51
    assert lock(jobs).holder().alive() == (False, "no heartbeat for 301 s (stale after 300 s)")
    with pytest.raises(ClusterError, match=r"it looks lost \(no heartbeat for 301 s .*\): `ray-chaos sweep --profile "
                                           r"<profile>` reverts its open faults and releases it"):
        lock(jobs, owner="s2").acquire()


def test_a_holder_elsewhere_without_a_heartbeat_is_alive_until_its_expiry():
    clock = Clock()
    jobs = FakeJobs(clock)
    lock(jobs, heartbeat_s=None).acquire()  # the embedded cluster's sessions do not beat
    elsewhere(jobs)
    clock.t += 10_000
    assert lock(jobs).holder().alive() == (True, "it runs elsewhere and has no heartbeat to judge it by: it ends at "
                                                 "its expiry")


def test_beats_replace_each_other_and_a_session_whose_lock_was_taken_is_told():
    jobs = FakeJobs()
    held = lock(jobs)
    held.acquire()
    held.beat()
    held.beat()
    assert [j for j in jobs.jobs if j.startswith(BEAT_PREFIX)] == [f"{BEAT_PREFIX}s1-2"]
    jobs.jobs[LOCK_ID]["metadata"]["owner"] = "s2"  # swept as lost and taken by another session
    with pytest.raises(LockLost, match=r"is no longer this session's \(s1\): it is held by session s2 \(RUNNING\)"):
        held.beat()
    held.release()  # not ours: left alone
    assert jobs.jobs[LOCK_ID]["metadata"]["owner"] == "s2"


def test_release_removes_the_lock_and_every_heartbeat_and_keeps_the_lock_deleted():
    """The stopped lock job, deleted before Ray's job monitor saw its supervisor go, is written
    anew as FAILED by the monitor (Ray 2.60): it is deleted again."""
    jobs = FakeJobs()
    held = lock(jobs)
    held.acquire()
    held.beat()
    held.release()
    assert jobs.monitor_writes == [LOCK_ID] and jobs.jobs == {}


def test_a_jobs_api_that_refuses_otherwise_is_named():
    class Broken(FakeJobs):
        def submit_job(self, **kw):
            raise RuntimeError("Request failed with status code 500: boom")

    with pytest.raises(ClusterError, match=r"the Jobs API refused job ray-chaos-lock at http://10.0.0.1:8265: "
                                           r"Request failed with status code 500: boom"):
        lock(Broken()).acquire()


def test_a_release_that_fails_is_logged_not_raised(caplog):
    jobs = FakeJobs()
    held = lock(jobs)
    held.acquire()
    jobs.down = True
    held.release()
    assert "could not release the cluster's lock job ray-chaos-lock" in caplog.text


def test_an_unreachable_dashboard_is_a_cluster_error_naming_it():
    with pytest.raises(ClusterError, match=r"cannot reach the Jobs API at http://127.0.0.1:9"):
        ClusterLock("http://127.0.0.1:9").holder()


def test_the_state_a_dry_run_prints():
    clock = Clock()
    jobs = FakeJobs(clock)
    assert lock(jobs).state() == "free"
    lock(jobs).acquire()
    elsewhere(jobs)
    assert lock(jobs).state().endswith(": a session now would be refused")
    clock.t += 400
    assert "looks lost (no heartbeat for 400 s (stale after 300 s)): `ray-chaos sweep` releases it" in \
        lock(jobs).state()
