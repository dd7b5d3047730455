"""docs/reference/options.md: every option the pytest plugin adds, from its own
``pytest_addoption`` called with a parser that records what it is given."""

from __future__ import annotations

import dataclasses
from typing import Any

from chaos import pytest_plugin
from chaos.docgen.markdown import code, header, table

INTRO = """
The options the harness's pytest plugin adds (`pytest --help` lists them too). They go after
`pytest -m chaos …` or `ray-chaos run …`. Bad values are refused at start with a message
naming the option. With `--chaos-profile`, the SLOs come from the profile's `faults:`
([profile.md](profile.md)) and the fault catalog, not from `--chaos-slo-*`.
"""


@dataclasses.dataclass
class Option:
    names: tuple[str, ...]
    attrs: dict[str, Any]

    @property
    def usage(self) -> str:
        choices = self.attrs.get("choices")
        if self.attrs.get("action") in ("store_true", "store_false"):
            arg = ""
        elif choices:
            arg = " " + "|".join(map(str, choices))
        else:
            arg = " " + (self.attrs.get("metavar") or self.names[0].lstrip("-").split("-")[-1].upper())
        return ", ".join(self.names) + arg

    @property
    def default(self) -> str:
        if self.attrs.get("action") == "store_true":
            return "off"
        value = self.attrs.get("default")
        return "—" if value is None else code(value)


class RecordingParser:
    """Stands in for pytest's parser and option group: keeps every ``addoption`` call."""

    def __init__(self) -> None:
        self.options: list[Option] = []

    def getgroup(self, name: str, description: str = "", after: str | None = None) -> "RecordingParser":
        return self

    def addoption(self, *names: str, **attrs: Any) -> None:
        self.options.append(Option(names, attrs))

    def addini(self, *args: Any, **kwargs: Any) -> None:
        """Ini settings are not options: not listed."""


def plugin_options() -> list[Option]:
    parser = RecordingParser()
    pytest_plugin.pytest_addoption(parser)
    return parser.options


def render() -> str:
    rows = [(code(o.usage), o.default, o.attrs.get("help", "")) for o in plugin_options()]
    return (header("Command-line options", "`chaos/pytest_plugin.py` (`pytest_addoption`)", INTRO)
            + table(["option", "default", "what it does"], rows))
