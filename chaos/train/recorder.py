"""The recorder: a Ray Train callback injected into the run under test.

This is the ONLY module that touches Ray Train internals (``ray.train.v2._internal``).
tests/test_recorder_contract.py fails loudly if the pinned Ray changes any of them.

It is switched on with ``RAY_TRAIN_CALLBACKS=chaos.train.recorder.Recorder`` in the
job's runtime_env, so the user's script is not changed.  Ray builds it in the driver
and ships it (pickled) to the Train controller, where all hooks run; so the sink handle
and the log handler are set up lazily, in the controller.

The budget class and count of each failure decision are Ray's own: the recorder reads
the ``[FailurePolicy]`` record that Ray's DefaultFailurePolicy logs for every decision,
instead of re-deriving the accounting.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

from ray.train.v2._internal.execution.callback import (
    ControllerCallback,
    ReportCallback,
    WorkerGroupCallback,
)

from chaos.train.sink import ENV_SINK, NAMESPACE

ENV_STEP_METRIC = "RAY_CHAOS_STEP_METRIC"
FAILURE_POLICY_LOGGER = "ray.train.v2._internal.execution.failure_handling.default"
_DECISION_RE = re.compile(
    r"\[FailurePolicy\]\s+(?P<decision>\w+)\s+Source:\s+(?P<source>[\w ]+?)\s+"
    r"Error count:\s+(?P<count>\d+)\s+\(max allowed:\s+(?P<limit>[\w.]+)\)"
)
BUDGET_CLASS = {"worker group": "worker_group", "preemption": "preemption", "controller": "controller"}


def parse_failure_policy_line(message: str) -> dict | None:
    """Parse Ray's ``[FailurePolicy]`` log message into decision / class / count / limit."""
    m = _DECISION_RE.search(message)
    if not m:
        return None
    limit = m["limit"]
    return {
        "decision": m["decision"],
        "budget_class": BUDGET_CLASS.get(m["source"].strip(), m["source"].strip()),
        "count": int(m["count"]),
        "limit": None if limit == "inf" else int(float(limit)),
        "line": message.split("\nError:", 1)[0].strip(),
        "error": message.split("\nError:", 1)[1].strip()[:2000] if "\nError:" in message else "",
    }


class _PolicyLogHandler(logging.Handler):
    def __init__(self, recorder: "Recorder"):
        super().__init__(level=logging.INFO)
        self._recorder = recorder

    def emit(self, record: logging.LogRecord) -> None:
        parsed = parse_failure_policy_line(record.getMessage())
        if parsed:
            self._recorder._pending_decision = parsed


def _scalar_metrics(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool)) or v is None}


class Recorder(ControllerCallback, WorkerGroupCallback, ReportCallback):
    def __init__(self):
        self._sink_name = os.environ.get(ENV_SINK)
        self._step_metric = os.environ.get(ENV_STEP_METRIC, "step")
        self._sink = None
        self._attempt = -1
        self._errors_reported_for = -2
        self._pending_decision: dict | None = None
        self._final_state: str | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_sink"] = None
        return state

    # -- plumbing ----------------------------------------------------------------
    def _emit(self, kind: str, **data: Any) -> None:
        event = {"t": time.time(), "source": "recorder", "kind": kind, "data": data}
        if not self._sink_name:
            return
        try:
            if self._sink is None:
                import ray

                self._sink = ray.get_actor(self._sink_name, namespace=NAMESPACE)
            self._sink.push.remote(event)
        except Exception as e:  # never break the user's run because the harness went away
            logging.getLogger(__name__).warning("ray-chaos recorder could not send %s: %s", kind, e)

    # -- controller hooks --------------------------------------------------------
    def after_controller_start(self, train_run_context) -> None:
        policy_logger = logging.getLogger(FAILURE_POLICY_LOGGER)
        if policy_logger.getEffectiveLevel() > logging.INFO:
            policy_logger.setLevel(logging.INFO)
        policy_logger.addHandler(_PolicyLogHandler(self))
        run_config = train_run_context.run_config
        fc = run_config.failure_config
        self._emit(
            "controller_started",
            run_name=run_config.name,
            storage_path=run_config.storage_path,
            num_workers=getattr(train_run_context.scaling_config, "num_workers", None),
            step_metric=self._step_metric,
            failure_config={
                "max_failures": fc.max_failures,
                "max_preemption_failures": fc.max_preemption_failures,
                "controller_failure_limit": fc.controller_failure_limit,
            },
        )

    def after_controller_state_update(self, previous_state, current_state) -> None:
        cur = current_state._state_type.name
        data = {"prev": previous_state._state_type.name, "cur": cur}
        error = getattr(current_state, "training_failed_error", None)
        if error is not None:
            data["error"] = str(error)[:2000]
        if current_state.is_terminal():
            self._final_state = cur
        self._emit("state_changed", **data)

    def before_controller_execute_failure_decision(self, failure_decision) -> None:
        parsed, self._pending_decision = self._pending_decision, None
        data = {"attempt": self._attempt, "decision": failure_decision.value}
        if parsed:
            data.update({k: parsed[k] for k in ("budget_class", "count", "limit", "line", "error")})
        self._emit("failure_decision", **data)

    def after_controller_finish(self, result) -> None:
        error = getattr(result, "error", None)
        self._emit("run_finished", state=self._final_state or ("ERRORED" if error else "FINISHED"),
                   error=str(error)[:4000] if error else None)

    # -- worker group hooks ------------------------------------------------------
    def after_worker_group_start(self, worker_group) -> None:
        self._attempt += 1
        placement = []
        for w in worker_group.get_workers():
            dc = w.distributed_context
            placement.append({
                "rank": dc.world_rank if dc else None,
                "local_rank": dc.local_rank if dc else None,
                "node_id": w.metadata.node_id,
                "node_ip": w.metadata.node_ip,
                "hostname": w.metadata.hostname,
                "pid": w.metadata.pid,
            })
        self._emit("attempt_started", attempt=self._attempt, placement=placement)

    def after_worker_group_poll_status(self, worker_group_status) -> None:
        errors = worker_group_status.errors
        if errors and self._errors_reported_for != self._attempt:
            self._errors_reported_for = self._attempt
            self._emit("worker_error", attempt=self._attempt,
                       errors={str(rank): f"{type(e).__name__}: {e}"[:2000] for rank, e in errors.items()})

    # -- report hook -------------------------------------------------------------
    def after_report(self, training_report, metrics) -> None:
        rank0 = metrics[0] if metrics else {}
        step = rank0.get(self._step_metric)
        checkpoint = training_report.checkpoint
        self._emit(
            "report",
            attempt=self._attempt,
            step=step if isinstance(step, (int, float)) else None,
            checkpoint=checkpoint.path if checkpoint is not None else None,
            metrics=_scalar_metrics(rank0),
        )
