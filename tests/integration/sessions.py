"""What every integration test that runs a chaos session in a subprocess checks afterwards,
and the contract fixture it leaves (tests/contract) under make integration."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contract"))

import tapes  # noqa: E402  (tests/contract/tapes.py)


def assert_nothing_left(session_pid):
    """No process of that pytest session's cluster (Ray temp dir /tmp/rc-<pid>) may survive it."""
    marker = f"/tmp/rc-{session_pid}/"
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace"):
                left.append(cmdline.parent.name)
        except OSError:
            continue
    assert not left, f"processes of the embedded cluster left behind: {left}"


def record_contract(name, reports, command):
    """Under make integration (CHAOS_CONTRACT_DIR set), the session's taped run becomes
    tests/contract/fixtures/<name>.json (a session that never started a run has none: ``name`` None)."""
    if name is None:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    tapes.record(name, Path(reports), command, recorded_by=f"make integration: {test}")
