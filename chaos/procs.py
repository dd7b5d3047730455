"""Processes the harness starts: tracked by PID, stopped by PID.

Each tracked process is started as the leader of a new session.  Everything Ray
spawns under it (gcs_server, raylet, agents, workers) stays in that session, so the
exact set of PIDs to stop is "members of session <leader pid>" plus descendants —
never a match on a process name.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

import psutil

log = logging.getLogger(__name__)


def session_members(sid: int) -> list[int]:
    """PIDs whose session id is ``sid``; zombies are left out (dead already, only unreaped)."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(proc.pid) == sid:
                members.append(proc.pid)
        except OSError:  # exited while we looked
            continue
    return members


class TrackedProcess:
    """One started command (a session leader) and everything it spawned."""

    def __init__(self, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, name: str | None = None):
        self.argv = list(argv)
        self.name = name or Path(argv[0]).name
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
        )
        self.pid = self.popen.pid
        log.debug("started %s pid=%d log=%s", self.name, self.pid, self.log_path)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def members(self) -> list[int]:
        """Every live PID that belongs to this process tree."""
        pids = set(session_members(self.pid))
        try:
            pids.update(c.pid for c in psutil.Process(self.pid).children(recursive=True))
            pids.add(self.pid)
        except psutil.NoSuchProcess:
            pass
        return sorted(pids)

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGKILL) -> None:
        """Signal every member by PID, then wait (bounded) until none is left."""
        deadline = time.monotonic() + timeout
        while True:
            pids = self.members()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            self.popen.poll()  # reap the leader if it is ours
            procs = [p for p in map(_proc, pids) if p is not None]
            psutil.wait_procs(procs, timeout=0.5)
            if time.monotonic() > deadline:
                left = self.members()
                if left:
                    raise RuntimeError(f"{self.name}: processes {left} still alive {timeout:.0f}s after stop")
                break
        self.popen.poll()
        self._log.close()


def _proc(pid: int):
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
