"""Every checker, and the one composer that runs them (Jepsen's ``compose`` with
``check-safe``): a checker that raises yields an *unverifiable* verdict naming it — never a
pass, and never a harness error that hides the other verdicts."""

from __future__ import annotations

import traceback
from typing import Protocol

from chaos.timeline import Timeline
from chaos.verdicts.budget import WithinBudget
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.final_state import FinalState
from chaos.verdicts.head import HeadLoss
from chaos.verdicts.node_recovery import NodeRecovery
from chaos.verdicts.preemption import PreemptionWindow
from chaos.verdicts.recovery import RecoveryTime
from chaos.verdicts.resume import ResumedFromLatest
from chaos.verdicts.run_finished import RunFinished
from chaos.verdicts.state import StateRestored
from chaos.verdicts.status import Status
from chaos.verdicts.storage import StorageFaults
from chaos.verdicts.trajectory import StateTrajectory
from chaos.verdicts.verdict import Verdict


class Checker(Protocol):
    """One family of verdicts over a timeline."""

    name: str
    # whether it judges a run stopped before its end (it stalled, never resumed): the
    # restarts it made are judged, its charges, recovery and end are not (the stop is the finding)
    judges_a_stopped_run: bool

    def applies(self, expect: Expect) -> bool: ...

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]: ...


#: in the order the report lists them
CHECKERS: tuple[Checker, ...] = (HeadLoss(), ResumedFromLatest(), StateRestored(), WithinBudget(), RecoveryTime(),
                                 PreemptionWindow(), NodeRecovery(), StorageFaults(), RunFinished(), StateTrajectory(),
                                 FinalState())


def safely(checker: Checker, timeline: Timeline, expect: Expect) -> list[Verdict]:
    """``checker``'s verdicts, or one unverifiable verdict naming it and what it raised."""
    try:
        return checker.check(timeline, expect)
    except Exception as e:  # a checker's bug must not pass what it did not check, nor hide the others
        return [Verdict(checker.name, Status.UNVERIFIABLE, f"unverifiable: checker failed: the {checker.name} "
                        f"checker raised {type(e).__name__}: {e}", Diagnosis.CHECKER_FAILED,
                        {"checker": checker.name, "traceback": traceback.format_exc(limit=8)})]


def judge(timeline: Timeline, expect: Expect, finished: bool = True,
          checkers: tuple[Checker, ...] = CHECKERS) -> list[Verdict]:
    """Every verdict that applies; for a run stopped before its end (``finished=False``), only
    those of the checkers that judge one."""
    return [v for c in checkers if c.applies(expect) and (finished or c.judges_a_stopped_run)
            for v in safely(c, timeline, expect)]
