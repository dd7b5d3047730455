"""``-m`` read as pytest reads it: chaos (and soak) tests run only when the marker expression
asks for them, never because their name occurs in it as text."""

import pytest

from chaos.pytest_plugin import asks_for


@pytest.mark.parametrize("expr", ["chaos", "chaos and not extended", "chaos or integration", "(chaos)",
                                  "chaos or soak or not (chaos or soak)"])
def test_an_expression_that_asks_for_chaos_selects_it(expr):
    assert asks_for(expr, "chaos")


@pytest.mark.parametrize("expr", ["not nochaos", "not chaos", "nochaos", "integration", "", None,
                                  "chaos_like", "not integration", "not extended or integration"])
def test_an_expression_that_does_not_ask_for_chaos_leaves_it_out(expr):
    assert not asks_for(expr, "chaos")


def test_soak_is_read_the_same_way():
    assert asks_for("soak", "soak") and not asks_for("chaos", "soak") and not asks_for("not soak", "soak")


def test_pytest_expression_module_is_what_asks_for_relies_on():
    """Fails loudly when pytest changes its private marker-expression module (asks_for uses it)."""
    from _pytest.mark.expression import Expression

    from chaos.pytest_plugin import _MARK_NAME

    assert _MARK_NAME.findall("(chaos and not my.mark-x) or gpu[1]") == ["chaos", "and", "not", "my.mark-x", "or",
                                                                        "gpu[1]"]
    compiled = Expression.compile("chaos and not extended")
    assert compiled.evaluate(lambda name, /, **kwargs: name == "chaos") is True
    assert compiled.evaluate(lambda name, /, **kwargs: name in ("chaos", "extended")) is False


def test_a_malformed_expression_is_pytest_s_own_error():
    with pytest.raises(Exception, match="expected"):
        asks_for("chaos and", "chaos")


def test_an_expression_that_needs_another_mark_too_asks_for_the_tests_carrying_both():
    """-m "chaos and extended" (make integration-suites) selected nothing: the expression was
    evaluated for a test carrying chaos alone, so no extended suite ever ran."""
    suites = [{"chaos"}, {"chaos", "extended"}, {"chaos", "soak"}]
    assert asks_for("chaos and extended", "chaos", suites)
    assert not asks_for("chaos and extended", "chaos", [{"chaos"}])  # the twin: none carries both
    assert asks_for("chaos and not extended", "chaos", suites)
    assert not asks_for("not chaos", "chaos", suites) and not asks_for("not nochaos", "chaos", suites)


def test_make_integration_suites_marker_collects_the_extended_suites():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = {}
    for expr in ("chaos and extended", "chaos and not extended"):
        done = subprocess.run([sys.executable, "-m", "pytest", "-m", expr, "suites", "--collect-only", "-q",
                               "-p", "no:cacheprovider"], cwd=root, capture_output=True, text=True, timeout=120)
        out[expr] = [line for line in done.stdout.splitlines() if "::" in line]
    assert out["chaos and extended"] and out["chaos and not extended"], out
    assert not set(out["chaos and extended"]) & set(out["chaos and not extended"])
