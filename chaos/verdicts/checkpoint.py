"""Which step a committed checkpoint holds for a rank, and the step a restart from it must
report first: one reading, or two where the reports admit both.

A checkpoint reported with step ``s`` holds the state after step ``s`` (DESIGN §6), and a
restart from it reports first the step that followed it in the run's reports (or ``s`` plus
the reporting stride).  Two shapes leave that open, and the restart's own state values
decide between their readings (chaos.verdicts.resume_rank):

* a checkpoint reported without a step (``report({}, checkpoint=ck)``) between steps ``p``
  and ``n``: saved after ``p`` (metrics, then the checkpoint) or after ``n`` (the checkpoint,
  then that step's metrics);
* a checkpoint at step ``s`` followed by another report at ``s`` that carries the training
  state the checkpoint's report did not: saved at the top of step ``s`` (the state before it:
  the restart must begin at ``s``), or an evaluation after saving (begin at the next step).

A rank missing from the commit (an elastic run's rank that did not exist when it was
committed, a rank preempted under relaxed collectives) takes the step the committing ranks
agree on, and the committing ranks' reports for what followed — not its own history.
"""

from __future__ import annotations

import collections
import dataclasses

from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.reports import Row, RunReports, Step


@dataclasses.dataclass(frozen=True)
class Reading:
    ck: Step  # the checkpoint's step
    nxt: Step | None  # the step a restart from it reports first (None: not known, see ``unknown``)
    rule: str
    unknown: Diagnosis | None = None  # why ``nxt`` is None
    before_step: bool = False  # holds the state before step ``ck`` (saved at the top of it)
    assumes: str = ""  # what this reading assumes, where the reports admit another


def readings(run: RunReports, commit: Row, rank: int, attempt: int) -> list[Reading]:
    """The readings of ``commit`` for ``rank`` restarting in ``attempt`` ([]: no step for it)."""
    if rank not in commit.steps and rank in commit.data.checkpoint_after_step:
        return _stepless(run, commit, rank, attempt)
    held = _held(run, commit, rank)
    if held is None:
        return []
    ck, source, whose = held
    found = [_reading(run, commit, rank, attempt, ck, source, whose)]
    if _maybe_saved_before_its_step(run, commit, source, ck):
        found = [dataclasses.replace(found[0], assumes="an evaluation after saving it"),
                 Reading(ck, ck, f"checkpoint step {ck}{whose} saved at the top of step {ck} (its report carried "
                         f"no training state; the report of step {ck} after it did): a restart begins at step {ck}",
                         before_step=True, assumes=f"saved at the top of step {ck}, before training it")]
    return found


def _held(run: RunReports, commit: Row, rank: int) -> tuple[Step, int, str] | None:
    """(the step ``commit`` holds for ``rank``, the rank whose reports tell what followed it,
    how the step was found) — None when nothing gives the rank a step."""
    if rank in commit.steps:
        return commit.steps[rank], rank, ""
    preempted = rank in commit.data.without_ranks
    absent = rank not in run.ranks_of(commit.attempt)
    held = set(commit.steps.values())
    if not (preempted or absent) or len(held) != 1:
        return None
    committers = ", ".join(map(str, sorted(commit.steps)))
    why = ("which was being preempted" if preempted else
           f"which did not run in attempt {commit.attempt} (the world size changed)")
    return held.pop(), min(commit.steps), f" (committed by rank {committers} without rank {rank}, {why})"


def _reading(run: RunReports, commit: Row, rank: int, attempt: int, ck: Step, source: int, whose: str,
             assumes: str = "") -> Reading:
    nxt = run.next_after(commit, source, ck)
    if nxt is not None:
        return Reading(ck, nxt, f"the step that followed checkpoint step {ck}{whose} in attempt {commit.attempt}'s "
                                "reports", assumes=assumes)
    strides = run.strides_before(attempt).get(source)
    if strides is not None and strides.regular is not None:
        return Reading(ck, ck + strides.regular, f"checkpoint step {ck}{whose} + the run's reporting stride "
                                                 f"{strides.regular} before the fault", assumes=assumes)
    if strides is not None:
        return Reading(ck, None, f"no report followed checkpoint step {ck}{whose}, and the reports before the fault "
                                 f"came at varying strides ({', '.join(map(str, strides.seen))}), so the step after "
                                 "it cannot be predicted", Diagnosis.IRREGULAR_STRIDE, assumes=assumes)
    return Reading(ck, None, f"no report followed checkpoint step {ck}{whose} and the reports before the fault "
                             "showed no stride", Diagnosis.NO_REPORTING_STRIDE, assumes=assumes)


def _stepless(run: RunReports, commit: Row, rank: int, attempt: int) -> list[Reading]:
    """A checkpoint reported without a step, after step ``p``: saved after ``p``, or after the
    step whose metrics came right after it."""
    prev = commit.data.checkpoint_after_step[rank]
    nxt = next((r.steps[rank] for r in run.after(commit) if rank in r.steps), None)
    where = f"the checkpoint was reported without a step, after step {prev}"
    found = [_reading(run, commit, rank, attempt, prev, rank, f" ({where})", f"it was saved after step {prev}")]
    if nxt is not None:
        found.append(_reading(run, commit, rank, attempt, nxt, rank, f" ({where} and before step {nxt}'s metrics)",
                              f"it was saved after step {nxt}, before that step's metrics were reported"))
    return found


def _maybe_saved_before_its_step(run: RunReports, commit: Row, rank: int, ck: Step) -> bool:
    """Whether ``commit`` may hold the state before step ``ck``: its own step's report after it
    carries the training state its report did not — or, where the fault came before any
    report of that step followed it, an earlier checkpoint of the run showed that habit."""
    later = run.same_step_after(commit, rank, ck)
    if later is not None:
        return _saved_before_the_step(run, commit, later, rank)
    if any(run.after(commit)):
        return False  # a later step came and none of this step's: saved after it
    return any(c is not commit and rank in c.steps and (after := run.same_step_after(c, rank, c.steps[rank]))
               is not None and _saved_before_the_step(run, c, after, rank)
               for c in run.rows if c.checkpoint and c.attempt <= commit.attempt)


def _saved_before_the_step(run: RunReports, commit: Row, later: Row, rank: int) -> bool:
    """Whether the report after ``commit`` at its step carries the training state that the
    commit's own report did not (its state value, else — for the rank whose metrics are kept —
    the metric names the attempt's other reports carry): the step may have been trained after
    the checkpoint was saved."""
    if commit.value(rank) is None and later.value(rank) is not None:
        return True
    if rank != next(iter(commit.data.steps or {}), None):
        return False
    usual = collections.Counter(frozenset(r.data.metrics) for r in run.of_attempt(commit.attempt)
                                if not r.checkpoint and r is not later and r.data.metrics)
    if not usual:
        return False
    keys = usual.most_common(1)[0][0]
    return not keys <= set(commit.data.metrics) and keys <= set(later.data.metrics)
