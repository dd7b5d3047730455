"""Preemption: the node is taken away with notice, as a spot reclaim or a KubeRay pod
deletion does.  Ray drains it with reason PREEMPTION, Train tells the workers
(``ray.train.get_preemption_info()``), and the restart is charged to
``max_preemption_failures``, not ``max_failures``.

Two ways in, as the platforms do it:

- ``drain`` (default): Ray's own drain request (as ``ray drain-node`` sends it, reason PREEMPTION,
  with a deadline), as autoscaler v2 sends it for a spot reclaim; Ray does not kill the
  node at the deadline, so this fault does, by SIGKILLing the node's raylet — the
  instance going away.
- ``sigterm``: SIGTERM to the node's ``ray start --block``, as a pod deletion delivers
  it.  Ray ≥ 2.57 drains the node for up to ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``
  (read from that process's environment) and then shuts it down itself;
  ``kill_after_s`` SIGKILLs it earlier, as a kubelet does after a grace period shorter
  than that window.

Measured on Ray 2.60: a node SIGKILLed once its drain deadline has passed dies
"Terminated due to preemption", its workers' deaths are flagged preempted, and the
restart is charged to ``max_preemption_failures``; killed before the deadline (a
kubelet's grace shorter than the window) it is an unexpected termination, charged to
``max_failures``.  The GCS compares the death with the deadline it was given, so the
drain request is sent from this process with the deadline the kill is timed by (the
``ray drain-node`` CLI computes its own after its start-up: seconds later on a busy
machine, which made the kill land before Ray's deadline).  When Ray's own drain window
ends it instead, the raylet exits as an expected termination, so the charge depends on
whether Train's controller checks the preemption deadline before it sees the dead
worker: a race (seen charged to ``max_failures``).  The suites use the two deterministic
paths.

The notice (when Ray was told, and the deadline) is a ``preemption_notice`` event, so
the verdicts can say whether a checkpoint was committed inside the window.
"""

from __future__ import annotations

import shlex
import time

import ray

from chaos.cluster import Target
from chaos.errors import InjectionError
from chaos.faults.base import Fault, FaultContext, Injection, placement_target
from chaos.faults.raylet import KILL_RAYLET_BY_NODE_ID
from chaos.transport.ray import drain_node

# Ray 2.57 drains a node on SIGTERM to `ray start --block`; 2.58 charges a preempted
# node's failure to max_preemption_failures.  Older Rays would charge max_failures.
MIN_RAY = (2, 58)
RAY_DEFAULT_DRAIN_WINDOW_S = 30.0
PREEMPTION_POLL_S = 5.0  # Train's default RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S

# SIGTERM to the `ray start --block` that owns the node's raylet (found by its exact node
# id, never by name); prints that PID and its drain window setting.  A node that would not
# drain (window <= 0) is refused before anything is sent.
SIGTERM_RAY_START = r"""
id={node_id}
for d in /proc/[0-9]*; do
  cmd=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null) || continue
  case "$cmd" in */raylet/raylet\ *"--node_id=$id"*)
    ppid=$(awk '/^PPid:/ {{print $2}}' "$d/status")
    parent=$(tr '\0' ' ' < "/proc/$ppid/cmdline" 2>/dev/null)
    case "$parent" in *" start "*"--block"*) ;;
      *) echo "the raylet of node $id (pid ${{d#/proc/}}) was not started by 'ray start --block' (parent $ppid: $parent)" >&2; exit 4;;
    esac
    window=$(tr '\0' '\n' < "/proc/$ppid/environ" 2>/dev/null | sed -n 's/^RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=//p')
    if [ -n "$window" ] && awk "BEGIN {{ exit !($window <= 0) }}"; then
      echo "node $id runs with RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=$window: Ray does not drain it on SIGTERM, so a SIGTERM would be no preemption (nothing sent)" >&2; exit 5
    fi
    kill -TERM "$ppid" && echo "$ppid ${{window:-default}}"; exit 0;;
  esac
done
echo "no raylet with --node_id=$id on $(hostname)" >&2; exit 3
"""


# The `ray start --block` that owns the node's raylet (by its exact node id): its PID, or nothing.
RAY_START_OF_NODE = r"""
id={node_id}
for d in /proc/[0-9]*; do
  cmd=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null) || continue
  case "$cmd" in */raylet/raylet\ *"--node_id=$id"*)
    ppid=$(awk '/^PPid:/ {{print $2}}' "$d/status")
    case "$(tr '\0' ' ' < "/proc/$ppid/cmdline" 2>/dev/null)" in *" start "*"--block"*) echo "$ppid";; esac
    exit 0;;
  esac
done
"""
# End that `ray start --block` (SIGTERM, SIGKILL after 20 s) if PID still is one.
END_RAY_START = r"""
pid={pid}
case "$(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null)" in *" start "*"--block"*) ;; *) echo gone; exit 0;; esac
kill -TERM "$pid"
running() {{ [ -r "/proc/$pid/status" ] && awk '/^State:/ {{exit ($2 == "Z")}}' "/proc/$pid/status"; }}  # exited: a zombie
i=0; while [ $i -lt 40 ]; do running || {{ echo ended; exit 0; }}; sleep 0.5; i=$((i + 1)); done
kill -KILL "$pid" 2>/dev/null; echo killed
"""


def ray_version() -> tuple[int, int]:
    major, minor = ray.__version__.split(".")[:2]
    return int(major), int(minor)


def require_preemption_budget(what: str) -> None:
    """Refuse a preemption fault on a Ray that would charge it to max_failures (shared by
    every fault that preempts: this one, a graceful pod deletion, an eviction, a drain)."""
    if ray_version() < MIN_RAY:
        raise InjectionError(
            f"{what} needs Ray >= {MIN_RAY[0]}.{MIN_RAY[1]} (SIGTERM drain since 2.57, the preemption "
            f"budget since 2.58); this harness runs Ray {ray.__version__}, whose preemptions would be "
            "charged to max_failures")


def emit_notice(ctx: FaultContext, inj: Injection, t: float, window_s: float, via: str) -> None:
    """The ``preemption_notice`` event (when Ray was told, and the deadline) the
    preemption-window verdict reads, and the same in the injection's evidence."""
    inj.evidence.update(notice_t=t, deadline_t=t + window_s, window_s=window_s)
    ctx.timeline.emit("fault", "preemption_notice", t=t, node_id=inj.target.node_id, ledger_id=inj.ledger_id,
                      via=via, window_s=window_s, deadline=t + window_s)


class Preempt(Fault):
    kind = "preempt"
    METHODS = ("sigterm", "drain")

    def __init__(self, rank: int = 1, via: str = "drain", deadline_s: float = 8.0, kill_after_s: float | None = None):
        if via not in self.METHODS:
            raise ValueError(f"preempt via={via!r} unknown; expected one of {self.METHODS}")
        require_preemption_budget("preempt")
        if deadline_s <= 0:
            raise ValueError(f"preempt deadline_s must be > 0, got {deadline_s}")
        if kill_after_s is not None and (via != "sigterm" or kill_after_s <= 0):
            raise ValueError("preempt kill_after_s is the SIGKILL after the SIGTERM (via='sigterm'), > 0 seconds; "
                             f"got via={via!r}, kill_after_s={kill_after_s}")
        self.rank = rank
        self.via = via
        self.deadline_s = deadline_s  # the drain request's deadline (via="drain")
        # via="sigterm": the platform's SIGKILL after its grace period (a pod's
        # terminationGracePeriodSeconds); None = Ray's drain window ends it.
        self.kill_after_s = kill_after_s

    def describe(self) -> str:
        if self.via == "sigterm":
            end = f", SIGKILL after {self.kill_after_s:g} s" if self.kill_after_s else ""
            return f"preemption of the node hosting rank {self.rank} (SIGTERM to ray start, Ray drains it{end})"
        return f"preemption of the node hosting rank {self.rank} (drain request, node killed after {self.deadline_s:g} s)"

    def resolve(self, ctx: FaultContext) -> Target:
        return placement_target(ctx, self.rank)

    def run_env(self) -> dict[str, str]:
        # Train learns of a drain on its preemption poll (every 5 s by default).  Against a
        # notice of a few seconds, as short test windows give, a controller slowed by a busy
        # machine can see the dead worker before the notice; poll 4x per notice instead, so
        # the charge does not depend on the machine's load.  Notices of 20 s+ keep Ray's poll.
        notice = self.deadline_s if self.via == "drain" else self.kill_after_s
        if notice is None or notice / 4 >= PREEMPTION_POLL_S:
            return {}
        return {"RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": f"{max(0.5, notice / 4):g}"}

    def detect_timeout(self, base_s: float) -> float:
        # The node dies only when the drain window ends.
        return base_s + max(self.deadline_s, RAY_DEFAULT_DRAIN_WINDOW_S)

    def revert_plan(self, inj: Injection) -> dict:
        """Where the fault ends the node itself (a drain: Ray never does; a SIGKILL after the
        grace period), a session stopped before that kill (Ctrl-C in the window, a failed kill,
        SIGKILL) would leave the node draining for good, taking no work: revert and sweep end
        that node (its raylet, by its exact node id: a node recovery started since is another)."""
        if self.via == "sigterm" and self.kill_after_s is None:
            return super().revert_plan(inj)  # Ray's drain window ends that node by itself
        return {"action": "end-preempted-node", "host": inj.host.key, "node_id": inj.target.node_id,
                "why": "the node stays draining until its raylet is killed"}

    def revert(self, ctx: FaultContext, inj: Injection) -> bool:
        if self.revert_plan(inj)["action"] == "none":
            return False
        return _end_node(inj.host.transport, inj.target.node_id)

    @classmethod
    def sweep(cls, plan: dict, backend) -> bool:
        if plan.get("action") != "end-preempted-node":
            return super().sweep(plan, backend)
        transport = backend.connect(plan["host"])
        try:
            return _end_node(transport, plan["node_id"])
        finally:
            transport.close()

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        return self._sigterm(ctx, inj) if self.via == "sigterm" else self._drain(ctx, inj)

    def _sigterm(self, ctx: FaultContext, inj: Injection) -> dict:
        transport = inj.host.transport
        t = time.time()
        result = transport.run(SIGTERM_RAY_START.format(node_id=shlex.quote(inj.target.node_id)), timeout=20,
                               privileged=True)
        if not result.ok:
            raise InjectionError(f"SIGTERM to ray start of node {inj.target.node_id[:8]} on {transport.host} failed: "
                                 f"exit {result.exit_code}: {result.stderr.strip()}")
        pid, window = result.stdout.split()[:2]
        window_s = RAY_DEFAULT_DRAIN_WINDOW_S if window == "default" else float(window)
        if self.kill_after_s is None or self.kill_after_s >= window_s:
            emit_notice(ctx, inj, t, window_s, self.via)
            return {"via": "sigterm", "ray_start_pid": int(pid), "window_s": window_s}
        emit_notice(ctx, inj, t, self.kill_after_s, self.via)
        details = self._kill_at(inj, t + self.kill_after_s)
        return {"via": "sigterm", "ray_start_pid": int(pid), "window_s": window_s, **details}

    def _drain(self, ctx: FaultContext, inj: Injection) -> dict:
        node = inj.target.node_id
        if inj.host.console is None:  # see _kill_at: a host whose Ray only its own service restarts
            owner = inj.host.transport.run(RAY_START_OF_NODE.format(node_id=shlex.quote(node)), timeout=20)
            inj.evidence["ray_start_pid"] = int(owner.stdout.split()[0]) if owner.ok and owner.stdout.split() else None
        t = time.time()
        drain_node(ctx.cluster.gcs_address, node, "chaos: preemption", t + self.deadline_s)
        emit_notice(ctx, inj, t, self.deadline_s, self.via)
        return {"via": "drain", "deadline_s": self.deadline_s, **self._kill_at(inj, t + self.deadline_s)}

    def _kill_at(self, inj: Injection, when: float) -> dict:
        """The instance goes away at ``when`` (Ray leaves that to whoever asked for the drain;
        a kubelet SIGKILLs after the grace period): the fault's own schedule, not a wait
        for something to happen."""
        time.sleep(max(0.0, when - time.time()))
        node, transport = inj.target.node_id, inj.host.transport
        pid = _kill_raylet(transport, node, "killed at its deadline")
        if pid is None:  # the node had ended the drain by itself (it went idle)
            # Its raylet exited 0, which `ray start --block` does not count as an exit: it would
            # block on for good and the host's service never restart Ray, where the instance
            # would have gone.  End it, as the instance going away does.
            owner = inj.evidence.get("ray_start_pid")
            ended = (transport.run(END_RAY_START.format(pid=int(owner)), timeout=40, privileged=True).stdout.strip()
                     or "?") \
                if owner else "not known"
            return {"raylet_pid": None, "at_deadline": "the node had shut down already", "ray_start": ended}
        return {"raylet_pid": pid, "killed_at_s": round(time.time() - when, 3)}


def _kill_raylet(transport, node_id: str, what: str) -> int | None:
    """SIGKILL the raylet of node ``node_id``: its PID, or None when it no longer runs."""
    killed = transport.run(KILL_RAYLET_BY_NODE_ID.format(node_id=shlex.quote(node_id)), timeout=20, privileged=True)
    if killed.exit_code == 3:
        return None
    if not killed.ok:
        raise InjectionError(f"node {node_id[:8]} could not be {what} on {transport.host}: "
                             f"exit {killed.exit_code}: {killed.stderr.strip()}")
    return int(killed.stdout.split()[0])


def _end_node(transport, node_id: str) -> bool:
    """End the preempted node if its raylet still runs (revert, sweep); whether it did."""
    return _kill_raylet(transport, node_id, "ended after its preemption") is not None
