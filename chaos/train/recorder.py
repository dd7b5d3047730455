"""The recorder: a Ray Train callback injected into the run under test.

This is the ONLY module that touches Ray Train internals (``ray.train.v2._internal``).
tests/unit/test_ray_contracts.py fails loudly if the pinned Ray changes any of them.

It is switched on with ``RAY_TRAIN_CALLBACKS=chaos.train.recorder.Recorder`` in the
job's runtime_env, so the user's script is not changed.  Ray builds it in the driver
and ships it (pickled) to the Train controller, where all hooks run; so the sink handle
and the log handler are set up lazily, in the controller.

Each hook only reads the facts it needs from Ray's objects into plain data and hands
them to ``chaos.train.recording.Recording``, which turns them into timeline events; with
``RAY_CHAOS_TAPE_FILE`` set the facts are also taped (``chaos.train.tape``) for replay.

The budget class and count of each failure decision are Ray's own: the recorder reads
the ``[FailurePolicy]`` record that Ray's DefaultFailurePolicy logs for every decision,
instead of re-deriving the accounting.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid

from ray.train.v2._internal.execution.callback import (
    ControllerCallback,
    ReportCallback,
    WorkerGroupCallback,
)

from chaos.faults.catalog import BUDGET_LIMIT_FIELDS, NEWER_FAILURE_CONFIG_FIELDS
from chaos.train.recording import Recording
from chaos.train.sink import ENV_SINK, NAMESPACE
from chaos.train.tape import ENV_TAPE_FILE, TapeWriter

ENV_STEP_METRIC = "RAY_CHAOS_STEP_METRIC"  # "auto", or comma-separated metric names tried in order
ENV_EVENTS_FILE = "RAY_CHAOS_EVENTS_FILE"  # also append every event here (JSON lines; see _deliver)
ENV_STATE_METRIC = "RAY_CHAOS_STATE_METRIC"  # a per-step value a correct restore reproduces (e.g. loss)
FAILURE_POLICY_LOGGER = "ray.train.v2._internal.execution.failure_handling.default"


class _PolicyLogHandler(logging.Handler):
    def __init__(self, recorder: "Recorder"):
        super().__init__(level=logging.INFO)
        self._recorder = recorder

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "[FailurePolicy]" in message:
            self._recorder._take("policy_logged", message=message,
                                 error_types=error_types(record.exc_info[1] if record.exc_info else None))


def error_types(error: BaseException | None) -> list[str]:
    """The failure's class and its causes' classes (a ControllerError's controller failure, a
    WorkerGroupError's per-rank errors): what attributes a decision to a fault."""
    if error is None:
        return []
    causes = [getattr(error, "controller_failure", None),
              *(getattr(error, "worker_failures", None) or {}).values()]
    return [type(error).__name__, *sorted({type(c).__name__ for c in causes if c is not None})]


class Recorder(ControllerCallback, WorkerGroupCallback, ReportCallback):
    def __init__(self):
        self._sink_name = os.environ.get(ENV_SINK)
        self._events_file = os.environ.get(ENV_EVENTS_FILE)
        self._tape_file = os.environ.get(ENV_TAPE_FILE)
        self._settings = {"step_metric": os.environ.get(ENV_STEP_METRIC, "auto"),
                          "state_metric": os.environ.get(ENV_STATE_METRIC) or None}
        self._recording = Recording(self._settings["step_metric"], self._settings["state_metric"], self._deliver)
        self._sink = None
        self._tape: TapeWriter | None = None
        self._preempted: list[int] = []  # the last preempted ranks taped (only changes are facts)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_sink"] = None
        return state

    # -- plumbing ----------------------------------------------------------------
    def _take(self, hook: str, **facts) -> None:
        t = time.time()
        if self._tape_file:
            if self._tape is None:
                import ray

                self._tape = TapeWriter(self._tape_file, {"ray": ray.__version__, **self._settings})
            self._tape.write(t, hook, facts)
        self._recording.take(hook, t, facts)

    def _deliver(self, event: dict) -> None:
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
            logging.getLogger(__name__).warning("ray-chaos recorder could not send %s: %s", event["kind"], e)

    # -- controller hooks --------------------------------------------------------
    def after_controller_start(self, train_run_context) -> None:
        policy_logger = logging.getLogger(FAILURE_POLICY_LOGGER)
        if policy_logger.getEffectiveLevel() > logging.INFO:
            policy_logger.setLevel(logging.INFO)
        policy_logger.addHandler(_PolicyLogHandler(self))
        run_config = train_run_context.run_config
        fc = run_config.failure_config
        self._take("controller_started",
                   run_id=getattr(train_run_context, "run_id", None) or uuid.uuid4().hex,
                   run_name=run_config.name, storage_path=run_config.storage_path,
                   num_workers=getattr(train_run_context.scaling_config, "num_workers", None),
                   failure_config={**{f: getattr(fc, f) for f in BUDGET_LIMIT_FIELDS.values()},
                                   # absent before their Ray (make canary on 2.59 found a bare attribute)
                                   **{f: getattr(fc, f, absent) for f, absent in NEWER_FAILURE_CONFIG_FIELDS.items()}})

    def after_controller_state_update(self, previous_state, current_state) -> None:
        error = getattr(current_state, "training_failed_error", None)
        self._take("state_changed", prev=previous_state._state_type.name, cur=current_state._state_type.name,
                   terminal=current_state.is_terminal(), error=str(error)[:2000] if error is not None else None)

    def before_controller_execute_failure_decision(self, failure_decision) -> None:
        self._take("failure_decision", decision=failure_decision.value)

    def after_controller_finish(self, result) -> None:
        error = getattr(result, "error", None)
        self._take("controller_finished", error=str(error)[:4000] if error else None)

    # -- worker group hooks ------------------------------------------------------
    def after_worker_group_start(self, worker_group) -> None:
        workers = []
        for w in worker_group.get_workers():
            dc = w.distributed_context
            workers.append({"rank": dc.world_rank if dc else None, "local_rank": dc.local_rank if dc else None,
                            "node_id": w.metadata.node_id, "node_ip": w.metadata.node_ip,
                            "hostname": w.metadata.hostname, "pid": w.metadata.pid})
        self._take("worker_group_started", workers=workers)

    def after_worker_group_poll_status(self, worker_group_status) -> None:
        errors = worker_group_status.errors
        if errors:  # every poll tick calls this; only the ones with errors are facts worth taping
            self._take("poll_errors", errors={str(rank): f"{type(e).__name__}: {e}"[:2000] for rank, e in errors.items()})
        # Which ranks Train's preemption watcher says are going: with
        # relax_collectives_on_preemption, Ray then commits the survivors' reports alone.
        info = worker_group_status.get_preemption_info()
        preempted = sorted(info.preempted_ranks) if info is not None else []
        if preempted != self._preempted:
            self._preempted = preempted
            self._take("poll_preemption", preempted_ranks=preempted)
        # A rank's report reaches the controller in one poll, after the rank persisted its
        # checkpoint to storage and before Ray commits it (when every rank has reported).
        persisted = {str(rank): {"checkpoint": status.training_report.checkpoint.path,
                                 "metrics": dict(status.training_report.metrics or {})}
                     for rank, status in worker_group_status.worker_statuses.items()
                     if status.training_report is not None and status.training_report.checkpoint is not None}
        if persisted:
            self._take("poll_checkpoints", reports=persisted)

    # -- report hook -------------------------------------------------------------
    def after_report(self, training_report, metrics) -> None:
        checkpoint = training_report.checkpoint
        self._take("reported", checkpoint=checkpoint.path if checkpoint is not None else None,
                   metrics=[dict(m or {}) for m in metrics])
