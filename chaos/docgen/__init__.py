"""Reference pages generated from the code (``python -m chaos.docgen``): the fault kinds,
the verdicts' diagnoses, the ``--chaos-*`` options, the ``ray-chaos`` command, every profile
field and the Python API, written to docs/reference/.  Hand-written tables drifted from the
code they described (a profile doc missing three sections the examples used); a generated
page cannot, and tests/unit/test_docgen.py fails when the committed pages differ from what
the code gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from chaos.docgen import api, cli, diagnoses, faults, options, profile

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "reference"
REGENERATE = "python -m chaos.docgen"

#: file name -> the function that renders it
PAGES: dict[str, Callable[[], str]] = {
    "fault-kinds.md": faults.render,
    "diagnoses.md": diagnoses.render,
    "options.md": options.render,
    "cli.md": cli.render,
    "profile.md": profile.render,
    "python-api.md": api.render,
}


def render_all() -> dict[str, str]:
    """Every page's text, keyed by its file name."""
    return {name: render() for name, render in PAGES.items()}


def stale(out: Path = OUT) -> list[str]:
    """The pages under ``out`` that differ from what the code gives now (missing ones too)."""
    return [name for name, text in render_all().items()
            if not (out / name).is_file() or (out / name).read_text() != text]


def write(out: Path = OUT) -> list[str]:
    """Write every page under ``out``; return the names of those that changed."""
    out.mkdir(parents=True, exist_ok=True)
    changed = stale(out)
    for name, text in render_all().items():
        if name in changed:
            (out / name).write_text(text)
    return changed
