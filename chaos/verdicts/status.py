"""A verdict's status, with one order and one merge rule (Jepsen's ``merge-valid``).

The order says how much a status tells: ``n/a`` (the claim did not arise) < ``pass`` <
``expected`` (an expected failure, correctly seen) < ``warning`` (shown, never fails) <
``unverifiable`` (evidence missing) < ``fail``.  Merging several statuses gives the
greatest, so a claim made of several (one per rank, one per checker) passes only when no
part failed or went unchecked, and n/a — no claim at all — never outweighs a part that was
checked.  ``expected`` ranks above ``pass`` so that a budget-exhaustion suite's merged
result still says the exhaustion was seen.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Status(str, enum.Enum):
    NOT_APPLICABLE = "n/a"
    PASS = "pass"
    EXPECTED = "expected"
    WARNING = "warning"
    UNVERIFIABLE = "unverifiable"
    FAIL = "fail"

    def __str__(self) -> str:
        return str(self.value)

    @property
    def rank(self) -> int:
        return list(Status).index(self)

    def fails(self, unverifiable: str = "fail") -> bool:
        """Whether this status fails a test; ``unverifiable`` fails it unless ``"warn"``."""
        return self is Status.FAIL or (self is Status.UNVERIFIABLE and unverifiable == "fail")

    @staticmethod
    def merge(statuses: Iterable[Status]) -> Status:
        """The greatest of ``statuses`` (n/a for none)."""
        return max(statuses, key=lambda s: s.rank, default=Status.NOT_APPLICABLE)
