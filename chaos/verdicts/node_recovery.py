"""node-agent, node-recovered: per ``xid`` fault, the links only the platform can make —
the node agent acted on the Xid (its condition / label / taint on the node) within its SLO,
and the node came back (Ready with a new boot id, or a new node) within the recovery SLO.
Missing evidence is unverifiable; an agent that never acted fails both."""

from __future__ import annotations

import dataclasses
from typing import Any

from chaos.timeline import Event, Timeline
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.status import Status
from chaos.verdicts.verdict import Verdict


class NodeRecovery:
    name = "node-recovery"
    judges_a_stopped_run = True

    def applies(self, expect: Expect) -> bool:
        return True

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]:
        return node_recovery_chain(timeline)


@dataclasses.dataclass
class _Chain:
    """One xid fault's chain events (None: not seen)."""

    fault: Event
    logged: Event | None
    acted: Event | None
    silent: Event | None
    back: Event | None
    stuck: Event | None
    broken: Event | None

    @classmethod
    def of(cls, timeline: Timeline, fault: Event) -> _Chain:
        lid = fault.data.get("ledger_id")

        def mine(kind: str) -> Event | None:
            e: Event | None = timeline.first(kind, where=lambda e: e.data.get("ledger_id") == lid)
            return e

        return cls(fault, mine("xid_logged"), mine("node_agent_acted"), mine("node_agent_silent"),
                   mine("node_recovered"), mine("node_not_recovered"), mine("chain_watch_failed"))

    @property
    def since(self) -> float:
        return self.logged.t if self.logged is not None else self.fault.t  # the line, not the pod that wrote it

    def slo(self, key: str) -> Any:
        return self.logged.data.get(key) if self.logged is not None else None

    def no_evidence(self) -> str:
        return "unverifiable: no node agent evidence: " + (
            f"the watch of the node failed: {self.broken.data.get('error')}" if self.broken is not None else
            "nothing watched the node's conditions, labels and taints (it needs the Kubernetes API)")


def node_recovery_chain(timeline: Timeline) -> list[Verdict]:
    out = []
    for i, fault in enumerate((e for e in timeline.of("fault_injected") if e.data.get("fault") == "xid"), 1):
        c = _Chain.of(timeline, fault)
        logged = c.logged.data if c.logged is not None else {}
        evidence = {"xid": logged.get("xid", "?"), "line": logged.get("line"), "kernel_log": logged.get("written"),
                    "agent_slo_s": logged.get("agent_slo_s"), "recover_slo_s": logged.get("recover_slo_s")}
        out += [_agent(f"node-agent (fault {i})", c, evidence), _recovered(f"node-recovered (fault {i})", c, evidence)]
    return out


def _agent(name: str, c: _Chain, evidence: dict[str, Any]) -> Verdict:
    xid, slo = evidence["xid"], c.slo("agent_slo_s")
    if c.acted is not None:
        after = c.acted.t - c.since
        signal = ", ".join(f"{k} {v}" for k, v in c.acted.data.items() if k in ("condition", "label", "taints"))
        evidence.update(agent_after_s=round(after, 3),
                        signals={k: c.acted.data.get(k) for k in ("condition", "label", "taints")})
        if slo is not None and after > slo:
            return Verdict(name, Status.FAIL, f"node agent too slow: it acted on Xid {xid} after {after:.1f} s (SLO "
                           f"{slo:.1f} s): {signal}", Diagnosis.AGENT_TOO_SLOW, evidence)
        return Verdict(name, Status.PASS, f"the node agent acted on Xid {xid} after {after:.1f} s: {signal}", None,
                       evidence)
    if c.silent is not None:
        evidence["seen"] = c.silent.data.get("seen")
        return Verdict(name, Status.FAIL, f"node agent never acted: automatic node recovery did not act on Xid {xid} "
                       f"within {c.silent.data.get('waited_s', 0):.0f} s: {c.silent.data.get('seen')}",
                       Diagnosis.AGENT_NEVER_ACTED, evidence)
    return Verdict(name, Status.UNVERIFIABLE, c.no_evidence(), Diagnosis.NO_AGENT_EVIDENCE, evidence)


def _recovered(name: str, c: _Chain, evidence: dict[str, Any]) -> Verdict:
    slo = c.slo("recover_slo_s")
    if c.back is not None:
        took = c.back.t - (c.acted.t if c.acted is not None else c.since)
        b = c.back.data
        evidence.update(node_back_after_s=round(took, 3), **{k: b.get(k) for k in ("action", "node_after",
                                                                                  "boot_id_after")})
        how = (f"rebooted (boot id {b.get('boot_id_before')} -> {b.get('boot_id_after')})"
               if b.get("action") == "reboot" else f"replaced by node {b.get('node_after')}")
        if slo is not None and took > slo:
            return Verdict(name, Status.FAIL, f"node recovery too slow: node {b.get('node')} {how} {took:.1f} s after "
                           f"the agent acted (SLO {slo:.1f} s)", Diagnosis.NODE_RECOVERY_TOO_SLOW, evidence)
        return Verdict(name, Status.PASS, f"node {b.get('node')} {how} {took:.1f} s after the agent acted", None,
                       evidence)
    if c.stuck is not None or c.silent is not None:
        why = (f"waited {c.stuck.data.get('waited_s', 0):.0f} s: {c.stuck.data.get('seen')}" if c.stuck is not None
               else "the node agent never acted, so nothing recovered it")
        return Verdict(name, Status.FAIL, f"node not recovered: {why}", Diagnosis.NODE_NOT_RECOVERED, evidence)
    return Verdict(name, Status.UNVERIFIABLE, c.no_evidence(), Diagnosis.NO_AGENT_EVIDENCE, evidence)
