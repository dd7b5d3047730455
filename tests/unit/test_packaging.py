"""What the wheel is made of, and `ray-chaos run`'s command line (the installed wheel itself is
tests/wheel/test_wheel.py's, under make chaos)."""

import subprocess
import sys
from pathlib import Path

import pytest
import setuptools
import tomllib

import chaos
from chaos import cli

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_of_the_tree_is_in_the_wheel():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    found = set(setuptools.find_packages(where=str(ROOT), include=["chaos*"]))
    assert found - listed == set(), f"add these to pyproject.toml's [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed - found - set(mapped) == set(), f"listed but not in the tree: {sorted(listed - found - set(mapped))}"
    assert all((ROOT / d).is_dir() for d in mapped.values()), mapped
    assert (ROOT / mapped["chaos.suites"] / "__init__.py").is_file()


def test_the_version_is_written_once():
    assert PYPROJECT["project"]["dynamic"] == ["version"] and "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "chaos.__version__"}
    assert chaos.__version__ and f"## [{chaos.__version__}]" in (ROOT / "CHANGELOG.md").read_text()


def test_version_option(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"ray-chaos {chaos.__version__}"


def test_licence_is_apache_2():
    assert PYPROJECT["project"]["license"] == "Apache-2.0" and PYPROJECT["project"]["license-files"] == ["LICENSE"]
    assert "Apache License\n                           Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()


@pytest.fixture
def suites(tmp_path) -> Path:
    d = tmp_path / "site" / "chaos" / "suites"
    d.mkdir(parents=True)
    for name in ("__init__.py", "test_raylet_kill.py", "test_ssh_faults.py"):
        (d / name).write_text("")
    return d


def test_run_defaults_to_every_suite_marked_chaos(suites, tmp_path):
    assert cli.pytest_args([], None, suites, tmp_path) == [
        "-m", "chaos", str(suites), "--alluredir", "reports/allure-results", f"--rootdir={suites}",
        "-o", f"cache_dir={tmp_path / '.pytest_cache'}"]


def test_run_resolves_suite_names_and_passes_the_rest(suites, tmp_path):
    (tmp_path / "test_ssh_faults.py").write_text("")  # the user's own file of that name wins
    args = cli.pytest_args(["test_raylet_kill.py::test_x", "-k", "spare", "test_ssh_faults.py", "mine.py", "-x"],
                           "staging.yaml", suites, tmp_path)
    assert args[:3] == ["-m", "chaos", str(suites / "test_raylet_kill.py::test_x")]
    assert args[3:8] == ["-k", "spare", "test_ssh_faults.py", "mine.py", "-x"]
    assert args[-4:-2] == ["--chaos-profile", "staging.yaml"]


def test_run_keeps_what_the_user_set(suites, tmp_path):
    args = cli.pytest_args(["-m", "chaos and not extended", "--alluredir=out", "--rootdir", str(tmp_path)], None,
                           suites, tmp_path)
    assert args.count("-m") == 1 and "--alluredir" not in args and not any(a.startswith("--rootdir=") for a in args)


def test_run_answers_help():
    proc = subprocess.run([sys.executable, "-m", "chaos.cli", "run", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "--profile PROFILE" in proc.stdout and "pytest -m chaos" in proc.stdout, proc.stderr


def test_run_collects_the_standard_suites_from_anywhere(tmp_path):
    """No Ray: ``--collect-only`` from a directory that is not the checkout."""
    proc = subprocess.run([sys.executable, "-m", "chaos.cli", "run", "--collect-only", "-q", "test_raylet_kill.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "test_raylet_kill.py::test_raylet_kill_with_spare_capacity" in proc.stdout.splitlines(), proc.stdout
    assert "ray-chaos run: -m pytest -m chaos" in proc.stderr
