"""Polled waits (with a deadline and what was seen) for things only visible from outside."""

from __future__ import annotations

import socket
from pathlib import Path

from chaos.waits import poll_until


def _poll(check, awaited: str, timeout: float):
    """Poll ``check`` (returns what was seen, or None when satisfied) until a deadline."""
    def attempt():
        seen = check()
        return seen is None, seen or "it"
    poll_until(attempt, timeout, awaited, interval=0.05)


def wait_listening(address: str, port: int, timeout: float = 10.0) -> None:
    """Wait until a TCP connect to address:port succeeds (a workload has started)."""
    def check():
        try:
            socket.create_connection((address, port), 0.5).close()
        except OSError as e:
            return repr(e)
    _poll(check, f"{address}:{port} accepting connections", timeout)


def wait_text(path: Path, text: str, count: int = 1, timeout: float = 10.0) -> None:
    """Wait until ``text`` occurs ``count`` times in the file at ``path``."""
    def check():
        content = path.read_text() if path.exists() else ""
        return None if content.count(text) >= count else f"{content.count(text)} times in {content[-300:]!r}"
    _poll(check, f"{text!r} {count} times in {path}", timeout)
