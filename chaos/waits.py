"""Waiting on state that has no event: poll with a deadline, and say what was seen.

Used only where Ray offers nothing to subscribe to (node table over HTTP, resource
accounting).  Timeline events have their own condition-variable waits.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

import tenacity

from chaos.errors import WaitTimeout

T = TypeVar("T")


def poll_until(check: Callable[[], tuple[T | None, str]], timeout: float, what: str, interval: float = 0.25,
               stop: threading.Event | None = None) -> T:
    """Call ``check()`` -> (value, seen) until value is truthy; raise WaitTimeout with ``seen``.

    ``stop``, once set, ends the wait early (shutdown); an exception from ``check`` ends it too.
    """
    stop = stop or threading.Event()
    seen = "nothing yet"

    def attempt() -> T | None:
        nonlocal seen
        value, seen = check()
        return value

    def give_up(state: tenacity.RetryCallState):
        if stop.is_set():
            raise WaitTimeout(f"stopped waiting for {what} (shutting down); saw: {seen}")
        raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; saw: {seen}")

    return tenacity.Retrying(
        retry=tenacity.retry_if_result(lambda value: not value),
        stop=tenacity.stop_any(tenacity.stop_after_delay(timeout), lambda state: stop.is_set()),
        wait=tenacity.wait_fixed(interval),
        sleep=stop.wait,  # a pause that a set stop event cuts short
        retry_error_callback=give_up,
    )(attempt)
