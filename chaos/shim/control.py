"""Arm and disarm the CUDA shim in running processes through its control file.

The control file is a fixed 4 KiB file every shimmed process on the host maps MAP_SHARED:

    offset 0   magic   b"CHAOSCU1"
    offset 8   gen     u32, a seqlock: odd while a writer is mid-update
    offset 12  len     u32, bytes of plan text (0 = disarmed)
    offset 16  csum    u32, FNV-1a of the text
    offset 64  text    the plan rendered by Plan.render()

The shim compares `gen` with the last one it applied on every call (its whole disarmed
cost) and re-reads the text only when it changed.  Writers are serialised with flock and
update the file in place -- never replace or truncate it, the mappings would go stale.

This module only needs the standard library at run time, so `control_command` can ship
`write_control`'s source to a host that lacks the harness.
"""

from __future__ import annotations

import fcntl
import inspect
import json
import mmap
import os
import shlex
import struct
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chaos.shim.plan import Plan

MAGIC = b"CHAOSCU1"
SIZE = 4096
TEXT_OFFSET = 64
CAPACITY = SIZE - TEXT_OFFSET
EVENTS = {"inject", "arm", "disarm", "boot_id_unreadable"}


def _fnv1a(data: bytes) -> int:
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def write_control(control_path: str | os.PathLike, text: str) -> int:
    """Publish plan text (empty = disarm) to every process mapping the file; returns the new generation."""
    data = text.encode()
    if len(data) > CAPACITY:
        raise ValueError(f"plan text is {len(data)} bytes; the control file holds at most {CAPACITY}")
    fd = os.open(control_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size < SIZE:
            os.ftruncate(fd, SIZE)
        with mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            base = (struct.unpack_from("<I", m, 8)[0] + 1) & ~1  # even; heals a crashed writer's odd gen
            struct.pack_into("<I", m, 8, (base + 1) & 0xFFFFFFFF)  # readers now retry
            m[0:8] = MAGIC
            m[TEXT_OFFSET:TEXT_OFFSET + len(data)] = data
            struct.pack_into("<II", m, 12, len(data), _fnv1a(data))
            gen = (base + 2) & 0xFFFFFFFF
            struct.pack_into("<I", m, 8, gen)
            return gen
    finally:
        os.close(fd)  # also releases the flock


def arm(control_path: str | os.PathLike, plan: Plan) -> int:
    """Arm `plan` in every shimmed process that uses this control file; returns the generation."""
    return write_control(control_path, plan.render())


def disarm(control_path: str | os.PathLike) -> int:
    """Disarm: injections stop, sticky and hung processes are released."""
    return write_control(control_path, "")


def process_env(library: str | os.PathLike, control_path: str | os.PathLike, log_path: str | os.PathLike,
                plan: Plan | None = None) -> dict[str, str]:
    """Environment variables that put a process (e.g. a Ray worker) under the shim.

    With `plan`, it is armed from start-up; otherwise arm it later through `control_path`.
    Prepend to an existing LD_PRELOAD rather than replacing it.
    """
    env = {"LD_PRELOAD": str(library), "CHAOS_CUDA_CONTROL": str(control_path), "CHAOS_CUDA_LOG": str(log_path)}
    if plan is not None:
        env["CHAOS_CUDA_PLAN"] = plan.render()
    return env


def control_command(control_path: str, plan: Plan | None, python: str = "python3") -> str:
    """A shell command that arms (or, with plan=None, disarms) the file on another host.

    It carries ``write_control``'s own source (and what it needs, not this whole module: a
    Kubernetes exec sends its command in the URL, which API servers cap at a few KiB), so the
    host needs only a Python 3 interpreter.
    """
    text = plan.render() if plan is not None else ""
    return shlex.join([python, "-c", _REMOTE_SOURCE, control_path, text])


def _remote_source() -> str:
    constants = "".join(f"{name} = {globals()[name]!r}\n" for name in ("MAGIC", "SIZE", "TEXT_OFFSET", "CAPACITY"))
    return ("import fcntl, mmap, os, struct, sys\n" + constants + inspect.getsource(_fnv1a)
            + inspect.getsource(write_control) + "print(write_control(sys.argv[1], sys.argv[2]))\n")


def read_log(log_path: str | os.PathLike) -> list[dict]:
    """The shim's JSON events (inject/arm/disarm/boot_id_unreadable) from a log file, in file order.

    Other lines (a log that is also a process's stderr) and a torn last line are skipped.
    """
    events = []
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.startswith("{") or not line.endswith("\n"):
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and event.get("event") in EVENTS:
                events.append(event)
    return events


_REMOTE_SOURCE = _remote_source()

if __name__ == "__main__":  # CONTROL_PATH PLAN_TEXT
    print(write_control(sys.argv[1], sys.argv[2]))
