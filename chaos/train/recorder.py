"""The recorder: a Ray Train callback injected into the run under test.

This is the ONLY module that touches Ray Train internals (``ray.train.v2._internal``).
tests/unit/test_ray_contracts.py fails loudly if the pinned Ray changes any of them.

It is switched on with ``RAY_TRAIN_CALLBACKS=chaos.train.recorder.Recorder`` in the
job's runtime_env, so the user's script is not changed.  Ray builds it in the driver
and ships it (pickled) to the Train controller, where all hooks run; so the events log
(under the controller node's Ray logs directory) and the log handler are set up lazily, in
the controller.

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
from chaos.train.channel import (CHUNK_LINES, ENV_EVENTS_LOG, ENV_STATE_METRIC, ENV_STEP_METRIC, EVENTS_LOG_DIR,
                                 chunk_name)
from chaos.train.recording import Recording
from chaos.train.tape import ENV_TAPE_FILE, TapeWriter

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


def elastic_range(scaling_config) -> dict | None:
    """An elastic run's worker range and resize interval (None for a fixed group)."""
    if not getattr(scaling_config, "elasticity_enabled", False):
        return None
    return {"min_workers": scaling_config.min_workers, "max_workers": scaling_config.max_workers,
            "resize_interval_s": scaling_config.elastic_resize_monitor_interval_s}


def node_logs_dir() -> str:
    """The Ray logs directory of the node this process runs on (no public API says it)."""
    import ray._private.worker

    return ray._private.worker.global_worker.node.get_logs_dir_path()


def events_log_dir(name: str) -> str:
    """Where the recorder writes the events of a run whose events log is called ``name``."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"{ENV_EVENTS_LOG}={name!r}: a plain file name is needed")
    directory = os.path.join(node_logs_dir(), EVENTS_LOG_DIR, name)
    os.makedirs(directory, exist_ok=True)
    return directory


class EventsLogWriter:
    """Appends events as JSON lines, CHUNK_LINES to a file, one write per line (a reader
    never sees half of one, and a file with CHUNK_LINES lines is complete), each on disk
    before the next (fsync): a head power-cycled under a head fault keeps its logs directory,
    and without it would lose the last seconds of events — a committed checkpoint among them —
    from a file that then reads as complete.

    Each line carries ``seq``, its place in the log, spent even when the write fails (a full
    disk): the reader names any number missing (``events_lost``) instead of judging the run
    on what is left.  A later ``fit()`` of the same job (a new controller, a new writer)
    continues the log where the earlier one left it."""

    def __init__(self, directory: str):
        self.directory = directory
        self._index, self._lines, self._seq = self._end_of_log()

    def _end_of_log(self) -> tuple[int, int, int]:
        """The file being filled, its lines, and the next seq, from what is on disk."""
        index = 0
        while os.path.exists(os.path.join(self.directory, chunk_name(index + 1))):
            index += 1
        seq = 0
        for i in range(index, -1, -1):  # the last complete line of the log says where it is
            try:
                with open(os.path.join(self.directory, chunk_name(i)), "rb") as f:
                    lines = f.read().split(b"\n")[:-1]
            except FileNotFoundError:
                lines = []
            if i == index:
                count = len(lines)
            if lines:
                seq = json.loads(lines[-1])["seq"] + 1
                break
        return index, count, seq

    def append(self, event: dict) -> None:
        if self._lines == CHUNK_LINES:
            self._index, self._lines = self._index + 1, 0
        seq, self._seq = self._seq, self._seq + 1
        try:
            with open(os.path.join(self.directory, chunk_name(self._index)), "a") as out:
                out.write(json.dumps({"seq": seq, **event}, default=str) + "\n")
                out.flush()
                self._lines += 1  # in the file now, on disk or not
                os.fsync(out.fileno())
        except OSError as e:
            logging.getLogger(__name__).warning("ray-chaos recorder could not write event %d to %s: %s",
                                                seq, self.directory, e)


class Recorder(ControllerCallback, WorkerGroupCallback, ReportCallback):
    def __init__(self):
        self._events_log = os.environ.get(ENV_EVENTS_LOG)
        self._events_writer: EventsLogWriter | None = None  # made in the controller, where the hooks run
        self._tape_file = os.environ.get(ENV_TAPE_FILE)
        self._settings = {"step_metric": os.environ.get(ENV_STEP_METRIC, "auto"),
                          "state_metric": os.environ.get(ENV_STATE_METRIC) or None}
        self._recording = Recording(self._settings["step_metric"], self._settings["state_metric"], self._deliver)
        self._tape: TapeWriter | None = None
        self._preempted: list[int] = []  # the last preempted ranks taped (only changes are facts)

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
        if self._events_log:
            if self._events_writer is None:
                try:
                    self._events_writer = EventsLogWriter(events_log_dir(self._events_log))
                except Exception as e:  # never break the user's run for the harness's sake
                    logging.getLogger(__name__).warning("ray-chaos recorder has no events log: %s", e)
                    self._events_log = None
            if self._events_writer is not None:
                self._events_writer.append(event)

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
                   elastic=elastic_range(train_run_context.scaling_config),
                   failure_config={**{f: getattr(fc, f) for f in BUDGET_LIMIT_FIELDS.values()},
                                   # absent before their Ray (make canary on 2.59 found a bare attribute)
                                   **{f: getattr(fc, f, absent) for f, absent in NEWER_FAILURE_CONFIG_FIELDS.items()}})

    def after_controller_state_update(self, previous_state, current_state) -> None:
        error = getattr(current_state, "training_failed_error", None)
        self._take("state_changed", prev=previous_state._state_type.name, cur=current_state._state_type.name,
                   terminal=current_state.is_terminal(), error=str(error)[:2000] if error is not None else None)

    def before_controller_execute_failure_decision(self, failure_decision) -> None:
        self._take("failure_decision", decision=failure_decision.value)

    def before_controller_execute_resize_decision(self, resize_decision) -> None:
        """Train's scaling policy sized the next worker group: at every start, and, for an
        elastic run, when a healthy group is replaced by a bigger (or smaller) one."""
        self._take("resize_decision", num_workers=resize_decision.num_workers)

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
