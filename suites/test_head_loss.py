"""Head and GCS loss: what the pinned Ray (2.60) does when the head goes, with and without
GCS fault tolerance (an external Redis), asserted as measured (chaos/head_loss.py).

With fault tolerance the worker nodes keep their Ray node ids, but the job's driver and
the Train controller ran on the head: the run is lost with its driver, nothing is charged
to any budget, and a resubmission of the same run (what a RayJob's retry does) resumes
from the last committed checkpoint.  A Redis restart ends the GCS too.  Without fault
tolerance the restarted head knows nothing: "cluster lost: no GCS fault tolerance".
"""

import uuid
from pathlib import Path

import pytest

from chaos import verify
from chaos.train.run import reference_spec
from chaos.verify import Expectation

pytestmark = pytest.mark.chaos


def head_loss_run(request, **params):
    """The reference workload under a run name of its own (resubmissions keep it)."""
    out = Path(request.config.getoption("chaos_reports")).resolve()
    defaults = dict(steps=40, checkpoint_every=5, step_time=0.3, num_workers=2, max_failures=1)
    return reference_spec(f"headloss-{uuid.uuid4().hex[:6]}", str(out / "storage"), **{**defaults, **params})


def slo(request):
    """--chaos-slo-recover: the head's loss, the resubmission and its first report within it."""
    return request.config.getoption("chaos_slo_recover")


def test_gcs_kill_redis_restart_and_head_reboot_with_fault_tolerance(chaos_head_loss, request):
    """GCS fault tolerance on, one cluster, every head fault in turn under one run and its
    resubmissions.  The GCS is killed after the first checkpoint: the head restarts, the
    worker nodes stay, the run is lost with its driver and charged nothing; resubmitted, it
    resumes from the latest checkpoint.  Then Redis is restarted under the resubmitted run
    (the GCS goes down with it), then every process of the head is killed at once (its
    machine lost power) and started again: each time the same outcome, and the last
    submission resumes again and finishes."""
    exp = chaos_head_loss(gcs_ft=True, spec=head_loss_run(request, steps=30))
    exp.submit()
    exp.wait_checkpoint(timeout=180)
    verdicts = []
    for fault in ("gcs-kill", "redis-restart", "head-reboot"):
        lost_run = exp.run_ids()[-1]
        loss = exp.inject(fault)
        verdicts += [verify.head_loss_outcome(loss, "driver-lost"), verify.workers_after_head_loss(loss, kept=True)]
        exp.submit()  # what a RayJob's retry does
        exp.wait_checkpoint(timeout=180)  # the resubmitted run is going: the next fault hits it
        verdicts += verify.resumed_after_resubmission(exp.timeline, lost_run, exp.run_ids()[-1])
        verdicts.append(verify.reports_resumed(exp.timeline, loss, slo(request)))
    exp.wait_finished(timeout=180)
    verdicts.append(verify.within_budget(exp.timeline, Expectation(charged={})))
    exp.judge(verdicts)


@pytest.mark.extended
def test_head_reboot_without_fault_tolerance_is_a_lost_cluster(chaos_head_loss, request):
    """Ray's default (GCS tables in memory): the head comes back empty.  The harness must say
    "cluster lost: no GCS fault tolerance" within its deadline, never hang; the worker nodes
    give up on the old GCS after their reconnect timeout and come back as new nodes."""
    exp = chaos_head_loss(gcs_ft=False, spec=head_loss_run(request), gcs_reconnect_timeout_s=15)
    exp.submit()
    exp.wait_checkpoint(timeout=180)
    loss = exp.inject("head-reboot", timeout=90)
    verdict = verify.head_loss_outcome(loss, "cluster-lost")
    assert verdict.status == "expected" and "cluster lost: no GCS fault tolerance" in verdict.message, verdict.line()
    replaced = exp.wait_workers_replaced(loss, timeout=90)
    exp.judge([verdict, verify.workers_after_head_loss(replaced, kept=False),
               verify.within_budget(exp.timeline, Expectation(charged={}))])
