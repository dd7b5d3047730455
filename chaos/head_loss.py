"""Head and GCS loss on the embedded cluster, observed and judged without a Ray driver.

Every other experiment's harness is a Ray driver attached to the head's raylet; a head
fault would take that connection, and with it the pytest process, down.  So a head-loss
experiment talks to the cluster only over HTTP: the Jobs API and the dashboard (node
states, the recorder's events log), which come back with the head.

What Ray 2.60 does, measured here (README, "Which budget a fault costs"):

* The GCS is one process of the head: when it dies, ``ray start --block`` stops the rest
  of the head and exits, as a head container whose GCS crashed does; the cluster starts
  the head again (``head_recovery``), on the same address and ports — on its test host
  (``head_host="testhost"``) by rebooting it, so a head reboot shows a new boot id.
* A Redis restart takes the GCS down with it (the GCS exits when Redis drops; with the
  AOF the restarted Redis still has the tables).
* With GCS fault tolerance the worker nodes keep their Ray node ids through all of it, but
  the job's driver and the Train controller ran on the head and are gone: the run is lost
  with its driver, nothing is charged to any budget, and the Jobs API keeps reporting the
  job RUNNING.  A resubmission with the same run name and storage resumes from the last
  committed checkpoint (what a RayJob's retry does).
* Without it the restarted head has an empty GCS: the job is unknown to it and the worker
  nodes come back as new nodes — "cluster lost: no GCS fault tolerance".

The recorder's events come through its events log, as every run's (chaos.train.eventlog):
followed over the dashboard, which goes and comes back with the head; with fault tolerance
the head keeps its session directory, so the file is found again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import psutil

from chaos import plot, summary, verify
from chaos.cluster import ClusterView
from chaos.embedded.cluster import EmbeddedCluster
from chaos.errors import WaitTimeout
from chaos.report import Reporter
from chaos.timeline import Event, Timeline
from chaos.train.eventlog import EventLog
from chaos.train.recorder import ENV_EVENTS_LOG
from chaos.train.run import RunSpec, runtime_env
from chaos.verify import Verdict
from chaos.waits import poll_until

log = logging.getLogger(__name__)

#: head fault kind -> what it does to the embedded cluster
HEAD_FAULTS: dict[str, Callable[[EmbeddedCluster], object]] = {
    "gcs-kill": EmbeddedCluster.kill_gcs,
    "head-reboot": EmbeddedCluster.kill_head,
    "redis-restart": EmbeddedCluster.restart_redis,
}
#: what a head loss did to the run under test
OUTCOMES = ("continued", "driver-lost", "cluster-lost")


def head_fault(kind: str) -> Callable[[EmbeddedCluster], object]:
    try:
        return HEAD_FAULTS[kind]
    except KeyError:
        raise ValueError(f"unknown head fault {kind!r}; known: {', '.join(HEAD_FAULTS)}") from None


@dataclasses.dataclass
class HeadLoss:
    """What one head fault did: the evidence every verdict reads."""

    fault: str
    gcs_ft: bool
    outcome: str | None  # one of OUTCOMES; None: not established before the deadline
    diagnosis: str
    t_fault: float
    head_down_s: float | None  # fault -> the head's process tree gone
    head_up_s: float | None  # fault -> its dashboard answering again
    job_id: str
    job_status_after: str
    driver_pid: int | None  # on this machine (a test host's PID namespace mapped back)
    driver_alive_after: bool | None
    workers_before: dict[str, str]  # worker node id -> ip
    workers_after: dict[str, str]
    head_boot_ids: list[str]  # the head test host's boot ids before and after (empty: a local head)
    head_history: list[dict]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class HeadLossExperiment:
    """One Train run on ``cluster``, one head fault, and resubmissions of the run."""

    def __init__(self, cluster: EmbeddedCluster, spec: RunSpec, run_dir: Path, reporter: Reporter | None = None,
                 unverifiable: str = "fail", test_id: str = ""):
        from ray.job_submission import JobSubmissionClient  # HTTP only: no driver

        self.cluster, self.spec, self.run_dir = cluster, spec, Path(run_dir)
        self.test_id = test_id or spec.name
        self.verdicts: list[Verdict] = []
        self.metrics: dict = {}
        self.reporter, self.unverifiable = reporter or Reporter(), unverifiable
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.timeline = Timeline()
        self.client = JobSubmissionClient(cluster.dashboard_url)
        self.view = ClusterView(cluster.dashboard_url, cluster.gcs_address)
        self.jobs: list[str] = []
        self._events: list[EventLog] = []

    # -- the run -------------------------------------------------------------------
    def submit(self) -> str:
        """Submit the run (again: same name and storage, so Train restores its latest checkpoint)."""
        job_id = f"chaos-{self.spec.name}-{uuid.uuid4().hex[:6]}"
        env = runtime_env(self.spec, {ENV_EVENTS_LOG: job_id})
        self.client.submit_job(entrypoint=self.spec.entrypoint, submission_id=job_id, runtime_env=env)
        self.jobs.append(job_id)
        # the head (and the node it ran on) may go: losing the file is an outcome here, not an error
        self._events.append(EventLog(self.view, job_id, self.timeline, lost_after_s=None).start())
        self.timeline.emit("harness", "job_submitted", job_id=job_id, entrypoint=self.spec.entrypoint)
        self.reporter.say(f"submitted job {job_id}" + (" (a resubmission of the same run)" if len(self.jobs) > 1
                                                          else ""))
        return job_id

    def run_ids(self) -> list[str]:
        """The Train runs seen so far, in start order (one per submission that got going)."""
        return [e.data["run_id"] for e in self.timeline.of("controller_started")]

    def wait_checkpoint(self, timeout: float) -> Event:
        """The first report of the latest submission's run that committed a checkpoint."""
        submitted = self.timeline.of("job_submitted")[-1].t
        report = self.timeline.wait_for(
            lambda ev: next((e for e in ev if e.kind == "report" and e.t > submitted and e.data.get("checkpoint")),
                            None), timeout, f"a committed checkpoint of job {self.jobs[-1]}")
        self.reporter.say(f"checkpoint committed at step {report.data.get('step')}")
        return report

    def wait_finished(self, timeout: float) -> Event:
        """The end of the latest submission's run."""
        submitted = self.timeline.of("job_submitted")[-1].t
        end = self.timeline.wait_for(lambda ev: next((e for e in ev if e.kind == "run_finished" and e.t > submitted),
                                                     None), timeout, f"the run of job {self.jobs[-1]} to finish")
        self.reporter.say(f"run finished: {end.describe()}")
        return end

    def judge(self, verdicts: list[Verdict]) -> None:
        """Report the verdicts (console, Allure, run dir, the summary record) with the timeline
        and its picture, and fail the test on any that fails."""
        self.verdicts = list(verdicts)
        for v in verdicts:
            self.reporter.say(v.line())
        self.reporter.attach_text("verdicts", "\n".join(v.line() for v in verdicts))
        self.reporter.attach_json("verdict evidence", [v.to_json() for v in verdicts])
        (self.run_dir / "verdicts.json").write_text(json.dumps([v.to_json() for v in verdicts], indent=1,
                                                               default=str))
        self._attach()
        verify.check(verdicts, self.unverifiable)

    def _attach(self) -> None:
        try:
            self.timeline.dump(self.run_dir / "timeline.json")
            self.reporter.attach_file("timeline.json", self.run_dir / "timeline.json")
            png = plot.render_timeline(self.timeline, self.run_dir / "timeline.png", title=self.spec.name)
            self.reporter.attach_png("timeline", png)
            self.metrics = summary.metrics_for(self.timeline, summary.failure_config_of(self.timeline))
        except Exception as e:  # artefacts must never hide the real outcome
            log.exception("could not attach the head-loss artefacts: %s", e)

    def record(self, outcome: str) -> dict:
        """The per-test record for reports/summary.json, as every experiment's."""
        kinds = [e.data.get("fault", "?") for e in self.timeline.of("fault_injected")]
        return summary.test_record(self.test_id, kinds, "embedded", outcome, self.verdicts, self.timeline,
                                   self.metrics)

    # -- the fault ------------------------------------------------------------------
    def inject(self, kind: str, timeout: float = 120.0, settle_s: float = 10.0) -> HeadLoss:
        """Inject head fault ``kind``, wait for the head to be gone and back, and establish
        what became of the run (within ``timeout``; ``settle_s`` after the head is back for
        reports to resume, which is what "continued" means)."""
        fault = head_fault(kind)
        self.reporter.labels(kind, "embedded", "head and GCS loss")
        job_id = self.jobs[-1]
        driver = self._driver_process(job_id)
        workers_before = self._workers()
        boot = self.cluster.head_boots
        th = self.cluster.head_testhost
        boot_ids = [th.boot_id] if th is not None else []
        t_fault = time.time()
        fault_id = uuid.uuid4().hex[:12]  # not the ledger's: a head fault is reverted by the cluster itself
        self.timeline.emit("harness", "fault_injected", fault=kind, target="head", job_id=job_id, ledger_id=fault_id)
        detail = fault(self.cluster)
        killed = f"{len(detail)} processes SIGKILLed" if isinstance(detail, list) else f"pid {detail} SIGKILLed"
        self.reporter.say(f"injected {kind} into the head: {killed}")
        head_down_s = head_up_s = None
        try:
            down = poll_until(lambda: (self._event_after("down", t_fault), self._head_seen()), 30,
                              f"the head to go down after {kind}")
            head_down_s = down["t"] - t_fault
            self.timeline.emit("fault", "fault_detected", t=down["t"], ledger_id=fault_id, by="head_down")
            up = self.cluster.wait_head_up(after=boot, timeout=timeout)
            head_up_s = up["t"] - t_fault
            boot_ids += [up["boot_id"]] if th is not None else []
            self.timeline.emit("cluster", "head_back", t=up["t"], boot=up["boot"])
        except WaitTimeout as err:
            log.warning("head fault %s: %s", kind, err)
        outcome, diagnosis, status = self._judge(job_id, driver, t_fault, head_down_s, head_up_s, settle_s, timeout)
        loss = HeadLoss(fault=kind, gcs_ft=self.cluster.redis is not None, outcome=outcome, diagnosis=diagnosis,
                        t_fault=t_fault, head_down_s=head_down_s, head_up_s=head_up_s, job_id=job_id,
                        job_status_after=status, driver_pid=driver.pid if driver else None,
                        driver_alive_after=None if driver is None else _alive(driver),
                        workers_before=workers_before, workers_after=self._workers(), head_boot_ids=boot_ids,
                        head_history=[e for e in self.cluster.head_history if e["t"] >= t_fault])
        self.timeline.emit("harness", "head_loss", **{k: v for k, v in loss.to_json().items() if k != "head_history"})
        self.reporter.say(f"after {kind}: {loss.outcome or 'no outcome'}: {loss.diagnosis}")
        self.reporter.attach_json(f"head loss: {kind}", loss.to_json())
        return loss

    def _judge(self, job_id: str, driver: psutil.Process | None, t_fault: float, head_down_s: float | None,
               head_up_s: float | None, settle_s: float, timeout: float) -> tuple[str | None, str, str]:
        """(outcome, diagnosis, the Jobs API's status of the job) once the evidence settles."""
        gcs_ft = self.cluster.redis is not None
        if head_down_s is not None and head_up_s is None:
            why = "the head did not come back" if self.cluster.config.head_recovery else "head recovery is off"
            if not gcs_ft:
                return "cluster-lost", f"cluster lost: no GCS fault tolerance ({why})", "unreachable"
            return None, f"{why}: nothing could be established about the run", "unreachable"
        back = t_fault + (head_up_s or 0.0)  # a head that stayed up: reports after the fault count
        deadline = time.monotonic() + max(settle_s, 1.0)
        status = "unknown"
        while True:
            status = self._job_status(job_id)
            reports = [e for e in self.timeline.of("report") if e.t > back]
            if reports:
                return "continued", (f"the run continued: step {reports[0].data.get('step')} reported "
                                     f"{reports[0].t - t_fault:.1f} s after the fault, no new attempt"), status
            if status == "unknown to the head":
                why = ("no GCS fault tolerance" if not gcs_ft else
                       "the GCS lost its tables although fault tolerance is on (Redis without them?)")
                return "cluster-lost", (f"cluster lost: {why} — the head came back with a GCS that does not know "
                                        f"job {job_id}; the run is gone"), status
            if gcs_ft and driver is not None and not _alive(driver) and time.monotonic() >= deadline:
                return "driver-lost", (f"run lost with its driver: the job's driver (pid {driver.pid}) and the "
                                       "Train controller ran on the head and died with it; GCS fault tolerance "
                                       f"kept the cluster; the Jobs API says {status}"), status
            if time.monotonic() >= deadline + timeout:
                return None, (f"no outcome within {settle_s + timeout:.0f} s of the head's return: no report, "
                              f"driver {_describe(driver)}, "
                              f"job {status}"), status
            try:  # the next look: as soon as a report arrives, or in a second
                self.timeline.wait_for(lambda ev: any(e.kind == "report" and e.t > back for e in ev), 1.0,
                                       "a report after the head's return")
            except WaitTimeout:
                pass

    def wait_workers_replaced(self, loss: HeadLoss, timeout: float) -> HeadLoss:
        """Wait until as many worker nodes as before are alive again, none of them under an id
        from before the fault (a new GCS: every node re-registers); return ``loss`` with them."""
        def replaced():
            now = self._workers()
            done = len(now) >= len(loss.workers_before) and not set(now) & set(loss.workers_before)
            return (now if done else None), f"alive workers {now or 'none'}"

        now = poll_until(replaced, timeout, f"{len(loss.workers_before)} worker nodes to re-join under new node ids")
        return dataclasses.replace(loss, workers_after=now)

    # -- facts over HTTP and /proc ------------------------------------------------------
    def _driver_process(self, job_id: str) -> psutil.Process | None:
        """The job's driver process on this machine.  Ray reports the PID the driver sees: on
        a test-host head that is a PID in the host's own PID namespace, mapped back here."""
        pid = self._driver_pid(job_id)
        th = self.cluster.head_testhost
        if pid is None:
            return None
        here = [pid] if th is None else [p for p in th.namespace_pids() if _namespace_pid(p) == pid]
        try:
            return psutil.Process(here[0])
        except (IndexError, psutil.NoSuchProcess):
            log.warning("job %s: its driver (pid %s on the head) is not running", job_id, pid)
            return None

    def _driver_pid(self, job_id: str) -> int | None:
        try:
            info = self.client.get_job_info(job_id)
        except Exception as err:  # noqa: BLE001 - the Jobs API raises RuntimeError and requests errors
            log.warning("job %s: no driver info: %s", job_id, err)
            return None
        pid = getattr(info, "driver_info", None) and info.driver_info.pid
        return int(pid) if pid else None

    def _job_status(self, job_id: str) -> str:
        try:
            return str(self.client.get_job_status(job_id).value)
        except RuntimeError as err:
            return "unknown to the head" if "does not exist" in str(err) else f"unreachable: {err}"
        except Exception as err:  # noqa: BLE001 - connection errors while the head is away
            return f"unreachable: {type(err).__name__}"

    def _workers(self) -> dict[str, str]:
        return {n["node_id"]: n["ip"] for n in self.cluster.gcs_nodes()
                if n["alive"] and n["ip"] != self.cluster.head_ip}

    def _event_after(self, event: str, t: float) -> dict | None:
        return next((e for e in self.cluster.head_history if e["event"] == event and e["t"] >= t), None)

    def _head_seen(self) -> str:
        return ", ".join(e["event"] for e in self.cluster.head_history[-4:]) or "no head events"

    def close(self) -> None:
        """Stop following the events; stop the submitted jobs that are still running."""
        for events in self._events:
            events.drain()
        for job_id in self.jobs:
            try:
                self.client.stop_job(job_id)
            except Exception:  # noqa: BLE001 - gone with a lost head, or finished
                pass
        self.timeline.dump(self.run_dir / "timeline.json")


def _alive(proc: psutil.Process) -> bool:
    """Whether that very process (its PID and start time) still runs."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _describe(proc: psutil.Process | None) -> str:
    return "unknown (no driver PID from the Jobs API)" if proc is None else \
        f"pid {proc.pid} {'alive' if _alive(proc) else 'gone'}"


def _namespace_pid(pid: int) -> int | None:
    """A process's PID in its own (innermost) PID namespace, from /proc/<pid>/status."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next((ln for ln in f if ln.startswith("NSpid:")), "")
    except OSError:
        return None
    fields = line.split()[1:]
    return int(fields[-1]) if fields else None
