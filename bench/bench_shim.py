"""Per-call cost of the CUDA shim: direct, shim disarmed, shim armed but not firing.

Builds the stub driver, the shim and a tiny C loop, runs the loop under each setup in one
go (round-robin, best of several rounds, so a burst of load elsewhere hits every setup
alike) and prints ns/call side by side.
Run: .venv/bin/python bench/bench_shim.py [calls]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chaos.shim.build import compiler, ensure_shim  # noqa: E402
from chaos.shim.plan import Plan  # noqa: E402
from chaos.shim.cuda_stub import build_stub  # noqa: E402

LOOP_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int (*query_fn)(void *);
typedef int (*gpa_fn)(const char *, void **, int, unsigned long long, int *);
int cuStreamQuery(void *);

static double ns_per_call(query_fn f, long n) {
    struct timespec a, b;
    int bad = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) bad |= f(NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (bad) { fprintf(stderr, "a call failed\n"); exit(1); }
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
}

int main(int argc, char **argv) {
    long n = atol(argv[1]);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    void *p = NULL;
    int status;
    if (!gpa || gpa("cuStreamQuery", &p, 12000, 0, &status)) return 2;
    double best_export = 1e9, best_gpa = 1e9;
    for (int r = 0; r < 5; r++) {
        double e = ns_per_call(cuStreamQuery, n), g = ns_per_call((query_fn)p, n);
        if (e < best_export) best_export = e;
        if (g < best_gpa) best_gpa = g;
    }
    printf("%.2f %.2f\n", best_export, best_gpa);
    return 0;
}
"""


def build_loop(tmp: Path) -> Path:
    """The benchmark loop, linked to a stub driver built in tmp/stub."""
    stub = build_stub(tmp / "stub")
    (tmp / "loop.c").write_text(LOOP_C)
    loop = tmp / "loop"
    subprocess.run([compiler(), "-O2", "-o", str(loop), str(tmp / "loop.c"), f"-L{stub}", "-l:libcuda.so.1",
                    f"-Wl,-rpath,{stub}", "-ldl"], check=True)
    return loop


def direct_env(tmp: Path) -> dict[str, str]:
    """The loop's environment without the shim (RANK=0, as a Ray Train worker has it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_CUDA_") and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(tmp / "stub"), CHAOS_CUDA_LOG=str(tmp / "log"), RANK="0")
    return env


def shim_setups(shim: Path, tmp: Path, label: str = "shim") -> dict[str, dict[str, str]]:
    """Environments for each armed-or-not state of `shim` that never fails a call.

    Armed but not firing takes three paths: a plan for another symbol or rank (decided when
    the plan is applied), a plan for this symbol and rank that is not yet due (counted per
    call), and one whose shots are spent (decided again once the last shot fired).
    """
    base = direct_env(tmp)
    shimmed = {**base, "LD_PRELOAD": str(shim), "CHAOS_CUDA_CONTROL": str(tmp / "control")}
    plans = {
        "armed for another symbol": Plan(symbols=("cuLaunchKernel",)),
        "armed for another rank": Plan(symbols=("cuStreamQuery",), rank=7),
        "armed, not yet due": Plan(symbols=("cuStreamQuery",), after=2**62),
        "armed, times spent": Plan(symbols=("cuStreamQuery",), mode="delay", delay_us=1, times=1),
    }
    return {f"{label}, disarmed": shimmed,
            **{f"{label}, {name}": {**shimmed, "CHAOS_CUDA_PLAN": plan.render()} for name, plan in plans.items()}}


def measure(loop: Path, setups: dict[str, dict[str, str]], calls: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Best (exported, getproc) ns/call per setup over `rounds` round-robin passes."""
    best: dict[str, tuple[float, float]] = {}
    for _ in range(rounds):
        for name, env in setups.items():
            out = subprocess.run([str(loop), str(calls)], env=env, capture_output=True, text=True, check=True)
            e, g = map(float, out.stdout.split())
            old = best.get(name, (e, g))
            best[name] = (min(e, old[0]), min(g, old[1]))
    return best


def print_table(results: dict[str, tuple[float, float]], calls: int, rounds: int) -> None:
    direct = results["direct (no shim)"]
    width = max(map(len, results)) + 1
    print(f"cuStreamQuery, best of {rounds} rounds x 5 x {calls:,} calls (stub driver)")
    print(f"{'setup':{width}} {'exported ns':>12} {'ratio':>6} {'getproc ns':>11} {'ratio':>6}")
    for name, (export_ns, gpa_ns) in results.items():
        print(f"{name:{width}} {export_ns:12.2f} {export_ns / direct[0]:6.2f} {gpa_ns:11.2f} {gpa_ns / direct[1]:6.2f}")


def main(calls: int = 20_000_000, rounds: int = 3) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        loop = build_loop(tmp)
        setups = {"direct (no shim)": direct_env(tmp), **shim_setups(ensure_shim(tmp / "cache"), tmp)}
        results = measure(loop, setups, calls, rounds)
    print_table(results, calls, rounds)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000_000)
