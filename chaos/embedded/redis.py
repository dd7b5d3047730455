"""The external Redis that gives the embedded cluster's GCS fault tolerance.

Ray keeps the GCS tables in memory unless the head starts with ``RAY_REDIS_ADDRESS``; then a
restarted GCS reloads them from Redis and the surviving raylets, workers and drivers
reconnect (KubeRay's ``gcsFaultToleranceOptions`` do the same with a Redis the user runs).
This is Debian's ``redis-server``, started and stopped by PID, on one address only:
127.0.0.1, or the test-host bridge's address when the head is a test host (the GCS is its
only client); with an append-only file so a Redis restart keeps the tables (without
persistence a restarted Redis is empty and the GCS's state is gone).
"""

from __future__ import annotations

import shutil
import signal
import socket
from pathlib import Path

from chaos.errors import ClusterError
from chaos.procs import TrackedProcess
from chaos.waits import poll_until



def redis_binary() -> str:
    """``redis-server`` on PATH, or a clear error naming how to get it."""
    path = shutil.which("redis-server")
    if path is None:
        raise ClusterError("GCS fault tolerance needs redis-server, which is not on PATH: install it "
                           "(Debian: apt-get install redis-server; `make setup` does) or run without gcs_ft")
    return path


def ping(port: int, timeout: float = 1.0, host: str = "127.0.0.1") -> str:
    """Redis's answer to PING on ``host:port`` (``+PONG`` when it serves), or why there is none."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).decode(errors="replace").strip()
    except OSError as err:
        return f"no answer: {err}"


class RedisServer:
    """One redis-server on ``host:port`` keeping its data under ``data_dir``."""

    def __init__(self, port: int, data_dir: Path, log_path: Path, start_timeout: float = 15.0,
                 host: str = "127.0.0.1"):
        self.host, self.port, self.data_dir, self.log_path = host, port, Path(data_dir), Path(log_path)
        self.start_timeout = start_timeout
        self.proc: TrackedProcess | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "RedisServer":
        """Start it and return once it answers PING (its AOF, if any, loaded)."""
        binary = redis_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Protected mode refuses every client off loopback; on the test-host bridge (no route
        # out, only the head host on it talks to Redis) it would refuse the GCS.
        protected = "yes" if self.host.startswith("127.") else "no"
        argv = [binary, "--bind", self.host, "--port", str(self.port), "--protected-mode", protected,
                "--daemonize", "no", "--dir", str(self.data_dir), "--appendonly", "yes", "--save", "",
                "--appendfsync", "everysec"]
        self.proc = TrackedProcess(argv, self.log_path, name=f"redis-{self.port}")
        self.starts += 1

        def answered():
            if not self.proc.alive():
                tail = self.log_path.read_text(errors="replace").splitlines()[-8:]
                raise ClusterError(f"redis-server on {self.address} exited with code {self.proc.popen.returncode} "
                                   f"while starting; see {self.log_path}:\n" + "\n".join(tail))
            answer = ping(self.port, host=self.host)
            return answer == "+PONG" or None, answer

        try:
            poll_until(answered, self.start_timeout, f"redis-server on {self.address} to answer PING", interval=0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self) -> int:
        """SIGKILL it (what a crashed Redis pod is); return the PID killed."""
        if self.proc is None or not self.proc.alive():
            raise ClusterError(f"redis-server on {self.address} is not running")
        pid = self.proc.pid
        self.proc.stop(sig=signal.SIGKILL)
        return pid

    def stop(self) -> None:
        """Stop every process of it by PID; idempotent."""
        if self.proc is not None:
            self.proc.stop(sig=signal.SIGKILL)
