"""`python -m chaos.embedded up`'s refusals, before any supervisor starts (no cluster here)."""

import pytest

from chaos.embedded.__main__ import main


@pytest.mark.parametrize("argv, said", [
    (["--kubernetes", "--foreign"], "--kubernetes and --foreign: one kind of cluster at a time"),
    (["--foreign", "--hosts", "plain"], "--foreign: --hosts do not apply (its machines are always test hosts; "
                                        "each node's service restarts its Ray)"),
    (["--kubernetes", "--recovery-delay", "1"], "--kubernetes: --recovery-delay do not apply (its nodes are always "
                                                "test hosts"),
    (["--foreign", "--workers", "0"], "a foreign cluster needs at least 1 worker, got workers=0"),
])
def test_up_refuses_what_cannot_work_naming_it(argv, said, capsys, tmp_path):
    assert main(["up", "--dir", str(tmp_path), *argv]) == 2
    assert said in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing started, nothing written
