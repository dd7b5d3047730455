"""Bad option values are refused at start with a usage error naming the option — before any
cluster starts (in-process: the refusal comes from the plugin's pytest_configure)."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, message", [
    (["--chaos-workers", "0"], "--chaos-workers=0: must be >= 1"),
    (["--chaos-node-recovery", "sometimes"], "invalid choice: 'sometimes'"),
    (["--chaos-raylet-kill", "pkill"], "invalid choice: 'pkill'"),
    (["--chaos-workload", " "], "--chaos-workload is empty"),
    (["--chaos-workload-dir", "/nonexistent/dir"], "--chaos-workload-dir /nonexistent/dir: not a directory"),
    (["--chaos-workload", "HF_TOKEN=hf_abc python train.py"], "--chaos-workload contains HF_TOKEN=…"),
    (["--chaos-workload", "python train.py --api-key abc"], "--chaos-workload contains --api-key …"),
    (["--chaos-unverifiable", "ignore"], "invalid choice: 'ignore'"),
    (["--chaos-stall-limit", "0"], "--chaos-stall-limit=0.0: must be >= 1"),
    (["--chaos-finish-timeout", "0"], "--chaos-finish-timeout=0.0: must be >= 1"),
    (["--chaos-step-metric", " , "], "--chaos-step-metric is empty"),
    (["--chaos-state-rtol", "inf"], "--chaos-state-rtol=inf: a relative tolerance is a finite number >= 0"),
    (["--chaos-state-rtol=-1e-3"], "--chaos-state-rtol=-0.001: a relative tolerance is a finite number >= 0"),
    (["--chaos-state-rtol", "nan"], "--chaos-state-rtol=nan: a relative tolerance is a finite number >= 0"),
])
def test_bad_option_values_are_clear_usage_errors(args, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = pytest.main(["-m", "chaos", "suites", "-p", "no:cacheprovider", *args])
    out = capsys.readouterr()
    assert code == 4, out.out + out.err
    assert message in out.out + out.err
