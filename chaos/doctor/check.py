"""One line of doctor's table (re-exported as ``chaos.doctor.Check``; the modules that make
checks import it from here, so that the package's ``run`` may import them)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of the table."""

    subject: str  # "cluster", "lock", "safety", "profile", "host 10.1.0.3", "kubernetes", "hyperpod"
    what: str  # what was checked
    ok: bool
    detail: str  # what was seen
    fix: str = ""  # one line, only when not ok
    kinds: tuple[str, ...] = ()  # the enabled kinds that cannot run while this fails; (): every kind

    def __post_init__(self):
        if self.ok == bool(self.fix):
            raise ValueError(f"{self.subject}: {self.what}: a fix is given exactly when the check failed")
