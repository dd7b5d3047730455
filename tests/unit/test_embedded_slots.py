"""Slots keep the clusters of several processes on one machine apart (ports, loopback block,
bridge); free_port hands ports out without repeats until a slice is used up."""

import pytest

from chaos.embedded import cluster as emb
from chaos.errors import ClusterError


@pytest.fixture
def locks(tmp_path, monkeypatch):
    monkeypatch.setattr(emb, "SLOT_LOCKS", tmp_path / "slots")
    return tmp_path / "slots"


def test_no_slot_claims_the_highest_free_one_and_skips_held_ones(locks):
    first = emb.claim_slot(None, bridge=False)
    second = emb.claim_slot(None, bridge=False)
    try:
        assert (first.slot, second.slot) == (emb.SLOTS - 1, emb.SLOTS - 2)
    finally:
        first.release()
        second.release()
    again = emb.claim_slot(None, bridge=False)  # released: free again
    assert again.slot == emb.SLOTS - 1
    again.release()


def test_a_held_slot_is_refused_by_name(locks):
    held = emb.claim_slot(3, bridge=False)
    try:
        with pytest.raises(ClusterError, match=r"slot 3 is held by another process .*slot3\.lock"):
            emb.claim_slot(3, bridge=False)
    finally:
        held.release()


def test_all_slots_held_says_so(locks):
    claims = [emb.claim_slot(None, bridge=False) for _ in range(emb.SLOTS)]
    try:
        with pytest.raises(ClusterError, match=r"no free embedded-cluster slot .*held by other processes: \[0, 1"):
            emb.claim_slot(None, bridge=False)
    finally:
        for c in claims:
            c.release()


def test_free_port_reuses_the_oldest_hand_out_only_when_the_slice_is_used_up(monkeypatch):
    monkeypatch.setattr(emb, "_PORTS_HANDED_OUT", {})
    monkeypatch.setattr(emb, "_RECENT_HANDOUTS", 1)
    ports = range(64997, 65000)
    first = [emb.free_port(ports) for _ in range(3)]
    assert sorted(first) == list(ports)
    # used up: the one handed out longest ago comes back, never the latest one
    assert emb.free_port(ports) == first[0]
    assert emb.free_port(ports) == first[1]


def test_free_port_never_repeats_a_recent_hand_out(monkeypatch):
    monkeypatch.setattr(emb, "_PORTS_HANDED_OUT", {})
    ports = range(64997, 65000)
    [emb.free_port(ports) for _ in range(3)]
    with pytest.raises(ClusterError, match="no free TCP port left in 64997-64999"):
        emb.free_port(ports)


def test_cluster_starts_take_turns_and_a_waiter_sees_who_holds_the_lock(locks):
    """Another process's start waits (here: a child process, as an xdist worker is) and is
    told who holds the lock; once the first start is over, it goes ahead."""
    import subprocess
    import sys

    probe = ("import sys; from pathlib import Path; from chaos.embedded import cluster as emb; "
             "emb.SLOT_LOCKS = Path(sys.argv[1])\n"
             "try:\n    with emb.one_start_at_a_time('cluster B', timeout=float(sys.argv[2])): print('started B')\n"
             "except Exception as e: print(e)")

    def other_start(timeout):
        return subprocess.run([sys.executable, "-c", probe, str(locks), str(timeout)], capture_output=True,
                              text=True, timeout=60).stdout

    with emb.one_start_at_a_time("cluster A"):
        seen = other_start(1.0)
        assert "cluster-start lock to start cluster B" in seen and "held by PID" in seen, seen
        assert "starting cluster A" in seen, seen
    assert other_start(5.0).strip() == "started B"


def test_a_start_inside_a_start_of_the_same_process_does_not_wait_for_itself(locks):
    with emb.one_start_at_a_time("cluster A"):
        with emb.one_start_at_a_time("its part", timeout=1.0):
            pass


def test_a_failed_start_frees_the_lock(locks):
    with pytest.raises(RuntimeError, match="boom"):
        with emb.one_start_at_a_time("cluster A"):
            raise RuntimeError("boom")
    with emb.one_start_at_a_time("cluster B", timeout=1.0):
        pass
