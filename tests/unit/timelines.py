"""Recorded-timeline builders for verdict tests: what the recorder and faults emit."""

from chaos.timeline import Event, Timeline


class Script:
    """Builds a timeline the way a run produces it, one event at a time."""

    def __init__(self, max_failures=3, step_metric="step"):
        self.t = 1000.0
        self.events = [self._e("recorder", "controller_started", run_name="r", step_metric=step_metric,
                               failure_config={"max_failures": max_failures, "max_preemption_failures": -1,
                                               "controller_failure_limit": -1})]
        self.attempt = -1
        self.failures = {}

    def _e(self, source, kind, dt=0.5, **data):
        self.t += dt
        return Event(self.t, source, kind, data)

    def start_attempt(self, dt=1.0):
        self.attempt += 1
        self.events.append(self._e("recorder", "attempt_started", dt, attempt=self.attempt,
                                   placement=[{"rank": 0, "node_id": "n0", "node_ip": "127.0.1.2", "pid": 1},
                                              {"rank": 1, "node_id": "n1", "node_ip": "127.0.1.3", "pid": 2}]))
        return self

    def steps(self, first, last, every=5, metric=True):
        for s in range(first, last + 1):
            ck = f"/storage/checkpoint_{s}" if s % every == 0 else None
            self.events.append(self._e("recorder", "report", attempt=self.attempt, step=s if metric else None,
                                       checkpoint=ck, metrics={"step": s} if metric else {}))
        return self

    def fault(self, node_id="n1", detect=1.5):
        self.events.append(self._e("fault", "fault_injected", fault="raylet-kill",
                                   target={"node_id": node_id, "node_ip": "127.0.1.3"}))
        self.events.append(self._e("cluster", "node_dead", detect, node_id=node_id))
        return self

    def decision(self, decision="RETRY", budget_class="worker_group", limit=3):
        self.failures[budget_class] = self.failures.get(budget_class, 0) + 1
        self.events.append(self._e("recorder", "failure_decision", attempt=self.attempt, decision=decision,
                                   budget_class=budget_class, count=self.failures[budget_class], limit=limit,
                                   line=f"[FailurePolicy] {decision}"))
        return self

    def finish(self, state="FINISHED"):
        self.events.append(self._e("recorder", "run_finished", state=state))
        self.events.append(self._e("harness", "job_finished", status="SUCCEEDED" if state == "FINISHED" else "FAILED"))
        return self

    def timeline(self):
        return Timeline(self.events)
