"""Every diagnosis a verdict can give, spelt once.

A verdict that does not pass names what went wrong with a ``Diagnosis``; its message starts
with the diagnosis phrase.  Each member carries what everything else reads: its kind (a
finding, missing evidence, a warning or an expected outcome), the Allure report category it
is filed under (chaos.allure_site), the verdicts that give it, and one line for
docs/testing.md's coverage map (tests/unit/test_coverage_map.py checks the map against
this enum, row by row).
"""

from __future__ import annotations

import enum


class Kind(str, enum.Enum):
    FINDING = "finding"  # the run did something wrong: the verdict fails
    UNVERIFIABLE = "unverifiable"  # the evidence to decide is missing: never a pass
    WARNING = "warning"  # shown, never fails (a non-deterministic workload's state)
    EXPECTED = "expected"  # the outcome the suite expects (a lost cluster without GCS fault tolerance)


class ReportCategory(str, enum.Enum):
    """The report's categories, in the order Allure tries them (the first that matches wins:
    findings before missing evidence)."""

    RESTARTED = "restarted from scratch"
    OLDER = "resumed from an older checkpoint"
    PAST = "resumed past the checkpoint (skipped data)"
    TRAINED_AGAIN = "checkpoint step trained again"
    UNEXPECTED_STEP = "resumed at an unexpected step"
    RANKS_DISAGREE = "ranks disagree"
    STATE = "state not restored"
    FINAL_STATE = "final state differs"
    HEAD_LOSS = "head loss: unexpected outcome"
    STALLED = "training stalled"
    DID_NOT_RESUME = "did not resume"
    UNRELATED = "unrelated failure"
    EXHAUSTED = "retry budget exhausted"
    WRONG_CHARGE = "wrong budget charge"
    RECOVERY = "recovery too slow"
    PREEMPTION = "preemption window"
    NODE_RECOVERY = "automatic node recovery"
    RUN_FAILED = "run failed"
    STORAGE = "storage fault mishandled"
    UNVERIFIABLE = "unverifiable (missing evidence)"
    CLEANUP = "cleanup failed"


#: how a message with missing evidence begins, whichever diagnosis it carries
UNVERIFIABLE_PREFIXES = ("unverifiable: ", "inconclusive: ")

_R = "resumed-from-latest"
_B = "within-budget"


class Diagnosis(str, enum.Enum):
    """``phrase`` (the value), kind, report category, the verdicts that give it, doc line."""

    kind: Kind
    report: ReportCategory
    verdicts: tuple[str, ...]
    doc: str

    def __new__(cls, phrase: str, kind: Kind, report: ReportCategory, verdicts: tuple[str, ...],
                doc: str) -> Diagnosis:
        member = str.__new__(cls, phrase)
        member._value_ = phrase
        member.kind, member.report, member.verdicts, member.doc = kind, report, verdicts, doc
        return member

    def __str__(self) -> str:
        return str(self.value)

    # -- any checker ------------------------------------------------------------------------
    CHECKER_FAILED = ("unverifiable: checker failed", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE, ("any",),
                      "a checker raised instead of judging: what it checks is unverified (the message names it)")
    # -- resumed-from-latest ------------------------------------------------------------------
    RESTARTED_FROM_SCRATCH = ("restarted from scratch", Kind.FINDING, ReportCategory.RESTARTED, (_R,),
                              "a restart began at or before the run's first step although a checkpoint was committed")
    OLDER_CHECKPOINT = ("resumed from an older checkpoint", Kind.FINDING, ReportCategory.OLDER, (_R,),
                        "a restart began after a checkpoint older than the latest one")
    PAST_THE_CHECKPOINT = ("resumed past the checkpoint", Kind.FINDING, ReportCategory.PAST, (_R,),
                           "a restart began beyond the step that followed the latest checkpoint: data skipped")
    TRAINED_AGAIN = ("checkpoint step trained again", Kind.FINDING, ReportCategory.TRAINED_AGAIN, (_R,),
                     "a restart trained the latest checkpoint's own step again from the state after it")
    UNEXPECTED_STEP = ("resumed at an unexpected step", Kind.FINDING, ReportCategory.UNEXPECTED_STEP, (_R,),
                       "a restart began at a step no rule explains")
    RANKS_DISAGREE = ("ranks disagree", Kind.FINDING, ReportCategory.RANKS_DISAGREE, (_R,),
                      "ranks that reported the same steps before a restart began it at different steps")
    NO_STEP_METRIC = ("unverifiable: no step metric", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE, (_R,),
                      "no report carried the step metric")
    STEP_NOT_A_NUMBER = ("unverifiable: step not a number", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE, (_R,),
                         "the step metric was reported, but as a value that is no number (a string, say)")
    STEP_GOES_BACK = ("unverifiable: step metric goes back", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE, (_R,),
                      "the step metric went back within one attempt (an epoch-local counter)")
    NO_STEP_AFTER_RESTART = ("unverifiable: no step after the restart", Kind.UNVERIFIABLE,
                             ReportCategory.UNVERIFIABLE, (_R,),
                             "a restarted attempt (or one rank of it) reported without the step metric")
    RANK_NEVER_REPORTS_A_STEP = ("unverifiable: rank never reports a step", Kind.UNVERIFIABLE,
                                 ReportCategory.UNVERIFIABLE, (_R,),
                                 "a rank reported in every attempt but never with a step (rank-0-only metrics)")
    AT_CHECKPOINT_STEP = ("unverifiable: resumed at the checkpoint's own step", Kind.UNVERIFIABLE,
                          ReportCategory.UNVERIFIABLE, (_R,),
                          "a restart first reported the checkpoint's own step, and no state value tells an "
                          "evaluation from the step trained again")
    CHECKPOINT_STEP_AMBIGUOUS = ("unverifiable: checkpoint step ambiguous", Kind.UNVERIFIABLE,
                                 ReportCategory.UNVERIFIABLE, (_R,),
                                 "the reports admit two steps for the checkpoint (reported without a step, or "
                                 "saved at the top of a step) and no state value tells which")
    STATE_DOES_NOT_TELL = ("unverifiable: state metric does not tell the states apart", Kind.UNVERIFIABLE,
                           ReportCategory.UNVERIFIABLE, (_R, "state-restored"),
                           "the state value that would decide gives, within the tolerance, what a state one or more "
                           "updates away gives too (a metric that does not move, or a tolerance wider than a step's "
                           "change), so reproducing it shows nothing")
    NO_CHECKPOINT_REPORTED = ("unverifiable: no checkpoint reported", Kind.UNVERIFIABLE,
                              ReportCategory.UNVERIFIABLE, (_R,), "the run never handed Ray Train a checkpoint")
    NO_STEP_AT_CHECKPOINT = ("unverifiable: no step at the checkpoint", Kind.UNVERIFIABLE,
                             ReportCategory.UNVERIFIABLE, (_R,), "the latest checkpoint carried no step for a rank")
    NO_REPORTING_STRIDE = ("unverifiable: no reporting stride", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                           (_R,), "nothing followed the checkpoint and the reports before the fault showed no stride")
    IRREGULAR_STRIDE = ("unverifiable: irregular reporting stride", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                        (_R,), "the reports before the fault came at varying strides, so the step after the "
                               "checkpoint cannot be predicted (a Trainer logging and saving at different steps)")
    BETWEEN_REPORTS = ("unverifiable: first step between reports", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                       (_R,), "a restart first reported a step between the checkpoint and the step reported after "
                              "it: steps before it may have been trained unreported or skipped")
    EVENTS_UNREAD = ("unverifiable: events unread", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE, (_R, _B),
                     "a lost job's events log could not be read to its end")
    EVENTS_LOST = ("unverifiable: events lost", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE, (_R, _B),
                   "the recorder could not write some events (their sequence numbers are missing)")
    # -- state ------------------------------------------------------------------------------
    STATE_NOT_RESTORED = ("state not restored", Kind.FINDING, ReportCategory.STATE,
                          ("state-restored", _R, "state-trajectory"),
                          "a re-done or followed step did not reproduce its state value (declared deterministic)")
    STATE_DIFFERS = ("state differs", Kind.WARNING, ReportCategory.STATE, ("state-restored", _R, "state-trajectory"),
                     "the same, for a workload not declared deterministic: a warning")
    TOO_FEW_REDONE = ("unverifiable: too few re-done steps", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                      ("state-restored",), "a deterministic run re-did fewer than two steps after a restart, which "
                                           "prove the weights only, and no fault-free baseline was made")
    FINAL_STATE_DIFFERS = ("final state differs", Kind.FINDING, ReportCategory.FINAL_STATE, ("final-state",),
                           "the run ended in another state than its fault-free baseline")
    RUN_DID_NOT_FINISH_FOR_STATE = ("unverifiable: run did not finish", Kind.UNVERIFIABLE,
                                    ReportCategory.UNVERIFIABLE, ("final-state",),
                                    "an unfinished run has no final state to compare")
    NO_STATE_METRIC = ("unverifiable: no state metric", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                       ("final-state", "state-restored", "state-trajectory"), "no usable state value was reported")
    NO_BASELINE = ("unverifiable: no baseline", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                   ("final-state", "state-trajectory"), "no fault-free baseline could be made or used")
    BASELINE_NOT_REPRODUCED = ("unverifiable: baseline not reproduced", Kind.UNVERIFIABLE,
                               ReportCategory.UNVERIFIABLE, ("state-trajectory",),
                               "the run left its baseline before any fault")
    NO_STEP_TO_COMPARE = ("unverifiable: no step to compare", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                          ("state-trajectory",), "a restarted attempt reported no step the baseline has")
    TOO_FEW_FOLLOWED = ("unverifiable: too few steps followed", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                        ("state-trajectory",), "a restarted attempt matched the fault-free run at one step only, its "
                                               "first after the restore, which shows the weights alone")
    # -- within-budget ----------------------------------------------------------------------
    BUDGET_EXHAUSTED = ("retry budget exhausted", Kind.FINDING, ReportCategory.EXHAUSTED, (_B,),
                        "Ray ran out of retries (a finding unless the suite expects it)")
    WRONG_BUDGET_CLASS = ("charged to the wrong budget class", Kind.FINDING, ReportCategory.WRONG_CHARGE, (_B,),
                          "a fault's failure was charged to another budget class than its kind's")
    WRONG_CHARGE_COUNT = ("unexpected number of charged failures", Kind.FINDING, ReportCategory.WRONG_CHARGE, (_B,),
                          "the faults charged more or fewer failures than they should")
    BUDGET_NOT_EXHAUSTED = ("budget not exhausted", Kind.FINDING, ReportCategory.WRONG_CHARGE, (_B,),
                            "the suite expected exhaustion and Ray kept retrying")
    UNRELATED_FAILURE = ("unrelated failure", Kind.FINDING, ReportCategory.UNRELATED, (_B,),
                         "a failure no injected fault explains")
    NO_POLICY_RECORD = ("unverifiable: no failure-policy record", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                        (_B,), "a failure decision came without Ray's [FailurePolicy] accounting")
    NO_FAILURE_EVIDENCE = ("unverifiable: no failure evidence", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                           (_B,), "a charge rests on a decision tied to its fault by timing alone")
    NO_MEASURED_OUTCOMES = ("unverifiable: no measured outcomes", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                            (_B,), "a lasting fault's charge (xid, storage) with no measured outcomes to accept")
    CHARGE_NOT_MEASURED = ("charge not among the measured outcomes", Kind.FINDING, ReportCategory.WRONG_CHARGE,
                           (_B,), "a lasting fault's charge (xid, storage) is none of the measured ones")
    # -- recovery-time ----------------------------------------------------------------------
    RECOVERY_TOO_SLOW = ("recovery too slow", Kind.FINDING, ReportCategory.RECOVERY, ("recovery-time",),
                         "detection or recovery took longer than the SLO, or never happened")
    INCONCLUSIVE = ("inconclusive", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE, ("recovery-time",),
                    "the fault landed after the run had ended")
    # -- preemption-window ------------------------------------------------------------------
    NO_JIT_CHECKPOINT = ("no just-in-time checkpoint", Kind.FINDING, ReportCategory.PREEMPTION,
                         ("preemption-window",), "no checkpoint made because of the notice")
    CHECKPOINT_IN_WINDOW = ("checkpoint inside the preemption window", Kind.FINDING, ReportCategory.PREEMPTION,
                            ("preemption-window",), "a checkpoint inside a window that must have none")
    NO_CADENCE = ("unverifiable: no checkpoint cadence", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                  ("preemption-window",), "nothing before the notice tells a periodic checkpoint from one for it")
    NO_PERSIST_RECORD = ("unverifiable: no persist record", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                         ("preemption-window",), "no rank was seen persisting the window's checkpoint")
    # -- node-agent, node-recovered ---------------------------------------------------------
    AGENT_NEVER_ACTED = ("node agent never acted", Kind.FINDING, ReportCategory.NODE_RECOVERY,
                         ("node-agent", "node-recovered"), "the node health agent never acted on the Xid")
    AGENT_TOO_SLOW = ("node agent too slow", Kind.FINDING, ReportCategory.NODE_RECOVERY, ("node-agent",),
                      "the agent acted after its SLO")
    NODE_NOT_RECOVERED = ("node not recovered", Kind.FINDING, ReportCategory.NODE_RECOVERY, ("node-recovered",),
                          "the node never came back (rebooted or replaced)")
    NODE_RECOVERY_TOO_SLOW = ("node recovery too slow", Kind.FINDING, ReportCategory.NODE_RECOVERY,
                              ("node-recovered",), "the node came back after its SLO")
    NO_AGENT_EVIDENCE = ("unverifiable: no node agent evidence", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                         ("node-agent", "node-recovered"), "nothing watched the node's conditions and labels")
    # -- storage ---------------------------------------------------------------------------
    RESTORED_FAILED_UPLOAD = ("restored a checkpoint whose upload failed", Kind.FINDING, ReportCategory.STORAGE,
                              ("storage",), "a restart read a checkpoint folder whose upload a storage fault made "
                              "fail, which Ray never committed: the script loads checkpoints from storage itself")
    FAILED_RESTORE_IGNORED = ("a failed restore did not fail its attempt", Kind.FINDING, ReportCategory.STORAGE,
                              ("storage",), "a restore that met a storage fault failed, yet its attempt trained on "
                              "without the state it could not read")
    STORAGE_MET_NOTHING = ("unverifiable: the storage fault met no checkpoint transfer", Kind.UNVERIFIABLE,
                           ReportCategory.UNVERIFIABLE, ("storage",), "no checkpoint upload or restore ran in the "
                           "storage fault's window: it tested nothing")
    NO_STORAGE_EVIDENCE = ("unverifiable: no storage evidence", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                           ("storage",), "nothing recorded the run's S3 requests (no storage fault proxy)")
    # -- run-finished ----------------------------------------------------------------------
    RUN_FAILED = ("run failed", Kind.FINDING, ReportCategory.RUN_FAILED, ("run-finished",),
                  "the run or its job did not end successfully")
    RUN_DID_NOT_FINISH = ("run did not finish", Kind.FINDING, ReportCategory.RUN_FAILED, ("run-finished",),
                          "no final state was recorded, or not within the finish timeout")
    RUN_DID_NOT_FAIL_CLEANLY = ("run did not fail cleanly", Kind.FINDING, ReportCategory.RUN_FAILED,
                                ("run-finished",), "an expected exhaustion did not end the run ERRORED")
    NO_JOB_STATUS = ("unverifiable: no job status", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE, ("run-finished",),
                     "an expected exhaustion whose job status was never read")
    DRIVER_DID_NOT_EXIT = ("driver did not exit", Kind.FINDING, ReportCategory.RUN_FAILED, ("run-finished",),
                           "the script hung after fit() returned")
    # -- progress, healed -------------------------------------------------------------------
    TRAINING_STALLED = ("training stalled", Kind.FINDING, ReportCategory.STALLED, ("progress",),
                        "no rank reported for longer than the stall limit")
    DID_NOT_RESUME = ("did not resume", Kind.FINDING, ReportCategory.DID_NOT_RESUME, ("progress",),
                      "Ray never noticed the fault, or never restarted after it")
    CRASH_LOOP = ("crash loop", Kind.FINDING, ReportCategory.DID_NOT_RESUME, ("progress",),
                  "failures in a row without progress under an unlimited budget")
    ENDED_BEFORE_FAULT = ("run ended before the fault", Kind.FINDING, ReportCategory.RUN_FAILED, ("progress",),
                          "the run ended before a fault's trigger fired")
    CLEANUP_FAILED = ("cleanup failed", Kind.FINDING, ReportCategory.CLEANUP, ("healed",),
                      "a node down, a fault still armed or a resource still held after the test")
    # -- head loss -------------------------------------------------------------------------
    HEAD_LOSS_OUTCOME = ("head loss: unexpected outcome", Kind.FINDING, ReportCategory.HEAD_LOSS, ("head-loss",),
                         "a head fault did something else to the run than expected")
    HEAD_NO_REBOOT = ("head loss: no reboot", Kind.FINDING, ReportCategory.HEAD_LOSS, ("head-loss",),
                      "a head reboot kept its boot id")
    NO_OUTCOME = ("unverifiable: no outcome", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE, ("head-loss",),
                  "what the head fault did to the run could not be settled")
    CLUSTER_LOST = ("cluster lost", Kind.EXPECTED, ReportCategory.HEAD_LOSS, ("head-loss",),
                    "without GCS fault tolerance the restarted head forgot the cluster (expected)")
    NO_WORKER_EVIDENCE = ("unverifiable: no worker nodes seen", Kind.UNVERIFIABLE, ReportCategory.UNVERIFIABLE,
                          ("worker nodes after head loss",),
                          "no worker node was recorded alive before the head fault: their fate cannot be told")
    WORKER_NODE_FATE = ("unexpected worker node fate", Kind.FINDING, ReportCategory.HEAD_LOSS,
                        ("worker nodes after head loss",),
                        "worker nodes did not keep (GCS fault tolerance) or all change their node ids")


def report_phrases(category: ReportCategory) -> tuple[str, ...]:
    """What a failing test's message contains when it belongs in ``category``: the phrases of
    its findings; for missing evidence, how such a message begins.  Warnings and expected
    outcomes never fail a test, so they file nothing."""
    if category is ReportCategory.UNVERIFIABLE:
        return UNVERIFIABLE_PREFIXES
    return tuple(d.value for d in Diagnosis if d.report is category and d.kind is Kind.FINDING)
