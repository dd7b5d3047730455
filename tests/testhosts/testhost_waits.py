"""Polled waits (with a deadline and what was seen) for things only visible from outside."""

from __future__ import annotations

import socket
from pathlib import Path

import tenacity


def _poll(check, awaited: str, timeout: float):
    """Poll ``check`` (returns what was seen, or None when satisfied) until a deadline."""
    seen = []

    def attempt():
        seen[:] = [check()]
        return seen[0] is None

    try:
        tenacity.Retrying(stop=tenacity.stop_after_delay(timeout), wait=tenacity.wait_fixed(0.05),
                          retry=tenacity.retry_if_result(lambda ok: not ok))(attempt)
    except tenacity.RetryError:
        raise AssertionError(f"awaited {awaited} for {timeout}s; saw {seen[0]}") from None


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
