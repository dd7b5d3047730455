"""A session's hold on its cluster (Backend.session) against the fake Jobs API: the lock with
its owner and heartbeat, the open ledger entries kept on the cluster, a refusal while another
session's faults are open there, the abort when the lock is lost, and a bounded way out when
the cluster no longer answers."""

from __future__ import annotations

import threading
import time

import pytest

import chaos.backends.base as base
from chaos.backends.base import Backend, Host
from chaos.backends.jobs_store import ENTRY_PREFIX, ClusterLedger
from chaos.backends.lock import BEAT_PREFIX, LOCK_ID
from chaos.cluster import ClusterView, Node
from chaos.errors import ClusterError
from chaos.ledger import Ledger
from chaos.profile import profile_from_dict
from chaos.report import Reporter
from chaos.safety import NodeInfo
from chaos.waits import poll_until
from fake_jobs import FakeJobs, FakeStore

HEAD = Node("h" * 56, "10.0.0.1", True, True, 1.0, None, None, {}, {})
W2 = Node("a" * 56, "10.0.0.2", True, False, 1.0, None, None, {}, {})


class View(ClusterView):
    def __init__(self, jobs):
        super().__init__("http://10.0.0.1:8265", "10.0.0.1:6379")
        self.jobs = jobs

    def nodes(self):
        return [HEAD, W2]

    def unreachable(self, timeout=5.0):
        return "http://10.0.0.1:8265/api/version did not answer: refused" if self.jobs.down else None


class Profiled(Backend):
    name = label = "profiled"
    storage_path = "/tmp/storage"

    def __init__(self, jobs, heartbeat_s=0.05, profiled=True):
        p = profile_from_dict({"name": "staging", "ray": {"dashboard_url": "http://10.0.0.1:8265",
                                                          "gcs_address": "10.0.0.1:6379"},
                               "storage": {"path": "/s"},
                               "safety": {"lock_heartbeat_s": heartbeat_s, "lock_stale_after_s": 2 * heartbeat_s}})
        super().__init__(profile=p if profiled else None)
        self.view = View(jobs)

    def _open(self):
        return self.view

    def _close(self):
        pass

    def node_info(self, node_id):
        return NodeInfo(node_id, "10.0.0.2")

    def host_key(self, node):
        return node.ip

    def connect(self, key):
        raise AssertionError("no host is reached here")

    def _reach(self, key, node):
        return Host(key=key, name=None, transport=None)

    def healthy_workers(self):
        return True, "fine"

    def wait_healed(self, timeout):
        pass


@pytest.fixture
def jobs(monkeypatch):
    jobs = FakeJobs(clock=time.time)
    monkeypatch.setattr(base, "JobsStore", lambda url: FakeStore(jobs))
    return jobs


def beats(jobs):
    return [j for j in jobs.jobs if j.startswith(BEAT_PREFIX)]


def test_a_profile_session_holds_the_lock_beats_keeps_its_entries_on_the_cluster_and_gives_all_back(jobs, tmp_path):
    backend = Profiled(jobs)
    with backend.session(Reporter(echo=lambda line: None), owner="s1") as b:
        assert jobs.jobs[LOCK_ID]["metadata"]["owner"] == "s1"
        poll_until(lambda: (len([j for j in jobs.submitted if j.startswith(BEAT_PREFIX)]) >= 3, beats(jobs)), 10,
                   "three heartbeats")
        assert len(beats(jobs)) <= 2, "each beat removes the one before"
        ledger = Ledger(tmp_path / "l.jsonl", session="s1", cluster=b.cluster_ledger)
        entry = ledger.record("cuda", {"node_ip": "10.0.0.2"}, {"action": "disarm-cuda-shim", "host": "10.0.0.2"})
        assert ENTRY_PREFIX + entry in jobs.jobs
        ledger.mark(entry, "reverted")
    assert jobs.jobs == {}, "lock, heartbeats and entries all removed"
    assert backend.cluster_ledger is None


def test_twin_the_embedded_cluster_locks_without_a_heartbeat_or_entries_on_the_cluster(jobs):
    backend = Profiled(jobs, profiled=False)
    beating = {t for t in threading.enumerate() if t.name == "lock-heartbeat"}
    with backend.session(Reporter(echo=lambda line: None), owner="s1") as b:
        assert {t for t in threading.enumerate() if t.name == "lock-heartbeat"} <= beating, "a heartbeat started"
        assert "heartbeat_s" not in jobs.jobs[LOCK_ID]["metadata"] and beats(jobs) == []
        assert b.cluster_ledger is None
    assert jobs.jobs == {}


def test_another_sessions_open_faults_on_the_cluster_refuse_the_session_until_a_sweep(jobs):
    ClusterLedger(FakeStore(jobs)).open({"id": "e1", "fault": "cuda", "session": "s0",
                                         "target": {"node_ip": "10.0.0.2"}, "revert": {"action": "disarm-cuda-shim"}})
    with pytest.raises(ClusterError, match=r"1 fault\(s\) of another session are still open on this cluster: cuda "
                                           r"\(e1\) on 10.0.0.2 by session s0; `ray-chaos sweep --profile staging` "
                                           r"reverts them"):
        with Profiled(jobs).session(Reporter(echo=lambda line: None), owner="s1"):
            pass
    assert LOCK_ID not in jobs.jobs, "the refused session gave the lock back"


def test_a_session_whose_lock_was_taken_is_aborted(jobs):
    aborted = threading.Event()
    reasons = []

    def on_abort(reason):
        reasons.append(reason)
        aborted.set()

    with Profiled(jobs).session(Reporter(echo=lambda line: None), owner="s1", on_abort=on_abort):
        jobs.jobs[LOCK_ID]["metadata"]["owner"] = "s2"  # a sweep took it for lost, another session took it
        assert aborted.wait(10), "the heartbeat did not notice its lock was gone"
    assert reasons[0].startswith("lock lost: the cluster's lock at http://10.0.0.1:8265 is no longer this "
                                 "session's (s1): it is held by session s2"), reasons


def test_a_session_whose_heartbeat_cannot_reach_the_cluster_is_aborted_before_it_looks_lost(jobs):
    reasons = []
    aborted = threading.Event()
    with Profiled(jobs).session(Reporter(echo=lambda line: None), owner="s1",
                                on_abort=lambda r: (reasons.append(r), aborted.set())):
        jobs.down = True
        assert aborted.wait(10)
        jobs.down = False
    assert reasons[0].startswith("no heartbeat reached the cluster for "), reasons


def test_the_way_out_of_a_session_whose_cluster_is_gone_skips_the_lock_and_says_so(jobs):
    said = []
    with Profiled(jobs, heartbeat_s=30).session(Reporter(echo=said.append), owner="s1"):
        jobs.down = True
    assert any(line.endswith("cleanup: skipped: release the cluster's lock (the cluster is unreachable)")
               for line in said), said
    assert LOCK_ID in jobs.jobs, "left for a sweep to release once its heartbeat is seen stopped"
