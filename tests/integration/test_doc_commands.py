"""Every command in the README and docs/ that targets a profile, taken from the pages
themselves and run as a team would run it — by a runner outside a cluster the harness did not
start (the foreign-cluster stand-in, chaos/embedded/foreign.py), in the order the pages give
them — so a documented command that stopped working fails here, not in a team's first night.

What the test changes in a command, and only that: the profile's path is the stand-in's; the
reports go to a directory of the test's; a command that runs suites runs one of them
(``-k``: every suite would take an hour) with ``--chaos-raylet-kill sigkill`` (the stand-in's
nodes run Ray under a service manager: docs/embedded-cluster.md).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.parent.name != "reference")]
SHELL_BLOCK = re.compile(r"^```(?:sh|bash|console)?\n(.*?)^```", re.M | re.S)
PROFILE_ARG = re.compile(r"(--(?:chaos-)?profile)(?:\s+|=)(\S+\.ya?ml)")
ONE_SUITE = "test_raylet_kill_with_spare_capacity"


def documented_commands() -> list[str]:
    """Each distinct command of the pages' shell blocks that names a profile, comments cut,
    in the order the pages give them."""
    seen: dict[str, None] = {}
    for page in PAGES:
        for block in SHELL_BLOCK.findall(page.read_text()):
            for line in block.splitlines():
                command = re.sub(r"\s+#.*$", "", line).strip()
                if PROFILE_ARG.search(command):
                    seen.setdefault(" ".join(command.split()), None)
    return list(seen)


def as_run_here(command: str, profile: Path, reports: Path) -> str:
    """``command`` against the stand-in: its profile, the test's reports, one suite."""
    command = PROFILE_ARG.sub(lambda m: f"{m[1]} {shlex.quote(str(profile))}", command)
    words = shlex.split(command)
    if "sweep" in words:
        return f"{command} --ledger {shlex.quote(str(reports / 'ledger.jsonl'))}"
    if Path(words[0]).name == "pytest" or (Path(words[0]).name == "ray-chaos" and words[1:2] == ["run"]):
        return (f"{command} -k {ONE_SUITE} --chaos-raylet-kill sigkill -p no:cacheprovider -rA "
                f"--chaos-reports {shlex.quote(str(reports))}")
    return command


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """The stand-in (3 workers) and its profile."""
    from chaos.embedded.foreign import ForeignCluster, ForeignConfig
    from chaos.embedded.testhost import testhosts_supported
    from chaos.profile import dump_profile

    supported, why = testhosts_supported()
    if not supported:
        pytest.skip(f"the foreign-cluster stand-in's machines are test hosts, which are not possible here: {why}")
    base = tmp_path_factory.mktemp("doc-commands")
    cluster = ForeignCluster(ForeignConfig(workers=3, base_dir=base / "cluster")).up()
    try:
        profile = base / "staging.yaml"
        dump_profile(cluster.profile(), profile)
        yield cluster, profile, base
    finally:
        cluster.down()


def test_the_pages_document_the_profile_commands_this_test_runs():
    commands = documented_commands()
    assert any("--chaos-dry-run" in c for c in commands), commands
    assert any("sweep" in c for c in commands), commands
    assert any("--chaos-dry-run" not in c and "sweep" not in c for c in commands), commands


def test_every_documented_profile_command_works_against_the_stand_in(foreign):
    from chaos.embedded.foreign import wait_healthy

    cluster, profile, base = foreign
    reports = base / "reports"
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    for command in documented_commands():
        wait_healthy(cluster, timeout=180)
        here = as_run_here(command, profile, reports)
        code, out = cluster.run_outside(here, ROOT, timeout=900, env=env)
        print(f"$ {here}\n{out[-3000:]}", file=sys.stderr)
        assert code == 0, f"{command}\nexit {code}:\n{out[-6000:]}"
        if "sweep" in command:
            assert "nothing left armed" in out, out[-3000:]
        elif "--chaos-dry-run" in command:
            assert "DRY RUN plan of" in out and "eligible now (3): " in out and re.search(r"\b1 skipped\b", out), \
                out[-6000:]
        else:
            assert re.search(rf"^PASSED \S+::{ONE_SUITE}$", out, re.M), out[-6000:]
