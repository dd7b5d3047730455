"""docs/reference/cli.md: every ``ray-chaos`` subcommand's ``--help``, as the command prints it."""

from __future__ import annotations

import contextlib
import io
import os
import re

from chaos import cli
from chaos.docgen.markdown import header

INTRO = """
What `ray-chaos --help` and `ray-chaos <command> --help` print (at 100 columns).
"""
COLUMNS = "100"  # argparse wraps at the terminal's width: one width, one page


def help_text(*args: str) -> str:
    """What ``ray-chaos ARGS --help`` prints."""
    out = io.StringIO()
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = COLUMNS
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), \
                contextlib.suppress(SystemExit):
            cli.main([*args, "--help"])
    finally:
        if before is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = before
    return out.getvalue().rstrip() + "\n"


def subcommands() -> list[str]:
    """The subcommands the top-level help lists (``{run,report,...}``)."""
    found = re.search(r"\{([a-z,-]+)\}", help_text())
    if not found:
        raise ValueError(f"ray-chaos --help lists no subcommands:\n{help_text()}")
    return found[1].split(",")


def render() -> str:
    pages = [("ray-chaos", help_text())] + [(f"ray-chaos {c}", help_text(c)) for c in subcommands()]
    silent = [name for name, text in pages if not text.startswith("usage: ")]
    if silent:
        raise ValueError(f"{', '.join(silent)}: --help prints no usage; every subcommand must answer --help")
    return header("The `ray-chaos` command", "`chaos/cli.py`", INTRO) + "".join(
        f"## `{name}`\n\n```\n{text}```\n\n" for name, text in pages)
