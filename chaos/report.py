"""Allure glue: steps, attachments, labels, parameters — and a console echo of each.

Everything the experiment wants to show goes through here, so a run without Allure
(``allure-pytest`` not active) still prints its progress and verdicts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path

import allure

log = logging.getLogger("chaos")


class Reporter:
    def __init__(self, echo=print):
        self._echo = echo

    def say(self, text: str) -> None:
        self._echo(f"[chaos {time.strftime('%H:%M:%S')}] {text}")

    @contextlib.contextmanager
    def step(self, title: str):
        self.say(f"▶ {title}")
        t0 = time.monotonic()
        with allure.step(title):
            try:
                yield
            except BaseException as e:
                self.say(f"✗ {title} ({time.monotonic() - t0:.1f} s): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                raise
        self.say(f"✓ {title} ({time.monotonic() - t0:.1f} s)")

    def labels(self, fault_kind: str, backend: str, story: str) -> None:
        allure.dynamic.epic("Ray Train fault tolerance")
        allure.dynamic.feature(fault_kind)
        allure.dynamic.story(story)
        allure.dynamic.label("backend", backend)
        allure.dynamic.tag(fault_kind, backend)

    def parameter(self, name: str, value) -> None:
        allure.dynamic.parameter(name, value)

    def attach_json(self, name: str, data) -> None:
        allure.attach(json.dumps(data, indent=1, default=str), name=name, attachment_type=allure.attachment_type.JSON)

    def attach_text(self, name: str, text: str) -> None:
        allure.attach(text, name=name, attachment_type=allure.attachment_type.TEXT)

    def attach_file(self, name: str, path: Path, kind=None) -> None:
        if Path(path).exists():
            allure.attach.file(str(path), name=name, attachment_type=kind or allure.attachment_type.TEXT)

    def attach_png(self, name: str, path: Path) -> None:
        self.attach_file(name, path, allure.attachment_type.PNG)
