"""What a suite reads of an experiment's outcome."""

import pytest


def test_a_verdict_asked_for_and_absent_names_the_verdicts_there_are():
    from chaos.experiment import Outcome
    from chaos.verdicts import Verdict

    outcome = Outcome("t", None, [Verdict("resumed-from-latest (run)", "unverifiable", "no checkpoint", None, {})],
                      [], None)
    assert outcome.verdict("resumed-from-latest (run)").status == "unverifiable"
    with pytest.raises(LookupError, match=r"no verdict 'resumed-from-latest \(attempt 1\)' among: .*no checkpoint"):
        outcome.verdict("resumed-from-latest (attempt 1)")
