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
    import threading

    entered, release = threading.Event(), threading.Event()

    def first_start():
        with emb.one_start_at_a_time("cluster A"):
            entered.set()
            release.wait(30)

    t = threading.Thread(target=first_start)
    t.start()
    try:
        assert entered.wait(30), "the first start never took the lock"
        # another start (its own open file, so flock refuses it as another process's would)
        with pytest.raises(Exception, match=r"cluster-start lock to start cluster B.*held by PID \d+ starting cluster A"):
            with emb.one_start_at_a_time("cluster B", timeout=1.0):
                pass
    finally:
        release.set()
        t.join(30)
    with emb.one_start_at_a_time("cluster B", timeout=5.0):  # freed when the first start ended
        assert "starting cluster B" in (locks / "starting.lock").read_text()


def test_a_failed_start_frees_the_lock(locks):
    with pytest.raises(RuntimeError, match="boom"):
        with emb.one_start_at_a_time("cluster A"):
            raise RuntimeError("boom")
    with emb.one_start_at_a_time("cluster B", timeout=1.0):
        pass
