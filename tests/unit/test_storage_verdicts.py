"""The storage verdicts on recorded timelines (chaos.verdicts.storage, with chaos.attribution
and within-budget for the charges): each rule's buggy case and its healthy twin.  The storage
events are what chaos.storage.events.collect makes of the fault proxy's log."""

from __future__ import annotations

from chaos.attribution import attribute
from chaos.timeline import Event
from chaos.verdicts import Diagnosis, Expect, Status, judge
from chaos.verdicts.budget import within_budget
from chaos.verdicts.recovery import recovery_time
from chaos.verdicts.storage import StorageFaults
from timelines import Script

SLOWDOWN = ("OSError: When creating key 'ck/run/checkpoint_b/' in bucket 'ray-chaos': AWS Error SLOW_DOWN during "
            "PutObject operation: Please reduce your request rate.")


class S3Script(Script):
    """A run on S3 storage: each checkpoint's upload as the proxy logged it, before its commit."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seq = 0
        self.committed: dict[int, str] = {}  # step -> the folder committed for it
        self.events[0] = Event(self.events[0].t, "recorder", "controller_started",
                               {**self.events[0].data, "storage_path": "s3://ray-chaos/ck"})

    def request(self, method, key, status, query=(), client="127.0.1.2", fault=None, dt=0.05):
        self.t += dt
        self.seq += 1
        self.events.append(Event(self.t, "storage", "storage_request", {
            "seq": self.seq, "run_id": self.run_id, "method": method, "key": key, "query": list(query),
            "status": status, "client": client, "fault": fault, "t_end": self.t + 0.01,
            "checkpoint": key.split("/")[0] if "/" in key else None}))
        return self

    def folder(self, step):
        """Ray names each checkpoint's folder by its time: a step saved again gets another one."""
        return f"checkpoint_s{step}a{self.attempt}"

    def upload(self, step, failed=0, fault_status=503, complete=True):
        folder = self.folder(step)
        for _ in range(failed):
            self.request("PUT", f"{folder}/", fault_status, fault="errors", dt=0.5)
        if complete:
            self.request("PUT", f"{folder}/", 200)
            self.request("POST", f"{folder}/state.pt", 200, ["uploads"])
            self.request("PUT", f"{folder}/state.pt", 200, ["partNumber", "uploadId"])
            self.request("POST", f"{folder}/state.pt", 200, ["uploadId"])
        return self

    def restore(self, step, client="127.0.1.3", status=206, fault=None, folder=None):
        folder = folder or self.committed[step]
        self.request("HEAD", f"{folder}/state.pt", 200 if status != 404 else 404, client=client)
        return self.request("GET", f"{folder}/state.pt", status, client=client, fault=fault)

    def steps(self, first, last, every=5, **kw):
        for s in range(first, last + 1):
            if every and s % every == 0:
                self.upload(s)
                self.committed[s] = self.folder(s)
                self.report({r: s for r in range(self.ranks)}, f"ray-chaos/ck/r/{self.folder(s)}")
            else:
                self.report({r: s for r in range(self.ranks)})
        return self

    def storage_fault(self, kind="storage-errors", node="n0", scope_rank=0):
        self.faults += 1
        self.events.append(self._e("fault", "fault_injected", fault=kind, ledger_id=f"f{self.faults}",
                                   target={"node_id": node, "node_ip": f"127.0.1.{scope_rank + 2}",
                                           "rank": scope_rank}))
        self.fault_t = self.t
        return self

    def window_ended(self, started=None):
        self.events.append(self._e("fault", "storage_window_ended", fault="storage-errors",
                                   ledger_id=f"f{self.faults}", started=started or self.fault_t, cut_short=False))
        self.events.append(Event(self.t, "fault", "fault_detected", {"ledger_id": f"f{self.faults}",
                                                                    "by": "storage_window_ended"}))
        return self

    def failed_upload(self, step=10):
        """The upload of ``step``'s checkpoint meets the fault and fails: rank 0 raises."""
        self.upload(step, failed=9, complete=False)
        self.worker_error({0: SLOWDOWN})
        self.events.append(Event(self.t, "fault", "fault_detected", {"ledger_id": f"f{self.faults}",
                                                                    "by": "worker_error"}))
        return self.decision(error=SLOWDOWN, error_types=("WorkerGroupError", "OSError"), limit=5)


def failed_upload_run(restore_failed=False):
    """Checkpoint step 10's upload fails; attempt 1 restores step 5's checkpoint and trains on
    from step 6 — or (``restore_failed``) loads the failed upload's folder and goes on at 11."""
    s = S3Script(max_failures=5).start_attempt().steps(1, 9).storage_fault().failed_upload(10)
    failed = s.folder(10)
    s.start_attempt()
    if restore_failed:
        s.restore(10, folder=failed, status=404)
    else:
        s.restore(5)
    s.window_ended()
    return s.steps(11 if restore_failed else 6, 20).finish().timeline()


def storage_verdict(tl):
    [v] = StorageFaults().check(tl, Expect())
    return v


def test_a_failed_upload_never_restored_passes_and_is_named():
    v = storage_verdict(failed_upload_run())
    assert v.status is Status.PASS, v.line()
    assert "the upload of checkpoint folder checkpoint_s10a0 failed (9 of its 9 requests answered by the fault): " \
           "never committed, and no attempt restored it" in v.message


def test_a_restart_that_restores_the_failed_upload_fails():
    """The script scans S3 for the newest folder and loads the one whose upload failed."""
    v = storage_verdict(failed_upload_run(restore_failed=True))
    assert v.status is Status.FAIL and v.diagnosis is Diagnosis.RESTORED_FAILED_UPLOAD, v.line()
    assert "read checkpoint folder checkpoint_s10a0, whose upload failed (9 of its 9 requests" in v.message


def test_the_failed_upload_is_the_storage_faults_charge_never_unrelated():
    tl = failed_upload_run()
    att = attribute(tl)
    assert not att.unrelated and [len(v) for v in att.by_fault.values()] == [1]
    ok = within_budget(tl, Expect(charge_outcomes=({"worker_group": 1},)))
    assert ok.status is Status.PASS, ok.line()
    # twin: the same run asserted against outcomes it did not show
    wrong = within_budget(tl, Expect(charge_outcomes=({},)))
    assert wrong.status is Status.FAIL and wrong.diagnosis is Diagnosis.CHARGE_NOT_MEASURED, wrong.line()


def test_an_error_elsewhere_during_the_window_is_still_unrelated():
    """A rank on another node failing with the script's own error while a storage fault of
    rank 0's node is armed: not the fault's (twin of the S3 error, which is)."""
    s = S3Script(max_failures=5).start_attempt().steps(1, 9).storage_fault()
    s.worker_error({1: "ValueError: bad batch shape"}).decision(error="ValueError: bad batch shape",
                                                                error_types=("WorkerGroupError", "ValueError"))
    tl = s.start_attempt().restore(5).window_ended().steps(6, 20).finish().timeline()
    assert within_budget(tl, Expect(charge_outcomes=({"worker_group": 1},))).diagnosis is Diagnosis.UNRELATED_FAILURE


def absorbed_run(upload=True):
    s = S3Script().start_attempt().steps(1, 9).storage_fault()
    if upload:
        s.upload(10, failed=4)
        s.committed[10] = s.folder(10)
        s.report({0: 10, 1: 10}, f"ray-chaos/ck/r/{s.folder(10)}")
    s.window_ended(started=s.fault_t + 0.1)
    return s.steps(11, 20).finish().timeline()


def test_a_burst_the_retries_absorb_charges_nothing_and_commits_late():
    tl = absorbed_run()
    v = storage_verdict(tl)
    assert v.status is Status.PASS, v.line()
    assert v.message == ("absorbed by the S3 client's and Ray's retries: no attempt failed; the upload of checkpoint "
                         "step 10 (checkpoint_s10a0) met it (4 of its 8 requests answered or held by the fault) and "
                         "committed 1.5 s late (it took 1.7 s; the run's other uploads 0.16 s)"), v.message
    assert within_budget(tl, Expect(charge_outcomes=({},))).status is Status.PASS
    [rec] = recovery_time(tl, Expect(slo_recover_s=60))
    assert rec.status is Status.PASS and "nothing to recover" in rec.message, rec.line()


def test_a_window_that_met_no_transfer_is_unverifiable_not_a_pass():
    v = storage_verdict(absorbed_run(upload=False))
    assert v.status is Status.UNVERIFIABLE and v.diagnosis is Diagnosis.STORAGE_MET_NOTHING, v.line()


def test_no_proxy_record_is_unverifiable():
    tl = absorbed_run()
    bare = type(tl)([e for e in tl.events if e.kind != "storage_request"])
    v = storage_verdict(bare)
    assert v.status is Status.UNVERIFIABLE and v.diagnosis is Diagnosis.NO_STORAGE_EVIDENCE, v.line()


def restore_run(swallowed=False):
    """The window, every client's, covers the upload of step 10 and then attempt 1's restore of
    step 5: that restore fails; attempt 2 restores after the window."""
    s = S3Script(max_failures=5).start_attempt().steps(1, 9).storage_fault(kind="storage-errors").failed_upload(10)
    # what pyarrow does: a HEAD of the object first, which the fault answers: no GET follows
    s.start_attempt().request("HEAD", f"{s.committed[5]}/state.pt", 500, client="127.0.1.4", fault="errors")
    if swallowed:  # the script catches the failed load and trains from scratch
        return s.window_ended().steps(1, 20).finish().timeline()
    error = "OSError: When reading information for key 'ck/r/checkpoint_a/state.pt': AWS Error INTERNAL_FAILURE"
    s.worker_error({1: error}).decision(error=error, error_types=("WorkerGroupError", "OSError"), limit=5)
    # the next attempt, on the same node, meets it again
    s.start_attempt().request("HEAD", f"{s.committed[5]}/state.pt", 500, client="127.0.1.4", fault="errors")
    s.worker_error({1: error}).decision(error=error, error_types=("WorkerGroupError", "OSError"), limit=5)
    s.window_ended().start_attempt().restore(5)
    return s.steps(6, 20).finish().timeline()


def test_a_restore_that_meets_the_fault_fails_its_attempt_and_is_charged():
    tl = restore_run()
    v = storage_verdict(tl)
    assert v.status is Status.PASS, v.line()
    for attempt in (1, 2):  # each attempt's restore its own, though from one node
        assert f"127.0.1.4's restore of checkpoint step 5 (checkpoint_s5a0) failed and so did its attempt {attempt}" \
            in v.message, v.message
    assert not attribute(tl).unrelated  # rank 1's S3 error on another node: the storage fault's
    assert within_budget(tl, Expect(charge_outcomes=({"worker_group": 3},))).status is Status.PASS
    resumed = [x for x in judge(tl, Expect(charge_outcomes=({"worker_group": 3},))) if x.name.startswith("resumed")]
    assert resumed and all(x.status is Status.PASS for x in resumed), [x.line() for x in resumed]


def test_a_failed_restore_the_script_swallows_fails():
    v = storage_verdict(restore_run(swallowed=True))
    assert v.status is Status.FAIL and v.diagnosis is Diagnosis.FAILED_RESTORE_IGNORED, v.line()
    assert "yet attempt 1 reported step 1 after it" in v.message


def test_a_partition_the_endpoint_never_saw_is_named_by_the_ranks_s3_errors():
    """Rank 0's host cut off from the endpoint: its upload never reaches the proxy, only its
    error says what happened — evidence enough that the fault met a transfer."""
    timeout = ("OSError: When getting information for key 'ck/r/.validate_storage_marker' in bucket 'ray-chaos': "
               "AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 28, Timeout was reached")
    s = S3Script(max_failures=5).start_attempt().steps(1, 9).storage_fault(kind="storage-partition")
    s.worker_error({0: timeout}).decision(error=timeout, error_types=("WorkerGroupError", "OSError"), limit=5)
    tl = s.start_attempt().restore(5).window_ended().steps(6, 20).finish().timeline()
    v = storage_verdict(tl)
    assert v.status is Status.PASS, v.line()
    assert "attempt 0's rank 0 failed with an S3 error: OSError: When getting information for key" in v.message
    assert not attribute(tl).unrelated
