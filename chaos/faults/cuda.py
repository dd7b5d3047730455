"""CUDA faults: the shim makes a driver call inside one training rank fail or hang.

Before the run starts, the shim is built on every live worker node's host through the
backend's transport (``prepare``: no shared filesystem assumed); the run is started with it
preloaded in every process (``run_env``) and a control file per host; injecting writes a plan — aimed at the target rank — into the target
host's control file through its transport; reverting disarms it (which also releases a
hung process) and collects the shim's JSON log into the timeline.
"""

from __future__ import annotations

import concurrent.futures
import json
import shlex
import uuid

from chaos.cluster import Node, Target
from chaos.errors import InjectionError
from chaos.faults.base import Fault, FaultContext, Injection, placement_target
from chaos.shim.control import control_command, process_env
from chaos.shim.plan import Plan


def shim_env(shim_path: str | None, control_path: str, log_path: str, driver_dir: str | None) -> dict[str, str]:
    """A run's environment under the shim (built here when ``shim_path`` is None), armed later
    through ``control_path``; ``driver_dir`` (e.g. the stub libcuda.so.1) first on the library path."""
    if shim_path is None:
        from chaos.shim.build import ensure_shim

        shim_path = str(ensure_shim())
    env = process_env(shim_path, control_path, log_path)
    if driver_dir:
        # Before the node's own library path, which Ray expands (``${...}``) in each worker's
        # environment: this machine's own LD_LIBRARY_PATH means nothing on a cluster's nodes.
        env["LD_LIBRARY_PATH"] = f"{driver_dir}:${{LD_LIBRARY_PATH}}"
    return env


def deliver_to_workers(ctx: FaultContext) -> tuple[str, int]:
    """The shim built on every live worker node's host (where Train's workers make the CUDA
    calls), through the backend's transports: (its path, the same on each; how many hosts).  A run's processes
    on the head only load it if the head shares a worker's filesystem (ld.so says so and goes
    on without it, which is harmless there: nothing on the head calls CUDA)."""
    from chaos.shim.build import deliver_shim

    hosts = {h.key: h for h in (ctx.backend.host(n.node_id) for n in ctx.cluster.alive_workers())}
    if not hosts:
        raise InjectionError("no live worker node to put the CUDA shim on")
    with concurrent.futures.ThreadPoolExecutor(min(8, len(hosts)), thread_name_prefix="shim-delivery") as pool:
        paths = set(pool.map(lambda h: deliver_shim(h.transport, ctx.backend.python), hosts.values()))
    [path] = paths  # one root and one source hash: every host reports the same path
    return path, len(hosts)


def check_shim_loaded(transport, target: Target, shim_path: str) -> None:
    """Refuse to arm unless the target rank's process has the shim mapped: a process started
    without it (a node that joined after the run started, an environment that overrides
    LD_PRELOAD) would never see the fault, and the test would wait for nothing."""
    pid = target.pid
    if pid is None:
        raise InjectionError(f"{transport.host}: no PID for rank {target.rank} in the run's placement, so nothing "
                             "shows its process loaded the CUDA shim: not armed")
    maps = f"/proc/{int(pid)}/maps"
    seen = transport.run(f"if [ ! -r {maps} ]; then echo gone; elif grep -qF {shlex.quote(shim_path)} {maps}; "
                         "then echo loaded; else echo missing; fi", timeout=30)
    state = seen.stdout.strip()
    if state == "loaded":
        return
    why = {"gone": "is gone", "missing": f"has not loaded the CUDA shim {shim_path} (not in {maps})"}.get(
        state, f"could not be checked ({seen.stderr.strip() or state or 'no answer'})")
    raise InjectionError(f"{transport.host}: rank {target.rank}'s process (PID {pid}) {why}: not armed")


class ShimFault:
    """What a fault that acts through the shim does before the run: put it on the worker hosts
    (``prepare``) and preload it in every process of the run (``run_env``)."""

    shim_path: str | None
    control_path: str
    log_path: str
    driver_dir: str | None

    delivered: bool = False  # whether prepare put the shim on the hosts (not given a path)

    def prepare(self, ctx: FaultContext) -> str | None:
        if self.shim_path is not None:
            return None
        self.shim_path, hosts = deliver_to_workers(ctx)
        self.delivered = True
        return f"the CUDA shim at {self.shim_path} on {hosts} worker host{'s' if hosts > 1 else ''}"

    def prepare_node(self, ctx: FaultContext, node: Node) -> str | None:
        """The shim on a node that joined during the run, at the path the run preloads, as
        soon as Ray lists the node: Train's processes there start with it only if it is there
        first (ld.so skips a missing preload), and arming checks that it was."""
        from chaos.shim.build import deliver_shim

        if not self.delivered:
            return None
        host = ctx.backend.host(node.node_id)
        path = deliver_shim(host.transport, ctx.backend.python)
        if path != self.shim_path:
            raise InjectionError(f"{host.name or host.key}: the CUDA shim went to {path}, but the run preloads "
                                 f"{self.shim_path}")
        return f"the CUDA shim at {path} on {host.name or host.key}, which joined during the run ({node.short()})"

    def run_env(self) -> dict[str, str]:
        env = shim_env(self.shim_path, self.control_path, self.log_path, self.driver_dir)
        self.shim_path = env["LD_PRELOAD"]
        return env


class CudaFault(ShimFault, Fault):
    kind = "cuda"
    kills_node = False
    one_shot = True  # a fresh process on the same host would read the same armed control file

    def __init__(self, preset: str = "ecc", rank: int = 1, shim_path: str | None = None,
                 driver_dir: str | None = None, collective_timeout_s: float | None = None, **overrides):
        """``driver_dir``: a directory holding libcuda.so.1 to put first on LD_LIBRARY_PATH
        (the stub driver on machines without a GPU; None on a real GPU node).
        ``collective_timeout_s``: the timeout the run configures so a hang is caught."""
        self.preset = preset
        self.rank = rank
        self.overrides = overrides
        self.shim_path = shim_path
        self.driver_dir = driver_dir
        self.collective_timeout_s = collective_timeout_s
        # One control file and log per fault object: the run's environment names them.
        files = uuid.uuid4().hex[:8]
        self.control_path = f"/dev/shm/chaos-cuda-{files}.ctl"
        self.log_path = f"/tmp/chaos-cuda-{files}.jsonl"
        sample = self._plan()  # a bad preset or field fails here, not mid-run
        self.error_name, self.mode = sample.error_name, sample.mode
        if self.mode == "hang" and not collective_timeout_s:
            raise ValueError("a hang fault needs collective_timeout_s: without a timeout nothing can catch the hang")

    def _plan(self) -> Plan:
        """A plan with its own id, so each injection's shim events can be told apart."""
        return Plan.preset(self.preset, rank=self.rank, plan_id=f"{self.preset}-{uuid.uuid4().hex[:8]}",
                           **self.overrides)

    def describe(self) -> str:
        return f"CUDA {self.preset} ({self.error_name}, {self.mode}) in rank {self.rank}"

    def run_env(self) -> dict[str, str]:
        env = super().run_env()
        if self.collective_timeout_s:
            env["RAY_TRAIN_COLLECTIVE_TIMEOUT_S"] = str(self.collective_timeout_s)
            env["CHAOS_COLLECTIVE_TIMEOUT_S"] = str(self.collective_timeout_s)
        return env

    def resolve(self, ctx: FaultContext) -> Target:
        return placement_target(ctx, self.rank)

    def detect_timeout(self, base_s: float) -> float:
        """A hang is only seen once the run's collective timeout has fired."""
        return base_s + (self.collective_timeout_s or 0)

    def revert_plan(self, inj: Injection) -> dict:
        return {"action": "disarm-cuda-shim", "host": inj.host.key, "control": self.control_path,
                "log": self.log_path, "command": control_command(self.control_path, None)[:80] + "..."}

    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        check_shim_loaded(inj.host.transport, inj.target, self.shim_path)
        plan = self._plan()
        inj.evidence["plan"] = plan.render()
        result = inj.host.transport.run(control_command(self.control_path, plan, python=ctx.backend.python),
                                        timeout=30)
        if not result.ok:
            raise InjectionError(f"arming the CUDA shim on {inj.host.transport.host} failed: {result.stderr.strip()}")
        return {"plan_id": plan.plan_id, "control": self.control_path, "plan": plan.render()}

    def revert(self, ctx: FaultContext, inj: Injection) -> bool:
        transport = inj.host.transport
        transport.run(control_command(self.control_path, None, python=ctx.backend.python), timeout=30).check()
        log = transport.run(f"cat {shlex.quote(self.log_path)} 2>/dev/null; rm -f {shlex.quote(self.log_path)}",
                            timeout=30)
        for line in log.stdout.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == "inject":
                ctx.timeline.emit("shim", "cuda_injection", t=rec["t"], **{k: v for k, v in rec.items() if k != "t"})
        transport.run(f"rm -f {shlex.quote(self.control_path)}", timeout=30)
        return True

    @classmethod
    def sweep(cls, plan: dict, backend) -> bool:
        """Disarm the control file on the host the plan names, then remove it and the shim's log
        there (a disarmed file maps nothing any process still needs)."""
        transport = backend.reach(plan["host"]).transport
        transport.run(control_command(plan["control"], None, python=backend.python), timeout=60).check()
        files = [plan["control"]] + ([plan["log"]] if plan.get("log") else [])
        transport.run("rm -f " + " ".join(shlex.quote(f) for f in files), timeout=60).check()
        return True
