"""One exception hierarchy, so callers can tell a bad profile from a broken host."""

from collections.abc import Iterable
from typing import Any


class ChaosError(Exception):
    """Base of every error the harness raises on purpose."""


class ProfileError(ChaosError):
    """A profile or option value is invalid; the message names where and what."""


class ClusterError(ChaosError):
    """The cluster did not reach the state the harness needed (start-up, health)."""


class TransportError(ChaosError):
    """A host or pod could not be reached, or a command on it failed."""


class InjectionError(ChaosError):
    """A fault could not be injected or reverted."""


class WaitTimeout(ChaosError):
    """An awaited event did not happen before its deadline.

    The message always says what was awaited and what was seen instead.
    """


class WorkloadError(ChaosError):
    """The run under test failed in a way that is not a verdict (e.g. before training)."""


class VerificationError(ChaosError, AssertionError):
    """A verdict failed; carries the verdicts so reports can show the evidence.

    An AssertionError on purpose: a failed verdict is a finding about the cluster
    (a failed test), not a broken harness.
    """

    def __init__(self, message: str, verdicts: Iterable[Any] = ()) -> None:
        super().__init__(message)
        self.verdicts = list(verdicts)


class Aborted(ChaosError):
    """A stop condition fired (the cluster got less healthy than the profile allows):
    the chaos was reverted and the test is aborted — not failed."""
