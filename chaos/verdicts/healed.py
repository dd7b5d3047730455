"""healed: after the test every node is alive (or replaced), no fault is still armed, and
every resource the run held is free again."""

from __future__ import annotations

from typing import Any

from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.status import Status
from chaos.verdicts.verdict import Verdict


def healed(nodes_ok: bool, nodes_detail: str, armed: list[dict[str, Any]], resources_ok: bool,
           resources_detail: str) -> Verdict:
    problems = []
    if not nodes_ok:
        problems.append(nodes_detail)
    if armed:
        problems.append(f"{len(armed)} fault(s) still armed: " + ", ".join(f"{a['fault']}@{a['id']}" for a in armed))
    if not resources_ok:
        problems.append(resources_detail)
    evidence = {"nodes": nodes_detail, "armed": armed, "resources": resources_detail}
    if problems:
        return Verdict("healed", Status.FAIL, "cleanup failed: " + "; ".join(problems), Diagnosis.CLEANUP_FAILED,
                       evidence)
    return Verdict("healed", Status.PASS, f"{nodes_detail}; no fault armed; {resources_detail}", None, evidence)
