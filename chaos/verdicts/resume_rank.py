"""One rank's restart against the latest checkpoint: where it had to begin, where it began.

``judge_rank`` reads the checkpoint (chaos.verdicts.checkpoint), judges the rank's first
step against each reading, and where two readings disagree lets the restart's first state
value decide: a first step that reproduces what an earlier attempt (or the fault-free
baseline) gave for it began from the state that step began from — neither trained twice nor
skipped; one that does not, of a workload declared deterministic, began elsewhere.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chaos.verdicts.checkpoint import Reading, readings
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.reports import Row, RunReports, Step
from chaos.verdicts.status import Status
from chaos.verdicts.tolerance import same_step, step_in

DETERMINISM_HINT = "--chaos-deterministic, or chaos.expect(deterministic=True)"
#: the lead failure of a restart with several, worst first
SEVERITY = (Diagnosis.RESTARTED_FROM_SCRATCH, Diagnosis.OLDER_CHECKPOINT, Diagnosis.TRAINED_AGAIN,
            Diagnosis.PAST_THE_CHECKPOINT, Diagnosis.UNEXPECTED_STEP)


@dataclasses.dataclass(frozen=True)
class Judgement:
    rank: int
    got: Any
    status: Status
    diagnosis: Diagnosis | None = None
    expected: Any = None
    checkpoint_step: Any = None
    rule: str = ""
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "got": self.got, "status": self.status.value,
                "diagnosis": self.diagnosis.value if self.diagnosis else None, "expected": self.expected,
                "checkpoint_step": self.checkpoint_step, "rule": self.rule, "why": self.why}


def judge_rank(run: RunReports, rank: int, got: Step, commits: list[Row], attempt: int) -> Judgement:
    if not commits:
        return _fresh_start(run, rank, got, attempt)
    found = readings(run, commits[-1], rank, attempt)
    if not found:
        return Judgement(rank, got, Status.UNVERIFIABLE, Diagnosis.NO_STEP_AT_CHECKPOINT,
                         why=f"the latest checkpoint's report carried no step for rank {rank}")
    judged = [_judge_reading(run, rank, got, commits, attempt, r) for r in found]
    if len({(j.status, j.diagnosis) for j in judged}) == 1:
        return judged[0]
    return _decide_by_state(run, rank, got, attempt, list(zip(found, judged)))


def _fresh_start(run: RunReports, rank: int, got: Step, attempt: int) -> Judgement:
    first = run.run_first_step(rank, attempt)
    if first is None:
        return Judgement(rank, got, Status.PASS, None, got, None,
                         f"no checkpoint existed and no earlier attempt reported a step: attempt {attempt} began the "
                         f"run at step {got}")
    rule = "no checkpoint existed yet, so a fresh start at the run's first step"
    if same_step(got, first):
        return Judgement(rank, got, Status.PASS, None, first, None, rule)
    return Judgement(rank, got, Status.FAIL, Diagnosis.UNEXPECTED_STEP, first, None, rule,
                     f"no checkpoint existed yet, so step {first} was expected")


def _whole(*steps: Any) -> bool:
    return all(isinstance(s, int) for s in steps)


def _judge_reading(run: RunReports, rank: int, got: Step, commits: list[Row], attempt: int,
                   r: Reading) -> Judgement:
    if same_step(got, r.nxt):
        return Judgement(rank, got, Status.PASS, None, r.nxt, r.ck, r.rule)
    if same_step(got, r.ck) and not r.before_step:
        return _at_checkpoint_step(run, rank, got, r, attempt, commits)
    after_it = got > r.ck and not same_step(got, r.ck)
    if after_it and not r.before_step and _whole(got, r.ck) and got == r.ck + 1:
        return Judgement(rank, got, Status.PASS, None, r.ck + 1, r.ck,
                         f"{r.rule}; step {got} is the one right after checkpoint step {r.ck}, wherever the attempt's "
                         "reports fall")
    if after_it and r.nxt is None:
        return Judgement(rank, got, Status.UNVERIFIABLE, r.unknown, None, r.ck, r.rule, r.rule)
    if after_it and r.nxt is not None and got < r.nxt:
        unseen = f"{r.ck + 1}..{got - 1}" if _whole(got, r.ck) else f"after {r.ck} and before {got}"
        return Judgement(rank, got, Status.UNVERIFIABLE, Diagnosis.BETWEEN_REPORTS, r.nxt, r.ck, r.rule,
                         f"attempt {attempt} first reported step {got}, between checkpoint step {r.ck} and step "
                         f"{r.nxt} ({r.rule}): steps {unseen} may have been trained unreported (a reporting phase "
                         "that restarts with the attempt) or skipped")
    return _wrong(run, rank, got, commits, attempt, r)


def _wrong(run: RunReports, rank: int, got: Step, commits: list[Row], attempt: int, r: Reading) -> Judgement:
    """A first step the reading cannot explain: which mistake it is."""
    first = run.run_first_step(rank, attempt)
    older = [p.ck for c in commits[:-1] for p in readings(run, c, rank, attempt) if step_in(got, {p.ck, p.nxt})]
    if first is not None and got <= first:
        diagnosis, why = Diagnosis.RESTARTED_FROM_SCRATCH, f"the run's first step was {first}"
    elif older:
        diagnosis, why = Diagnosis.OLDER_CHECKPOINT, f"that follows checkpoint step {older[-1]}"
    elif r.nxt is not None and got > r.nxt:
        diagnosis, why = Diagnosis.PAST_THE_CHECKPOINT, f"steps {r.nxt}..{got} were skipped" + _loaded_from_storage(
            run, got, r, attempt)
    else:
        expected = r.nxt if r.nxt is not None else f"a step after {r.ck}"
        diagnosis, why = Diagnosis.UNEXPECTED_STEP, f"expected {expected}"
    return Judgement(rank, got, Status.FAIL, diagnosis, r.nxt, r.ck, r.rule, why)


def _loaded_from_storage(run: RunReports, got: Step, r: Reading, attempt: int) -> str:
    """A skip that follows a checkpoint a rank wrote and Ray never committed, named."""
    if r.nxt is None:
        return ""
    stride = r.nxt - r.ck
    loaded = [p for p in run.uncommitted_before(attempt)
              if p.step is not None and r.ck < p.step < got and got - p.step <= stride + 1e-9]
    if not loaded:
        return ""
    p = loaded[-1]
    return (f": it follows step {p.step}, whose checkpoint rank {p.rank} had written to storage in attempt {p.attempt} "
            f"({p.checkpoint}) but Ray never committed (the fault came before every rank reported it; the latest "
            f"committed checkpoint is step {r.ck}) — the script loaded a checkpoint from storage instead of "
            "ray.train.get_checkpoint()")


def _decide_by_state(run: RunReports, rank: int, got: Step, attempt: int,
                     judged: list[tuple[Reading, Judgement]]) -> Judgement:
    """Readings that disagree about ``got``: the restart's first state value decides — a pass
    only for a reading that has the restart right, and only where the value rules out what
    every other reading's state would have given."""
    wrong_reading, wrong = next(((r, j) for r, j in judged if j.status is not Status.PASS), judged[0])
    readings_said = "; ".join(f"if {r.assumes}, {j.status.value}" + (f" ({j.diagnosis.value})" if j.diagnosis else "")
                              for r, j in judged)
    rule = f"the checkpoint's step is read two ways ({readings_said}): attempt {attempt}'s first state value decides"
    first = run.first_valued(attempt, rank)
    earlier = run.earlier_value(rank, first[0], attempt) if first is not None else None
    if first is None or earlier is None:
        missing = (f"attempt {attempt} reported no state value" if first is None else
                   f"no earlier attempt (nor a fault-free baseline) reported step {first[0]} with a state value")
        return Judgement(rank, got, Status.UNVERIFIABLE, Diagnosis.CHECKPOINT_STEP_AMBIGUOUS, wrong.expected,
                         wrong.checkpoint_step, rule, f"{rule}, but {missing} (report the step with the checkpoint, "
                         "ray.train.report({'step': s, ...}, checkpoint=ck), and the training loss)")
    (step, value), (where, was) = first, earlier
    if run.reproduces(value, was):
        return _reproduced(run, Decided(rank, got, attempt, step, value, where, was, rule), judged)
    how = f"step {step} gave {value:.6g} in attempt {attempt} but {was:.6g} in {where}"
    if not run.expect.is_deterministic:
        return Judgement(rank, got, Status.UNVERIFIABLE, Diagnosis.CHECKPOINT_STEP_AMBIGUOUS, wrong.expected,
                         wrong.checkpoint_step, rule, f"{rule}: {how}, which for a workload not declared deterministic "
                         f"({DETERMINISM_HINT}) may be its data order or RNG")
    again = (wrong.checkpoint_step is not None and same_step(got, wrong.checkpoint_step)
             and not wrong_reading.before_step)
    diagnosis = Diagnosis.TRAINED_AGAIN if again else wrong.diagnosis or Diagnosis.UNEXPECTED_STEP
    what = (f"step {got} was trained again from the state after it" if again else
            f"if {wrong_reading.assumes}: {wrong.why or diagnosis.value}")
    return Judgement(rank, got, Status.FAIL, diagnosis, wrong.expected, wrong.checkpoint_step, rule,
                     f"{how}: attempt {attempt} did not begin from the state step {step} began from — {what}")


@dataclasses.dataclass(frozen=True)
class Decided:
    """A restart's first state value that reproduced an earlier one: rank, its first step,
    the attempt, the step valued, its value, and the earlier (where, value)."""

    rank: int
    got: Step
    attempt: int
    step: Step
    value: float
    where: str
    was: float
    rule: str


def _reproduced(run: RunReports, d: Decided, judged: list[tuple[Reading, Judgement]]) -> Judgement:
    """The first state value reproduced: it began from the state step ``d.step`` began from.
    That passes the reading with the restart right, unless the value cannot rule out another
    reading's state; where no reading has the restart right, it changes nothing."""
    right = next(((r, j) for r, j in judged if j.status is Status.PASS), None)
    others = [(r, j) for r, j in judged if j.status is not Status.PASS]
    shown = f"step {d.step} reproduced {d.was:.6g} of {d.where}"
    if right is None:
        if all(j.status is Status.FAIL for _, j in others):
            lead = min((j for _, j in others), key=lambda j: SEVERITY.index(j.diagnosis)
                       if j.diagnosis in SEVERITY else len(SEVERITY))
            return dataclasses.replace(lead, rule=d.rule, why=f"{lead.why} — under either reading ({shown})")
        lead = others[0][1]
        return Judgement(d.rank, d.got, Status.UNVERIFIABLE, Diagnosis.CHECKPOINT_STEP_AMBIGUOUS, lead.expected,
                         lead.checkpoint_step, d.rule, f"{d.rule}: {shown}, but under no reading did attempt "
                         f"{d.attempt} begin where it should, so that shows nothing of where it began")
    for reading, _ in others:
        by = _apart(run, reading, right[0], d.rank, d.attempt)
        cannot = _cannot_tell(run, d, by, f"the state it would have begun from if {reading.assumes}",
                              Diagnosis.CHECKPOINT_STEP_AMBIGUOUS)
        if cannot is not None:
            diagnosis, why = cannot
            return Judgement(d.rank, d.got, Status.UNVERIFIABLE, diagnosis, right[1].expected,
                             right[1].checkpoint_step, d.rule, f"{d.rule}: {shown}, but {why}")
    return Judgement(d.rank, d.got, Status.PASS, None, d.got, right[1].checkpoint_step,
                     f"{d.rule}: {shown}, so attempt {d.attempt} began from the state step {d.step} began from")


def _apart(run: RunReports, other: Reading, right: Reading, rank: int, attempt: int) -> Step | None:
    """How many steps further the state ``other`` says the checkpoint holds than ``right``
    does (None where a reading saved at the top of a step meets steps of unknown units)."""
    one = run.one_step(rank, attempt)
    if (other.before_step or right.before_step) and one is None:
        return None

    def held(r: Reading) -> Step:
        return r.ck - one if r.before_step and one is not None else r.ck

    return held(other) - held(right)


def _cannot_tell(run: RunReports, d: Decided, by: Step | None, other: str,
                 missing: Diagnosis) -> tuple[Diagnosis, str] | None:
    """Why the restart's value at ``d.step`` does not rule out ``other`` — a state ``by``
    steps away from the one it reproduced — or None where it does: the earlier value ``by``
    steps away (else the same distance on the other side: how far the metric moves over
    that many steps) must lie outside the tolerance of it."""
    if by is None or same_step(by, 0):
        return missing, f"nothing tells it from {other} (the same state, or steps of unknown units)"
    near = run.value_near(d.rank, d.step, by, d.attempt)
    if near is None:
        return missing, (f"no earlier attempt (nor a fault-free baseline) reported step {d.step + by} or "
                         f"{d.step - by} with a state value, so nothing shows that the state metric tells it from "
                         f"{other}")
    at, where, there = near
    if run.reproduces(d.value, there):
        return Diagnosis.STATE_DOES_NOT_TELL, (
            f"step {at} gave {there:.6g} in {where}, within the tolerance (rtol {run.rtol:g}) of {d.value:.6g}: the "
            f"state metric does not tell it from {other} (report a state metric that moves with every step, or "
            "tighten --chaos-state-rtol)")
    return None


def _at_checkpoint_step(run: RunReports, rank: int, got: Step, r: Reading, attempt: int,
                        commits: list[Row]) -> Judgement:
    """A first report at the checkpoint's own step is an evaluation after loading it, or step
    ``ck`` trained again.  A checkpoint committed again at a step committed before is work
    done twice; otherwise neither case reproduces step ``ck``'s earlier (pre-update) value,
    so the first *trained* step after it decides — it must reproduce what an earlier
    attempt (or the fault-free baseline) reported for that step."""
    ck, nxt = r.ck, r.nxt
    done_twice = _committed_again(run, rank, got, r, attempt, commits) or _trained_again_from_older(
        run, rank, got, r, attempt, commits)
    if done_twice is not None:
        return done_twice
    trained = run.trained_after(attempt, rank, ck)
    if trained is not None and nxt is not None and trained > nxt and not same_step(trained, nxt):
        return Judgement(rank, got, Status.FAIL, Diagnosis.PAST_THE_CHECKPOINT, nxt, ck,
                         f"after a first report at checkpoint step {ck}, the next step reported is the one that "
                         f"followed the checkpoint before the fault ({nxt})",
                         f"attempt {attempt} reported step {ck}, then step {trained}: steps {nxt}..{trained} were "
                         "skipped")
    return _next_trained_step_decides(run, rank, got, r, attempt, trained)


def _committed_again(run: RunReports, rank: int, got: Step, r: Reading, attempt: int,
                     commits: list[Row]) -> Judgement | None:
    again = run.recommitted(attempt, rank, commits)
    if again is None:
        return None
    rule = f"attempt {attempt} committed checkpoint step {again} again"
    if len({c.steps[rank] for c in commits if rank in c.steps}) == 1:  # no older checkpoint to come from
        return Judgement(rank, got, Status.FAIL, Diagnosis.RESTARTED_FROM_SCRATCH, r.nxt, r.ck, rule,
                         f"step {again}, the run's first checkpoint, was trained and committed again")
    return Judgement(rank, got, Status.FAIL, Diagnosis.OLDER_CHECKPOINT, r.nxt, r.ck, rule,
                     f"steps {got}..{again} were trained again: step {again} had been committed before")


def _trained_again_from_older(run: RunReports, rank: int, got: Step, r: Reading, attempt: int,
                              commits: list[Row]) -> Judgement | None:
    """A first report at checkpoint step ``ck`` that reproduces the value step ``ck`` had
    *before* it was trained: only the state before that checkpoint gives it (an evaluation
    after loading checkpoint ``ck``, or step ``ck`` trained again from it, start from the
    state after it).  Not applied where the earlier attempt's value at ``ck`` equals its value
    at the next step it reported: a metric that does not move with training cannot tell."""
    ck = r.ck
    now = run.value_at(rank, ck, lambda a: a == attempt)
    before = run.value_at(rank, ck, lambda a: a < attempt)
    if now is None or before is None or not run.reproduces(now[1], before[1]):
        return None
    following = next((x.steps[rank] for x in run.stepped if x.attempt == before[0] and rank in x.steps
                      and x.steps[rank] > ck), None)
    moved = run.value_at(rank, following, lambda a: a == before[0]) if following is not None else None
    if moved is None or run.reproduces(moved[1], before[1]):
        return None
    older = sorted({c.steps[rank] for c in commits if rank in c.steps and c.steps[rank] < ck})
    rule = (f"a first report at checkpoint step {ck} that gives step {ck}'s value from before it was trained "
            f"(attempt {before[0]}) comes from the state before checkpoint {ck}")
    how = f"step {ck} gave {now[1]:.6g} in attempt {attempt}, as it did in attempt {before[0]} before it was trained"
    if older:
        return Judgement(rank, got, Status.FAIL, Diagnosis.OLDER_CHECKPOINT, r.nxt, ck, rule,
                         f"{how}: it was trained again from an older state (checkpoint step {older[-1]}), not "
                         f"evaluated after loading checkpoint {ck}")
    return Judgement(rank, got, Status.FAIL, Diagnosis.RESTARTED_FROM_SCRATCH, r.nxt, ck, rule,
                     f"{how}: it was trained again without the checkpoint's state")


def _next_trained_step_decides(run: RunReports, rank: int, got: Step, r: Reading, attempt: int,
                               trained: Step | None) -> Judgement:
    ck, nxt = r.ck, r.nxt
    earlier = run.earlier_value(rank, trained, attempt) if trained is not None else None
    now = run.value_at(rank, trained, lambda a: a == attempt) if trained is not None else None
    rule = (f"a first report at checkpoint step {ck} is judged by the first trained step after it "
            f"({trained if trained is not None else 'none reported'}) against an earlier attempt's value, or "
            "the fault-free baseline's")
    if earlier is None or now is None:
        missing = ("the attempt reported no step after it" if trained is None else
                   f"no state value at step {trained} in attempt {attempt}" if now is None else
                   f"no earlier attempt (nor a fault-free baseline) reported step {trained} with a state value")
        return Judgement(rank, got, Status.UNVERIFIABLE, Diagnosis.AT_CHECKPOINT_STEP, nxt, ck, rule,
                         f"attempt {attempt} first reported step {ck}, the checkpoint's own step: an evaluation after "
                         f"loading it, or step {ck} trained again — {missing} to tell which (report the training "
                         "loss, or --chaos-state-metric NAME, and let the fault land after the step that follows a "
                         "checkpoint is reported, or compare with a fault-free run: --chaos-baseline)")
    (where, was), (_, value) = earlier, now
    if not run.reproduces(value, was):
        why = (f"step {trained} gave {value:.6g} in attempt {attempt} but {was:.6g} in {where}: step {ck} was trained "
               "again, or the state was not restored")
        if run.expect.is_deterministic:
            return Judgement(rank, got, Status.FAIL, Diagnosis.STATE_NOT_RESTORED, nxt, ck, rule, why)
        return Judgement(rank, got, Status.WARNING, Diagnosis.STATE_DIFFERS, nxt, ck, rule,
                         why + f" (a warning: the workload is not declared deterministic, {DETERMINISM_HINT})")
    assert trained is not None
    shown = f"step {trained} reproduced {was:.6g} of {where}"
    # step ck trained again leaves the state one update further: the value must rule that out
    cannot = _cannot_tell(run, Decided(rank, got, attempt, trained, value, where, was, rule),
                          run.one_step(rank, attempt), f"the state one update further (step {ck} trained again)",
                          Diagnosis.AT_CHECKPOINT_STEP)
    if cannot is not None:
        diagnosis, why = cannot
        return Judgement(rank, got, Status.UNVERIFIABLE, diagnosis, nxt, ck, rule,
                         f"attempt {attempt} first reported step {ck}, the checkpoint's own step: an evaluation after "
                         f"loading it, or step {ck} trained again — {shown}, but {why}")
    return Judgement(rank, got, Status.PASS, None, nxt, ck, f"{rule}: {shown}")


def judge_late_step(run: RunReports, rank: int, commits: list[Row], attempt: int) -> Judgement:
    """A rank whose first report(s) in ``attempt`` carried no step: its first step shows where
    it began only when that step is already before the checkpoint (work done again whatever
    came first); any other first step is unverifiable, never a pass."""
    own = run.first_step_of(attempt, rank)
    unknown = f"rank {rank}'s first report(s) in attempt {attempt} carried no step"
    if own is None and not run.stepped_ever(rank):
        return Judgement(rank, None, Status.UNVERIFIABLE, Diagnosis.RANK_NEVER_REPORTS_A_STEP,
                         why=f"rank {rank} reported, but with no step in any attempt (rank-0-only "
                             f"metrics?): where it resumed cannot be seen, and rank 0's step says nothing of it (a "
                             "rank that restores nothing looks the same); report the step on every rank: "
                             "ray.train.report({'step': step, ...}) on each rank, the other metrics may stay rank 0's")
    if own is None:
        return Judgement(rank, None, Status.UNVERIFIABLE, Diagnosis.NO_STEP_AFTER_RESTART,
                         why=f"{unknown}, nor did any later one")
    got = own[1]
    judged = judge_rank(run, rank, got, commits, attempt)
    ck = judged.checkpoint_step
    if judged.status is Status.FAIL and ck is not None and got < ck and not same_step(got, ck):
        return dataclasses.replace(judged, why=f"{judged.why}; {unknown}, and its first step, {got}, is before "
                                               f"checkpoint step {ck}")
    return Judgement(rank, got, Status.UNVERIFIABLE, Diagnosis.NO_STEP_AFTER_RESTART, judged.expected, ck,
                     judged.rule, f"{unknown}: its first step, {got}, cannot show where it began")
