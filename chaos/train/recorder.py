"""The recorder: a Ray Train callback injected into the run under test.

This is the ONLY module that touches Ray Train internals (``ray.train.v2._internal``).
tests/unit/test_ray_contracts.py fails loudly if the pinned Ray changes any of them.

It is switched on with ``RAY_TRAIN_CALLBACKS=chaos.train.recorder.Recorder`` in the
job's runtime_env, so the user's script is not changed.  Ray builds it in the driver
and ships it (pickled) to the Train controller, where all hooks run; so the sink handle
and the log handler are set up lazily, in the controller.

The budget class and count of each failure decision are Ray's own: the recorder reads
the ``[FailurePolicy]`` record that Ray's DefaultFailurePolicy logs for every decision,
instead of re-deriving the accounting.

Every rank's report is kept (a restart is judged per rank), and every event carries the
Train run it belongs to (a driver may call ``fit()`` more than once).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from typing import Any

from ray.train.v2._internal.execution.callback import (
    ControllerCallback,
    ReportCallback,
    WorkerGroupCallback,
)

from chaos.train.sink import ENV_SINK, NAMESPACE

ENV_STEP_METRIC = "RAY_CHAOS_STEP_METRIC"  # "auto", or comma-separated metric names tried in order
ENV_EVENTS_FILE = "RAY_CHAOS_EVENTS_FILE"  # also append every event here (JSON lines; see _emit)
ENV_STATE_METRIC = "RAY_CHAOS_STATE_METRIC"  # a per-step value a correct restore reproduces (e.g. loss)
# What ``auto`` tries, in order: Ray's own framework callbacks report "step" (Hugging Face
# Transformers: TrainerState.global_step through log_history; Lightning: trainer.global_step),
# then names other loops commonly count with.
AUTO_STEP_METRICS = ("step", "global_step", "training_iteration", "iteration")
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
            parsed["error_types"] = error_types(record.exc_info[1] if record.exc_info else None)
            self._recorder._pending_decision = parsed


def error_types(error: BaseException | None) -> list[str]:
    """The failure's class and its causes' classes (a ControllerError's controller failure, a
    WorkerGroupError's per-rank errors): what attributes a decision to a fault."""
    if error is None:
        return []
    causes = [getattr(error, "controller_failure", None),
              *(getattr(error, "worker_failures", None) or {}).values()]
    return [type(error).__name__, *sorted({type(c).__name__ for c in causes if c is not None})]


def _scalar_metrics(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool)) or v is None}


def as_number(value: Any) -> int | float | None:
    """A reported step or state value as a plain number: ints, floats, numpy/torch scalars
    (anything with ``.item()``); a whole float becomes an int.  Anything else is None."""
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return int(value) if value.is_integer() else value
    return int(value)


def step_metric_names(spec: str) -> tuple[str, ...]:
    """``auto`` -> AUTO_STEP_METRICS; ``"a,b"`` -> ("a", "b")."""
    names = tuple(n.strip() for n in (spec or "auto").split(",") if n.strip())
    if names in ((), ("auto",)):
        return AUTO_STEP_METRICS
    return tuple(n for name in names for n in (AUTO_STEP_METRICS if name == "auto" else (name,)))


class Recorder(ControllerCallback, WorkerGroupCallback, ReportCallback):
    def __init__(self):
        self._sink_name = os.environ.get(ENV_SINK)
        self._events_file = os.environ.get(ENV_EVENTS_FILE)
        self._step_metric_spec = os.environ.get(ENV_STEP_METRIC, "auto")
        self._step_names = step_metric_names(self._step_metric_spec)
        self._step_metric: str | None = None  # the first of _step_names a report carried
        self._state_metric = os.environ.get(ENV_STATE_METRIC) or None
        self._run_id = ""
        self._ranks: list = []  # world rank of each worker, in worker-group order
        self._last_step: dict = {}  # rank -> step it last reported in this attempt
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
        event = {"t": time.time(), "source": "recorder", "kind": kind, "data": {"run_id": self._run_id, **data}}
        if self._events_file:
            # The channel that outlives the head: a head-loss experiment has no Ray driver (its
            # connection would die with the head) and the controller is on this machine's disk.
            try:
                with open(self._events_file, "a") as out:
                    out.write(json.dumps(event, default=str) + "\n")
            except OSError as e:
                logging.getLogger(__name__).warning("ray-chaos recorder could not write %s: %s", self._events_file, e)
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
        self._run_id = getattr(train_run_context, "run_id", None) or uuid.uuid4().hex
        run_config = train_run_context.run_config
        fc = run_config.failure_config
        self._emit(
            "controller_started",
            run_name=run_config.name,
            storage_path=run_config.storage_path,
            num_workers=getattr(train_run_context.scaling_config, "num_workers", None),
            step_metric=self._step_metric_spec,
            step_metric_names=list(self._step_names),
            state_metric=self._state_metric,
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
        if data["prev"] != cur or error is not None:  # Ray re-enters RUNNING on every poll tick
            self._emit("state_changed", **data)

    def before_controller_execute_failure_decision(self, failure_decision) -> None:
        parsed, self._pending_decision = self._pending_decision, None
        data = {"attempt": self._attempt, "decision": failure_decision.value}
        if parsed:
            data.update({k: parsed[k] for k in ("budget_class", "count", "limit", "line", "error", "error_types")})
        self._emit("failure_decision", **data)

    def after_controller_finish(self, result) -> None:
        error = getattr(result, "error", None)
        self._emit("run_finished", state=self._final_state or ("ERRORED" if error else "FINISHED"),
                   error=str(error)[:4000] if error else None)

    # -- worker group hooks ------------------------------------------------------
    def after_worker_group_start(self, worker_group) -> None:
        self._attempt += 1
        self._last_step = {}
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
        self._ranks = [p["rank"] for p in placement]
        self._emit("attempt_started", attempt=self._attempt, placement=placement)

    def after_worker_group_poll_status(self, worker_group_status) -> None:
        errors = worker_group_status.errors
        if errors and self._errors_reported_for != self._attempt:
            self._errors_reported_for = self._attempt
            self._emit("worker_error", attempt=self._attempt,
                       errors={str(rank): f"{type(e).__name__}: {e}"[:2000] for rank, e in errors.items()})

    # -- report hook -------------------------------------------------------------
    def _step_of(self, metrics: dict) -> Any:
        if self._step_metric is None:
            self._step_metric = next((n for n in self._step_names if n in metrics), None)
        return metrics.get(self._step_metric) if self._step_metric else None

    def after_report(self, training_report, metrics) -> None:
        """One event per report round, with every rank's step (and state value)."""
        checkpoint = training_report.checkpoint
        ranks = self._ranks if len(self._ranks) == len(metrics) else list(range(len(metrics)))
        steps, sources, states = {}, {}, {}
        for rank, m in zip(ranks, metrics):
            m = m or {}
            step = as_number(self._step_of(m))
            source = "metric" if step is not None else None
            if step is None and checkpoint is not None and rank in self._last_step:
                step, source = self._last_step[rank], "last reported"
            if step is not None:
                self._last_step[rank] = step
            steps[str(rank)], sources[str(rank)] = step, source
            if self._state_metric:
                states[str(rank)] = as_number(m.get(self._state_metric))
        first = str(ranks[0]) if ranks else None
        self._emit(
            "report",
            attempt=self._attempt,
            step=steps.get(first),
            steps=steps,
            step_sources=sources,
            step_metric=self._step_metric,
            states=states or None,
            checkpoint=checkpoint.path if checkpoint is not None else None,
            metrics=_scalar_metrics(metrics[0] if metrics else {}),
        )
