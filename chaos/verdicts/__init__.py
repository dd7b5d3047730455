"""Verdicts: checked claims about a timeline, each carrying its evidence (DESIGN §6).

Knows nothing about transports or clusters: everything it judges is in the timeline
(recorder, fault and node events) plus what the suite expects (``Expect``).  One checker per
family, each in its own module (resume, state, trajectory, final_state, budget, recovery,
preemption, node_recovery, run_finished, head); ``judge`` composes them.  Statuses
(``Status``) have one order and one merge rule; diagnoses (``Diagnosis``) are spelt once.
A driver may hold several Train runs (``fit()`` twice); every rule is applied per run.
"""

from chaos.verdicts.compose import CHECKERS, Checker, judge
from chaos.verdicts.diagnosis import Diagnosis, Kind, ReportCategory
from chaos.verdicts.expect import Expect
from chaos.verdicts.states import Baseline
from chaos.verdicts.status import Status
from chaos.verdicts.verdict import Verdict, check

__all__ = ["CHECKERS", "Baseline", "Checker", "Diagnosis", "Expect", "Kind", "ReportCategory", "Status", "Verdict",
           "check", "judge"]
