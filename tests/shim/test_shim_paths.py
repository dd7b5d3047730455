"""Every way a process reaches the driver goes through the shim, to the right real variant."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shim_helpers import compile_program

PATHS = ["export", "dlsym", "gpa2", "gpa1", "ptsz", "self2", "self1"]

# driver command -> (concrete entry point, its per-thread-default-stream variant)
COMMANDS = {
    "launch": ("cuLaunchKernel", "cuLaunchKernel_ptsz"),
    "launchex": ("cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"),
    "coop": ("cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz"),
    "alloc": ("cuMemAlloc_v2", "cuMemAlloc_v2"),
    "allocasync": ("cuMemAllocAsync", "cuMemAllocAsync_ptsz"),
    "htod": ("cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds"),
    "dtoh": ("cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds"),
    "cpyasync": ("cuMemcpyAsync", "cuMemcpyAsync_ptsz"),
    "htodasync": ("cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz"),
    "dtohasync": ("cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz"),
    "ctxsync": ("cuCtxSynchronize", "cuCtxSynchronize"),
    "ctxsync2": ("cuCtxSynchronize_v2", "cuCtxSynchronize_v2"),
    "ssync": ("cuStreamSynchronize", "cuStreamSynchronize_ptsz"),
    "squery": ("cuStreamQuery", "cuStreamQuery_ptsz"),
    "equery": ("cuEventQuery", "cuEventQuery"),
    "esync": ("cuEventSynchronize", "cuEventSynchronize"),
    "graph": ("cuGraphLaunch", "cuGraphLaunch_ptsz"),
}


def concrete(path: str, command: str) -> str:
    return COMMANDS[command][1 if path == "ptsz" else 0]


@pytest.mark.parametrize("path", PATHS)
def test_disarmed_calls_reach_the_matching_real_variant(run_driver, path):
    names = sorted({concrete(path, c) for c in COMMANDS})
    run = run_driver(path, *COMMANDS, *(f"stubcalls:{n}" for n in names))
    assert all(rc == 0 for _, rc in run.results()), run.lines
    calls = {line.split()[1]: int(line.split()[2]) for line in run.lines if line.startswith("calls ")}
    expected = {n: sum(concrete(path, c) == n for c in COMMANDS) for n in names}
    assert calls == expected
    assert run.injections() == []


@pytest.mark.parametrize("path", PATHS)
def test_every_wrapped_entry_point_injects_through_each_path(run_driver, path):
    run = run_driver(path, *COMMANDS, plan="symbols=*;mode=error;error=700;times=0;plan_id=all")
    assert run.results() == [(c, 700) for c in COMMANDS]
    assert [e["symbol"] for e in run.injections()] == [concrete(path, c) for c in COMMANDS]


def test_ptsz_variant_is_targeted_separately(run_driver):
    plan = "symbols=cuLaunchKernel_ptsz;error=719;times=0"
    assert run_driver("gpa2", "launch", plan=plan).codes("launch") == [0]
    assert run_driver("ptsz", "launch", "stubcalls:cuLaunchKernel_ptsz", plan=plan).codes("launch") == [719]


def test_cuCtxSynchronize_and_v2_are_distinct_wrappers(run_driver):
    run = run_driver("gpa2", "ctxsync", "ctxsync2", plan="symbols=cuCtxSynchronize_v2;error=999;times=0")
    assert run.results() == [("ctxsync", 0), ("ctxsync2", 999)]


@pytest.mark.parametrize("path", ["export", "dlsym", "gpa2", "gpa1"])
def test_export_table_passes_through_untouched(run_driver, path):
    run = run_driver(path, "exporttable", plan="symbols=*;mode=sticky;error=999")
    assert "table c0ffee5ec7e7ab1e" in run.lines
    assert run.codes("exporttable") == [0]


def test_many_threads_calling_dlsym_and_getprocaddress(run_driver):
    run = run_driver("dlsym", "threads:16:3000", "launch",
                     plan="symbols=cuLaunchKernel;mode=delay;delay_us=1;times=0")
    assert run.results() == [("threads:16:3000", 0), ("launch", 0)]


NEXT_LIB_A = """
#define _GNU_SOURCE
#include <dlfcn.h>
int probe(void) { return 1; }
void *next_probe(void) { return dlsym(RTLD_NEXT, "probe"); }
"""
NEXT_LIB_B = "int probe(void) { return 2; }\n"
NEXT_MAIN = """
#include <stdio.h>
void *next_probe(void);
int main(void) { int (*p)(void) = (int (*)(void))next_probe(); printf("%d\\n", p ? p() : -1); return 0; }
"""


def test_dlsym_override_keeps_rtld_next_relative_to_the_caller(shim, tmp_path):
    """RTLD_NEXT is resolved from the caller's address; the override must not make it the shim."""
    a = compile_program(NEXT_LIB_A, tmp_path / "liba.so", "-shared", "-fPIC", "-ldl")
    b = compile_program(NEXT_LIB_B, tmp_path / "libb.so", "-shared", "-fPIC")
    exe = compile_program(NEXT_MAIN, tmp_path / "next", "-Wl,--no-as-needed", str(a), str(b),
                          f"-Wl,-rpath,{tmp_path}")
    out = subprocess.run([str(exe)], env={"LD_PRELOAD": str(shim)}, capture_output=True, text=True, timeout=20)
    assert out.stdout.strip() == "2", out.stderr


VERSIONED_LOOKUPS = """
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
gpa = cuda.cuGetProcAddress_v2
gpa.argtypes = (ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                ctypes.POINTER(ctypes.c_int))
cuda.chaosStubCalls.restype = ctypes.c_ulong
out = {}
for name, version in [("cuMemAlloc", 3000), ("cuMemAlloc", 12000), ("cuLaunchKernelEx", 11000), ("cuNoSuch", 12000)]:
    pfn, status = ctypes.c_void_p(), ctypes.c_int(-1)
    rc = gpa(name.encode(), ctypes.byref(pfn), version, 0, ctypes.byref(status))
    called = None
    if rc == 0:
        handle = ctypes.c_ulonglong()
        called = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)(pfn.value)(ctypes.byref(handle), 8)
    out[f"{name}@{version}"] = [rc, status.value, called]
out["calls"] = [cuda.chaosStubCalls(b"cuMemAlloc"), cuda.chaosStubCalls(b"cuMemAlloc_v2")]
print(json.dumps(out))
"""


def test_versioned_lookups_pass_unwrapped_variants_through(shim_env):
    """cuMemAlloc at 3000 is the v1 entry point (not wrapped): the driver's answer stands;
    at 12000 it is cuMemAlloc_v2, wrapped (the plan fails it, so the stub never sees it)."""
    env = shim_env("symbols=cuMemAlloc*;error=2;times=0")
    p = subprocess.run([sys.executable, "-c", VERSIONED_LOOKUPS], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"cuMemAlloc@3000": [0, 0, 0], "cuMemAlloc@12000": [0, 0, 2],
                                    "cuLaunchKernelEx@11000": [500, 2, None], "cuNoSuch@12000": [500, 1, None],
                                    "calls": [1, 0]}
