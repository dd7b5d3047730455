"""One chaos experiment, end to end: steady state → trigger → inject → detect → recover
→ finish → verify → heal, every wait event-driven with a deadline.

Suites describe *what* (workload, faults with their triggers, expectations); this module
does the *how* and always cleans up: faults are reverted and the run is stopped on every
exit path, and artefacts are attached even when a step fails.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from pathlib import Path
from typing import Callable

import ray

from chaos import plot, summary
from chaos.cluster import ClusterView
from chaos.errors import ChaosError, InjectionError, WaitTimeout
from chaos.faults.base import Fault, FaultContext, Target
from chaos.ledger import Ledger
from chaos.report import Reporter
from chaos.timeline import Timeline, recovery_metrics
from chaos.train.run import Run, RunSpec
from chaos.waits import poll_until
from chaos.verify import Expectation, Verdict, check, healed, verdicts_for

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Timeouts:
    start_s: float = 300.0  # submission → first report (torch import on a busy 2-core box)
    trigger_s: float = 300.0
    detect_s: float = 60.0
    recover_s: float = 300.0
    finish_s: float = 600.0
    heal_s: float = 180.0


@dataclasses.dataclass
class Environment:
    """What the pytest plugin hands an experiment: the cluster and where things go."""

    cluster: ClusterView
    head_node_id: str
    ledger: Ledger
    out_dir: Path
    backend: str
    transport_for: Callable
    host_name_for: Callable = lambda ip: None
    console_for: Callable = lambda ip: None
    fresh_transport_for: Callable | None = None
    python: str = "python3"
    healthy_workers: Callable[[], tuple[bool, str]] = lambda: (True, "no node health check for this backend")
    wait_healed: Callable[[float], None] = lambda timeout: None
    timeouts: Timeouts = dataclasses.field(default_factory=Timeouts)
    dry_run: bool = False
    storage_path: str = "reports/storage"
    check_target: Callable = lambda target: None  # raises (safety.TargetRefused) when a target is not allowed
    live_faults: object = None  # safety.LiveFaults, when the cluster limits live faults
    properties: dict = dataclasses.field(default_factory=dict)  # environment.properties for the report
    allow_head: bool = False  # a profile's safety.allow_head
    abort_reason: str | None = None
    _timelines: list = dataclasses.field(default_factory=list)

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

    def verdict(self, prefix: str) -> Verdict:
        return next(v for v in self.verdicts if v.name.startswith(prefix))

    def assert_verdicts(self) -> None:
        """Fail the test with every failed verdict's message (diagnosis first)."""
        check(self.verdicts)


class Experiment:
    def __init__(self, env: Environment, spec: RunSpec, faults: list[tuple[object, Fault]], expect: Expectation,
                 test_id: str, reporter: Reporter | None = None):
        self.env = env
        self.spec = spec
        self.faults = faults
        self.expect = expect
        self.test_id = test_id
        self.reporter = reporter or Reporter()
        self.timeline = Timeline()
        self.slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", test_id.split("::")[-1])[:80]
        self.dir = Path(env.out_dir) / "runs" / f"{self.slug}-{time.strftime('%Y%m%d-%H%M%S')}"
        self._armed: list[tuple[Fault, Target, str, object]] = []
        self._targets: list[Target] = []
        self._entries: list[str] = []  # ledger ids this experiment wrote

    def run(self) -> Outcome:
        env, r = self.env, self.reporter
        self.dir.mkdir(parents=True, exist_ok=True)
        env._timelines.append(self.timeline)
        if env.abort_reason:
            self.timeline.abort(env.abort_reason)
        kinds = sorted({f.kind for _, f in self.faults})
        r.labels(",".join(kinds), env.backend, self.slug)
        for k, v in self.spec.params.items():
            r.parameter(k, v)
        ctx = FaultContext(cluster=env.cluster, timeline=self.timeline, transport_for=env.transport_for,
                           host_name_for=env.host_name_for, console_for=env.console_for,
                           fresh_transport_for=env.fresh_transport_for, python=env.python,
                           allow_head=env.allow_head)
        fault_env: dict[str, str] = {}
        for _, fault in self.faults:
            fault_env.update(fault.run_env())
        run = Run(self.spec, env.cluster.dashboard_url, env.head_node_id, self.timeline, self.dir, extra_env=fault_env)
        targets: list[Target] = []
        nodes_before = env.cluster.table()
        self._free_cpus_before = ray.available_resources().get("CPU", 0)
        env.cluster.watch(self.timeline)
        verdicts: list[Verdict] = []
        self.verdicts = verdicts
        try:
            with r.step("steady state: cluster healthy, run submitted, training started"):
                ok, detail = env.healthy_workers()
                if not ok:
                    raise WaitTimeout(f"cluster not healthy before the experiment: {detail}")
                run.submit()
                first = run.wait_training_started(env.timeouts.start_s)
                r.say(f"run {run.job_id}: first report step={first.data.get('step')} attempt={first.attempt}")
            for i, (trigger, fault) in enumerate(self.faults, 1):
                r.parameter(f"fault {i}", fault.describe())
                r.parameter(f"trigger {i}", trigger.describe())
                with r.step(f"fault {i}: wait until {trigger.describe()}"):
                    fired = trigger.wait(self.timeline, env.timeouts.trigger_s)
                    r.say(f"trigger fired on {fired.describe()}")
                with r.step(f"fault {i}: inject {fault.describe()}"):
                    target = self._inject(ctx, fault)
                    targets.append(target)
                    self._targets.append(target)
                    r.parameter(f"target {i}", target.describe())
                if env.dry_run:
                    continue
                with r.step(f"fault {i}: detect" + (f" (Ray marks node {target.node_id[:8]} DEAD)" if fault.kills_node
                                                    else f" (Train sees rank {target.rank} fail)")):
                    self._detect(fault, target)
                    fault.after_detect(ctx, target)
                if fault.one_shot:  # disarm before the next attempt can start, or it would fail again
                    self._revert_all(ctx)
                with r.step(f"fault {i}: recover (next attempt reports, or the budget runs out)"):
                    self._recover()
                self._revert_all(ctx)
            if env.dry_run:  # every target is resolved and printed; nothing to finish or verify
                return Outcome(self.slug, self.timeline, verdicts, targets, run)
            with r.step("finish: the run ends by itself"):
                run.wait_finished(env.timeouts.finish_s)
            with r.step("verify: verdicts from the timeline"):
                verdicts.extend(verdicts_for(self.timeline, self.expect))
                for v in verdicts:
                    r.say(v.line())
        finally:
            # Each cleanup step on its own: one failing must neither skip the others nor hide
            # the exception that brought us here.
            self._cleanup("revert faults", lambda: self._revert_all(ctx, final=True))
            self._cleanup("stop the run", run.stop)
            self._cleanup("stop the node watcher", env.cluster.stop_watching)
            env._timelines.remove(self.timeline)
            heal_verdict = self._heal()
            verdicts.append(heal_verdict)
            r.say(heal_verdict.line())
            self._attach(run, nodes_before, verdicts)
        return Outcome(self.slug, self.timeline, verdicts, targets, run)

    # -- phases ------------------------------------------------------------------
    def _inject(self, ctx: FaultContext, fault: Fault) -> Target:
        target = fault.resolve(ctx)
        try:
            self.env.check_target(target)
        except ChaosError as e:
            if self.env.dry_run:
                self.reporter.say(f"DRY RUN: {fault.describe()} into {target.describe()} would be REFUSED: {e}")
                return target
            raise
        if self.env.dry_run:
            self.reporter.say(f"DRY RUN: would inject {fault.describe()} into {target.describe()}; "
                              f"revert: {fault.revert_plan(target)}")
            return target
        slot = self.env.live_faults.acquire(fault.describe()) if self.env.live_faults is not None else None
        entry = self.env.ledger.record(fault.kind, target.to_json(), fault.revert_plan(target), test=self.test_id)
        self.timeline.emit("fault", "fault_injected", fault=fault.kind, target=target.to_json(), ledger_id=entry,
                           description=fault.describe(), detect_by="node" if fault.kills_node else "train")
        # Armed before inject: whatever half-happened (an exception, Ctrl-C mid-command) is reverted.
        self._armed.append((fault, target, entry, slot))
        self._entries.append(entry)
        try:
            details = fault.inject(ctx, target)
        except BaseException as e:
            self.env.ledger.mark(entry, "failed", error=f"inject: {e}")
            if isinstance(e, Exception):
                raise InjectionError(f"injection failed: {fault.describe()} into {target.describe()}: {e}") from e
            raise
        self.env.ledger.mark(entry, "injected", **details)
        self.reporter.say(f"injected {fault.describe()} into {target.describe()}: {details}")
        return target

    def _detect(self, fault: Fault, target: Target) -> None:
        fault_t = self.timeline.of("fault_injected")[-1].t
        what = (f"Ray to mark node {target.node_id[:8]} ({target.node_ip}) DEAD" if fault.kills_node
                else f"Train to see rank {target.rank} fail")
        seen = self.timeline.wait_for(lambda ev: fault.detected(ev, target, fault_t),
                                      self.env.timeouts.detect_s + (getattr(fault, "collective_timeout_s", None) or 0),
                                      what)
        self.reporter.say(f"detected: {seen.describe()} {seen.data.get('death_reason') or ''}")

    def _recover(self) -> None:
        fault_t = self.timeline.of("fault_injected")[-1].t

        def recovered(events):
            later = [e for e in events if e.t >= fault_t]
            for a in (e for e in later if e.kind == "attempt_started"):
                first = next((x for x in later if x.kind == "report" and x.attempt == a.attempt), None)
                if first is not None:
                    return first
            return next((e for e in later if e.kind in ("run_finished", "job_finished")), None)

        e = self.timeline.wait_for(recovered, self.env.timeouts.recover_s,
                                   "the next attempt's first report (or the run's end)")
        self.reporter.say(f"after the fault: {e.describe()}")

    def _revert_all(self, ctx: FaultContext, final: bool = False) -> None:
        """Revert every armed fault.  A failed revert keeps its live-fault slot and, unless
        this is the final attempt, stays armed to be retried on the way out."""
        failed = []
        while self._armed:
            fault, target, entry, slot = self._armed.pop()
            try:
                did = fault.revert(ctx, target)
            except Exception as e:
                self.env.ledger.mark(entry, "failed", error=f"revert failed: {e}")
                log.error("revert of %s (%s) failed: %s", fault.kind, entry, e)
                failed.append((fault, target, entry, slot))
                continue
            self.env.ledger.mark(entry, "reverted" if did else "nothing-to-revert")
            self.timeline.emit("fault", "fault_reverted", fault=fault.kind, ledger_id=entry, reverted=did)
            if slot is not None:
                self.env.live_faults.release(slot)
        if not final:
            self._armed.extend(failed)

    def _cleanup(self, what: str, step) -> None:
        try:
            step()
        except Exception as e:
            log.error("cleanup step %r failed: %s", what, e)
            self.reporter.say(f"cleanup: could not {what}: {e}")

    def _heal(self) -> Verdict:
        try:
            self.env.wait_healed(self.env.timeouts.heal_s)
            nodes_ok, nodes_detail = self.env.healthy_workers()
        except Exception as e:
            nodes_ok, nodes_detail = False, str(e)
        try:
            mine = set(self._entries)
            armed = [e for e in self.env.ledger.open_entries()
                     if e["id"] in mine and (e.get("revert") or {}).get("action", "none") != "none"]
        except Exception as e:
            armed = [{"fault": "ledger unreadable", "id": str(e)}]
        res_ok, res_detail = self._resources_free()
        return healed(nodes_ok, nodes_detail, armed, res_ok, res_detail)

    def _resources_free(self) -> tuple[bool, str]:
        """Once the job is gone, the CPUs free before it must be free again (no leaked actors).

        Compared with the free CPUs seen before submission, not with the total, so other
        tenants of a shared cluster do not make this fail."""
        before = self._free_cpus_before or 0.0

        def check():
            avail = ray.available_resources().get("CPU", 0)
            return (f"{avail:g} CPUs free, as before the run" if avail >= before else None), \
                f"{avail:g} CPUs free, {before:g} were free before the run"

        try:
            return True, poll_until(check, 60, "the run's CPUs to be free again", interval=0.5)
        except Exception as e:
            return False, f"leaked resources: {e}"

    # -- artefacts ---------------------------------------------------------------
    def _attach(self, run: Run, nodes_before: list[dict], verdicts: list[Verdict]) -> None:
        r = self.reporter
        try:
            self.timeline.dump(self.dir / "timeline.json")
            r.attach_file("timeline.json", self.dir / "timeline.json")
            r.attach_json("ledger", self.env.ledger.lines())
            r.attach_text("failure-policy lines", "\n".join(run.failure_policy_lines()) or "(no failure decision)")
            r.attach_json("nodes before", nodes_before)
            r.attach_json("nodes after", self.env.cluster.table())
            r.attach_file("job log", run.log_path)
            r.attach_json("verdicts", [v.to_json() for v in verdicts])
            evidence = {f.describe(): f.evidence for _, f in self.faults if getattr(f, "evidence", None)}
            if evidence:
                r.attach_json("fault evidence (boot ids, node ids)", evidence)
            transcript = []
            for ip in sorted({t.node_ip for t in self._targets}):
                for entry in getattr(self.env.transport_for(ip), "transcript", []):
                    cmd = entry.command if len(entry.command) < 200 else entry.command[:200] + " …"
                    transcript.append(f"{time.strftime('%H:%M:%S', time.localtime(entry.time))} {entry.host} $ {cmd}"
                                      f" -> exit {entry.exit_code} {entry.error or ''} {entry.note}".rstrip())
            if transcript:
                r.attach_text("SSH transcript", "\n".join(transcript))
            png = plot.render_timeline(self.timeline, self.dir / "timeline.png", title=self.slug)
            r.attach_png("timeline", png)
            started = self.timeline.first("controller_started")
            metrics = summary.metrics_for(self.timeline, started.data.get("failure_config", {}) if started else {})
            for key in ("time_to_detect", "time_to_recover", "steps_lost", "ettr"):
                if metrics.get(key) is not None:
                    r.parameter(key, round(metrics[key], 2) if isinstance(metrics[key], float) else metrics[key])
            self.metrics = metrics
        except Exception as e:  # artefacts must never hide the real outcome
            log.exception("could not attach artefacts: %s", e)

    def record(self, outcome: str) -> dict:
        """The per-test record for reports/summary.json."""
        return {"test": self.test_id, "fault_kind": ",".join(sorted({f.kind for _, f in self.faults})),
                "backend": self.env.backend, "outcome": outcome,
                "verdicts": [v.to_json() for v in getattr(self, "verdicts", [])], "metrics": getattr(self, "metrics", {}),
                "recoveries": [dataclasses.asdict(m) for m in recovery_metrics(self.timeline)]}
