"""Every `ray-chaos` subcommand answers --help: exit 0 and its usage printed."""

import argparse

import pytest

from chaos import cli


def subcommands() -> list[str]:
    [action] = [a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return list(action.choices)


def test_the_parser_has_the_subcommands_the_docs_name():
    assert {"run", "report", "doctor", "ledger", "sweep", "project"} <= set(subcommands())


@pytest.mark.parametrize("command", subcommands())
def test_every_subcommand_answers_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: ray-chaos {command}")
