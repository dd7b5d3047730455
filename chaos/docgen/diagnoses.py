"""docs/reference/diagnoses.md: every diagnosis a verdict can give."""

from __future__ import annotations

from chaos import verify
from chaos.docgen.markdown import code, header

INTRO = """
A verdict that does not pass names what went wrong: its message starts with one of these
phrases, and the report's categories group tests by it. `unverifiable: …` means the evidence
to decide was missing: never a pass (`--chaos-unverifiable fail`, the default, fails the test).
What each verdict checks: [../verdicts.md](../verdicts.md); which test covers each diagnosis:
[../testing.md](../testing.md#diagnoses).
"""


def render() -> str:
    return header("Diagnoses", "`chaos/verify.py` (`DIAGNOSES`)", INTRO) + "".join(
        f"- {code(d)}\n" for d in verify.DIAGNOSES)
