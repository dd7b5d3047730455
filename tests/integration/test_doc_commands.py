"""Every command in the README and docs/ that targets a profile, taken from the pages
themselves and run as written — by a runner outside a cluster the harness did not start (the
foreign-cluster stand-in, chaos/embedded/foreign.py), in the order the pages give them, from a
directory of the team's — so a documented command that stopped working fails here, not in a
team's first night. The other commands of the same blocks (`ray-chaos report`) run too.

What stands in, and only that: `staging.yaml` is the stand-in's profile; `my_suite.py` is the
README's example suite; a command that runs the standard suites runs one of them
(``PYTEST_ADDOPTS=-k ...``: every suite would take an hour), and every session kills raylets by
SIGKILL (``--chaos-raylet-kill sigkill``; ``-rA`` to list what passed: the stand-in's nodes run Ray under a service manager,
as docs/profiles.md says to do there).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from chaos.docgen.markdown import fenced_blocks

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.parent.name != "reference")]
PROFILE_ARG = re.compile(r"--(?:chaos-)?profile(?:\s+|=)\S+\.ya?ml")
ONE_SUITE = "-k test_raylet_kill_with_spare_capacity"
SIGKILL = "--chaos-raylet-kill sigkill -rA"


def documented_commands() -> list[str]:
    """The distinct `ray-chaos`/`pytest` commands of every shell block that names a profile,
    comments cut, in the order the pages give them."""
    seen: dict[str, None] = {}
    for page in PAGES:
        for info, block in fenced_blocks(page.read_text()):
            if info not in ("", "sh", "bash", "console") or not PROFILE_ARG.search(block):
                continue
            for line in block.splitlines():
                command = " ".join(re.sub(r"\s+#.*$", "", line).split())
                if command.split(" ", 1)[0] in ("ray-chaos", "pytest"):
                    seen.setdefault(command, None)
    return list(seen)


def readme_example() -> str:
    """The README's first Python block: a suite, as a team would save it."""
    return next(body for info, body in fenced_blocks((ROOT / "README.md").read_text()) if info == "python")


def addopts(command: str) -> str:
    """What a session of ``command`` gets through PYTEST_ADDOPTS ('' for no session)."""
    words = shlex.split(command)
    if words[:2] == ["ray-chaos", "run"]:
        return f"{ONE_SUITE} {SIGKILL}"
    return SIGKILL if words[0] == "pytest" else ""


def team_directory(work: Path, profile: dict) -> None:
    """``staging.yaml`` and ``my_suite.py``, the names the pages use."""
    from chaos.profile import dump_profile, profile_from_dict

    dump_profile(profile_from_dict(profile), work / "staging.yaml")
    (work / "my_suite.py").write_text(readme_example())


def test_the_pages_document_what_this_test_runs():
    commands = documented_commands()
    assert any("--chaos-dry-run" in c for c in commands), commands
    assert any(c.startswith("ray-chaos sweep") for c in commands), commands
    assert any(c.startswith("ray-chaos doctor") for c in commands), commands
    assert any(c.startswith("pytest") and "my_suite.py" in c for c in commands), commands
    assert any(c.startswith("ray-chaos run") and "--chaos-dry-run" not in c for c in commands), commands
    assert "def test_" in readme_example()


def test_every_documented_profile_command_works_against_the_stand_in(foreign_standin, tmp_path):
    from chaos.embedded.foreign import wait_healthy

    work = tmp_path / "work"
    work.mkdir()
    team_directory(work, foreign_standin.profile())
    env = {"HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}
    for command in documented_commands():
        wait_healthy(foreign_standin, timeout=180)
        code, out = foreign_standin.run_outside(f"{command} 2>&1", work, timeout=900,
                                                env={**env, "PYTEST_ADDOPTS": addopts(command)})
        print(f"$ {command}\n{out[-3000:]}", file=sys.stderr)
        assert code == 0, f"{command}\nexit {code}:\n{out[-6000:]}"
        _assert_it_did_its_work(command, out, work)


def _assert_it_did_its_work(command: str, out: str, work: Path) -> None:
    if command.startswith("ray-chaos doctor"):
        assert "✗" not in out and re.search(r"^doctor: all \d+ checks passed$", out, re.M), out[-3000:]
    elif command.startswith("ray-chaos sweep"):
        assert "nothing left armed" in out, out[-3000:]
    elif "--chaos-dry-run" in command:
        assert "DRY RUN plan of" in out and "eligible now (3): " in out and re.search(r"\b1 skipped\b", out), \
            out[-6000:]
    elif command.startswith("ray-chaos run"):
        assert re.search(r"^PASSED \S+::test_raylet_kill_with_spare_capacity$", out, re.M), out[-6000:]
    elif command.startswith("pytest"):
        assert re.search(r"^PASSED my_suite.py::test_\w+$", out, re.M), out[-6000:]
    elif command.startswith("ray-chaos report"):
        assert (work / "reports" / "allure-report" / "index.html").is_file(), out[-3000:]
