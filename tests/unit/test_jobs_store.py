"""The cluster's records through the Jobs SDK (chaos.backends.jobs_store): every call bounded
(the SDK sets no timeout: a head that drops packets would hold it for minutes), and once the
dashboard was found silent, the next calls fail at once instead of each waiting again."""

from __future__ import annotations

import threading

import pytest

import chaos.backends.jobs_store as jobs_store
from chaos.backends.jobs_store import ClusterLedger, JobsStore
from chaos.errors import ClusterError
from chaos.ledger import Ledger
from fake_jobs import FakeJobs

FOREVER = threading.Event()


class Counting(FakeJobs):
    """The fake Jobs API, counting the calls that reach it; ``blocked``: each blocks for ever."""

    def __init__(self, blocked=False):
        super().__init__()
        self.blocked, self.calls = blocked, 0

    def get_job_info(self, job_id):
        self.calls += 1
        if self.blocked:
            FOREVER.wait()
        return super().get_job_info(job_id)


@pytest.fixture(autouse=True)
def short(monkeypatch):
    monkeypatch.setattr(jobs_store, "HTTP_TIMEOUT_S", 0.2)


def test_a_call_the_dashboard_never_answers_is_bounded_and_the_next_ones_fail_at_once():
    jobs = Counting(blocked=True)
    store = JobsStore("http://10.0.0.1:8265", client=jobs)
    with pytest.raises(ClusterError, match=r"cannot reach the Jobs API at http://10.0.0.1:8265: no answer to "
                                           r"get_job_info within 0.2 s"):
        store.get("ray-chaos-lock")
    assert store.silent == "no answer to get_job_info within 0.2 s"
    with pytest.raises(ClusterError, match="no answer to get_job_info within 0.2 s"):
        store.get("ray-chaos-lock")
    assert jobs.calls == 1, "a dashboard found silent is not asked again at once"


def test_twin_a_refusal_silences_it_and_an_http_error_does_not():
    jobs = Counting()
    jobs.down = True
    store = JobsStore("http://10.0.0.1:8265", client=jobs)
    with pytest.raises(ClusterError, match="Failed to connect to Ray"):
        store.get("x")
    assert store.silent and "Failed to connect to Ray" in store.silent
    answering = JobsStore("http://10.0.0.1:8265", client=Counting())
    assert answering.get("absent") is None and answering.silent is None

    class Refusing(Counting):
        def get_job_info(self, job_id):
            raise RuntimeError("Request failed with status code 500: boom")

    refusing = JobsStore("http://10.0.0.1:8265", client=Refusing())
    with pytest.raises(ClusterError, match=r"cannot read job x at http://10.0.0.1:8265: Request failed with status "
                                           r"code 500: boom"):
        refusing.get("x")
    assert refusing.silent is None, "a dashboard that answers, even with an error, is not silent"


def test_a_revert_recorded_after_the_cluster_went_silent_does_not_wait_on_it(tmp_path, caplog):
    jobs = Counting()
    store = JobsStore("http://10.0.0.1:8265", client=jobs)
    ledger = Ledger(tmp_path / "l.jsonl", cluster=ClusterLedger(store))
    entry = ledger.record("cuda", {"node_ip": "10.0.0.2"}, {"action": "disarm-cuda-shim", "host": "10.0.0.2"})
    ledger.cluster_gone("http://10.0.0.1:8265/api/version did not answer: timed out")
    jobs.blocked, calls = True, jobs.calls
    ledger.mark(entry, "reverted")
    assert jobs.calls == calls and ledger.entries()[entry]["state"] == "reverted"
    assert f"ledger entry {entry} stays on the cluster (a sweep removes it)" in caplog.text
