"""What one chaos test costs the machine in CPU, and who spends it.

Runs chaos test(s) in a pytest subprocess (by default the raylet kill with spare capacity:
one real Ray Train run, one fault, one restart) and samples every process on the machine
every 0.2 s.  Prints the session's wall time, the CPU seconds every process started during
it used, grouped by kind (Ray's actors by their ``ray::`` title, scripts by name), and the
ratio CPU/wall: how many cores the test kept busy.  CPU/cores is the floor on the test's
wall time on a machine with that many cores, however its tests are spread over workers.

Most of a run's CPU is Python start-ups: every Ray Train actor (controller, each worker
of each attempt, and the per-attempt synchronization, dataset, preemption-watcher and
placement-group-cleaner actors) is a new process importing Ray Train and, for the
workers, torch.  A process that exits between two samples loses up to 0.2 s of its CPU
(an undercount).

CPU seconds drift with the machine (the same test measured 89 and 150 CPU s on two days
here), so the bench first times one fixed piece of the same work — ``import ray.train.torch``
in a fresh interpreter, which every Train worker, controller and driver pays — and prints
the session's CPU in those units too: compare runs of different days by that ratio.
Run: .venv/bin/python bench/bench_run_cost.py [pytest selection ...]
"""

from __future__ import annotations

import collections
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity"]
TICK_S = 0.2


def kind(cmdline: list[str]) -> str:
    """A stable name for what a process is: Ray's title, or the script or binary it runs."""
    if not cmdline:
        return "?"
    if cmdline[0].startswith("ray::"):
        return cmdline[0].split()[0].split(".")[0]
    for arg in cmdline[1:]:
        if arg.endswith(".py"):
            return Path(arg).name
    if "-m" in cmdline[:-1]:
        return cmdline[cmdline.index("-m") + 1]
    return Path(cmdline[0]).name


class Sampler(threading.Thread):
    """Per process started after it began: its latest CPU total and its most telling kind
    (a Ray worker is ``ray::IDLE`` until an actor takes it)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.before = {p.pid for p in psutil.process_iter()}
        self.seen: dict[int, tuple[str, float]] = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(TICK_S):
            for p in psutil.process_iter(["cmdline"]):
                if p.pid in self.before or p.pid == os.getpid():
                    continue
                try:
                    times = p.cpu_times()
                except psutil.Error:
                    continue
                name = kind(p.info["cmdline"] or [])
                old = self.seen.get(p.pid, ("?", 0.0))[0]
                self.seen[p.pid] = (max(name, old, key=_telling), times.user + times.system)


def _telling(name: str) -> int:
    """An actor's title tells most, then a Ray worker's, then a script's name."""
    return 3 if name.startswith("ray::") and name != "ray::IDLE" else 2 if name == "ray::IDLE" else 0 if name == "?" else 1


def calibrate() -> float:
    """CPU seconds of ``import ray.train.torch`` in a fresh interpreter, on this machine now."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import ray.train.torch"], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(selection: list[str]) -> int:
    unit = calibrate()
    sampler = Sampler()
    sampler.start()
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-m", "chaos", *selection, "-p", "no:cacheprovider", "-q"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-2000:], sep="\n")
        print(f"the session failed (exit {done.returncode}); its cost is not printed")
        return 1
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for name, cpu in sampler.seen.values():
        by_kind[name].append(cpu)
    total = sum(sum(v) for v in by_kind.values())
    cores = psutil.cpu_count() or 1
    print(f"{' '.join(selection)}")
    print(f"wall {wall:.1f} s, CPU {total:.1f} s: {total / wall:.2f} of {cores} cores busy on average; "
          f"floor on {cores} cores {total / cores:.1f} s")
    print(f"calibration: import ray.train.torch takes {unit:.2f} CPU s here now; the session's CPU is "
          f"{total / unit:.1f} such imports")
    print(f"{'kind':40} {'procs':>5} {'CPU s':>7} {'share':>6}")
    for name, cpus in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        if sum(cpus) >= 0.2:
            print(f"{name[:40]:40} {len(cpus):5d} {sum(cpus):7.1f} {sum(cpus) / total:6.0%}")
    actors = sum(sum(v) for k, v in by_kind.items() if k.startswith("ray::"))
    print(f"Ray's actor processes (ray::*): {actors:.1f} CPU s = {actors / total:.0%} of the session's CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or DEFAULT))
