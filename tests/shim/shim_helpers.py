"""Helpers for the shim tests: compiling test programs and driving the C test driver."""

from __future__ import annotations

import dataclasses
import os
import selectors
import subprocess
import time
from pathlib import Path

from chaos.shim.build import compiler

DEADLINE_S = 20.0


def compile_program(source: Path | str, out: Path, *extra: str) -> Path:
    """Compile a test program (a path, or C source text) with the system compiler."""
    if isinstance(source, str):
        src = out.with_suffix(".c")
        src.write_text(source)
        source = src
    subprocess.run([compiler(), "-O1", "-Wall", "-o", str(out), str(source), *extra], check=True)
    return out


@dataclasses.dataclass
class Run:
    """A finished driver run: its stdout lines and the shim's JSON events."""

    lines: list[str]
    log: list[dict]

    def results(self) -> list[tuple[str, int]]:
        """(command, CUresult) for every call line."""
        out = []
        for line in self.lines:
            parts = line.rsplit(" ", 1)
            if len(parts) == 2 and parts[1].lstrip("-").isdigit() and not line.startswith(("calls ", "table ")):
                out.append((parts[0], int(parts[1])))
        return out

    def codes(self, command: str) -> list[int]:
        return [rc for cmd, rc in self.results() if cmd == command]

    def injections(self) -> list[dict]:
        return [e for e in self.log if e["event"] == "inject"]


class Interactive:
    """A driver run the test steps through: it prints 'waiting' at each `wait` command and
    continues when the test calls resume(); every read is bounded by a deadline."""

    def __init__(self, driver: Path, path: str, commands: list[str], env: dict):
        self.proc = subprocess.Popen([str(driver), path, *commands], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.buffer = b""

    def readline(self, timeout: float = DEADLINE_S) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.sel.select(remaining):
                raise AssertionError(f"driver printed nothing within {timeout}s")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise AssertionError(f"driver exited early ({self.proc.wait()}): {self.proc.stderr.read().decode()}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def expect(self, line: str, timeout: float = DEADLINE_S) -> None:
        got = self.readline(timeout)
        assert got == line, f"expected {line!r}, driver printed {got!r}"

    def assert_silent(self, timeout: float) -> None:
        """The driver prints nothing for `timeout` seconds (it is blocked in a call)."""
        assert b"\n" not in self.buffer and not self.sel.select(timeout), "driver was expected to block"

    def resume(self) -> None:
        """Let the driver past its `wait` command."""
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()
        self.expect("wait 0")

    def finish(self, timeout: float = DEADLINE_S) -> list[str]:
        """Wait for exit (bounded) and return the lines not read yet."""
        out, err = self.proc.communicate(timeout=timeout)
        self.stderr = err.decode()
        assert self.proc.returncode == 0, self.stderr
        return (self.buffer + out).decode().splitlines()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
