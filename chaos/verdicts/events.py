"""The timeline's event kinds, and typed payloads for the events the verdicts read.

``chaos.timeline`` documents every kind; the payloads below are what the verdicts rely on,
validated once (pydantic) where a verdict reads them, so a recorder that stops writing a
field fails loudly here instead of turning a judgement into a guess.  Extra fields pass
through untouched.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from chaos.timeline import Event

Step = int | float


class EventKind(str, enum.Enum):
    # recorder (every one carries run_id)
    CONTROLLER_STARTED = "controller_started"
    STATE_CHANGED = "state_changed"
    ATTEMPT_STARTED = "attempt_started"
    RESIZE_DECISION = "resize_decision"
    REPORT = "report"
    CHECKPOINT_PERSISTED = "checkpoint_persisted"
    WORKER_ERROR = "worker_error"
    TRAIN_PREEMPTION_NOTICE = "train_preemption_notice"
    FAILURE_DECISION = "failure_decision"
    RUN_FINISHED = "run_finished"
    # faults
    FAULT_INJECTED = "fault_injected"
    FAULT_RETURNED = "fault_returned"
    FAULT_DETECTED = "fault_detected"
    FAULT_REVERTED = "fault_reverted"
    PREEMPTION_NOTICE = "preemption_notice"
    HEAD_LOSS = "head_loss"
    XID_LOGGED = "xid_logged"
    NODE_AGENT_ACTED = "node_agent_acted"
    NODE_AGENT_SILENT = "node_agent_silent"
    NODE_RECOVERED = "node_recovered"
    NODE_NOT_RECOVERED = "node_not_recovered"
    CHAIN_WATCH_FAILED = "chain_watch_failed"
    # cluster
    NODE_DEAD = "node_dead"
    NODE_ALIVE = "node_alive"
    HEAD_UNREACHABLE = "head_unreachable"
    HEAD_REACHABLE = "head_reachable"
    # harness
    JOB_SUBMITTED = "job_submitted"
    JOB_ABANDONED = "job_abandoned"
    JOB_FINISHED = "job_finished"
    EVENTS_UNREAD = "events_unread"
    EVENTS_LOST = "events_lost"
    CLOCK_OFFSET = "clock_offset"
    NODE_PREPARED = "node_prepared"
    # shim
    CUDA_INJECTION = "cuda_injection"


class Payload(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ControllerStarted(Payload):
    run_id: str = ""
    run_name: str | None = None
    storage_path: str | None = None
    step_metric: str | None = None
    step_metric_names: list[str] = Field(default_factory=list)
    state_metric: str | None = None
    failure_config: dict[str, Any] = Field(default_factory=dict)
    train_run_id: str | None = None  # a resubmission's own Train run (chaos.train.run.continuation)


class AttemptStarted(Payload):
    run_id: str = ""
    attempt: int
    placement: list[dict[str, Any]] = Field(default_factory=list)
    world_size: int | None = None  # None in timelines recorded before elastic runs
    cause: str | None = None  # start | restart | resize (chaos.train.recording)


class Report(Payload):
    run_id: str = ""
    attempt: int | None = None
    steps: dict[int, Step | None] | None = None
    step: Step | None = None
    step_sources: dict[int, str | None] | None = None
    step_metric: str | None = None
    states: dict[int, float | None] | None = None
    state_metric: str | None = None
    state_refused: dict[int, str] | None = None
    state_nonfinite: dict[int, str] | None = None  # rank -> "nan"/"inf": a loss that is a number, not finite
    step_refused: dict[int, str] | None = None  # rank -> what was reported for the step (not a number)
    checkpoint: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    without_ranks: list[int] = Field(default_factory=list)
    # rank -> the step it last reported before a checkpoint report that carried no step of its own
    checkpoint_after_step: dict[int, Step] = Field(default_factory=dict)


class CheckpointPersisted(Payload):
    run_id: str = ""
    attempt: int | None = None
    rank: int
    step: Step | None = None
    checkpoint: str | None = None


class FailureDecision(Payload):
    run_id: str = ""
    attempt: int | None = None
    decision: str
    budget_class: str | None = None
    count: int | None = None
    limit: int | float | None = None  # None: unlimited
    error: str | None = None
    error_types: list[str] = Field(default_factory=list)


class RunFinished(Payload):
    run_id: str = ""
    state: str | None = None
    error: str | None = None


class JobFinished(Payload):
    status: str | None = None
    message: str | None = None


class EventsLost(Payload):
    job_id: str | None = None
    run_id: str | None = None
    seqs: list[int] = Field(default_factory=list)
    before_t: float | None = None
    why: str | None = None


class EventsUnread(Payload):
    job_id: str | None = None
    run_id: str | None = None
    next_attempt: int | None = None
    why: str | None = None


PAYLOADS: dict[str, type[Payload]] = {
    EventKind.CONTROLLER_STARTED: ControllerStarted, EventKind.ATTEMPT_STARTED: AttemptStarted,
    EventKind.REPORT: Report, EventKind.CHECKPOINT_PERSISTED: CheckpointPersisted,
    EventKind.FAILURE_DECISION: FailureDecision, EventKind.RUN_FINISHED: RunFinished,
    EventKind.JOB_FINISHED: JobFinished, EventKind.EVENTS_LOST: EventsLost, EventKind.EVENTS_UNREAD: EventsUnread,
}


def payload(event: Event) -> Payload:
    """``event``'s data as its kind's typed payload (a kind without one: its data as is)."""
    model = PAYLOADS.get(event.kind, Payload)
    return model.model_validate(event.data)


def report(event: Event) -> Report:
    if event.kind != EventKind.REPORT:
        raise TypeError(f"{event.describe()} is no report")
    return Report.model_validate(event.data)
