"""A checked claim about a timeline, with its evidence, and how a list of them fails a test."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from chaos.errors import VerificationError
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.status import Status


@dataclasses.dataclass
class Verdict:
    name: str
    status: Status
    message: str
    diagnosis: Diagnosis | None = None
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        if self.diagnosis is not None and not isinstance(self.diagnosis, Diagnosis):
            known = Diagnosis._value2member_map_.get(self.diagnosis)  # a diagnosis read back from JSON
            if not isinstance(known, Diagnosis):
                raise TypeError(f"verdict {self.name}: diagnosis {self.diagnosis!r} is no chaos.verdicts.Diagnosis")
            self.diagnosis = known

    @property
    def failed(self) -> bool:
        return self.status is Status.FAIL

    def fails(self, unverifiable: str = "fail") -> bool:
        """Whether this verdict fails the test (``unverifiable`` is ``fail`` or ``warn``)."""
        return self.status.fails(unverifiable)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "message": self.message,
                "diagnosis": self.diagnosis.value if self.diagnosis is not None else None,
                "evidence": self.evidence}

    def line(self) -> str:
        return f"[{self.status.value.upper():>12}] {self.name}: {self.message}"


def check(verdicts: Iterable[Verdict], unverifiable: str = "fail") -> None:
    """Raise VerificationError listing every failing verdict (failures first, so the first
    failure's diagnosis leads).  With ``unverifiable="fail"`` (the default) a verdict that
    could not be checked fails the test with its reason; ``"warn"`` lets it through, still
    shown in the report."""
    verdicts = list(verdicts)
    failing = sorted((v for v in verdicts if v.fails(unverifiable)), key=lambda v: v.status is not Status.FAIL)
    if failing:
        raise VerificationError("\n".join(v.message for v in failing), verdicts)
