"""Storage faults on checkpoints in S3 (chaos/faults/storage.py).

The reference workload checkpoints to the backend's S3 storage (``chaos.workload(storage="s3")``:
the embedded cluster's own moto server behind its storage fault proxy, or a profile's
``storage.s3``) through pyarrow's S3 client, as a user's run does, and each suite strikes the
storage where a production cluster's fails: the endpoint answering 503 SlowDown or 500, slow,
or cut off from a node.  Besides the usual verdicts, the storage verdict reads the proxy's
record of every request: a checkpoint whose upload failed is never what a restart restores, a
failed restore fails its attempt, and a window nothing failed in was absorbed — its checkpoint
committed late by how much.

A storage fault's charge depends on its window (the S3 client's retries and Ray Train's own
upload retry absorb a short one), so each suite asserts the charges measured on the pinned Ray
(``MEASURED``, ``chaos.expect(charge_outcomes=...)``) and the run records which one happened.
"""

import pytest

from chaos.faults import catalog
from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos

# What Ray 2.60 charged, measured here (2 cores, the embedded test hosts): per suite, the outcomes
# seen and the ones the same mechanism gives where a restart lands sooner or later (docs/verdicts.md,
# "Which budget a fault costs").  A failed upload is one worker-group failure; a restore that meets
# the window fails its attempt, another one — how many depends on how fast Ray restarts.
MEASURED = {
    "503 burst": [{}],  # seen twice: the upload 2.2 s late
    "503 window": [{"worker_group": 1}, {"worker_group": 2}],  # seen {1} twice
    # seen {3}, {4} and {5}: every restart inside the window fails at its restore
    "500 on every client": [{"worker_group": n} for n in range(2, 7)],
    # seen {1} twice, {2} once: when rank 0 restarted on the cut host inside the window
    "partition": [{"worker_group": 1}, {"worker_group": 2}],
    "slow": [{}],  # seen twice: the upload 8.0 s late
}


def workload(chaos, max_failures=5):
    return chaos.workload(storage="s3", num_workers=2, max_failures=max_failures, steps=25, checkpoint_every=5)


def hosts_of_their_own(chaos) -> bool:
    """Whether the worker hosts have a network of their own (test hosts, a profile's SSH hosts),
    not the plain embedded cluster's loopback processes, which share this machine's (and reach
    the endpoint from one address)."""
    from chaos.transport.local import LocalTransport

    workers = chaos.env.cluster.alive_workers()
    return bool(workers) and not isinstance(chaos.env.backend.host(workers[0].node_id).transport, LocalTransport)


def scope(chaos) -> str:
    """Rank 0's node's requests only, where the proxy can tell them; else every client's."""
    return "node" if hosts_of_their_own(chaos) else "endpoint"


@pytest.fixture
def own_network(chaos):
    """A storage partition cuts one host's network."""
    if not hosts_of_their_own(chaos):
        pytest.skip("a storage partition needs hosts with a network of their own: embedded test hosts "
                    "(--chaos-hosts namespaces, as root) or a profile's SSH hosts")


def storage_verdict(outcome):
    return outcome.verdict("storage (fault 1)")


def test_a_503_burst_at_a_checkpoint_upload_is_absorbed_and_the_checkpoint_commits_late(chaos):
    """S3 answers rank 0's node 503 SlowDown for 2 s from the first request of the checkpoint
    upload after checkpoint 1 (step 10's): the S3 client's retries and Ray Train's upload retry
    absorb it — nothing charged, no restart, the checkpoint committed late."""
    outcome = chaos.run(workload(chaos), faults=[
        (AfterCheckpoint(1), chaos.storage_errors(rank=0, duration_s=2.0, at="next-upload", scope=scope(chaos)))],
        expect=chaos.expect(charge_outcomes=MEASURED["503 burst"]))
    outcome.assert_verdicts()
    v = storage_verdict(outcome)
    assert v.message.startswith("absorbed by the S3 client's and Ray's retries: no attempt failed"), v.message
    [met] = [u for u in v.evidence["uploads"] if u["faulted"]]
    assert met["ok"] and met["step"] == 10, met
    assert len(outcome.timeline.attempts()) == 1


@pytest.mark.extended
def test_503s_longer_than_the_retries_fail_the_upload_and_the_run_resumes_from_the_checkpoint_before(chaos):
    """30 s of 503 from the next upload's first request: the upload of step 10's checkpoint
    fails after the retries (rank 0's error: AWS Error SLOW_DOWN), so Ray never commits it; the
    restart resumes from step 5's — and never reads the failed folder."""
    outcome = chaos.run(workload(chaos), faults=[
        (AfterCheckpoint(1), chaos.storage_errors(rank=0, duration_s=30.0, at="next-upload", scope=scope(chaos)))],
        expect=chaos.expect(charge_outcomes=MEASURED["503 window"]))
    outcome.assert_verdicts()
    v = storage_verdict(outcome)
    assert "failed" in v.message and "never committed, and no attempt restored it" in v.message, v.message
    assert outcome.verdict("resumed-from-latest").message.startswith("attempt 1 resumed at step 6"), \
        outcome.verdict("resumed-from-latest").line()


@pytest.mark.extended
def test_a_restore_that_meets_500s_is_charged_and_the_next_attempt_resumes_from_the_checkpoint(chaos):
    """500 InternalError to every client for 60 s from the next upload: the upload fails, then
    each restart's restore of step 5's checkpoint meets the fault too and fails its attempt
    (charged); the attempt after the window resumes from step 5's checkpoint."""
    outcome = chaos.run(workload(chaos, max_failures=8), faults=[
        (AfterCheckpoint(1), chaos.storage_errors(rank=0, duration_s=60.0, status=500, scope="endpoint",
                                                  at="next-upload"))],
        expect=chaos.expect(charge_outcomes=MEASURED["500 on every client"]))
    outcome.assert_verdicts()
    v = storage_verdict(outcome)
    assert "restore of checkpoint step 5" in v.message and "failed and so did its attempt" in v.message, v.message


@pytest.mark.extended
def test_rank_0s_node_cut_from_storage_during_an_upload(chaos, own_network):
    """Rank 0's host cut off from the S3 endpoint only (its iptables, over SSH) for 60 s after
    checkpoint 1: the next upload cannot reach it; healed, the run resumes from the last
    checkpoint it committed."""
    outcome = chaos.run(workload(chaos), faults=[
        (AfterCheckpoint(1), chaos.storage_partition(rank=0, duration_s=60.0))],
        # the catalog's detection SLO (the upload's requests time out through both retries, ~36 s)
        expect=chaos.expect(charge_outcomes=MEASURED["partition"],
                            slo_detect_s=catalog.kind("storage-partition").slo_detect_s))
    outcome.assert_verdicts()


@pytest.mark.extended
def test_slow_storage_delays_the_commit_and_charges_nothing(chaos):
    """Every S3 request of rank 0's node held 2 s for 10 s from the next upload: the checkpoint
    commits late, nothing fails."""
    outcome = chaos.run(workload(chaos), faults=[
        (AfterCheckpoint(1), chaos.storage_slow(rank=0, duration_s=10.0, latency_s=2.0, at="next-upload",
                                              scope=scope(chaos)))],
        expect=chaos.expect(charge_outcomes=MEASURED["slow"]))
    outcome.assert_verdicts()
    assert storage_verdict(outcome).message.startswith("absorbed"), storage_verdict(outcome).line()
