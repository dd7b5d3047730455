"""One chaos experiment, end to end: steady state → trigger → inject → detect → recover
→ finish → verify → heal, every wait event-driven with a deadline.

Suites describe *what* (workload, faults with their triggers, expectations); this module
does the *how* and always cleans up: faults are reverted and the run is stopped on every
exit path, and artefacts are attached even when a step fails.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import queue
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import psutil

from chaos import cleanup, plot, summary
from chaos.backends.base import Backend
from chaos.cleanup import Cleanup
from chaos.cluster import ClusterView, Node, Target
from chaos.errors import ChaosError, InjectionError, WaitTimeout
from chaos.faults.base import Fault, FaultContext, Injection
from chaos.faults.correlated import Correlated, fan_out, spread_s
from chaos.ledger import Ledger
from chaos.progress import CRASH_LOOP_FAILURES, Finding, StallWatch
from chaos.report import Reporter
from chaos.timeline import Event, Timeline, first_recovery, run_at
from chaos.train.run import Run, RunSpec
from chaos.transport.base import clock_offset
from chaos.train.tape import ENV_TAPE_FILE
from chaos.triggers import run_ended
from chaos.verdicts import Expect, Status, Verdict, check, judge
from chaos.verdicts.healed import healed
from chaos.verdicts.progress import did_not_resume, ended_before_fault
from chaos.verdicts.run_finished import did_not_end
from chaos.waits import poll_until

PREEMPTION_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Timeouts:
    start_s: float = 300.0  # submission → first report (torch import on a busy 2-core box)
    trigger_s: float = 300.0
    detect_s: float = 60.0
    recover_s: float = 300.0
    finish_s: float = 600.0
    driver_exit_s: float = 120.0  # Train's run ended → its job ends (a driver's own shutdown takes seconds)
    heal_s: float = 180.0


@dataclasses.dataclass
class Judging:
    """How verdicts fail a test: ``unverifiable`` is ``fail`` (default) or ``warn``; the stall
    limit is learnt from the run unless set; a crash loop is this many failures in a row
    without progress under an unlimited budget."""

    unverifiable: str = "fail"
    stall_limit_s: float | None = None
    crash_loop_failures: int = CRASH_LOOP_FAILURES


def node_clock_offset(env: "Environment", node_id: str) -> tuple[float, float]:
    """(node ``node_id``'s clock - this machine's, round trip): none to measure for a node on
    this machine (the embedded head), else through the node's host transport."""
    node = env.cluster.node(node_id)
    if node is not None and node.ip in {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}:
        return 0.0, 0.0
    return clock_offset(env.backend.host(node_id).transport)


class NotStarted(ChaosError):
    """A dry run without a profile was asked for the cluster, which it does not start: the
    plugin skips the test with this message."""


@dataclasses.dataclass
class Environment:
    """What the pytest plugin hands an experiment: a backend's cluster, the ledger, where things go."""

    backend: Backend
    ledger: Ledger
    out_dir: Path
    timeouts: Timeouts = dataclasses.field(default_factory=Timeouts)
    dry_run: bool = False  # plans are printed from read-only state (chaos.plan); no experiment runs
    rehearsal: bool = False  # runs go to every trigger, targets are resolved and checked, nothing is injected
    tape: bool = False  # each run's recorder tape into its run directory (chaos.train.tape)
    abort_reason: str | None = None
    _timelines: list = dataclasses.field(default_factory=list)

    @property
    def cluster(self) -> ClusterView:
        if self.backend.cluster is None and self.dry_run:
            raise NotStarted("this test reads the cluster's nodes itself, and a dry run does not start the embedded "
                             "cluster (with --chaos-profile, a dry run reads your cluster's)")
        return self.backend.cluster

    @property
    def head_node_id(self) -> str:
        return self.backend.head_node_id

    def abort(self, reason: str) -> None:
        """Stop every experiment's waits at once (the health guard's stop condition)."""
        self.abort_reason = reason
        for timeline in list(self._timelines):
            timeline.abort(reason)


@dataclasses.dataclass
class Outcome:
    name: str
    timeline: Timeline
    verdicts: list[Verdict]
    targets: list[Target]
    run: Run
    unverifiable: str = "fail"
    injections: list[Injection] = dataclasses.field(default_factory=list)  # what was injected, with its evidence

    def verdict(self, prefix: str) -> Verdict:
        """The first verdict named ``prefix``...; a LookupError lists the verdicts there are
        (a bare StopIteration once hid which ones a failing integration session had)."""
        found = next((v for v in self.verdicts if v.name.startswith(prefix)), None)
        if found is None:
            raise LookupError(f"no verdict {prefix!r} among: " + "; ".join(v.line() for v in self.verdicts))
        return found

    def assert_verdicts(self) -> None:
        """Fail the test with every failing verdict's message (diagnosis first); an
        unverifiable verdict fails too unless --chaos-unverifiable warn."""
        check(self.verdicts, self.unverifiable)


def prepare_faults(env: Environment, faults: list, timeline: Timeline, say: Callable[[str], None]) -> None:
    """Put on the hosts what each fault needs before a run starts (e.g. the CUDA shim), once
    per fault object (a fault remembers what it put there); a rehearsal touches no host."""
    if env.rehearsal:
        return
    ctx = FaultContext(cluster=env.cluster, timeline=timeline, backend=env.backend)
    for _, fault in faults:
        for member in getattr(fault, "members", [fault]):
            done = member.prepare(ctx)
            if done:
                say(f"prepare: {done}")


class RunLost(ChaosError):
    """A fault left nothing of the run to recover (a lost cluster): the waits stop and the run
    is judged on what happened, as a Finding's is."""


class Experiment:
    def __init__(self, env: Environment, spec: RunSpec, faults: list[tuple[object, Fault | Correlated]],
                 expect: Expect, test_id: str, reporter: Reporter | None = None, judging: Judging | None = None):
        self.env = env
        self.judging = judging or Judging()
        self.spec = spec
        self.faults = faults
        self.expect = expect
        self.test_id = test_id
        self.reporter = reporter or Reporter()
        self.timeline = Timeline()
        self.slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", test_id.split("::")[-1])[:80]
        self.dir = Path(env.out_dir) / "runs" / f"{self.slug}-{time.strftime('%Y%m%d-%H%M%S')}"
        self._armed: list[Injection] = []
        self._injections: list[Injection] = []
        self._group_of: dict[str, str] = {}  # ledger id -> group id, for a correlated fault's members
        self._run: Run | None = None
        self._judged: list[Verdict] = []  # the verdicts judged from the timeline (rejudge replaces them)
        self.finished = True  # the run ended by itself (False: stopped on a finding)

    def run(self) -> Outcome:
        env, r = self.env, self.reporter
        self.dir.mkdir(parents=True, exist_ok=True)
        env._timelines.append(self.timeline)
        if env.abort_reason:
            self.timeline.abort(env.abort_reason)
        kinds = sorted({f.kind for _, f in self.faults})
        r.labels(",".join(kinds), env.backend.label, self.slug)
        for k, v in self.spec.params.items():
            r.parameter(k, v)
        ctx = FaultContext(cluster=env.cluster, timeline=self.timeline, backend=env.backend)
        try:
            prepare_faults(env, self.faults, self.timeline, r.say)
        except BaseException:
            env._timelines.remove(self.timeline)
            raise
        fault_env = self.run_env()
        run = self._run = Run(self.spec, env.cluster, self.timeline, self.dir, extra_env=fault_env,
                              clock=lambda node_id: node_clock_offset(env, node_id))
        targets: list[Target] = []
        nodes_before = env.cluster.table()
        joined: queue.SimpleQueue = queue.SimpleQueue()
        env.cluster.watch(self.timeline, on_joined=joined.put)
        preparer = threading.Thread(target=self._prepare_joined, args=(ctx, joined), name="prepare-joined",
                                    daemon=True)
        preparer.start()
        verdicts: list[Verdict] = []
        self.verdicts = verdicts
        watch = StallWatch(self.judging.stall_limit_s, env.timeouts.recover_s,
                           slo_recover_s=self.expect.slo_recover_s, crash_loop_failures=self.judging.crash_loop_failures)
        finding: Verdict | None = None
        stopped = interrupted = False
        try:
            with r.step("steady state: cluster healthy, run submitted, training started"):
                ok, detail = env.backend.healthy_workers()
                if not ok:
                    raise WaitTimeout(f"cluster not healthy before the experiment: {detail}")
                run.submit()
                first = run.wait_training_started(env.timeouts.start_s)
                r.say(f"run {run.job_id}: first report step={first.data.get('step')} attempt={first.attempt}; "
                      f"head clock offset {self.timeline.clock_offset:+.3f} s")
                r.parameter("head clock offset (s)", round(self.timeline.clock_offset, 3))
            self.timeline.guard = watch
            for i, (trigger, fault) in enumerate(self.faults, 1):
                r.parameter(f"fault {i}", fault.describe())
                r.parameter(f"trigger {i}", trigger.describe())
                watch.waiting_for = trigger.describe()
                with r.step(f"fault {i}: wait until {trigger.describe()}"):
                    fired = self._wait_trigger(i, trigger)
                    r.say(f"trigger fired on {fired.describe()}")
                with r.step(f"fault {i}: inject {fault.describe()}"):
                    hit = (self._inject_group(ctx, fault) if isinstance(fault, Correlated)
                           else [self._inject(ctx, fault)])
                    targets.extend(hit)
                    r.parameter(f"target {i}", "; ".join(t.describe() for t in hit))
                if env.rehearsal:
                    continue
                injs = self._injections[-len(hit):]
                with r.step(f"fault {i}: detect (wait for {'; '.join(inj.fault.detection(inj.target) for inj in injs)})"):
                    self.timeline.guard = None  # a fault may legitimately silence the run until detected
                    for inj in injs:
                        self._detect(inj)
                    self._after_detect(ctx, injs)
                    self._follow_fate(run, injs)
                if fault.one_shot:  # disarm before the next attempt can start, or it would fail again
                    self._revert_all(ctx)
                watch.waiting_for = "the next attempt's first report"
                self.timeline.guard = watch
                with r.step(f"fault {i}: recover (next attempt reports, or the budget runs out)"):
                    self._recover()
                self._revert_all(ctx)
            if env.rehearsal:  # every target is resolved and printed; nothing to finish or verify
                return Outcome(self.slug, self.timeline, verdicts, targets, run, self.judging.unverifiable,
                               self._injections)
            watch.waiting_for = "the run to end"
            with r.step("finish: the run ends by itself"):
                exit_s = min(env.timeouts.finish_s, env.timeouts.driver_exit_s)
                try:
                    run.wait_finished(env.timeouts.finish_s, exit_s)
                except WaitTimeout as err:
                    log.warning("finish: %s", err)
                    raise Finding(did_not_end(self.timeline.events, env.timeouts.finish_s, exit_s,
                                              run.status())) from err
            self.timeline.guard = None
            self._collect_storage()
            with r.step("verify: verdicts from the timeline"):
                self._judged = judge(self.timeline, self.expect)
                verdicts.extend(self._judged)
                for v in verdicts:
                    r.say(v.line())
        except Finding as f:  # the run stalled or never resumed: stop it, judge what it did
            finding, stopped = f.verdict, True
            r.say(f"stopped waiting: {finding.message}")
        except RunLost as lost:  # nothing left to recover: judge what happened
            stopped = True
            r.say(f"stopped: {lost}")
        except KeyboardInterrupt:  # Ctrl-C, or the SIGTERM of a cancelled CI job (pytest_plugin)
            interrupted = True
            raise
        finally:
            self.timeline.guard = None
            env.backend.head_away.clear()
            way_out = self._way_out(interrupted)
            way_out.step("revert faults", lambda: self._revert_all(ctx, final=True))
            way_out.step("stop the run", lambda: run.stop(wait=not interrupted), needs_cluster=True)
            if stopped:
                self._collect_storage()
                with r.step("verify: verdicts from what the run did before it stopped"):
                    self._judged = judge(self.timeline, self.expect, finished=False)
                    verdicts.extend(self._judged)
                    if finding is not None:
                        verdicts.append(finding)
                    for v in verdicts:
                        r.say(v.line())
            way_out.step("stop the node watcher", env.cluster.stop_watching)
            joined.put(None)
            # a delivery under way ends within deliver_shim's own timeouts
            preparer.join(timeout=way_out.remaining(150.0))
            env._timelines.remove(self.timeline)
            heal_verdict = self._heal(run, way_out, wait=not interrupted)
            verdicts.append(heal_verdict)
            r.say(heal_verdict.line())
            self._attach(run, nodes_before, verdicts, way_out)
            self.finished = not stopped
            self._write_judging()
        return Outcome(self.slug, self.timeline, verdicts, targets, run, self.judging.unverifiable,
                       self._injections)

    def rejudge(self, expect: Expect) -> list[Verdict]:
        """The run judged again with ``expect`` — a fault-free baseline made after it, which
        a deterministic run that re-did too few steps needs (chaos.verdicts.state) — in place
        of the verdicts judged from its timeline; what the waits found and the heal verdict stay."""
        judged = {id(v) for v in getattr(self, "_judged", [])}
        kept = [v for v in self.verdicts if id(v) not in judged]
        self.expect = expect
        with self.reporter.step("verify again: against the fault-free baseline"):
            again = judge(self.timeline, expect, finished=self.finished)
            for v in again:
                self.reporter.say(v.line())
        self.verdicts[:] = again + kept
        self._judged = again
        self.reporter.attach_json("verdicts (with the fault-free baseline)", [v.to_json() for v in self.verdicts])
        self._write_judging()
        return self.verdicts

    def _write_judging(self) -> None:
        """What the contract tier replays the tape against (tests/contract)."""
        if self.env.tape:
            (self.dir / "judging.json").write_text(json.dumps(
                {"expectation": self.expect.to_json(), "finished": self.finished}, default=str))

    def _prepare_joined(self, ctx: FaultContext, joined: "queue.SimpleQueue[Node | None]") -> None:
        """Each worker node that joins during the run gets what the faults put on the hosts
        before it (``Fault.prepare_node``), one node after another until None; a failure is
        said and left to the arming, which checks what it needs."""
        while (node := joined.get()) is not None:
            if self.env.rehearsal:
                continue
            for _, fault in self.faults:
                for member in getattr(fault, "members", [fault]):
                    try:
                        done = member.prepare_node(ctx, node)
                    except Exception as e:
                        log.warning("prepare %s on joined node %s: %s", member.kind, node.short(), e)
                        self.reporter.say(f"prepare: could not prepare node {node.short()} for {member.kind}: {e}")
                        continue
                    if done:
                        self.reporter.say(f"prepare: {done}")
                        self.timeline.emit("harness", "node_prepared", node_id=node.node_id, fault=member.kind,
                                           what=done)

    def run_env(self) -> dict[str, str]:
        """What the run's environment gets from the harness: each fault's settings, the
        preemption watcher off where nothing can drain a node, the tape's path."""
        env: dict[str, str] = {}
        for _, fault in [] if self.env.rehearsal else self.faults:  # a rehearsal arms nothing in the run
            env.update(fault.run_env())
        drains = any(m.budget_class == "preemption" for _, f in self.faults for m in getattr(f, "members", [f]))
        if not drains and not self.env.backend.external_drains:
            # Train's preemption watcher (an actor per attempt, ~2.5 CPU s of imports each)
            # would watch for nothing.
            env[PREEMPTION_WATCHER] = "0"
        if self.env.tape:
            env[ENV_TAPE_FILE] = str((self.dir / "tape.jsonl").resolve())
        return env

    # -- phases ------------------------------------------------------------------
    def _inject(self, ctx: FaultContext, fault: Fault) -> Target:
        """Resolve, check (the backend's safety rules, fail closed; then the privileges the kind
        needs on the host), record, inject; the Injection is kept in ``_injections`` (rehearsal:
        nothing is recorded or injected)."""
        backend = self.env.backend
        target = fault.resolve(ctx)
        try:
            backend.check_target(target)
        except ChaosError as e:
            if self.env.rehearsal:
                self.reporter.say(f"REHEARSAL: {fault.describe()} into {target.describe()} would be REFUSED: {e}")
                return target
            raise
        if self.env.rehearsal:
            self.reporter.say(f"REHEARSAL: would inject {fault.describe()} into {target.describe()}")
            return target
        backend.check_privileges(fault.kind, target)  # a rehearsal reaches no host; ray-chaos doctor asks them
        inj = Injection(fault, target, backend.host(target.node_id))
        inj.slot = backend.live_faults.acquire(fault.describe())
        try:
            entry = self._record(inj)
        except BaseException:  # not recorded (e.g. on the cluster): not injected, its slot is free again
            backend.live_faults.release(inj.slot)
            raise
        try:
            details = self._issue(ctx, inj)
        except BaseException as e:
            self.env.ledger.mark(entry, "failed", error=f"inject: {e}")
            if isinstance(e, Exception):
                raise InjectionError(f"injection failed: {fault.describe()} into {target.describe()}: {e}") from e
            raise
        self.env.ledger.mark(entry, "injected", **details)
        self.reporter.say(f"injected {fault.describe()} into {target.describe()}: {details}")
        return target

    def _inject_group(self, ctx: FaultContext, group: Correlated) -> list[Target]:
        """A correlated fault: every member resolved and checked (the backend's safety rules, the
        privileges its kind needs on its host) before anything is injected — one refusal and none is (fail closed); then each
        member's ledger entry and live-fault slot, and all members injected at once.  A
        member that failed stays armed (reverted on the way out) and fails the step, naming
        its host."""
        backend, r = self.env.backend, self.reporter
        targets = [m.resolve(ctx) for m in group.members]
        group.check_distinct(targets)
        refused = []
        for m, t in zip(group.members, targets):
            try:
                backend.check_target(t)
                if not self.env.rehearsal:
                    backend.check_privileges(m.kind, t)
            except ChaosError as e:
                refused.append((t, e))
        if self.env.rehearsal:
            why = {t: e for t, e in refused}
            for m, t in zip(group.members, targets):
                r.say(f"REHEARSAL: {m.describe()} into {t.describe()} would be REFUSED: {why[t]}" if t in why else
                      f"REHEARSAL: would inject {m.describe()} into {t.describe()} (at once with the other "
                      f"{len(targets) - 1})")
            return targets
        if refused:
            raise InjectionError(f"correlated {group.kind}: nothing injected, {len(refused)} of {len(targets)} "
                                 "members refused: " + "; ".join(f"{t.describe()}: {e}" for t, e in refused)
                                 ) from refused[0][1]
        injs = [Injection(m, t, backend.host(t.node_id)) for m, t in zip(group.members, targets)]
        try:
            for inj in injs:
                inj.slot = backend.live_faults.acquire(inj.fault.describe())
        except ChaosError as e:
            for inj in injs:
                if inj.slot is not None:
                    backend.live_faults.release(inj.slot)
            raise InjectionError(f"correlated {group.kind}: nothing injected: {e}") from e
        group_id = uuid.uuid4().hex[:8]
        for i, inj in enumerate(injs):
            try:
                self._group_of[self._record(inj, group=group_id)] = group_id
            except BaseException:  # nothing injected; those recorded are reverted (and freed) on the way out
                for unrecorded in injs[i:]:
                    backend.live_faults.release(unrecorded.slot)
                raise
        results = fan_out(injs, lambda inj: self._issue(ctx, inj), group.start_timeout_s)
        for res in results:
            inj = res.inj
            inj.evidence["correlated"] = {"group": group_id, "members": len(injs), **res.to_json()}
            if res.ok:
                self.env.ledger.mark(inj.ledger_id, "injected", result=res.to_json(), **res.details)
            else:
                self.env.ledger.mark(inj.ledger_id, "failed", error=f"inject: {res.error}", result=res.to_json())
            r.say(f"  {res.line()}")
        failed = [res for res in results if not res.ok]
        spread = spread_s(results)
        r.say(f"correlated {group.kind} (group {group_id}): {len(results) - len(failed)} of {len(results)} hosts "
              "injected" + (f", issued within {spread * 1000:.1f} ms of each other" if spread is not None else ""))
        if failed:
            raise InjectionError(f"correlated injection failed on {len(failed)} of {len(results)} hosts: "
                                 + "; ".join(res.line() for res in failed))
        return targets

    def _record(self, inj: Injection, group: str | None = None) -> str:
        """The ledger entry (intent + revert plan), written before injecting; armed from here
        on: whatever half-happened (an exception, Ctrl-C mid-command) is reverted."""
        inj.ledger_id = self.env.ledger.record(inj.fault.kind, inj.target.to_json(), inj.fault.revert_plan(inj),
                                               test=self.test_id, group=group)
        self._armed.append(inj)
        self._injections.append(inj)
        return inj.ledger_id

    def _issue(self, ctx: FaultContext, inj: Injection) -> dict:
        """Inject one recorded fault, stamping when it was issued and when it returned."""
        fault, grouped = inj.fault, self._grouped(inj)
        if fault.loses_the_head:
            self.env.backend.head_away.set()
            if self._run is not None:
                self._run.head_may_go()
        inj.t = self.timeline.emit("fault", "fault_injected", fault=fault.kind, target=inj.target.to_json(),
                                   ledger_id=inj.ledger_id, description=fault.describe(),
                                   detect_by="node" if fault.kills_node else "train", **grouped).t
        details = fault.inject(ctx, inj)
        self.timeline.emit("fault", "fault_returned", ledger_id=inj.ledger_id, **grouped)
        return details

    def _grouped(self, inj: Injection) -> dict:
        """``{"group": id}`` for a correlated fault's member (its events carry it), else nothing."""
        group = self._group_of.get(inj.ledger_id)
        return {"group": group} if group else {}

    def _after_detect(self, ctx: FaultContext, injs: list[Injection]) -> None:
        """Each member's own waits after detection, in parallel (a correlated reboot waits for
        every host at once); every failure is named by its host."""
        if len(injs) == 1:
            injs[0].fault.after_detect(ctx, injs[0])
            return
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(injs), thread_name_prefix="chaos-after") as pool:
            futures = [(inj, pool.submit(inj.fault.after_detect, ctx, inj)) for inj in injs]
            failed = [(inj, f.exception()) for inj, f in futures if f.exception() is not None]
        if len(failed) == 1:
            raise failed[0][1]
        if failed:
            raise ChaosError(f"after detection, {len(failed)} of {len(injs)} hosts failed: "
                             + "; ".join(f"{inj.host.name or inj.target.node_ip}: {e}" for inj, e in failed)
                             ) from failed[0][1]

    def _follow_fate(self, run: Run, injs: list[Injection]) -> None:
        """What the run does now that the fault did its worst (``Fault.run_fate``): go on, be
        resubmitted (its driver is gone), or stop here (nothing left to recover: RunLost)."""
        fates = {inj.fault.run_fate(inj): inj for inj in injs}
        if any(inj.fault.loses_the_head for inj in injs):
            self.env.backend.head_away.clear()  # the head's fault has run its course: the guard looks again
        if "lost" in fates:
            inj = fates["lost"]
            raise RunLost(f"{inj.fault.kind} left nothing of the run to recover: "
                          f"{inj.evidence.get('diagnosis') or inj.evidence}")
        if "resubmit" in fates:
            inj = fates["resubmit"]
            lost = run.job_id
            job = run.resubmit(f"{inj.fault.kind}: {inj.evidence.get('diagnosis', 'its driver was lost')}")
            self.reporter.say(f"job {lost} lost its driver: the run resubmitted as job {job} under the same name "
                              "and storage (what a RayJob's retry does)")

    def _detect(self, inj: Injection) -> None:
        """Wait on the fault's own detection predicate; record the event it matched."""
        fault, target = inj.fault, inj.target
        what = fault.detection(target)
        timeout = fault.detect_timeout(self.env.timeouts.detect_s)
        try:
            seen = self.timeline.wait_for(lambda ev: fault.detected(ev, target, inj.t), timeout, what)
        except WaitTimeout as e:
            raise Finding(did_not_resume(f"Ray never noticed the fault: no sign of {what}", str(e))) from e
        self.timeline.emit("fault", "fault_detected", t=seen.t, ledger_id=inj.ledger_id, by=seen.kind,
                           node_id=target.node_id, **self._grouped(inj))
        self.reporter.say(f"detected: {seen.describe()} {seen.data.get('death_reason') or ''}")

    def _wait_trigger(self, i: int, trigger) -> Event:
        """The event fault ``i``'s trigger fired on; the run's end before it is a finding."""
        try:
            return trigger.wait(self.timeline, self.env.timeouts.trigger_s)
        except WaitTimeout:
            ended = run_ended(self.timeline.events)
            if ended is None:
                raise
            raise Finding(ended_before_fault(i, trigger.describe(), ended)) from None

    def _recover(self) -> None:
        fault_t = self.timeline.of("fault_injected")[-1].t

        def recovered(events):  # the run the fault hit, asked anew: its start may still be on its way
            hit = first_recovery(events, run_at(self.timeline, fault_t), fault_t)
            if hit is not None:
                return hit[1]
            return next((e for e in events if e.t >= fault_t and e.kind in ("run_finished", "job_finished")), None)

        try:
            e = self.timeline.wait_for(recovered, self.env.timeouts.recover_s,
                                       "the next attempt's first report (or the run's end)")
        except WaitTimeout as err:
            raise Finding(did_not_resume("no new attempt reported after the fault was detected", str(err))) from err
        self.reporter.say(f"after the fault: {e.describe()}")

    def _revert_all(self, ctx: FaultContext, final: bool = False) -> None:
        """Revert every armed fault.  A failed revert keeps its live-fault slot and, unless
        this is the final attempt, stays armed to be retried on the way out."""
        failed = []
        while self._armed:
            inj = self._armed.pop()
            try:
                did = inj.fault.revert(ctx, inj)
            except Exception as e:
                self.env.ledger.mark(inj.ledger_id, "failed", error=f"revert failed: {e}")
                log.error("revert of %s (%s) failed: %s", inj.fault.kind, inj.ledger_id, e)
                failed.append(inj)
                continue
            self.env.ledger.mark(inj.ledger_id, "reverted" if did else "nothing-to-revert")
            self.timeline.emit("fault", "fault_reverted", fault=inj.fault.kind, ledger_id=inj.ledger_id, reverted=did,
                               **self._grouped(inj))
            self.env.backend.live_faults.release(inj.slot)
        if not final:
            self._armed.extend(failed)

    def _collect_storage(self) -> None:
        """The fault proxy's record of the run's S3 requests, as storage events (chaos.storage.events)."""
        from chaos.storage import events

        try:
            added = events.collect(self.env.backend, self.timeline)
        except Exception as e:  # evidence missing is the verdicts' to say, never a broken session
            log.warning("could not collect the storage proxy's requests: %s", e)
            self.reporter.say(f"storage: could not read the fault proxy's requests: {e}")
            return
        if added:
            self.reporter.say(f"storage: {added} S3 requests of the run, as the fault proxy saw them")

    def _way_out(self, interrupted: bool) -> Cleanup:
        """The cleanup's steps: under one deadline when the session was interrupted (whoever
        stopped it wants it gone); those that need the cluster skipped when one look finds
        it unreachable — unless a head fault of this test may still be bringing it back
        (then the heal wait is what tells)."""
        way_out = Cleanup(self.reporter.say, cleanup.BOUND_S if interrupted else None)
        if interrupted or not any(inj.fault.loses_the_head for inj in self._injections):
            way_out.probe(self.env.cluster)
        if way_out.unreachable:  # the reverts' ledger marks do not wait on it either
            self.env.ledger.cluster_gone(way_out.unreachable)
        return way_out

    def _heal(self, run: Run, way_out: Cleanup, wait: bool = True) -> Verdict:
        """Whether the session leaves the cluster as it found it.  Interrupted (``wait``
        False), one look instead of waiting: whoever stopped the session wants it gone — a
        cluster that vanished under it kept it waiting minutes — and the reverts, which must
        not be skipped, have run by now.  A cluster that does not answer is not healed."""
        def nodes() -> tuple[bool, str]:
            try:
                if wait:
                    self.env.backend.wait_healed(self.env.timeouts.heal_s)
                return self.env.backend.healthy_workers()
            except Exception as e:
                return False, str(e)

        if way_out.unreachable:
            nodes_ok, nodes_detail = False, f"the cluster is unreachable: {way_out.unreachable}"
        else:
            nodes_ok, nodes_detail = way_out.step("look at the cluster's nodes", nodes, needs_cluster=True,
                                                  default=(False, "no answer before the cleanup's deadline"))
        if not wait and not nodes_ok:
            nodes_detail += " (one look: the session was interrupted)"
        try:
            mine = {inj.ledger_id for inj in self._injections}
            armed = [e for e in self.env.ledger.open_entries()
                     if e["id"] in mine and (e.get("revert") or {}).get("action", "none") != "none"]
        except Exception as e:
            armed = [{"fault": "ledger unreadable", "id": str(e)}]
        res_ok, res_detail = way_out.step(
            "look at what the job still holds", lambda: self._resources_free(run, wait), needs_cluster=True,
            default=(False, "could not tell what the job still holds: " + (
                f"the cluster is unreachable: {way_out.unreachable}" if way_out.unreachable
                else "no answer before the cleanup's deadline")))
        return healed(nodes_ok, nodes_detail, armed, res_ok, res_detail)

    def _resources_free(self, run: Run, wait: bool = True) -> tuple[bool, str]:
        """Once the job is gone, nothing it started may still hold CPU, GPU or a custom
        resource (no leaked actors or placement groups); one look when not ``wait``.

        Asked of the job's own actors and placement groups, not of the cluster's free
        resources, so other tenants of a shared cluster do not make this fail."""
        try:
            jobs = run.ray_job_ids()
        except Exception as e:
            return False, f"could not tell what the job still holds: its Ray job id is unreadable: {e}"
        if not jobs:
            return True, "the job was not submitted or started no driver: nothing of it holds resources"

        def check():
            held = [h for job in jobs for h in self.env.cluster.held_by_job(job)]
            return (None, "still held: " + "; ".join(held)) if held else (
                f"nothing of job {', '.join(jobs)} holds resources", "")

        try:
            if not wait:
                free, held = check()
                return (True, free) if free else (False, f"leaked resources: {held} (one look: the session was "
                                                         "interrupted)")
            return True, poll_until(check, 60, f"job {', '.join(jobs)}'s actors and placement groups to give back "
                                    "their resources", interval=0.5)
        except Exception as e:
            return False, f"leaked resources: {e}"

    # -- artefacts ---------------------------------------------------------------
    def _attach(self, run: Run, nodes_before: list[dict], verdicts: list[Verdict], way_out: Cleanup) -> None:
        r = self.reporter
        try:
            self.timeline.dump(self.dir / "timeline.json")
            r.attach_file("timeline.json", self.dir / "timeline.json")
            r.attach_json("ledger", self.env.ledger.lines())
            r.attach_text("failure-policy lines", "\n".join(run.failure_policy_lines()) or "(no failure decision)")
            r.attach_json("nodes before", nodes_before)
            after = way_out.step("read the node table for the report", self.env.cluster.table, needs_cluster=True)
            r.attach_json("nodes after", after if after is not None else "unread: see the cleanup lines")
            for i, sub in enumerate(run.submissions):
                r.attach_file("job log" + (f" (resubmission {i})" if i else ""), sub.log_path)
            r.attach_json("verdicts", [v.to_json() for v in verdicts])
            warnings = [v for v in verdicts if v.status is Status.WARNING]
            if warnings:  # shown on the test's page, though they do not fail it
                r.parameter("warnings", "; ".join(f"{v.name}: {v.diagnosis}" for v in warnings))
                r.attach_text("warnings", "\n".join(v.line() for v in warnings))
            evidence = {f"{i}: {inj.fault.describe()}": inj.evidence
                        for i, inj in enumerate(self._injections, 1) if inj.evidence}
            if evidence:
                r.attach_json("fault evidence (boot ids, node ids)", evidence)
            transcript = []
            for transport in {inj.host.key: inj.host.transport for inj in self._injections}.values():
                for entry in getattr(transport, "transcript", []):
                    cmd = entry.command if len(entry.command) < 200 else entry.command[:200] + " …"
                    transcript.append(f"{time.strftime('%H:%M:%S', time.localtime(entry.time))} {entry.host} $ {cmd}"
                                      f" -> exit {entry.exit_code} {entry.error or ''} {entry.note}".rstrip())
            if transcript:
                r.attach_text("SSH transcript", "\n".join(transcript))
            png = plot.render_timeline(self.timeline, self.dir / "timeline.png", title=self.slug)
            r.attach_png("timeline", png)
            metrics = summary.metrics_for(self.timeline, summary.failure_config_of(self.timeline))
            for key in ("time_to_detect", "time_to_recover", "steps_lost", "ettr"):
                if metrics.get(key) is not None:
                    r.parameter(key, round(metrics[key], 2) if isinstance(metrics[key], float) else metrics[key])
            self.metrics = metrics
        except Exception as e:  # artefacts must never hide the real outcome
            log.exception("could not attach artefacts: %s", e)

    def record(self, outcome: str) -> dict:
        """The per-test record for reports/summary.json."""
        return summary.test_record(self.test_id, (f.kind for _, f in self.faults), self.env.backend.label, outcome,
                                   getattr(self, "verdicts", []), self.timeline, getattr(self, "metrics", {}))
