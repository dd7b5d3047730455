"""The transport interface every fault uses to reach a host."""

from __future__ import annotations

import dataclasses
import shlex
import time
from typing import Protocol, Sequence


@dataclasses.dataclass(frozen=True)
class CommandResult:
    host: str
    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self) -> "CommandResult":
        """Raise TransportError naming host, command, exit code and stderr unless it succeeded."""
        from chaos.errors import TransportError

        if self.exit_code != 0:
            raise TransportError(
                f"{self.host}: `{self.command}` exited {self.exit_code}: {self.stderr.strip() or self.stdout.strip() or '(no output)'}"
            )
        return self


class Transport(Protocol):
    """A way to run commands on one host.

    ``run`` waits for the command (bounded by ``timeout``); ``launch`` starts a command
    and returns without waiting for it (a reboot drops the connection, which is the
    expected outcome and not an error).  ``privileged``: the command needs root's rights (a
    fault kind's catalog ``privileges``); a transport whose commands do not run as root
    already gets them for it (the SSH transport's ``become``).
    """

    host: str

    def run(self, command: str | Sequence[str], timeout: float = 30.0, privileged: bool = False) -> CommandResult: ...

    def launch(self, command: str | Sequence[str], privileged: bool = False) -> None: ...

    def close(self) -> None: ...


def as_shell(command: str | Sequence[str]) -> str:
    return command if isinstance(command, str) else shlex.join(command)


def clock_offset(transport: Transport, probes: int = 5) -> tuple[float, float]:
    """(the host's clock - this machine's, round trip) from the probe with the shortest round
    trip: events stamped on a node (the recorder's) and here (a fault's) need one clock."""
    best: tuple[float, float] | None = None
    for _ in range(probes):
        t0 = time.time()
        there = float(transport.run("date +%s.%N", timeout=10).check().stdout.strip())
        t1 = time.time()
        if best is None or t1 - t0 < best[1]:
            best = (there - (t0 + t1) / 2, t1 - t0)
    if best is None:
        raise ValueError(f"probes must be at least 1, got {probes}")
    return best
