"""A chaos session as a user runs it — its own pytest process — against the shared stand-in
cluster (conftest.py), what every such test checks afterwards, and the contract fixture it
leaves (tests/contract) under make integration."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contract"))

import tapes  # noqa: E402  (tests/contract/tapes.py)

from chaos.ledger import Ledger  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "examples" / "workloads"
RAYLET_KILL = "suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity"


def run_session(profile, reports, workload, *extra, tape, timeout=900, env=None):
    """The raylet-kill suite (fault after checkpoint 2) with ``workload`` through ``profile``
    (None: on its own embedded cluster, which must leave no process behind): exit code and
    output.  A session past ``timeout`` gets SIGTERM (it reverts its faults on the way out) and
    fails the test; every fault it injected must be reverted either way.  ``env``: added to
    the session's environment (e.g. the S3 credentials a profile names)."""
    cluster = ["--chaos-profile", str(profile)] if profile else []
    cmd = [sys.executable, "-m", "pytest", "-m", "chaos", RAYLET_KILL, "-p", "no:cacheprovider", "-q", "-s",
           *cluster, "--chaos-workload", workload, "--chaos-workload-dir", str(WORKLOADS),
           "--chaos-reports", str(reports), "--chaos-tape", *extra]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, **(env or {})})
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # it did not get out within 2 minutes: the ledger says what is left
            p.kill()
            out, _ = p.communicate()
        pytest.fail(f"{workload}: the chaos session ran past {timeout} s\n{out[-4000:]}")
    finally:
        assert_reverted(Path(reports) / "ledger.jsonl")
        if not profile:
            assert_nothing_left(p.pid)
    print("".join(line for line in out.splitlines(keepends=True) if re.match(r"\[chaos [\d:]+\] (\[|[✓✗▶])", line)))
    record_contract(tape, reports, cmd)
    return p.returncode, out


def assert_reverted(ledger):
    """Nothing the session injected is left on the shared cluster."""
    entries = Ledger(ledger).entries().values() if ledger.exists() else []
    left = [e for e in entries if e["state"] not in ("reverted", "nothing-to-revert")]
    assert not left, f"faults left on the cluster: {left}"


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


def record_contract(name, reports, command, test=""):
    """Under make integration (CHAOS_CONTRACT_DIR set), the session's taped run (of suite test
    ``test``, when it ran several) becomes tests/contract/fixtures/<name>.json (a session that
    never started a run has none: ``name`` None)."""
    if name is None or not os.environ.get("CHAOS_CONTRACT_DIR"):
        return
    current = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    tapes.record(name, tapes.run_dir(Path(reports), test), command, recorded_by=f"make integration: {current}")
