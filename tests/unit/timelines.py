"""Recorded-timeline builders for verdict tests: what the recorder and faults emit."""

from chaos.timeline import Event, Timeline


class Script:
    """Builds a timeline the way a run produces it, one event at a time."""

    def __init__(self, max_failures=3, step_metric="step", state_metric=None, ranks=2):
        self.t = 1000.0
        self.events = []
        self.ranks = ranks
        self.faults = 0
        self.max_failures = max_failures
        self.step_metric = step_metric
        self.state_metric = state_metric
        self.new_run()

    def new_run(self, run_id=None):
        """A second ``fit()`` in the same driver: a new controller, attempts from 0."""
        self.run_id = run_id or f"run{sum(e.kind == 'controller_started' for e in self.events) + 1}"
        self.attempt = -1
        self.failures = {}
        self.events.append(self._e("recorder", "controller_started", run_name="r", step_metric=self.step_metric,
                                   step_metric_names=[self.step_metric], state_metric=self.state_metric,
                                   failure_config={"max_failures": self.max_failures, "max_preemption_failures": -1,
                                                   "controller_failure_limit": -1}))
        return self

    def _e(self, source, kind, dt=0.5, **data):
        self.t += dt
        if source == "recorder":
            data = {"run_id": self.run_id, **data}
        return Event(self.t, source, kind, data)

    def start_attempt(self, dt=1.0):
        self.attempt += 1
        self.events.append(self._e("recorder", "attempt_started", dt, attempt=self.attempt,
                                   placement=[{"rank": r, "node_id": f"n{r}", "node_ip": f"127.0.1.{r + 2}", "pid": r + 1}
                                              for r in range(self.ranks)]))
        return self

    def report(self, steps, checkpoint=None, states=None, sources=None, metrics=None, persisted=True):
        """One report round: ``steps`` is {rank: step} (None: the rank reported no step);
        ``metrics``: what rank 0 reported.  A checkpoint is persisted by rank 0 in the same
        poll, as the recorder sees it when every rank reports at once (``persisted=False``: it
        was, earlier, with ``persist``)."""
        steps = {str(r): s for r, s in steps.items()}
        if checkpoint and persisted:
            self.persist(checkpoint, steps.get("0"), dt=0.0)
        self.events.append(self._e(
            "recorder", "report", attempt=self.attempt, steps=steps, step=steps.get("0"),
            step_sources=sources or {r: ("metric" if s is not None else None) for r, s in steps.items()},
            states={str(r): v for r, v in states.items()} if states else None,
            checkpoint=checkpoint, metrics=metrics or {}))
        return self

    def persist(self, checkpoint, step, rank=0, dt=0.5):
        """A rank's report with ``checkpoint`` reached the controller (on storage, not yet committed)."""
        self.events.append(self._e("recorder", "checkpoint_persisted", dt, attempt=self.attempt, rank=rank, step=step,
                                   checkpoint=checkpoint))
        return self

    def steps(self, first, last, every=5, metric=True, stride=1, rank_step=None, state=None):
        """Reports for steps first..last (by ``stride``); a checkpoint at every multiple of ``every``
        (None: never).  ``rank_step(rank, step)`` lets a rank report another step;
        ``state(rank, step)`` adds a state value (e.g. loss)."""
        for s in range(first, last + 1, stride):
            ck = f"/storage/checkpoint_{s}" if every and s % every == 0 else None
            steps = {r: ((rank_step(r, s) if rank_step else s) if metric else None) for r in range(self.ranks)}
            states = {r: state(r, s) for r in range(self.ranks)} if state else None
            self.report(steps, ck, states)
        return self

    def fault(self, node_id="n1", detect=1.5, kind="raylet-kill"):
        self.faults += 1
        ledger_id = f"f{self.faults}"
        self.events.append(self._e("fault", "fault_injected", fault=kind, ledger_id=ledger_id,
                                   target={"node_id": node_id, "node_ip": "127.0.1.3"}))
        self.events.append(self._e("cluster", "node_dead", detect, node_id=node_id))
        self.events.append(Event(self.t, "fault", "fault_detected", {"ledger_id": ledger_id, "by": "node_dead"}))
        return self

    def preemption(self, node_id="n1", window_s=8.0, via="drain"):
        """A preemption's notice; the node goes with ``gone()`` (reports may come between)."""
        self.faults += 1
        self.events.append(self._e("fault", "fault_injected", fault="preempt", ledger_id=f"f{self.faults}",
                                   target={"node_id": node_id, "node_ip": "127.0.1.3"}))
        self.events.append(Event(self.t, "fault", "preemption_notice",
                                 {"node_id": node_id, "ledger_id": f"f{self.faults}", "via": via,
                                  "window_s": window_s, "deadline": self.t + window_s}))
        return self

    def gone(self, node_id="n1", after=1.0, reason="Terminated due to preemption: chaos"):
        self.events.append(self._e("cluster", "node_dead", after, node_id=node_id, death_reason=reason))
        self.events.append(Event(self.t, "fault", "fault_detected", {"ledger_id": f"f{self.faults}", "by": "node_dead"}))
        return self

    def xid(self, xid=79, node="hyperpod-a", agent_after=None, back_after=None, agent_slo_s=60.0, recover_slo_s=600.0,
            action="replace"):
        """An xid fault: the kernel-log line, then the node agent's action ``agent_after`` s later
        (None: the agent stayed silent past its SLO) and the node back ``back_after`` s after that
        (None: not seen; events come as the chain watch emits them, with the harness's time)."""
        self.faults += 1
        lid = f"f{self.faults}"
        self.events.append(self._e("fault", "fault_injected", fault="xid", ledger_id=lid,
                                   target={"node_id": "n1", "node_ip": "127.0.1.3"}))
        t0 = self.t
        self.events.append(Event(t0, "fault", "xid_logged", {"ledger_id": lid, "xid": xid, "node": node,
                                                             "line": f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=2",
                                                             "agent_slo_s": agent_slo_s,
                                                             "recover_slo_s": recover_slo_s}))
        if agent_after is None:
            self.events.append(Event(t0 + agent_slo_s, "fault", "node_agent_silent",
                                     {"ledger_id": lid, "node": node, "xid": xid, "waited_s": agent_slo_s,
                                      "seen": f"node {node} still Schedulable"}))
        else:
            self.events.append(Event(t0 + agent_after, "fault", "node_agent_acted",
                                     {"ledger_id": lid, "node": node, "xid": xid,
                                      "condition": {"type": "NvidiaErrorReplace", "reason": "XidHardwareFailure"},
                                      "label": "sagemaker.amazonaws.com/node-health-status="
                                               "UnschedulablePendingReplacement"}))
            if back_after is not None:
                self.events.append(Event(t0 + agent_after + back_after, "fault", "node_recovered",
                                         {"ledger_id": lid, "node": node, "action": action, "node_after": "hyperpod-b",
                                          "boot_id_before": "b1", "boot_id_after": "b2"}))
        self.events.sort(key=lambda e: e.t)
        return self

    def at(self, t):
        """Move the script's clock to ``t`` (events after the chain's)."""
        self.t = max(self.t, t)
        return self

    def decision(self, decision="RETRY", budget_class="worker_group", limit=3, error="rank 1 died",
                 error_types=("WorkerGroupError", "ActorDiedError")):
        self.failures[budget_class] = self.failures.get(budget_class, 0) + 1
        self.events.append(self._e("recorder", "failure_decision", attempt=self.attempt, decision=decision,
                                   budget_class=budget_class, count=self.failures[budget_class], limit=limit,
                                   line=f"[FailurePolicy] {decision}", error=error, error_types=list(error_types)))
        return self

    def worker_error(self, errors, dt=0.1):
        """The attempt's first poll that carried errors, as the recorder emits it: ``errors`` is
        {rank: "Type: message"} (the decision that follows is the attempt's failure)."""
        self.events.append(self._e("recorder", "worker_error", dt, attempt=self.attempt,
                                   errors={str(r): m for r, m in errors.items()}))
        return self

    def rank_fault(self, kind="cuda", rank=1):
        """A fault inside one rank's process that leaves its node up (a CUDA error or hang): its
        target as the experiment records it (the rank's node, IP, rank and pid in this attempt)."""
        self.faults += 1
        self.events.append(self._e("fault", "fault_injected", fault=kind, ledger_id=f"f{self.faults}",
                                   target={"node_id": f"n{rank}", "node_ip": f"127.0.1.{rank + 2}", "rank": rank,
                                           "pid": rank + 1, "host": None}))
        return self

    def finish(self, state="FINISHED", job="SUCCEEDED"):
        self.events.append(self._e("recorder", "run_finished", state=state))
        self.events.append(self._e("harness", "job_finished",
                                   status=job if state == "FINISHED" else "FAILED"))
        return self

    def timeline(self):
        return Timeline(sorted(self.events, key=lambda e: e.t))  # an xid chain's events land ahead of the clock


class Recorded:
    """A run as the recorder makes it of Ray Train's hook calls (chaos.train.recording fed
    facts, as the recorder callback hands them over): for shapes whose events depend on what
    the recorder makes of a report (a step-less checkpoint, a string step, a NaN loss)."""

    def __init__(self, ranks=2, step_metric="auto", state_metric="auto", max_failures=3):
        from chaos.train.recording import Recording

        self.events, self.harness, self.t, self.ranks = [], [], 1000.0, ranks
        self.max_failures = max_failures
        self.recording = Recording(step_metric, state_metric, self.events.append)
        self.take("controller_started", run_id="run1", run_name="r", storage_path="/storage", num_workers=ranks,
                  failure_config={"max_failures": max_failures})

    def take(self, hook, dt=0.5, **facts):
        self.t += dt
        self.recording.take(hook, self.t, facts)
        return self

    def start_attempt(self):
        return self.take("worker_group_started", 1.0, workers=[
            {"rank": r, "node_id": f"n{r}", "node_ip": f"127.0.1.{r + 2}", "pid": r + 1} for r in range(self.ranks)])

    def report(self, metrics, checkpoint=None):
        """One report round: every rank reports ``metrics`` (a dict, or a function of the rank)."""
        per_rank = [dict(metrics(r) if callable(metrics) else metrics) for r in range(self.ranks)]
        return self.take("reported", metrics=per_rank, checkpoint=checkpoint)

    def fault(self, node_id="n1"):
        """A raylet kill of rank 1's node, detected, and Ray's decision to retry."""
        self.t += 0.5
        self.harness += [Event(self.t, "fault", "fault_injected", {
                             "fault": "raylet-kill", "ledger_id": "f1", "detect_by": "node",
                             "target": {"node_id": node_id, "node_ip": "127.0.1.3"}}),
                         Event(self.t + 1, "cluster", "node_dead", {"node_id": node_id}),
                         Event(self.t + 1, "fault", "fault_detected", {"ledger_id": "f1", "by": "node_dead"})]
        self.t += 1.5
        self.take("policy_logged", message=f"[FailurePolicy] RETRY Source: worker group Error count: 1 (max allowed: "
                                           f"{self.max_failures})\nError: rank 1 died",
                  error_types=["WorkerGroupError", "ActorDiedError"])
        return self.take("failure_decision", decision="RETRY")

    def finish(self):
        self.take("state_changed", prev="RUNNING", cur="FINISHED", terminal=True, error=None)
        self.take("controller_finished", error=None)
        self.harness.append(Event(self.t + 0.5, "harness", "job_finished", {"status": "SUCCEEDED"}))
        return self

    def timeline(self):
        return Timeline([*(Event.from_json(e) for e in self.events), *self.harness])


# -- runs the verdict tests share ---------------------------------------------------------
def good_run():
    return (Script().start_attempt().steps(1, 12).fault().decision()
            .start_attempt().steps(11, 20).finish())


def train_loss(rank, step):
    """A deterministic training loss per (rank, step)."""
    return 10.0 / step + rank


def evaluated_or_retrained(before_fault, first_step_after, every_after=5, state_after=train_loss):
    """Steps 1..``before_fault`` (a checkpoint every 5th), the fault, then an attempt whose
    first report is step 10 — the checkpoint's own step — with an evaluation's value, and
    steps ``first_step_after``.. trained with ``state_after``."""
    s = Script().start_attempt().steps(1, before_fault, state=train_loss).fault().decision().start_attempt()
    s.report({0: 10, 1: 10}, states={0: 99.0, 1: 99.0})
    return s.steps(first_step_after, 20, every=every_after, state=state_after).finish().timeline()


def loss(r, s):
    """A loss per (rank, step)."""
    return 1.0 / s + r
