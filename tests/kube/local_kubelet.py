"""A test ``PodLifecycle``: one real local process per pod, stopped the way a kubelet stops it.

The container's ``command`` + ``args`` run as a local process in its own session; the pod
is Running from the start and Ready once the process prints its first line (a readiness
probe: signal handlers are installed by then).  Graceful
deletion sends SIGTERM to that session and SIGKILL when the grace runs out; a forced
delete does the same with the kubelet's 2 s floor.  Once the process has exited the
server is told (``containers_stopped``), which is what removes a terminating pod.  A pod
whose process exits on its own becomes Succeeded or Failed.  ``exec`` runs ``argv`` as a
local subprocess.  Every process is tracked by PID and killed by PID in ``close()``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Sequence

from chaos.embedded.kube import ExecProcess, PodLifecycle

KUBELET_MIN_GRACE_S = 2  # kuberuntime's minimumGracePeriodInSeconds


class LocalProcesses(PodLifecycle):
    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.procs: dict[str, subprocess.Popen] = {}  # pod uid -> its container process
        self._terminating: set[str] = set()
        self._timers: dict[str, threading.Timer] = {}
        self._waiters: list[threading.Thread] = []
        self.exec_pids: set[int] = set()

    def pod_added(self, pod: dict) -> None:
        if not pod["spec"].get("nodeName"):
            return
        meta, container = pod["metadata"], pod["spec"]["containers"][0]
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        with self._lock:
            self.procs[meta["uid"]] = proc
        self.pods.set_status(meta["namespace"], meta["name"], {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}, uid=meta["uid"])
        probe = threading.Thread(target=self._probe, args=(meta["namespace"], meta["name"], meta["uid"], proc),
                                 name=f"probe:{meta['name']}", daemon=True)
        self._waiters.append(probe)
        probe.start()
        waiter = threading.Thread(target=self._wait, args=(meta["namespace"], meta["name"], meta["uid"], proc),
                                  name=f"kubelet:{meta['name']}", daemon=True)
        self._waiters.append(waiter)
        waiter.start()

    def _probe(self, namespace: str, name: str, uid: str, proc: subprocess.Popen) -> None:
        """Ready at the first line of output; the rest goes to the container's log file."""
        with open(self.log_dir / f"{name}.log", "ab") as log:
            first = proc.stdout.readline()
            log.write(first)
            if first:
                self.pods.set_status(namespace, name, {"conditions": [{"type": "Ready", "status": "True"}]}, uid=uid)
            for line in proc.stdout:
                log.write(line)

    def _wait(self, namespace: str, name: str, uid: str, proc: subprocess.Popen) -> None:
        code = proc.wait()
        with self._lock:
            terminating = uid in self._terminating
            timer = self._timers.pop(uid, None)
        if timer:
            timer.cancel()
        if terminating:
            self.pods.containers_stopped(namespace, name, uid)
        else:
            self.pods.set_status(namespace, name, {"phase": "Succeeded" if code == 0 else "Failed",
                                                   "conditions": [{"type": "Ready", "status": "False"}]}, uid=uid)

    def _stop(self, uid: str, grace_s: float) -> None:
        with self._lock:
            proc = self.procs.get(uid)
            if proc is None or proc.poll() is not None:
                return
            self._terminating.add(uid)
            old = self._timers.pop(uid, None)
            timer = threading.Timer(grace_s, self._kill, args=(proc,))
            self._timers[uid] = timer
        if old:
            old.cancel()
        self._signal(proc.pid, signal.SIGTERM)
        timer.start()

    @staticmethod
    def _signal(pid: int, signum: int) -> None:
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            pass

    def _kill(self, proc: subprocess.Popen) -> None:
        self._signal(proc.pid, signal.SIGKILL)

    def pod_terminating(self, pod: dict, grace_seconds: int) -> None:
        self._stop(pod["metadata"]["uid"], grace_seconds)

    def pod_removed(self, pod: dict) -> None:
        grace = pod["metadata"].get("deletionGracePeriodSeconds", 0)
        self._stop(pod["metadata"]["uid"], max(KUBELET_MIN_GRACE_S, grace))

    async def exec(self, pod: dict, container: str, argv: Sequence[str], stdin: bool, tty: bool) -> ExecProcess:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        self.exec_pids.add(proc.pid)
        return proc

    def close(self) -> None:
        """Kill every process still running (by PID) and wait for them."""
        with self._lock:
            procs = list(self.procs.values())
            timers = list(self._timers.values())
        for timer in timers:
            timer.cancel()
        for proc in procs:
            if proc.poll() is None:
                self._signal(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for pid in self.exec_pids:
            self._signal(pid, signal.SIGKILL)
        for waiter in self._waiters:
            waiter.join(timeout=10)
