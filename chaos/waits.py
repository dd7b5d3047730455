"""Waiting on state that has no event: poll with a deadline, and say what was seen.

Used only where Ray offers nothing to subscribe to (node table over HTTP, resource
accounting).  Timeline events have their own condition-variable waits.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

from chaos.errors import WaitTimeout

T = TypeVar("T")


def poll_until(check: Callable[[], tuple[T | None, str]], timeout: float, what: str, interval: float = 0.25,
               stop: threading.Event | None = None) -> T:
    """Call ``check()`` -> (value, seen) until value is truthy; raise WaitTimeout with ``seen``."""
    deadline = time.monotonic() + timeout
    pause = stop or threading.Event()
    seen = "nothing yet"
    while True:
        value, seen = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; saw: {seen}")
        if pause.wait(min(interval, max(0.0, deadline - time.monotonic()))):
            raise WaitTimeout(f"stopped waiting for {what} (shutting down); saw: {seen}")
