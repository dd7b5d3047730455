"""Fault modes, selectors and triggers, arming at run time, fork, and the JSON log."""

from __future__ import annotations

import struct
import subprocess
import time
from pathlib import Path

from chaos.shim.control import arm, disarm, read_log, write_control
from chaos.shim.plan import Plan

from shim_helpers import compile_program

LOG_KEYS = {"t", "host", "pid", "rank", "symbol", "call", "mode", "error", "error_name", "plan_id", "event"}


# ---- modes ----

def test_error_fails_the_matching_call_once(run_driver):
    run = run_driver("gpa2", "launch", "launch", "launch", "ssync",
                     plan=Plan(symbols=("cuLaunchKernel",), error=719, after=1, plan_id="e1"))
    assert run.results() == [("launch", 0), ("launch", 719), ("launch", 0), ("ssync", 0)]
    [inj] = run.injections()
    assert (inj["symbol"], inj["call"], inj["error"], inj["error_name"], inj["plan_id"]) == \
        ("cuLaunchKernel", 2, 719, "CUDA_ERROR_LAUNCH_FAILED", "e1")


def test_sticky_fails_every_later_call(run_driver):
    run = run_driver("export", "launch", "launch", "htod", "ssync", "alloc",
                     plan=Plan.preset("illegal-address", after=1))
    assert run.results() == [("launch", 0), ("launch", 700), ("htod", 700), ("ssync", 700), ("alloc", 700)]
    assert len(run.injections()) == 1


def test_deferred_surfaces_at_the_next_sync_or_query(run_driver):
    run = run_driver("gpa2", "launch", "htodasync", "launch", "equery", "ctxsync", "launch", "ssync",
                     plan=Plan(symbols=("cuLaunchKernel",), mode="deferred", error=214))
    assert run.results() == [("launch", 0), ("htodasync", 0), ("launch", 0), ("equery", 214),
                             ("ctxsync", 0), ("launch", 0), ("ssync", 0)]
    assert [e["symbol"] for e in run.injections()] == ["cuLaunchKernel"]


def test_ecc_preset_is_deferred_then_sticky(run_driver):
    run = run_driver("dlsym", "launch", "htodasync", "ctxsync", "launch", "squery", plan=Plan.preset("ecc"))
    assert run.results() == [("launch", 0), ("htodasync", 0), ("ctxsync", 214), ("launch", 214), ("squery", 214)]


def test_gpu_lost_fails_every_call_from_the_first(run_driver):
    run = run_driver("gpa2", "alloc", "htod", "launch", "equery", plan=Plan.preset("gpu-lost"))
    assert [rc for _, rc in run.results()] == [999] * 4


def test_delay_slows_the_call_and_then_succeeds(run_driver):
    start = time.monotonic()
    run = run_driver("gpa2", "ssync", "ssync",
                     plan=Plan(symbols=("cuStreamSynchronize",), mode="delay", delay_us=150_000, times=None))
    assert run.results() == [("ssync", 0), ("ssync", 0)]
    assert time.monotonic() - start >= 0.3
    assert [(e["error"], e["error_name"]) for e in run.injections()] == [(0, "CUDA_SUCCESS")] * 2


def test_hang_query_reports_not_ready_until_disarmed(shim_env, interactive):
    drv = interactive("gpa2", "squery", "wait", "squery", "squery", "wait", "squery", env=shim_env())
    drv.expect("squery 0")
    drv.expect("waiting")
    arm(shim_env.control, Plan(symbols=("cuStreamQuery",), mode="hang", plan_id="hq"))
    drv.resume()
    drv.expect("squery 600")
    drv.expect("squery 600")
    drv.expect("waiting")
    disarm(shim_env.control)
    drv.resume()
    drv.expect("squery 0")
    drv.finish()


def test_hang_sync_blocks_until_disarmed(shim_env, interactive):
    drv = interactive("ptsz", "wait", "launch", "ssync", "ssync", env=shim_env())
    drv.expect("waiting")
    arm(shim_env.control, Plan(symbols=("cuLaunchKernel",), mode="hang", plan_id="hs"))
    drv.resume()
    drv.expect("launch 0")  # the launch is queued; the device never finishes it
    drv.assert_silent(1.0)
    disarm(shim_env.control)
    drv.expect("ssync 0")
    drv.expect("ssync 0")
    drv.finish()
    events = [(e["event"], e["symbol"], e["error_name"]) for e in read_log(shim_env.log)]
    assert events == [("arm", "", "CUDA_ERROR_NOT_READY"), ("inject", "cuLaunchKernel_ptsz", "CUDA_ERROR_NOT_READY"),
                      ("disarm", "", "CUDA_ERROR_NOT_READY")]


# ---- arming at run time ----

def test_arm_and_disarm_mid_run_through_the_control_file(shim_env, interactive):
    drv = interactive("dlsym", "launch", "wait", "launch", "launch", "wait", "launch", "wait", "launch",
                      env=shim_env())
    drv.expect("launch 0")
    drv.expect("waiting")
    plan = Plan(symbols=("cuLaunchKernel",), error=715, after=1, plan_id="mid")
    arm(shim_env.control, plan)
    drv.resume()
    assert [drv.readline(), drv.readline()] == ["launch 0", "launch 715"]
    drv.expect("waiting")
    arm(shim_env.control, plan)  # re-arming starts the counters afresh
    drv.resume()
    drv.expect("launch 0")
    drv.expect("waiting")
    disarm(shim_env.control)
    drv.resume()
    drv.expect("launch 0")
    drv.finish()
    log = read_log(shim_env.log)
    assert [(e["event"], e["plan_id"]) for e in log] == [("arm", "mid"), ("inject", "mid"), ("arm", "mid"),
                                                          ("disarm", "mid")]


def test_control_file_armed_before_start_beats_the_inline_plan(run_driver, shim_env):
    arm(shim_env.control, Plan(symbols=("cuMemAlloc",), error=2, plan_id="file"))
    run = run_driver("gpa2", "launch", "alloc",
                     env=shim_env(Plan(symbols=("cuLaunchKernel",), plan_id="inline")))
    assert run.results() == [("launch", 0), ("alloc", 2)]


def test_inline_plan_without_control_file(run_driver, shim_env):
    env = shim_env("symbols=cuLaunchKernel;error=CUDA_ERROR_MISALIGNED_ADDRESS", control=False)
    assert run_driver("export", "launch", env=env).codes("launch") == [716]


def test_malformed_inline_plan_is_rejected_not_half_applied(driver, shim_env):
    env = shim_env("symbols=cuLaunchKernel;error=719;bogus=1")
    p = subprocess.run([str(driver), "gpa2", "launch"], env=env, capture_output=True, text=True, timeout=20)
    assert p.stdout.splitlines() == ["launch 0"]
    assert "bad line: bogus=1" in p.stderr


def test_concurrent_rearming_never_shows_a_torn_plan(shim_env, interactive):
    """Readers on four threads re-read the plan while it is rewritten 300 times."""
    drv = interactive("gpa2", "storm:4", "wait", "stop", env=shim_env())
    drv.expect("storm:4 0")
    drv.expect("waiting")
    for i in range(300):
        arm(shim_env.control, Plan(symbols=("cuEventQuery",), plan_id=f"p{i}", kernel="x" * (i % 100 + 1)))
    disarm(shim_env.control)
    drv.resume()
    assert int(drv.readline().split()[-1]) > 0
    drv.expect("stop 0")
    drv.finish()
    assert drv.stderr == ""
    assert {e["event"] for e in read_log(shim_env.log)} <= {"arm", "disarm"}


def test_a_writer_that_died_mid_update_does_not_wedge_readers(shim_env, interactive):
    write_control(shim_env.control, Plan(symbols=("cuLaunchKernel",), plan_id="torn").render())
    data = bytearray(shim_env.control.read_bytes())
    struct.pack_into("<I", data, 8, struct.unpack_from("<I", data, 8)[0] + 1)  # odd: "mid-update"
    shim_env.control.write_bytes(data)
    drv = interactive("gpa2", "launch", "wait", "launch", env=shim_env())
    drv.expect("launch 0")
    drv.expect("waiting")
    arm(shim_env.control, Plan(symbols=("cuLaunchKernel",), plan_id="healed"))
    drv.resume()
    drv.expect("launch 719")
    drv.finish()
    assert [e["plan_id"] for e in read_log(shim_env.log)] == ["healed", "healed"]


def test_processes_that_never_call_the_driver_log_nothing(shim_env):
    env = shim_env(Plan(symbols=("*",)))
    subprocess.run(["sh", "-c", "true"], env=env, check=True, timeout=20)
    assert not shim_env.log.exists()


# ---- selectors and triggers ----

def test_rank_selector_reads_RANK_lazily(run_driver):
    run = run_driver("gpa2", "launch", "setenv:RANK=1", "launch",
                     plan=Plan(symbols=("cuLaunchKernel",), rank=1, times=None))
    assert run.codes("launch") == [0, 719]
    assert run.injections()[0]["rank"] == 1


def test_rank_selector_skips_other_ranks(run_driver, shim_env):
    env = shim_env(Plan(symbols=("cuLaunchKernel",), rank=1, local_rank=0), RANK="0", LOCAL_RANK="0")
    assert run_driver("gpa2", "launch", env=env).codes("launch") == [0]
    env = shim_env(Plan(symbols=("cuLaunchKernel",), rank=1, local_rank=0), RANK="1", LOCAL_RANK="0")
    assert run_driver("gpa2", "launch", env=env).codes("launch") == [719]


def test_device_selector(run_driver):
    run = run_driver("gpa2", "launch", "dev:1", "launch", "dev:2", "launch",
                     plan=Plan(symbols=("cuLaunchKernel",), device=1, times=None))
    assert run.codes("launch") == [0, 719, 0]


def this_boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def until_reboot(boot_id: str) -> Plan:
    """The xid fault's plan: every driver call on the host of `boot_id` fails until it reboots."""
    return Plan(symbols=("*",), mode="error", times=None, error=999, boot_id=boot_id, plan_id="xid")


# Makes the boot id file unreadable to the shim, which calls open() for it.
NO_BOOT_ID = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int mode = flags & O_CREAT ? va_arg(ap, int) : 0;
    va_end(ap);
    if (!strcmp(path, "/proc/sys/kernel/random/boot_id")) return errno = EACCES, -1;
    return openat(AT_FDCWD, path, flags, mode);
}
"""


def test_boot_id_selector_fails_every_call_on_this_boot(run_driver):
    boot_id = this_boot_id()
    plan = until_reboot(boot_id)
    assert f"boot_id={boot_id}\n" in plan.render()
    run = run_driver("gpa2", "alloc", "htod", "launch", "launch", "equery", "ssync", "fork", "launch", "ctxsync",
                     plan=plan)
    assert run.results() == [("alloc", 999), ("htod", 999), ("launch", 999), ("launch", 999), ("equery", 999),
                             ("ssync", 999), ("child launch", 999), ("child ctxsync", 999)]
    assert len(run.injections()) == 8


def test_boot_id_selector_never_fires_on_another_boot(run_driver):
    boot_id = this_boot_id()
    other = ("0" if boot_id[0] != "0" else "1") + boot_id[1:]
    run = run_driver("gpa2", "alloc", "launch", "launch", "equery", "ssync", plan=until_reboot(other))
    assert run.results() == [("alloc", 0), ("launch", 0), ("launch", 0), ("equery", 0), ("ssync", 0)]
    assert [e["event"] for e in run.log] == ["arm"]


def test_boot_id_plan_never_fires_when_the_boot_id_is_unreadable(shim_env, interactive, build_dir):
    blind = compile_program(NO_BOOT_ID, build_dir / "libno_boot_id.so", "-shared", "-fPIC")
    env = shim_env(until_reboot(this_boot_id()))
    env["LD_PRELOAD"] = f"{blind} {env['LD_PRELOAD']}"
    drv = interactive("gpa2", "launch", "wait", "launch", "alloc", env=env)
    drv.expect("launch 0")
    drv.expect("waiting")
    arm(shim_env.control, until_reboot(this_boot_id()))
    drv.resume()
    drv.expect("launch 0")
    drv.expect("alloc 0")
    drv.finish()
    assert [e["event"] for e in read_log(shim_env.log)] == ["arm", "boot_id_unreadable", "arm"]


def test_every_n(run_driver):
    run = run_driver("gpa2", *["launch"] * 9, plan=Plan(symbols=("cuLaunchKernel",), every=3, times=None))
    assert [i + 1 for i, rc in enumerate(run.codes("launch")) if rc] == [3, 6, 9]


def test_after_n_at_most_k(run_driver):
    run = run_driver("gpa2", *["launch"] * 6, plan=Plan(symbols=("cuLaunchKernel",), after=2, times=2))
    assert [i + 1 for i, rc in enumerate(run.codes("launch")) if rc] == [3, 4]


def test_probability_is_deterministic_per_seed(run_driver):
    def fired(seed: int) -> list[int]:
        plan = Plan(symbols=("cuLaunchKernel",), probability=0.3, seed=seed, times=None)
        return [i for i, rc in enumerate(run_driver("gpa2", *["launch"] * 200, plan=plan).codes("launch")) if rc]
    first = fired(42)
    assert fired(42) == first
    assert fired(43) != first
    assert 30 <= len(first) <= 90


def test_kernel_name_glob(run_driver):
    run = run_driver("gpa2", "launch:matmul", "launch:relu", "launch:matadd", "htod",
                     plan=Plan(symbols=("*",), kernel="mat*", times=None))
    assert run.results() == [("launch:matmul", 719), ("launch:relu", 0), ("launch:matadd", 719), ("htod", 0)]


# ---- fork ----

def test_counters_reset_in_a_forked_child(run_driver):
    run = run_driver("gpa2", "launch", "launch", "fork", "launch", "launch", "launch",
                     plan=Plan(symbols=("cuLaunchKernel",), after=2))
    assert run.results() == [("launch", 0), ("launch", 0), ("child launch", 0), ("child launch", 0),
                             ("child launch", 719)]
    [inj] = run.injections()
    assert inj["call"] == 3


# ---- log ----

def test_log_lines_are_complete_json_and_match_the_injections(run_driver):
    run = run_driver("gpa2", *["launch"] * 5, "setenv:RANK=3", "launch",
                     plan=Plan(symbols=("cuLaunchKernel",), every=2, times=None, plan_id="log-1"))
    assert all(set(e) >= LOG_KEYS for e in run.log)
    assert [e["event"] for e in run.log] == ["arm", "inject", "inject", "inject"]
    injections = run.injections()
    assert [e["call"] for e in injections] == [2, 4, 6]
    assert [e["rank"] for e in injections] == [None, None, 3]
    assert len({e["pid"] for e in run.log}) == 1
    assert all(e["host"] and e["mode"] == "error" and e["plan_id"] == "log-1" for e in run.log)
    assert sum(rc != 0 for rc in run.codes("launch")) == len(injections)
