"""Head and GCS loss: the GCS killed, the head's machine power-cycled, the GCS's Redis
restarted — on a cluster whose head the harness controls (the backend's ``head``
capability: the embedded cluster's head on a test host of its own).

The harness is no Ray driver, so it outlives the head: it sees the head go as its node
table stops answering (``head_unreachable``, the detection) and come back
(``head_reachable``), and then establishes from evidence what became of the run.  What
Ray 2.60 does, measured (README, "Which budget a fault costs"):

* The GCS is one process of the head: when it dies, ``ray start --block`` stops the rest
  of the head and exits, as a head container whose GCS crashed does; the cluster starts
  the head again on the same address and ports (on its test host by rebooting it, so a
  head reboot shows a new boot id).  A Redis restart takes the GCS down with it.
* With GCS fault tolerance the worker nodes keep their Ray node ids through all of it, but
  the job's driver and the Train controller ran on the head and are gone: the run is lost
  with its driver (*driver-lost*), nothing is charged to any budget, and the Jobs API keeps
  calling the job RUNNING.  The experiment resubmits the run under the same name and
  storage (what a RayJob's retry does), and every verdict judges the resubmission as the
  run's next attempt (chaos.train.run.continuation).
* Without it the restarted head has an empty GCS: the job is unknown to it and the worker
  nodes come back as new nodes (*cluster-lost*); nothing is left to recover.
"""

from __future__ import annotations

import time
from typing import ClassVar

from chaos.cluster import Target
from chaos.errors import InjectionError, WaitTimeout
from chaos.faults.base import Fault, FaultContext, Injection
from chaos.timeline import Event
from chaos.waits import poll_until

#: what a head loss did to the run under test
OUTCOMES = ("continued", "driver-lost", "cluster-lost")
#: the run's fate after each outcome (Fault.run_fate); no outcome established: nothing to go on
FATES = {"continued": "continues", "driver-lost": "resubmit", "cluster-lost": "lost", None: "lost"}


class HeadFault:
    """What every head fault does (a mixin: each kind's class is ``(HeadFault, Fault)``, naming
    its kind and what it does to the head)."""

    kills_node = False  # with fault tolerance the head keeps its node id; detection is its absence
    loses_the_head = True
    verb: ClassVar[str] = ""

    def __init__(self, back_timeout_s: float = 120.0, settle_s: float = 10.0, replaced_timeout_s: float = 120.0):
        """``back_timeout_s``: how long the head may take to answer again; ``settle_s``: how long
        after that the run may take to show it continued; ``replaced_timeout_s``: without fault
        tolerance, how long the worker nodes may take to come back as new nodes."""
        if min(back_timeout_s, settle_s, replaced_timeout_s) <= 0:
            raise ValueError(f"{self.kind}: timeouts must be > 0")
        self.back_timeout_s, self.settle_s, self.replaced_timeout_s = back_timeout_s, settle_s, replaced_timeout_s

    def act(self, head) -> str:
        """Do it to the head (``Backend.head``); say what was done."""
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.kind}: {self.verb}"

    def target_rule(self) -> str:
        return "the cluster's live head node when the trigger fires (only if safety.allow_head: true)"

    def resolve(self, ctx: FaultContext) -> Target:
        """The live head (a head that came back runs a new Ray node)."""
        head = next((n for n in ctx.cluster.nodes() if n.is_head and n.alive), None)
        if head is None:
            raise InjectionError(f"{self.kind}: no live head node in the node table at {ctx.cluster.dashboard_url}")
        return Target(node_id=head.node_id, node_ip=head.ip, host="head")

    def revert_plan(self, inj: Injection) -> dict:
        return {"action": "none", "why": f"{self.kind} leaves nothing armed: the cluster starts its head again"}

    # -- inject ------------------------------------------------------------------------
    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        head = ctx.backend.head
        if head is None:
            raise InjectionError(f"{self.kind}: backend {ctx.backend.label} has no control of the cluster's head")
        job = _current_job(ctx.timeline.events)
        inj.evidence.update(
            fault=self.kind, gcs_ft=head.gcs_ft, job_id=job, driver_pid=_driver_pid(ctx, job),
            workers_before={n.node_id: n.ip for n in ctx.cluster.alive_workers()},
            head_boot_ids=[b for b in (head.boot_id(),) if b])
        did = self.act(head)
        inj.evidence["did"] = did
        return {"did": did, "gcs_ft": head.gcs_ft}

    def detection(self, target: Target) -> str:
        return "the harness to see the head's node table stop answering"

    def detected(self, events: list[Event], target: Target, fault_t: float) -> Event | None:
        """The harness saw the head go: its node table stopped answering."""
        return next((e for e in events if e.kind == "head_unreachable" and e.t >= fault_t), None)

    # -- after detection: the head back, and what became of the run ------------------------
    def after_detect(self, ctx: FaultContext, inj: Injection) -> None:
        head, ev, t_fault = ctx.backend.head, inj.evidence, inj.t
        lost = next(e for e in ctx.timeline.events if e.kind == "head_unreachable" and e.t >= t_fault)
        back = None
        try:
            back = ctx.timeline.wait_for(
                lambda events: next((e for e in events if e.kind == "head_reachable" and e.t >= lost.t), None),
                self.back_timeout_s, f"the head's node table to answer again after {self.kind}")
        except WaitTimeout:
            pass
        down_t = head.went_down_after(t_fault)
        ev.update(head_unreachable_s=lost.t - t_fault, head_down_s=None if down_t is None else down_t - t_fault,
                  head_up_s=None if back is None else back.t - t_fault)
        if back is not None and ev["head_boot_ids"]:
            ev["head_boot_ids"].append(head.boot_id())
        ev["outcome"], ev["diagnosis"], ev["job_status_after"] = self._outcome(ctx, inj, back)
        ev["driver_alive_after"] = None if ev["driver_pid"] is None else head.driver_alive(ev["driver_pid"])
        if ev["outcome"] == "cluster-lost" and back is not None:
            self._wait_workers_replaced(ctx, ev)
        ev["workers_after"] = {n.node_id: n.ip for n in _alive_workers(ctx)}
        ctx.timeline.emit("fault", "head_loss", ledger_id=inj.ledger_id,
                          **{k: v for k, v in ev.items() if k != "did"})

    def run_fate(self, inj: Injection) -> str:
        return FATES[inj.evidence.get("outcome")]

    def _outcome(self, ctx: FaultContext, inj: Injection, back: Event | None) -> tuple[str | None, str, str]:
        """(outcome, diagnosis, the Jobs API's status of the job) once the evidence settles."""
        head, ev = ctx.backend.head, inj.evidence
        if back is None:
            why = f"the head did not answer again within {self.back_timeout_s:.0f} s"
            if not head.gcs_ft:
                return "cluster-lost", f"cluster lost: no GCS fault tolerance ({why})", "unreachable"
            return None, f"{why}: nothing could be established about the run", "unreachable"
        deadline = time.monotonic() + self.settle_s
        while True:
            status = _job_status(ctx, ev["job_id"])
            reports = [e for e in ctx.timeline.of("report") if e.t > back.t]
            if reports:
                return "continued", (f"the run continued: step {reports[0].data.get('step')} reported "
                                     f"{reports[0].t - inj.t:.1f} s after the fault, no new attempt"), status
            if status == "unknown to the head":
                why = ("no GCS fault tolerance" if not head.gcs_ft else
                       "the GCS lost its tables although fault tolerance is on (Redis without them?)")
                return "cluster-lost", (f"cluster lost: {why} — the head came back with a GCS that does not know "
                                        f"job {ev['job_id']}; the run is gone"), status
            driver = ev["driver_pid"]
            alive = None if driver is None else head.driver_alive(driver)
            if head.gcs_ft and alive is False:  # nothing can go on with the run: its driver is gone
                return "driver-lost", (f"run lost with its driver: the job's driver (pid {driver}) and the Train "
                                       "controller ran on the head and died with it; GCS fault tolerance kept the "
                                       f"cluster; the Jobs API says {status}"), status
            if time.monotonic() >= deadline + self.back_timeout_s:
                return None, (f"no outcome within {self.settle_s + self.back_timeout_s:.0f} s of the head's return: "
                              f"no report, driver {'unknown' if driver is None else f'pid {driver}'} "
                              f"{'alive' if alive else 'gone' if alive is False else 'unknown'}, job {status}"), status
            try:  # the next look: as soon as a report arrives, or in a second
                ctx.timeline.wait_for(lambda events: any(e.kind == "report" and e.t > back.t for e in events), 1.0,
                                      "a report after the head's return")
            except WaitTimeout:
                pass

    def _wait_workers_replaced(self, ctx: FaultContext, ev: dict) -> None:
        """A new GCS: every worker node re-registers under a new id once it gives up on the old
        one; wait until as many are alive as before, none under an old id (else the verdict
        says what was seen)."""
        before = ev["workers_before"]

        def replaced():
            now = {n.node_id for n in _alive_workers(ctx)}
            return (len(now) >= len(before) and not now & set(before)) or None, f"alive workers {sorted(now)}"

        try:
            poll_until(replaced, self.replaced_timeout_s, f"{len(before)} worker nodes to re-join under new node ids")
        except WaitTimeout:
            pass


class GcsKill(HeadFault, Fault):
    kind = "gcs-kill"
    verb = "SIGKILL of the GCS server (the head's `ray start` then stops the rest of the head)"

    def act(self, head) -> str:
        return head.kill_gcs()


class HeadReboot(HeadFault, Fault):
    kind = "head-reboot"
    verb = "every process of the head killed at once (its machine power-cycled)"

    def act(self, head) -> str:
        return head.power_cycle()


class RedisRestart(HeadFault, Fault):
    kind = "redis-restart"
    verb = "the GCS's Redis SIGKILLed and started again on its data (the GCS exits when Redis drops)"

    def act(self, head) -> str:
        if not head.gcs_ft:
            raise InjectionError("redis-restart: this cluster runs without GCS fault tolerance: there is no Redis")
        return head.restart_redis()


# -- facts over HTTP -----------------------------------------------------------------------
def _current_job(events: list[Event]) -> str | None:
    return next((e.data.get("job_id") for e in reversed(events) if e.kind == "job_submitted"), None)


def _jobs(ctx: FaultContext):
    from ray.job_submission import JobSubmissionClient  # HTTP only: no driver

    return JobSubmissionClient(ctx.cluster.dashboard_url)


def _driver_pid(ctx: FaultContext, job: str | None) -> int | None:
    """The PID of the job's driver as the Jobs API reports it (the PID on its own node)."""
    if job is None:
        return None
    try:
        info = _jobs(ctx).get_job_info(job)
    except Exception:  # noqa: BLE001 - the Jobs API raises RuntimeError and requests errors
        return None
    pid = getattr(info, "driver_info", None) and info.driver_info.pid
    return int(pid) if pid else None


def _job_status(ctx: FaultContext, job: str | None) -> str:
    try:
        return str(_jobs(ctx).get_job_status(job).value)
    except RuntimeError as err:
        return "unknown to the head" if "does not exist" in str(err) else f"unreachable: {err}"
    except Exception as err:  # noqa: BLE001 - connection errors while the head is away
        return f"unreachable: {type(err).__name__}"


def _alive_workers(ctx: FaultContext):
    try:
        return ctx.cluster.alive_workers()
    except Exception:  # noqa: BLE001 - the head away again: none seen
        return []
