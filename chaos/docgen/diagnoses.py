"""docs/reference/diagnoses.md: every diagnosis a verdict can give (chaos.verdicts.Diagnosis)."""

from __future__ import annotations

from chaos.docgen.markdown import code, header, table
from chaos.verdicts.diagnosis import Diagnosis, Kind

INTRO = """
A verdict that does not pass names what went wrong: its message starts with one of these
phrases, and the report's categories group tests by it. `unverifiable: …` means the evidence
to decide was missing: never a pass (`--chaos-unverifiable fail`, the default, fails the test).
A *warning* is shown and never fails; an *expected* outcome is what the suite asked for.
What each verdict checks: [../verdicts.md](../verdicts.md); which test covers each diagnosis:
[../testing.md](../testing.md#diagnoses).
"""


def render() -> str:
    return header("Diagnoses", "`chaos/verdicts/diagnosis.py` (`Diagnosis`)", INTRO) + "".join(
        f"## {title}\n\n" + table(["diagnosis", "verdict", "what it means", "report category"], [
            (code(d.value), ", ".join(d.verdicts), d.doc, d.report.value) for d in Diagnosis if d.kind is kind])
        for kind, title in ((Kind.FINDING, "Findings"), (Kind.UNVERIFIABLE, "Missing evidence"),
                            (Kind.WARNING, "Warnings"), (Kind.EXPECTED, "Expected outcomes")))
