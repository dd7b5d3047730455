"""The way out of an experiment or a session: every cleanup step, one deadline, and no step
that needs the cluster once the cluster is known to be unreachable.

A session stopped after its cluster went away used to wait out each call's own timeout in
turn (stop the run, look at the nodes, ask what the job still holds, release the lock —
each an HTTP call to a head that no longer answers, some with no timeout at all): minutes.
Here a stopped session's steps share one deadline (``BOUND_S``); a step still running at
the deadline is left to finish on its own (its thread is a daemon) and said so, and one
look at the dashboard decides whether the steps that need the cluster are tried at all.
A step that fails is said and does not stop the others.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:
    from chaos.cluster import ClusterView

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how long a stopped (Ctrl-C, SIGTERM) experiment's cleanup may take, every step together
BOUND_S = 20.0
#: how long the one look at the dashboard may take: on a stopped session's way out, and on
#: any other (a busy head may be slow, and only silence for this long skips the heal wait)
PROBE_S = 5.0
PATIENT_PROBE_S = 30.0


class Cleanup:
    """The steps of one way out.  ``bound_s``: their shared deadline (None: each step's own
    waits apply, as on a way out nobody asked to hurry)."""

    def __init__(self, say: Callable[[str], None], bound_s: float | None = None):
        self.say = say
        self.bound_s = bound_s
        self._end = None if bound_s is None else time.monotonic() + bound_s
        #: why the cluster is known not to answer (None: not known)
        self.unreachable: str | None = None

    def remaining(self, cap: float | None = None) -> float | None:
        """Seconds left before the deadline (at most ``cap``); None: no deadline and no cap."""
        if self._end is None:
            return cap
        left = max(0.0, self._end - time.monotonic())
        return left if cap is None else min(cap, left)

    def probe(self, cluster: "ClusterView") -> None:
        """One look at the cluster's dashboard; from here on, steps that need the cluster
        are skipped if it does not answer."""
        left = self.remaining(PROBE_S if self._end is not None else PATIENT_PROBE_S)
        self.unreachable = (cluster.unreachable(left) if left else
                            f"no time was left to look at it (the cleanup's {self.bound_s:g} s deadline had passed)")
        if self.unreachable:
            self.say(f"cleanup: the cluster is unreachable ({self.unreachable}): steps that need it are skipped")

    def step(self, what: str, fn: Callable[[], T], needs_cluster: bool = False, default: T | None = None) -> T | None:
        """``fn()``, or ``default`` when it is skipped, fails, or outlives the deadline."""
        if needs_cluster and self.unreachable:
            self.say(f"cleanup: skipped: {what} (the cluster is unreachable)")
            return default
        if self._end is None:
            return self._call(what, fn, default)
        left = self.remaining()
        if left <= 0:
            self.say(f"cleanup: skipped: {what} (the cleanup's {self.bound_s:g} s deadline has passed)")
            return default
        box: list = []
        worker = threading.Thread(target=lambda: box.append(self._call(what, fn, default)),
                                  name=f"cleanup: {what}", daemon=True)
        worker.start()
        worker.join(left)
        if worker.is_alive():
            self.say(f"cleanup: gave up waiting for: {what} (the cleanup's {self.bound_s:g} s deadline)")
            return default
        return box[0]

    def _call(self, what: str, fn: Callable[[], T], default: T | None) -> T | None:
        try:
            return fn()
        except Exception as e:  # one failing step must neither skip the others nor hide why we are here
            log.error("cleanup step %r failed: %s", what, e)
            self.say(f"cleanup: could not {what}: {e}")
            return default
