"""head-loss: what a head fault did to the run (chaos.faults.head settles it into a
``head_loss`` event), and what became of the worker nodes."""

from __future__ import annotations

from typing import Any

from chaos.timeline import Timeline
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.recovery import seconds
from chaos.verdicts.status import Status
from chaos.verdicts.verdict import Verdict

#: what a head fault does to the run, by whether the GCS is fault tolerant (Ray 2.60, measured:
#: README): the driver runs on the head and dies with it; without an external Redis the
#: restarted head has an empty GCS
HEAD_OUTCOME_BY_GCS_FT = {True: "driver-lost", False: "cluster-lost"}


class HeadLoss:
    name = "head-loss"
    judges_a_stopped_run = True

    def applies(self, expect: Expect) -> bool:
        return True

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]:
        out = []
        for e in timeline.of("head_loss"):
            out += [head_loss_outcome(e.data, expect.head_outcome), workers_after_head_loss(e.data)]
        return out


def _times(loss: dict[str, Any]) -> str:
    up, boots = loss.get("head_up_s"), loss.get("head_boot_ids") or []
    times = (f"head unreachable {seconds(loss.get('head_unreachable_s'))} and back {seconds(up)} after the fault"
             if up is not None else "head did not come back")
    if len(boots) == 2:
        times += (f", its host rebooted (boot id {boots[0][:8]} → {boots[1][:8]})" if boots[0] != boots[1]
                  else ", its host kept its boot id")
    return times


def head_loss_outcome(loss: dict[str, Any], expected: str | None = None) -> Verdict:
    """The run's fate after a head fault (a ``head_loss`` event's data) against ``expected``
    (default: what the pinned Ray was measured to do)."""
    expected = expected or HEAD_OUTCOME_BY_GCS_FT[bool(loss.get("gcs_ft"))]
    name = f"head-loss ({loss.get('fault')}, GCS fault tolerance {'on' if loss.get('gcs_ft') else 'off'})"
    outcome, said, boots = loss.get("outcome"), loss.get("diagnosis", ""), loss.get("head_boot_ids") or []
    if outcome is None:
        return Verdict(name, Status.UNVERIFIABLE, f"unverifiable: no outcome: {said}", Diagnosis.NO_OUTCOME, loss)
    times = _times(loss)
    if outcome != expected:
        return Verdict(name, Status.FAIL, f"head loss: unexpected outcome: expected {expected}, got {outcome}: {said} "
                       f"({times})", Diagnosis.HEAD_LOSS_OUTCOME, {**loss, "expected": expected})
    if loss.get("fault") == "head-reboot" and len(boots) == 2 and boots[0] == boots[1]:
        return Verdict(name, Status.FAIL, f"head loss: no reboot: expected the head's host to reboot, but it kept "
                       f"boot id {boots[0]} ({times})", Diagnosis.HEAD_NO_REBOOT, loss)
    if outcome == "cluster-lost":
        return Verdict(name, Status.EXPECTED, f"{said} ({times})", Diagnosis.CLUSTER_LOST, loss)
    return Verdict(name, Status.PASS, f"{said} ({times})", None, loss)


def workers_after_head_loss(loss: dict[str, Any]) -> Verdict:
    """Every worker node outlived the head fault under its Ray node id (GCS fault tolerance),
    or none did (a new GCS: they came back as new nodes)."""
    kept = bool(loss.get("gcs_ft"))
    before, after = loss.get("workers_before") or {}, loss.get("workers_after") or {}
    survived = set(before) & set(after)
    evidence = {"fault": loss.get("fault"), "before": before, "after": after,
                "expected": "kept" if kept else "new ids"}
    name = f"worker nodes after head loss ({loss.get('fault')})"
    if not before:  # nothing to keep or lose: every fate would pass
        return Verdict(name, Status.UNVERIFIABLE, "unverifiable: no worker nodes seen: none was recorded alive before "
                       "the head fault, so what became of them cannot be told", Diagnosis.NO_WORKER_EVIDENCE, evidence)
    if kept:
        ok = bool(survived) and survived == set(before)
        wrong = (f"lost {sorted(n[:8] for n in set(before) - survived) or 'every node'}, expected all kept")
        good = f"all {len(survived)} worker nodes kept their Ray node ids through the head's restart"
    else:
        ok = not survived and len(after) >= len(before)
        wrong = (f"{sorted(n[:8] for n in survived)} kept their ids, {len(after)} of {len(before)} alive, expected "
                 "all under new ids")
        good = "no worker node kept its Ray node id: the new GCS did not know them; all came back as new nodes"
    if ok:
        return Verdict(name, Status.PASS, good, None, evidence)
    return Verdict(name, Status.FAIL, f"unexpected worker node fate: {wrong}", Diagnosis.WORKER_NODE_FATE, evidence)
