"""CUDA faults: the shim makes a driver call inside one training rank fail or hang.

The run is started with the shim preloaded in every process (``run_env``) and a control
file per host; injecting writes the plan — aimed at the target rank — into the target
host's control file through its transport; reverting disarms it (which also releases a
hung process) and collects the shim's JSON log into the timeline.
"""

from __future__ import annotations

import json
import os
import shlex
import uuid

from chaos.errors import InjectionError
from chaos.faults.base import Fault, FaultContext, Target, placement_target
from chaos.shim.control import control_command
from chaos.shim.plan import Plan


class CudaFault(Fault):
    kind = "cuda"
    budget_class = "worker_group"
    kills_node = False
    one_shot = True  # a fresh process on the same host would read the same armed control file

    def __init__(self, preset: str = "ecc", rank: int = 1, shim_path: str | None = None,
                 driver_dir: str | None = None, collective_timeout_s: float | None = None, **overrides):
        """``driver_dir``: a directory holding libcuda.so.1 to put first on LD_LIBRARY_PATH
        (the stub driver on machines without a GPU; None on a real GPU node).
        ``collective_timeout_s``: the timeout the run configures so a hang is caught."""
        self.run_id = uuid.uuid4().hex[:8]
        self.plan = Plan.preset(preset, rank=rank, plan_id=f"{preset}-{self.run_id}", **overrides)
        self.preset = preset
        self.rank = rank
        self.shim_path = shim_path
        self.driver_dir = driver_dir
        self.collective_timeout_s = collective_timeout_s
        self.control_path = f"/dev/shm/chaos-cuda-{self.run_id}.ctl"
        self.log_path = f"/tmp/chaos-cuda-{self.run_id}.jsonl"
        if self.plan.mode == "hang" and not collective_timeout_s:
            raise ValueError("a hang fault needs collective_timeout_s: without a timeout nothing can catch the hang")

    def describe(self) -> str:
        return f"CUDA {self.preset} ({self.plan.error_name}, {self.plan.mode}) in rank {self.rank}"

    def run_env(self) -> dict[str, str]:
        if self.shim_path is None:
            from chaos.shim.build import ensure_shim

            self.shim_path = str(ensure_shim())
        env = {"LD_PRELOAD": self.shim_path, "CHAOS_CUDA_CONTROL": self.control_path,
               "CHAOS_CUDA_LOG": self.log_path}
        if self.driver_dir:
            env["LD_LIBRARY_PATH"] = ":".join(filter(None, [self.driver_dir, os.environ.get("LD_LIBRARY_PATH")]))
        if self.collective_timeout_s:
            env["RAY_TRAIN_COLLECTIVE_TIMEOUT_S"] = str(self.collective_timeout_s)
            env["CHAOS_COLLECTIVE_TIMEOUT_S"] = str(self.collective_timeout_s)
        return env

    def resolve(self, ctx: FaultContext) -> Target:
        return placement_target(ctx, self.rank)

    def revert_plan(self, target: Target) -> dict:
        return {"action": "disarm-cuda-shim", "host": target.node_ip, "control": self.control_path,
                "command": control_command(self.control_path, None)[:80] + "..."}

    def inject(self, ctx: FaultContext, target: Target) -> dict:
        transport = ctx.transport_for(target.node_ip)
        result = transport.run(control_command(self.control_path, self.plan, python=ctx.python), timeout=30)
        if not result.ok:
            raise InjectionError(f"arming the CUDA shim on {transport.host} failed: {result.stderr.strip()}")
        return {"plan_id": self.plan.plan_id, "control": self.control_path, "plan": self.plan.render()}

    def detected(self, events, target: Target, fault_t: float):
        """A CUDA fault is detected when Train sees the rank fail (no node dies)."""
        return next((e for e in events if e.t >= fault_t and e.kind in ("worker_error", "failure_decision")), None)

    def revert(self, ctx: FaultContext, target: Target) -> bool:
        transport = ctx.transport_for(target.node_ip)
        transport.run(control_command(self.control_path, None, python=ctx.python), timeout=30).check()
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
