"""Which injected fault caused each of Ray's failure decisions: by what failed, not by when.

The within-budget verdict (chaos.verdicts.budget) counts a fault's charge from the decision this
module attributes to it; a decision no fault explains is an unrelated failure, and one tied
to a fault by its timing alone is no evidence of the charge.  Reads only the timeline.
"""

from __future__ import annotations

import dataclasses
import re

from chaos.faults.catalog import measured_kinds
from chaos.timeline import Event, Timeline, fault_groups, faulted_runs, first_recovery, run_at

# Ray's own startup errors: a restart waiting for capacity the fault took away.
CAPACITY_ERRORS = ("WorkerGroupStartupTimeoutError", "WorkerGroupStartupFailedError")


@dataclasses.dataclass
class Attribution:
    """Which injected fault caused each of Ray's failure decisions, and what said so."""

    by_fault: dict[str, list[Event]]  # ledger (or group) id -> decisions it caused (first one: its charge)
    consequential: list[Event]  # restarts that waited for capacity a fault took away
    unrelated: list[Event]
    # ledger ids of faults that keep failing attempts until their node is recovered (``xid``):
    # every decision until the run recovered from them is charged to them, and what that costs
    # is the platform's
    lasting: set[str] = dataclasses.field(default_factory=set)
    # decisions a fault claimed by time only: Ray recorded nothing (no rank's error, no error
    # class that places the failure) to tell whether the fault caused them; such a claim never
    # lets within-budget pass
    by_time: list[Event] = dataclasses.field(default_factory=list)
    # what each decision's evidence said (id of the decision -> its reading), claimed or not
    readings: dict[int, "_Reading"] = dataclasses.field(default_factory=dict)
    kinds: dict[str, str] = dataclasses.field(default_factory=dict)  # ledger (or group) id -> fault kind
    # decisions of another Train run of the driver (one no fault hit) that a fault's evidence
    # explains: its node still gone when that run started; no charge of the faulted run's
    spilled: list[Event] = dataclasses.field(default_factory=list)

    def charges(self, key: str) -> list[Event]:
        return self.by_fault[key] if key in self.lasting else self.by_fault[key][:1]

    def reading(self, decision: Event) -> "_Reading | None":
        return self.readings.get(id(decision))


# Fault kinds that last — until their node is recovered (a dead GPU fails every attempt placed
# on it), or their window on the storage ends (a restore fails as the upload did): they claim
# every decision until an attempt begun after the node was back, or the window over, reported
# (Ray may notice the node's loss only after the node is already back).  What that costs is
# measured, not fixed (catalog: charge_measured).
LASTING_KINDS = measured_kinds()
# The events that end a lasting fault (its ledger id names it).
LASTING_ENDS = ("node_recovered", "storage_window_ended")
# A storage fault's failure: pyarrow's S3 client words every error it raises "AWS Error <CODE>
# during <operation>" (SLOW_DOWN, INTERNAL_FAILURE, NETWORK_CONNECTION...).
STORAGE_KINDS = tuple(k for k in measured_kinds() if k.startswith("storage-"))
_STORAGE_PHRASES = ("aws error",)
# Ray's classes for a rank or a node taken away — the worker's actor or its node died, its
# health check failed or timed out, Train saw the node preempted: what a fault that takes a
# node or a process away leaves (on whichever rank: a HyperPod reboot or a drain takes every
# pod on the machine, not only the target's).
LOSS_ERRORS = ("ActorDiedError", "ActorUnavailableError", "RayActorError", "WorkerCrashedError", "LocalRayletDiedError",
               "NodeDiedError", "WorkerHealthCheckFailedError", "WorkerHealthCheckTimeoutError", "PreemptionError")
# A rank that failed because a peer did: a collective that broke or timed out (gloo's
# "Connection closed by peer" on the survivor of a killed node, the timeout that ends a hung
# rank's collective, Ray Train's own).  It says that another rank failed or hung, not which.
# A RuntimeError is one only when the collective library names itself in it (gloo's and
# NCCL's errors carry their source path or name), not for a script's own words.
PEER_ERRORS = ("CollectiveTimeoutError", "BroadcastCollectiveTimeoutError", "DistBackendError", "DistNetworkError",
               "DistStoreError", "NCCLHangError")
_PEER_PHRASES = ("gloo", "nccl", "processgroup", "c10d", "collective operation timeout")
# The failure's own wrappers: they say nothing about what failed.
_WRAPPERS = ("WorkerGroupError", "ControllerError", "TrainingFailedError")


@dataclasses.dataclass
class _Reading:
    """What one decision's evidence says about one fault: ``fault`` (it explains the failure),
    ``other`` (the failure is elsewhere) or ``unknown`` (nothing recorded to tell); ``why`` in
    words; the rank, its node and its error when one rank is the point."""

    outcome: str
    why: str
    rank: str | None = None
    node: str | None = None
    error: str | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass
class _Failure:
    """What Ray recorded about the failure behind one decision."""

    decision: Event
    types: set[str]  # the failure's classes and its causes' (error_types)
    errors: dict[str, str]  # rank -> "Type: message", from the attempt's first poll with errors ({}: none recorded)
    placement: dict[str, dict]  # rank -> where it ran in the decision's attempt ({}: not recorded)
    started: float | None  # when the decision's attempt started (None: not recorded)

    def where(self, rank: str) -> str:
        p = self.placement.get(rank)
        return f"rank {rank} on node {_node_name(p)}" if p else f"rank {rank}"


def _node_name(p: dict | None) -> str:
    if not p or not p.get("node_id"):
        return "?"
    ip = p.get("node_ip")
    return f"{str(p['node_id'])[:8]}" + (f" ({ip})" if ip else "")


def _error_class(text: str) -> str:
    """The class a rank's error text names; a remote call's error (``RayTaskError(X): ...``,
    how a collective through Train's SynchronizationActor fails) names its cause X."""
    head = (text or "").split(":", 1)[0].strip()
    wrapped = re.fullmatch(r"\w+\((\w+)\)", head)
    if wrapped:
        return wrapped[1]
    return head if head.isidentifier() else "an error"


def _error_line(text: str) -> str:
    return next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "no error text")[:300]


def _is_peer(text: str) -> bool:
    cls = _error_class(text)
    return cls in PEER_ERRORS or (cls == "RuntimeError" and any(p in text.lower() for p in _PEER_PHRASES))


def _failure_of(timeline: Timeline, d: Event, decisions: list[Event]) -> _Failure:
    """The decision's evidence: its classes, and — for a worker-group failure — the ranks'
    errors of its attempt recorded since the run's previous decision, with the attempt's
    placement.  A controller failure (a start that timed out) carries no rank's error: the
    attempt number it bears is the last one that started, whose errors are another failure's."""
    run = d.data.get("run_id")
    types = set(d.data.get("error_types") or ())
    before = [x.t for x in decisions if x.data.get("run_id") == run and x.t < d.t]
    since = max(before) if before else float("-inf")
    errors: dict[str, str] = {}
    if "ControllerError" not in types:
        polled = [e for e in timeline.of("worker_error") if e.data.get("run_id") == run and e.attempt == d.attempt
                  and since < e.t <= d.t]
        errors = {str(r): str(m) for r, m in (polled[-1].data.get("errors") or {}).items()} if polled else {}
    started = timeline.first("attempt_started", where=lambda e: e.data.get("run_id") == run and e.attempt == d.attempt)
    placement = {str(p.get("rank")): p for p in (started.data.get("placement") or [])} if started else {}
    return _Failure(d, types, errors, placement, started.t if started else None)


def _targets(group: list[Event]) -> list[dict]:
    """The fault's targets (a correlated fault's every member's); a head fault names none."""
    return [m.data["target"] for m in group if isinstance(m.data.get("target"), dict)]


def _on_target(f: _Failure, rank: str, targets: list[dict], running: bool | None) -> bool | None:
    """Whether ``rank`` ran on a target's node in the decision's attempt (None: cannot tell).
    Without the attempt's placement, the target's own rank in the attempt the fault hit."""
    p = f.placement.get(rank)
    if p is not None and any(t.get("node_id") for t in targets):
        return any(t.get("node_id") and p.get("node_id") == t.get("node_id") for t in targets)
    if running and any(t.get("rank") is not None for t in targets):
        return any(str(t.get("rank")) == rank for t in targets)
    return None


def _is_storage(text: str) -> bool:
    return any(p in (text or "").lower() for p in _STORAGE_PHRASES)


def _read_storage(f: _Failure, group: list[Event]) -> _Reading | None:
    """A storage fault explains a rank that failed with an S3 error, on whichever node (a fault
    of the endpoint fails every client's transfers) — and no rank's own other error."""
    own = {r: m for r, m in sorted(f.errors.items()) if not _is_peer(m)}
    hit = next((r for r, m in own.items() if _is_storage(m)), None)
    if hit is not None:
        return _Reading("fault", f"{f.where(hit)} failed with an S3 error ({_error_line(own[hit])[:160]}) while the "
                        f"{group[0].data.get('fault')} fault was armed", hit, _node_name(f.placement.get(hit)),
                        _error_line(own[hit]))
    if own:
        r = next(iter(own))
        return _Reading("other", f"{f.where(r)} failed with {_error_class(own[r])}, which is no S3 error: not the "
                        f"{group[0].data.get('fault')} fault's doing", r, _node_name(f.placement.get(r)),
                        _error_line(own[r]))
    return None


def _read(f: _Failure, group: list[Event], uncertainty: float) -> _Reading:
    """Whether the fault explains the failure, from what failed (never from the timing alone).

    The fault's when: a rank or a node was lost (``LOSS_ERRORS``, on any rank: the fault takes
    a node or a process away, and a machine's every pod with it) in an attempt the fault could
    reach (running when it landed, or placed on its node); or a rank on the fault's node failed
    (a CUDA fault: the rank's own exception); or every error is a peer's symptom (a broken or
    timed-out collective: a killed node's survivor, a hung rank's peers) in an attempt that ran
    on the fault's node.  Elsewhere when the only other errors are exceptions of ranks on other
    nodes, or the loss was in an attempt the fault could not reach.  Unknown when Ray recorded
    no rank's error and no class that places the failure."""
    if group[0].data.get("fault") in STORAGE_KINDS and (storage := _read_storage(f, group)) is not None:
        return storage
    targets = _targets(group)
    nodes = ", ".join(_node_name(t) for t in targets) or "none (it names no node)"
    a = f.decision.attempt
    running = None if f.started is None else f.started <= group[0].t + uncertainty
    touches = (any(_on_target(f, r, targets, running) for r in f.placement) if f.placement and targets else None)
    reach = True if running or touches else (None if running is None and touches is None else False)
    lost = _lost(f, group, targets, running, nodes, reach)
    if lost is not None:
        return lost
    if f.errors:
        own = {r: m for r, m in sorted(f.errors.items()) if not _is_peer(m)}
        if own:
            placed = {r: _on_target(f, r, targets, running) for r in own}
            hit = next((r for r, on in placed.items() if on), None)
            if hit is not None:
                return _Reading("fault", f"{f.where(hit)}, the fault's node, failed with {_error_class(own[hit])}",
                                hit, _node_name(f.placement.get(hit)), _error_line(own[hit]))
            unplaced = next((r for r, on in placed.items() if on is None), None)
            if unplaced is not None:
                return _Reading("unknown", f"{f.where(unplaced)} failed with {_error_class(own[unplaced])}, and "
                                f"where it ran in attempt {a} was not recorded", unplaced, None,
                                _error_line(own[unplaced]))
            r = next(iter(own))
            return _Reading("other", f"{f.where(r)} failed with {_error_class(own[r])}, not on the fault's node "
                            f"{nodes}", r, _node_name(f.placement.get(r)), _error_line(own[r]))
        r, m = next(iter(sorted(f.errors.items())))
        if touches:
            return _Reading("fault", f"{f.where(r)} lost a peer ({_error_class(m)}: a collective broke or timed out) "
                            f"in an attempt that ran on the fault's node {nodes}", r, _node_name(f.placement.get(r)),
                            _error_line(m))
        if touches is None:
            return _Reading("unknown", f"{f.where(r)} lost a peer ({_error_class(m)}), and where attempt {a} ran "
                            "was not recorded", r, None, _error_line(m))
        return _Reading("other", f"{f.where(r)} lost a peer ({_error_class(m)}), but attempt {a} ran nothing on "
                        f"the fault's node {nodes}", r, _node_name(f.placement.get(r)), _error_line(m))
    named = sorted(f.types - set(_WRAPPERS))
    if named and all(c in PEER_ERRORS for c in named) and touches is not None:
        if touches:
            return _Reading("fault", f"a collective broke or timed out ({named[0]}) in an attempt that ran on the "
                            f"fault's node {nodes}")
        return _Reading("other", f"a collective broke or timed out ({named[0]}), but attempt {a} ran nothing on the "
                        f"fault's node {nodes}")
    said = f"only the class(es) {', '.join(named)}, which do not say which rank failed" if named else \
        "no error class"
    return _Reading("unknown", f"Ray recorded no rank's error for attempt {a}'s failure and {said}")


def _lost(f: _Failure, group: list[Event], targets: list[dict], running: bool | None, nodes: str,
          reach: bool | None) -> _Reading | None:
    """The reading of a failure where a rank or a node was lost, None where none was.  A
    fault that takes a node or a process away explains a loss on any rank of an attempt it
    could reach (a machine's every pod goes with it); one that leaves its node up (a CUDA
    error inside a rank: ``detect_by`` "train") only a loss on its own node — another node's
    actor death is not its doing (and a loss no rank's error places leaves the ranks' own
    errors to decide)."""
    a = f.decision.attempt
    classes = (f.types & set(LOSS_ERRORS)) | {_error_class(m) for m in f.errors.values()} & set(LOSS_ERRORS)
    if not classes:
        return None
    rank = next((r for r, m in sorted(f.errors.items()) if _error_class(m) in LOSS_ERRORS), None)
    who = f"{f.where(rank)} was lost ({_error_class(f.errors[rank])})" if rank else f"a rank was lost ({min(classes)})"
    node, error = (_node_name(f.placement.get(rank)), _error_line(f.errors[rank])) if rank else (None, None)
    if group[0].data.get("detect_by") == "train":
        if rank is None:
            return None
        on = _on_target(f, rank, targets, running)
        if on is None:
            return _Reading("unknown", f"{who}, and where it ran in attempt {a} was not recorded", rank, None, error)
        if not on:
            return _Reading("other", f"{who}, but the {group[0].data.get('fault')} fault takes no node away and hit "
                            f"node {nodes}", rank, node, error)
        return _Reading("fault", f"{who} on the fault's node", rank, node, error)
    if reach is False:
        return _Reading("other", f"{who} in attempt {a}, which began after the fault and ran nothing on its node "
                        f"{nodes}", rank, node, error)
    return _Reading("fault", f"{who}: the fault took a node or a process away", rank, node, error)


def attribute(timeline: Timeline) -> Attribution:
    """Each fault claims the first decision after it that its evidence explains (``_read``:
    what failed, where — not the timing alone) — a correlated fault's members together, as
    one fault, over all their nodes; a lasting fault (``xid``, a storage fault) every such decision
    until the run recovered from it, a capacity wait included; a later capacity error (the worker group
    could not start while the fault's node was missing) is its consequence; every other
    decision is unrelated to the injected faults, even one right after a fault (a script's
    crash on another node).

    A decision after a fault that Ray recorded nothing about — no rank's error for its attempt
    and no class that places the failure — is claimed by time, as before this rule, and listed
    in ``by_time``: within-budget is then *unverifiable: no failure evidence*, never a pass
    (and a finding that does not depend on the claim still fails)."""
    faults = timeline.of("fault_injected")
    decisions = faulted_run_decisions(timeline)
    failures = [_failure_of(timeline, d, decisions) for d in decisions]
    groups = fault_groups(timeline)
    keys = [g[0].data.get("group") or g[0].data.get("ledger_id") or str(i) for i, g in enumerate(groups)]
    by_fault: dict[str, list[Event]] = {k: [] for k in keys}
    lasting = {k for k, g in zip(keys, groups) if g[0].data.get("fault") in LASTING_KINDS}
    claimed: dict[int, str] = {}  # decision index -> the key of the fault that claimed it
    readings: dict[int, _Reading] = {}
    by_time: list[Event] = []
    windows = []
    for i, (key, group) in enumerate(zip(keys, groups)):
        nxt = groups[i + 1][0].t if i + 1 < len(groups) else float("inf")
        if key in lasting:  # until the run recovered from it: an attempt begun after it was over reported
            back = next((e for e in timeline.events if e.kind in LASTING_ENDS and e.data.get("ledger_id") == key),
                        None)
            hit = first_recovery(timeline.events, run_at(timeline, group[0].t), back.t if back else group[0].t)
            nxt = min(nxt, hit[1].t) if hit is not None else nxt
        windows.append((key, group, group[0].t - timeline.clock_uncertainty, nxt))
        for j, d in enumerate(decisions):
            if j in claimed or not group[0].t - timeline.clock_uncertainty <= d.t < nxt:
                continue
            if set(d.data.get("error_types") or ()) & set(CAPACITY_ERRORS):
                if key not in lasting:
                    continue  # a consequence of a lost node, never a fault's own charge
                reading = _Reading("fault", "the worker group could not start while the fault's node was being "
                                   "recovered")
            else:
                reading = _read(failures[j], group, timeline.clock_uncertainty)
            readings.setdefault(j, reading)
            if reading.outcome == "other":
                continue
            readings[j] = reading
            by_fault[key].append(d)
            claimed[j] = key
            if reading.outcome == "unknown":
                by_time.append(d)
            if key not in lasting:
                break
    consequential, unrelated = [], []
    for j, d in enumerate(decisions):
        if j in claimed:
            continue
        after_fault = any(f.t - timeline.clock_uncertainty <= d.t for f in faults)
        if after_fault and set(d.data.get("error_types") or ()) & set(CAPACITY_ERRORS):
            consequential.append(d)
            continue
        unrelated.append(d)
        if j in readings and readings[j].outcome == "other":
            continue
        window = next(((k, g) for k, g, start, end in windows if start <= d.t < end), None)
        if window is None:
            readings[j] = _Reading("other", "no fault had been injected before it" if not after_fault else
                                   "it came after the fault's window had ended (the run had recovered from it)")
            continue
        k, g = window
        seen = _read(failures[j], g, timeline.clock_uncertainty)
        if seen.outcome == "other":
            readings[j] = seen
        else:
            charged_for = next((decisions[i].attempt for i, key in claimed.items() if key == k), None)
            readings[j] = dataclasses.replace(seen, outcome="other", why=(
                f"the fault before it ({g[0].data.get('fault')}) was already charged for attempt {charged_for}'s "
                "failure, and a fault is charged once" if charged_for is not None else seen.why))
    att = Attribution(by_fault, consequential, unrelated, lasting, by_time,
                      {id(decisions[j]): r for j, r in readings.items()},
                      {k: g[0].data.get("fault") for k, g in zip(keys, groups)})
    _read_other_runs(timeline, groups, att)
    return att


def _read_other_runs(timeline: Timeline, groups: list[list[Event]], att: Attribution) -> None:
    """The failure decisions of the driver's other Train runs (a warm-up or a later fit() that
    no fault hit) are no fault's charge, and each is an unrelated failure unless what failed
    shows the latest fault before it (its node still gone when that run started): those are
    listed as the fault's spill-over, and one Ray recorded nothing about is no evidence."""
    hit = set(faulted_runs(timeline))
    every = timeline.of("failure_decision")
    for d in (e for e in every if e.data.get("run_id") not in hit):
        before = [g for g in groups if g[0].t - timeline.clock_uncertainty <= d.t]
        run = d.data.get("run_id")
        if not before:
            att.unrelated.append(d)
            att.readings[id(d)] = _Reading("other", f"it failed in Train run {run}, which no fault hit, before any "
                                           "fault was injected")
            continue
        seen = _read(_failure_of(timeline, d, every), before[-1], timeline.clock_uncertainty)
        where = f"in Train run {run}, which no fault hit"
        att.readings[id(d)] = dataclasses.replace(seen, why=f"{seen.why} ({where})")
        if seen.outcome == "other":
            att.unrelated.append(d)
        elif seen.outcome == "unknown":
            att.by_time.append(d)
        else:
            att.spilled.append(d)


def faulted_run_decisions(timeline: Timeline) -> list[Event]:
    """Ray's failure decisions in the runs the faults hit (a warm-up or a later fit() is
    another run, with its own budget)."""
    hit = set(faulted_runs(timeline))
    return [e for e in timeline.of("failure_decision") if e.data.get("run_id") in hit]
