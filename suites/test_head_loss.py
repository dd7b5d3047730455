"""Head and GCS loss: what the pinned Ray (2.60) does when the head goes, with and without
GCS fault tolerance (an external Redis), asserted as measured (chaos/faults/head.py).

Head faults are catalog kinds like every other: the same experiment, ledger, safety rules,
detection (the harness sees the head's node table stop answering), timeline picture, heal
verdict and summary.  With fault tolerance the worker nodes keep their Ray node ids, but the
job's driver and the Train controller ran on the head: the run is lost with its driver,
nothing is charged to any budget, and the harness resubmits it (what a RayJob's retry does),
which must resume from the last committed checkpoint.  A Redis restart ends the GCS too.
Without fault tolerance the restarted head knows nothing: "cluster lost: no GCS fault
tolerance".
"""

import pytest

from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos

RUN = dict(steps=30, checkpoint_every=5, step_time=0.3, num_workers=2, max_failures=1)


@pytest.mark.head_faults(gcs_ft=True)
def test_gcs_kill_redis_restart_and_head_reboot_with_fault_tolerance(chaos):
    """GCS fault tolerance on: the GCS killed after the first checkpoint, Redis restarted after
    the resubmission's first, every process of the head killed at once (its machine lost
    power) after the next.  Each time the head comes back, the worker nodes stay, the run is
    lost with its driver and charged nothing, and the resubmission resumes from the latest
    checkpoint; the last one finishes."""
    outcome = chaos.run(chaos.workload(**RUN),
                        faults=[(AfterCheckpoint(1), chaos.gcs_kill()), (AfterCheckpoint(2), chaos.redis_restart()),
                                (AfterCheckpoint(3), chaos.head_reboot())])
    outcome.assert_verdicts()
    losses = outcome.timeline.of("head_loss")
    assert [(e.data["fault"], e.data["outcome"]) for e in losses] == [
        ("gcs-kill", "driver-lost"), ("redis-restart", "driver-lost"), ("head-reboot", "driver-lost")], losses
    resubmitted = [e.data["resubmits"] for e in outcome.timeline.of("job_submitted") if e.data.get("resubmits")]
    assert resubmitted == [e.data["job_id"] for e in outcome.timeline.of("job_abandoned")] and len(resubmitted) == 3
    resumes = [v for v in outcome.verdicts if v.name.startswith("resumed-from-latest")]
    assert [v.status for v in resumes] == ["pass"] * 3, [v.line() for v in resumes]


@pytest.mark.extended
@pytest.mark.head_faults(gcs_ft=False, gcs_reconnect_timeout_s=15)
def test_head_reboot_without_fault_tolerance_is_a_lost_cluster(chaos):
    """Ray's default (GCS tables in memory): the head comes back empty.  The harness must say
    "cluster lost: no GCS fault tolerance" within its deadline, never hang; the worker nodes
    give up on the old GCS after their reconnect timeout and come back as new nodes."""
    outcome = chaos.run(chaos.workload(**RUN), faults=[(AfterCheckpoint(1), chaos.head_reboot())])
    outcome.assert_verdicts()
    verdict = outcome.verdict("head-loss")
    assert verdict.status == "expected" and "cluster lost: no GCS fault tolerance" in verdict.message, verdict.line()
    assert outcome.verdict("worker nodes after head loss").status == "pass"
