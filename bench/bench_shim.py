"""Per-call cost of the CUDA shim: direct, shim disarmed, shim armed but not firing.

Builds the stub driver, the shim and a tiny C loop, runs the loop under each setup in one
go and prints ns/call side by side.  Run: .venv/bin/python bench/bench_shim.py [calls]
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
from fixtures.cuda_stub import build_stub  # noqa: E402

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


def main(calls: int = 20_000_000) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        stub = build_stub(tmp / "stub")
        shim = ensure_shim(tmp / "cache")
        (tmp / "loop.c").write_text(LOOP_C)
        loop = tmp / "loop"
        subprocess.run([compiler(), "-O2", "-o", str(loop), str(tmp / "loop.c"), f"-L{stub}", "-l:libcuda.so.1",
                        f"-Wl,-rpath,{stub}", "-ldl"], check=True)
        base = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_CUDA_")}
        base.update(LD_LIBRARY_PATH=str(stub), CHAOS_CUDA_LOG=str(tmp / "log"), RANK="0")
        other_symbol, other_rank = Plan(symbols=("cuLaunchKernel",)), Plan(symbols=("cuStreamQuery",), rank=7)
        shimmed = {**base, "LD_PRELOAD": str(shim), "CHAOS_CUDA_CONTROL": str(tmp / "control")}
        setups = {
            "direct (no shim)": base,
            "shim, disarmed": shimmed,
            "shim, armed for another symbol": {**shimmed, "CHAOS_CUDA_PLAN": other_symbol.render()},
            "shim, armed for another rank": {**shimmed, "CHAOS_CUDA_PLAN": other_rank.render()},
        }
        results = {}
        for name, env in setups.items():
            out = subprocess.run([str(loop), str(calls)], env=env, capture_output=True, text=True, check=True)
            results[name] = tuple(map(float, out.stdout.split()))
    direct = results["direct (no shim)"]
    print(f"cuStreamQuery, best of 5 x {calls:,} calls (stub driver)")
    print(f"{'setup':34} {'exported ns':>12} {'ratio':>6} {'getproc ns':>11} {'ratio':>6}")
    for name, (export_ns, gpa_ns) in results.items():
        print(f"{name:34} {export_ns:12.2f} {export_ns / direct[0]:6.2f} {gpa_ns:11.2f} {gpa_ns / direct[1]:6.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000_000)
