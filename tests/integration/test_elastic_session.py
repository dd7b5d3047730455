"""The per-commit elastic suite in a chaos session of its own, on an embedded cluster of its own
(the suite sets that cluster's node recovery delay, which the shared stand-in's profile cannot),
taped: under make integration its run becomes the contract fixture
``elastic_shrinks_and_grows_back`` (tests/contract), a real 3 -> 2 -> 3 run that the verdicts
are replayed against."""

import subprocess
import sys

import pytest

from sessions import ROOT, assert_nothing_left, assert_reverted, record_contract

SUITE_TEST = "suites/test_elastic.py::test_an_elastic_run_goes_on_without_the_lost_node_and_grows_back"
TIMEOUT_S = 900  # ~3.5 min alone on 2 cores: the cluster's start, three worker groups, the node's return


@pytest.mark.integration
def test_an_elastic_run_that_shrinks_and_grows_back_passes_and_is_taped(tmp_path):
    reports = tmp_path / "reports"
    cmd = [sys.executable, "-m", "pytest", "-m", "chaos", SUITE_TEST, "-p", "no:cacheprovider", "-q", "-s", "-rA",
           "--chaos-reports", str(reports), "--chaos-tape"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.terminate()  # the session reverts its fault and stops its cluster on the way out
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # not out within 2 minutes: the ledger says what is left
            p.kill()
            out, _ = p.communicate()
        pytest.fail(f"the elastic session ran past {TIMEOUT_S} s:\n{out[-6000:]}")
    finally:
        assert_reverted(reports / "ledger.jsonl")
        assert_nothing_left(p.pid)
    assert p.returncode == 0 and "1 passed" in out, out[-8000:]
    record_contract("elastic_shrinks_and_grows_back", reports, cmd)
