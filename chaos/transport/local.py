"""The local transport: commands on the machine the harness runs on."""

from __future__ import annotations

import subprocess
from typing import Sequence

from chaos.errors import TransportError
from chaos.transport.base import CommandResult, as_shell


class LocalTransport:
    """Commands as the harness's own user: ``privileged`` changes nothing (local hosts are the
    embedded cluster's, whose harness runs as root)."""

    def __init__(self, host: str = "localhost"):
        self.host = host

    def run(self, command: str | Sequence[str], timeout: float = 30.0, privileged: bool = False) -> CommandResult:
        cmd = as_shell(command)
        try:
            p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise TransportError(f"{self.host}: `{cmd}` did not finish within {timeout:.0f}s") from e
        return CommandResult(self.host, cmd, p.returncode, p.stdout, p.stderr)

    def launch(self, command: str | Sequence[str], privileged: bool = False) -> None:
        """Refused: "launch" is for commands that take the host down (a reboot), and the
        local host is the machine the harness itself runs on."""
        raise TransportError(f"{self.host}: refusing to launch `{as_shell(command)}` on the harness's own machine "
                             "(local transport); reach the host over ssh instead")

    def close(self) -> None:
        pass
