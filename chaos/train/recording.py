"""What the recorder makes of Ray Train's hook calls: facts in, timeline events out.

Pure logic, no Ray: ``chaos.train.recorder.Recorder`` (the Ray Train callback) reads
each hook's arguments into plain *facts* (dicts of strings and numbers) and hands them
here.  Keeping the line between Ray's objects and this logic explicit is what lets the
contract tier tape the facts of a real run (``chaos.train.tape``) and replay them here
without a cluster.

Facts per hook (``t``: the controller's clock when the hook ran):
  controller_started  run_id, run_name, storage_path, num_workers, elastic ({min_workers, max_workers,
                      resize_interval_s} or None; absent in tapes older than elastic runs),
                      failure_config{max_failures, max_preemption_failures, controller_failure_limit,
                      relax_collectives_on_preemption}
  state_changed       prev, cur, terminal, error (str or None)
  policy_logged       message (Ray's ``[FailurePolicy]`` log message), error_types
  failure_decision    decision (RETRY | RAISE)
  resize_decision     num_workers (the size Train's scaling policy gave the next worker group)
  controller_finished error (str or None)
  worker_group_started workers[{rank, local_rank, node_id, node_ip, hostname, pid}]
  poll_errors         errors{rank: "Type: message"} (only polls that carried errors)
  poll_checkpoints    reports{rank: {checkpoint (path), metrics}} (only polls where a rank's report
                      carried a checkpoint: persisted by that rank, not yet committed)
  poll_preemption     preempted_ranks [rank] (when the ranks Train's preemption watcher names change)
  reported            checkpoint (path or None), metrics [one dict per rank, in worker order]

A report event carries, besides every rank's step: ``step_refused`` (a step that was no
number), ``checkpoint_after_step`` (a checkpoint reported without a step: the rank's last
step before it), ``state_refused`` (a state value that was no number) and ``state_nonfinite``
(a NaN or infinite one), each only where some rank has one.
"""

from __future__ import annotations

import re
from typing import Any, Callable

# What ``auto`` tries, in order: Ray's own framework callbacks report "step" (Hugging Face
# Transformers: TrainerState.global_step through log_history; Lightning: trainer.global_step),
# then names other loops commonly count with.
AUTO_STEP_METRICS = ("step", "global_step", "training_iteration", "iteration")
# --chaos-state-metric auto: the training loss under the names scripts and Ray's framework
# callbacks report it.
AUTO_STATE_METRICS = ("loss", "train_loss", "training_loss")
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


def as_step(value: Any) -> tuple[int | float | None, str | None]:
    """(a reported step as a number, or why it is none): numbers as ``as_number`` reads them,
    and a string that spells one ("11") as that number; anything else is refused with what
    it was, so the verdict can say the step was there but no number."""
    number = as_number(value)
    if number is not None or value is None:
        return number, None
    if isinstance(value, str):
        try:
            number = as_number(float(value.strip()))
        except ValueError:
            number = None
    return (number, None) if number is not None else (None, f"{value!r} ({type(value).__name__})")


def step_metric_names(spec: str) -> tuple[str, ...]:
    """``auto`` -> AUTO_STEP_METRICS; ``"a,b"`` -> ("a", "b")."""
    names = tuple(n.strip() for n in (spec or "auto").split(",") if n.strip())
    if names in ((), ("auto",)):
        return AUTO_STEP_METRICS
    return tuple(n for name in names for n in (AUTO_STEP_METRICS if name == "auto" else (name,)))


class Recording:
    """One controller's hook calls turned into recorder events, handed to ``emit`` as
    ``{"t", "source": "recorder", "kind", "data"}`` dicts."""

    def __init__(self, step_metric: str, state_metric: str | None, emit: Callable[[dict], None]):
        self.emit_to = emit
        self.step_metric_spec = step_metric or "auto"
        self.step_names = step_metric_names(self.step_metric_spec)
        self.state_metric = state_metric or None
        self.state_names = (AUTO_STATE_METRICS if state_metric == "auto" else (state_metric,)) if state_metric else ()
        self.state_used: str | None = None  # the state metric the reports carry (auto: the first found)
        self.step_metric: str | None = None  # the first of step_names a report carried
        self.run_id = ""
        self.ranks: list = []  # world rank of each worker, in worker-group order
        self.last_step: dict = {}  # rank -> step it last reported in this attempt
        self.attempt = -1
        self.errors_reported_for = -2
        self.pending_decision: dict | None = None
        self.final_state: str | None = None
        self.preempted: list = []  # ranks Train's preemption watcher named in this attempt
        self.relax_collectives = False  # the run's FailureConfig.relax_collectives_on_preemption
        # Why the next worker group starts: the run's first, a retry after a failure decision,
        # or an elastic resize of a healthy group (Train shuts it down and starts another, with
        # no failure decision).
        self.next_cause: str | None = "start"

    def take(self, hook: str, t: float, facts: dict) -> None:
        getattr(self, f"_{hook}")(t, facts)

    def _emit(self, t: float, kind: str, **data: Any) -> None:
        self.emit_to({"t": t, "source": "recorder", "kind": kind, "data": {"run_id": self.run_id, **data}})

    # -- controller --------------------------------------------------------------
    def _controller_started(self, t: float, f: dict) -> None:
        self.run_id = f["run_id"]
        self.relax_collectives = bool(f["failure_config"].get("relax_collectives_on_preemption"))
        self._emit(t, "controller_started", run_name=f["run_name"], storage_path=f["storage_path"],
                   num_workers=f["num_workers"], elastic=f.get("elastic"), step_metric=self.step_metric_spec,
                   step_metric_names=list(self.step_names), state_metric=self.state_metric,
                   failure_config=f["failure_config"])

    def _state_changed(self, t: float, f: dict) -> None:
        data = {"prev": f["prev"], "cur": f["cur"]}
        if f.get("error") is not None:
            data["error"] = f["error"]
        if f["terminal"]:
            self.final_state = f["cur"]
        if data["cur"] == "RESIZING":
            self.next_cause = "resize"
        if data["prev"] != data["cur"] or f.get("error") is not None:  # Ray re-enters RUNNING on every poll tick
            self._emit(t, "state_changed", **data)

    def _policy_logged(self, t: float, f: dict) -> None:
        parsed = parse_failure_policy_line(f["message"])
        if parsed:
            parsed["error_types"] = f["error_types"]
            self.pending_decision = parsed

    def _failure_decision(self, t: float, f: dict) -> None:
        parsed, self.pending_decision = self.pending_decision, None
        data = {"attempt": self.attempt, "decision": f["decision"]}
        if f["decision"] == "RETRY":
            self.next_cause = "restart"
        if parsed:
            data.update({k: parsed[k] for k in ("budget_class", "count", "limit", "line", "error", "error_types")})
        self._emit(t, "failure_decision", **data)

    def _controller_finished(self, t: float, f: dict) -> None:
        error = f.get("error")
        self._emit(t, "run_finished", state=self.final_state or ("ERRORED" if error else "FINISHED"), error=error)

    def _resize_decision(self, t: float, f: dict) -> None:
        """``resize_decision``: the size of the worker group Train starts next, and why it starts
        (``cause``): an elastic upsize shows here as ``resize`` with no failure decision."""
        self._emit(t, "resize_decision", attempt=self.attempt, num_workers=f["num_workers"], cause=self.next_cause)

    # -- worker group ------------------------------------------------------------
    def _worker_group_started(self, t: float, f: dict) -> None:
        self.attempt += 1
        self.last_step = {}
        self.preempted = []
        placement = [dict(w) for w in f["workers"]]
        self.ranks = [p["rank"] for p in placement]
        cause, self.next_cause = self.next_cause, None  # the next start says its own cause
        self._emit(t, "attempt_started", attempt=self.attempt, placement=placement, world_size=len(placement),
                   cause=cause)

    def _poll_errors(self, t: float, f: dict) -> None:
        if f["errors"] and self.errors_reported_for != self.attempt:
            self.errors_reported_for = self.attempt
            self._emit(t, "worker_error", attempt=self.attempt, errors=dict(f["errors"]))

    def _poll_preemption(self, t: float, f: dict) -> None:
        self.preempted = list(f["preempted_ranks"])
        if self.preempted:
            self._emit(t, "train_preemption_notice", attempt=self.attempt, preempted_ranks=self.preempted)

    def _reporting_ranks(self, n: int) -> tuple[list, list]:
        """(the ranks behind a report round's ``n`` metrics, the ranks it was committed without).
        Ray lists the metrics in rank order, without rank ids: every rank's, or — when Ray
        committed the survivors' alone because relax_collectives_on_preemption let it go on
        without the preempted ranks — the survivors'.  Any other count is numbered 0..n-1, as
        Ray's list is."""
        if len(self.ranks) == n:
            return self.ranks, []
        survivors = [r for r in self.ranks if r not in self.preempted]
        if self.relax_collectives and self.preempted and len(survivors) == n:
            return survivors, [r for r in self.ranks if r in self.preempted]
        return list(range(n)), []

    def _poll_checkpoints(self, t: float, f: dict) -> None:
        """``checkpoint_persisted`` per rank: the rank wrote this checkpoint to storage (its report
        reached the controller); Ray commits it only once every rank has reported, so a fault in
        between leaves a checkpoint on storage that Ray never committed."""
        for rank, r in f["reports"].items():
            self._emit(t, "checkpoint_persisted", attempt=self.attempt, rank=int(rank),
                       step=as_step(self._step_of(r["metrics"] or {}))[0], checkpoint=r["checkpoint"])

    # -- reports -----------------------------------------------------------------
    def _step_of(self, metrics: dict) -> Any:
        if self.step_metric is None:
            self.step_metric = next((n for n in self.step_names if n in metrics), None)
        return metrics.get(self.step_metric) if self.step_metric else None

    def _reported(self, t: float, f: dict) -> None:
        """One event per report round, with every rank's step (and state value).  A checkpoint
        reported without a step gets none: whether it holds the state after the rank's last
        step or after the step whose metrics come next, only the verdicts can tell
        (``checkpoint_after_step`` names the last one)."""
        metrics, checkpoint = f["metrics"], f["checkpoint"]
        ranks, without = self._reporting_ranks(len(metrics))
        steps, sources, states, extra = {}, {}, {}, _Extra()
        for rank, m in zip(ranks, metrics):
            m = m or {}
            step, refused = as_step(self._step_of(m))
            steps[str(rank)], sources[str(rank)] = step, "metric" if step is not None else None
            extra.add("step_refused", rank, refused)
            if step is None and checkpoint is not None and rank in self.last_step:
                extra.add("checkpoint_after_step", rank, self.last_step[rank])
            if step is not None:
                self.last_step[rank] = step
            if self.state_names:
                states[str(rank)], why, nonfinite = self._state_of(m)
                extra.add("state_refused", rank, why)
                extra.add("state_nonfinite", rank, nonfinite)
        first = str(ranks[0]) if ranks else None
        if self.state_names and self.state_metric != self.state_used:
            extra.data["state_metric"] = self.state_used
        if without:  # a survivors' round: the checkpoint it commits is the run's, the preempted ranks' too
            extra.data["without_ranks"] = without
        self._emit(t, "report", attempt=self.attempt, step=steps.get(first), steps=steps, step_sources=sources,
                   step_metric=self.step_metric, states=states or None, checkpoint=checkpoint,
                   metrics=_scalar_metrics(metrics[0] if metrics else {}), **extra.data)

    def _state_of(self, metrics: dict) -> tuple[Any, str | None, str | None]:
        """(the rank's state value, why a reported one was refused, a value that is a number but
        not finite): a state metric that is no number is refused with its type, never silently
        dropped; a NaN or infinite loss (an fp16 step) is a number, left out of comparisons."""
        if self.state_used is None:
            self.state_used = next((n for n in self.state_names if n in metrics), None)
        if self.state_used is None or metrics.get(self.state_used) is None:
            return None, None, None
        raw = metrics[self.state_used]
        value = as_number(raw)
        if value is not None:
            return value, None, None
        if isinstance(raw, float) or (hasattr(raw, "item") and isinstance(_item(raw), float)):
            return None, None, str(_item(raw))
        return None, f"{self.state_used} = {raw!r} ({type(raw).__name__})", None


def _item(value: Any) -> Any:
    try:
        return value.item() if hasattr(value, "item") else value
    except (TypeError, ValueError):
        return value


class _Extra:
    """A report's optional per-rank fields, present only where some rank has one."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def add(self, field: str, rank: Any, value: Any) -> None:
        if value is not None:
            self.data.setdefault(field, {})[str(rank)] = value
