"""Cleanup from any runner (chaos.sweep, chaos.ledger) against the fake Jobs API: the open
ledger entries a session kept on the cluster, and its lock, are what another runner's sweep
finds; a lost session's faults are reverted by their kinds' sweeps and its lock released; a
live session's are never touched (each rule with its twin)."""

from __future__ import annotations

import subprocess

import pytest

from chaos.backends.base import Host
from chaos.backends.jobs_store import ENTRY_PREFIX, ClusterLedger
from chaos.backends.lock import LOCK_ID, ClusterLock, this_runner
from chaos.errors import ClusterError
from chaos.ledger import Ledger
from chaos.sweep import Cluster, sweep
from chaos.transport.base import CommandResult
from fake_jobs import Clock, FakeJobs, FakeStore

CUDA_PLAN = {"action": "disarm-cuda-shim", "host": "10.0.0.2", "control": "/dev/shm/x.ctl", "log": "/tmp/x.jsonl"}


class FakeTransport:
    def __init__(self, ok=True):
        self.ok, self.commands = ok, []

    def run(self, command, timeout=30):
        self.commands.append(command)
        return CommandResult("h", command[:20], 0 if self.ok else 1, "", "" if self.ok else "permission denied")


class FakeBackend:
    """What a sweep asks of a backend: a host by the key its ledger entry recorded."""

    python = "python3"

    def __init__(self, transport=None):
        self.transport, self.keys = transport or FakeTransport(), []

    def reach(self, key):
        self.keys.append(key)
        return Host(key=key, name=None, transport=self.transport)


def gone_runner() -> dict:
    """This machine's identity with the PID of a process that has ended."""
    p = subprocess.Popen(["true"])
    p.wait()
    return {**this_runner(), "pid": str(p.pid)}


def elsewhere() -> dict:
    return {"host": "ci-runner-7", "boot_id": "0" * 36, "pid_ns": "pid:[1]", "pid": "4242", "started": "1.00"}


def said():
    lines = []
    return lines, lines.append


# -- the runner's own ledger (no cluster side: the embedded cluster) ------------------------------
def left_by(ledger: Ledger, runner: dict, fault="cuda", plan=CUDA_PLAN, state="injected") -> str:
    entry_id = ledger.record(fault, {"node_ip": "10.0.0.2"}, plan)
    ledger._append({"id": entry_id, "runner": runner, "state": state})
    return entry_id


def test_sweep_reverts_what_a_dead_session_of_this_machine_left(tmp_path):
    ledger = Ledger(tmp_path / "l.jsonl")
    cuda = left_by(ledger, gone_runner())
    kill = left_by(ledger, gone_runner(), fault="raylet-kill", plan={"action": "none"}, state="pending")
    backend = FakeBackend()
    done = sweep(backend, Ledger(tmp_path / "l.jsonl"), None, say=lambda *_: None)
    assert done.ok and sorted(done.reverted) == sorted([cuda, kill]) and backend.keys == ["10.0.0.2"]
    disarm, remove = backend.transport.commands  # disarmed, then its files removed from the host
    assert "/dev/shm/x.ctl" in disarm and remove == "rm -f /dev/shm/x.ctl /tmp/x.jsonl", remove
    states = {k: v["state"] for k, v in ledger.entries().items()}
    assert states == {cuda: "reverted", kill: "nothing-to-revert"}


def test_twin_a_live_session_of_this_machine_keeps_its_faults(tmp_path):
    ledger = Ledger(tmp_path / "l.jsonl")
    mine = ledger.record("cuda", {"node_ip": "10.0.0.2"}, CUDA_PLAN)  # written by this process: alive
    lines, say = said()
    done = sweep(FakeBackend(), ledger, None, say=say)
    assert done.ok and done.kept == [mine] and done.reverted == []
    assert f"sweep: left cuda ({mine}) alone: its session {ledger.session} is alive (its process runs on this " \
           "machine)" in lines
    assert ledger.entries()[mine]["state"] == "pending"


def test_sweep_reports_what_it_could_not_revert(tmp_path):
    ledger = Ledger(tmp_path / "l.jsonl")
    i = left_by(ledger, gone_runner())
    j = left_by(ledger, gone_runner(), fault="raylet_kill", plan={"action": "none"})  # a kind this version lacks
    done = sweep(FakeBackend(FakeTransport(ok=False)), ledger, None, say=lambda *_: None)
    left, unknown = sorted(done.left, key=lambda e: e["fault"])
    assert not done.ok
    assert "permission denied" in left["error"] and ledger.entries()[i]["state"] == "failed"
    assert "unknown fault kind 'raylet_kill'" in unknown["error"] and ledger.entries()[j]["state"] == "failed"


def test_a_kind_whose_revert_is_unknown_to_its_fault_is_not_swept_as_done(tmp_path):
    ledger = Ledger(tmp_path / "l.jsonl")
    i = left_by(ledger, gone_runner(), fault="raylet-kill", plan={"action": "heal-partition", "netns": "x"})
    done = sweep(FakeBackend(), ledger, None, say=lambda *_: None)
    [left] = done.left
    assert "no sweep for revert action 'heal-partition'" in left["error"] and ledger.entries()[i]["state"] == "failed"


def test_without_a_cluster_to_ask_another_machines_entry_is_left_and_said(tmp_path):
    ledger = Ledger(tmp_path / "l.jsonl")
    i = left_by(ledger, elsewhere())
    lines, say = said()
    done = sweep(FakeBackend(), ledger, None, say=say)
    assert not done.ok and done.reverted == [] and i in done.unchecked[0]
    assert any("could not tell whether session" in line and "it ran on another machine" in line for line in lines)


# -- the cluster side: a lost runner's lock and entries, found by another runner ------------------
@pytest.fixture
def cluster(monkeypatch):
    """A cluster whose sessions ran on another machine (what their ledger entries name)."""
    import chaos.ledger

    monkeypatch.setattr(chaos.ledger, "this_runner", elsewhere)
    clock = Clock()
    jobs = FakeJobs(clock)
    store = FakeStore(jobs)
    return jobs, clock, store, Cluster(ClusterLock(store.dashboard_url, store=store), ClusterLedger(store))


def a_session(store, tmp_path, name="s1", stale_after_s=300.0):
    """A session as Backend.session runs one: its lock (held elsewhere) and its ledger, whose
    open entries are kept on the cluster."""
    held = ClusterLock(store.dashboard_url, owner=name, heartbeat_s=60, stale_after_s=stale_after_s, store=store)
    held.acquire()
    store.jobs.jobs[LOCK_ID]["metadata"].update(elsewhere())
    ledger = Ledger(tmp_path / f"{name}.jsonl", session=name, cluster=ClusterLedger(store))
    return held, ledger


def inject(ledger: Ledger, runner: dict | None = None) -> str:
    entry_id = ledger.record("cuda", {"node_ip": "10.0.0.2"}, CUDA_PLAN)
    ledger.mark(entry_id, "injected")
    return entry_id


def test_a_session_keeps_its_armed_entries_on_the_cluster_until_they_are_reverted(cluster, tmp_path):
    jobs, _, store, _ = cluster
    _, ledger = a_session(store, tmp_path)
    armed = inject(ledger)
    nothing = ledger.record("raylet-kill", {"node_ip": "10.0.0.3"}, {"action": "none"})
    assert [j for j in jobs.jobs if j.startswith(ENTRY_PREFIX)] == [ENTRY_PREFIX + armed], \
        "only an entry that leaves something to revert is kept on the cluster"
    assert ClusterLedger(store).entries()[armed]["revert"] == CUDA_PLAN
    ledger.mark(armed, "reverted")
    ledger.mark(nothing, "nothing-to-revert")
    assert not [j for j in jobs.jobs if j.startswith(ENTRY_PREFIX)]


def test_a_fault_whose_entry_cannot_be_written_on_the_cluster_is_not_injected(cluster, tmp_path):
    jobs, _, store, _ = cluster
    _, ledger = a_session(store, tmp_path)
    jobs.down = True
    with pytest.raises(ClusterError, match=r"cuda: not injected: its ledger entry could not be written on the "
                                           r"cluster, so no other runner could revert it"):
        ledger.record("cuda", {"node_ip": "10.0.0.2"}, CUDA_PLAN)
    [entry] = ledger.entries().values()
    assert entry["state"] == "nothing-to-revert" and entry["error"].startswith("not injected")


def test_another_runner_reverts_a_lost_sessions_faults_and_releases_its_lock(cluster, tmp_path):
    """The lost runner's reports are gone: the sweeping runner has an empty ledger of its own."""
    jobs, clock, store, view = cluster
    held, ledger = a_session(store, tmp_path)
    armed = inject(ledger)
    held.beat()
    clock.t += 301  # its heartbeat stopped: it is lost
    backend, (lines, say) = FakeBackend(), said()
    mine = Ledger(tmp_path / "other-runner" / "ledger.jsonl")
    done = sweep(backend, mine, view, say=say)
    assert done.ok and done.reverted == [armed], lines
    assert backend.keys == ["10.0.0.2"] and "/dev/shm/x.ctl" in backend.transport.commands[0]
    assert mine.entries()[armed]["state"] == "reverted" and mine.entries()[armed]["by"] == "sweep"
    assert jobs.jobs == {}, "the entry, the lock and its heartbeats are gone from the cluster"
    assert any(line.startswith("sweep: released the cluster lock of a session that is gone (session s1 (pid 4242 "
                               "on ci-runner-7)") and "no heartbeat for 301 s" in line for line in lines), lines


def test_twin_a_live_sessions_lock_and_faults_are_left_alone_and_said(cluster, tmp_path):
    jobs, clock, store, view = cluster
    held, ledger = a_session(store, tmp_path)
    armed = inject(ledger)
    clock.t += 200
    held.beat()
    clock.t += 250
    backend, (lines, say) = FakeBackend(), said()
    done = sweep(backend, Ledger(tmp_path / "other-runner.jsonl"), view, say=say)
    assert done.ok and done.kept == [armed] and done.reverted == [] and backend.keys == []
    assert LOCK_ID in jobs.jobs and ENTRY_PREFIX + armed in jobs.jobs
    assert any(line.startswith("sweep: left the cluster lock in place: held by a live session (session s1") and
               "its heartbeat is 250 s old (stale after 300 s)" in line for line in lines), lines
    assert f"sweep: left cuda ({armed}) alone: its session s1 is alive (it holds the cluster's lock with a fresh " \
           "heartbeat)" in lines


def test_an_entry_whose_session_does_not_hold_the_lock_is_reverted_and_the_live_holders_kept(cluster, tmp_path):
    """A session that released the lock (or lost it) cannot be injecting: what it left is
    reverted, while the live holder's own entries stay."""
    jobs, clock, store, view = cluster
    _, old = a_session(store, tmp_path, name="s0")
    left_over = inject(old)  # s0 could not revert it, then released the lock
    jobs.jobs[LOCK_ID]["status"] = "STOPPED"
    store.remove(LOCK_ID)
    _, live = a_session(store, tmp_path, name="s1")
    own = inject(live)
    done = sweep(FakeBackend(), Ledger(tmp_path / "r.jsonl"), view, say=lambda *_: None)
    assert done.reverted == [left_over] and done.kept == [own]
    assert ENTRY_PREFIX + own in jobs.jobs and ENTRY_PREFIX + left_over not in jobs.jobs and LOCK_ID in jobs.jobs


def test_an_entry_this_runner_closed_is_only_removed_from_the_cluster_not_reverted_again(cluster, tmp_path):
    jobs, clock, store, view = cluster
    held, ledger = a_session(store, tmp_path)
    armed = inject(ledger)
    ledger.cluster = None  # the cluster stopped answering just as the session reverted it
    ledger.mark(armed, "reverted")
    clock.t += 400
    backend, (lines, say) = FakeBackend(), said()
    done = sweep(backend, Ledger(tmp_path / "s1.jsonl"), view, say=say)
    assert done.ok and done.reverted == [] and backend.keys == []
    assert f"sweep: removed cuda ({armed}) from the cluster: already reverted" in lines
    assert jobs.jobs == {}


def test_a_sweep_that_cannot_read_the_cluster_fails_and_touches_nothing(cluster, tmp_path):
    jobs, clock, store, view = cluster
    held, ledger = a_session(store, tmp_path)
    inject(ledger)
    clock.t += 400
    jobs.down = True
    backend, (lines, say) = FakeBackend(), said()
    done = sweep(backend, Ledger(tmp_path / "r.jsonl"), view, say=say)
    assert not done.ok and done.reverted == [] and backend.keys == []
    assert done.unchecked[0].startswith("the cluster's lock: cannot reach the Jobs API at http://10.0.0.1:8265")
    assert "the ledger entries kept on the cluster" in done.unchecked[1]
    assert lines[0].startswith("sweep: could not check the cluster's lock: cannot reach the Jobs API"), lines


def test_a_lost_sessions_lock_is_kept_while_one_of_its_faults_could_not_be_reverted(cluster, tmp_path):
    jobs, clock, store, view = cluster
    held, ledger = a_session(store, tmp_path)
    armed = inject(ledger)
    clock.t += 400
    backend, (lines, say) = FakeBackend(FakeTransport(ok=False)), said()
    done = sweep(backend, Ledger(tmp_path / "r.jsonl"), view, say=say)
    assert not done.ok and [e["id"] for e in done.left] == [armed]
    assert LOCK_ID in jobs.jobs and ENTRY_PREFIX + armed in jobs.jobs
    assert any(line.startswith("sweep: kept the lost session's lock") for line in lines), lines
