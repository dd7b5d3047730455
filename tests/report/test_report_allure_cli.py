"""`ray-chaos report` outside a checkout: the pinned Allure CLI is found in the user's cache, or
installed there with npm after saying so; without npm the error says what to install.  npm is
a stand-in here (it links the checkout's node_modules, or fails as an unreachable registry
does): this tier reaches no registry."""

import json
import stat
from pathlib import Path

import pytest

from chaos import allure_site, cli
from chaos.errors import ChaosError

FAKE_NPM = """#!/bin/sh
# npm install --prefix DIR ... allure@VERSION, as the real one lays it out (node_modules linked)
echo "$@" >> "{log}"
[ -n "{fail}" ] && {{ echo "npm error code ENOTFOUND registry.npmjs.org" >&2; exit 1; }}
while [ "$1" != "--prefix" ]; do shift; done
/bin/ln -s "{node_modules}" "$2/node_modules"
"""


def tool_dir(tmp_path, node_modules: Path | None, fail: bool = False) -> Path:
    """A PATH directory with node, and an npm stand-in unless ``node_modules`` is None."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "node").symlink_to(allure_site.shutil.which("node"))
    if node_modules is not None:
        npm = bin_dir / "npm"
        npm.write_text(FAKE_NPM.format(log=tmp_path / "npm.log", fail="1" if fail else "", node_modules=node_modules))
        npm.chmod(npm.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.fixture
def elsewhere(tmp_path, monkeypatch, allure_installed):
    """A machine where the harness is installed, not cloned: no checkout, an empty cache; the
    checkout's node_modules (what the npm stand-in links)."""
    node_modules = Path(allure_site.allure_cli()[1]).parents[1]
    monkeypatch.setattr(allure_site, "CHECKOUT", tmp_path / "no-checkout")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return node_modules


def test_report_installs_the_pin_into_the_cache_then_finds_it_there(elsewhere, tmp_path, monkeypatch, capsys,
                                                                     allure_results):
    monkeypatch.setenv("PATH", str(tool_dir(tmp_path, elsewhere)))
    with pytest.raises(allure_site.AllureMissing):
        allure_site.allure_cli()
    assert cli.main(["report", "--results", str(allure_results), "--report", str(tmp_path / "report"),
                     "--history", str(tmp_path / "history.jsonl")]) == 0
    out, err = capsys.readouterr()
    cache = tmp_path / "cache" / "ray-chaos" / "allure" / allure_site.ALLURE_VERSION
    assert f"installing the Allure CLI once (npm install allure@{allure_site.ALLURE_VERSION} into {cache})" in err
    assert (tmp_path / "report" / "index.html").is_file() and "report: " in out
    [install] = (tmp_path / "npm.log").read_text().splitlines()
    assert install.startswith("install --prefix ") and install.endswith(f" allure@{allure_site.ALLURE_VERSION}")
    assert allure_site.allure_cli() == ["node", str(cache / "node_modules" / "allure" / "cli.js")]
    assert [p.name for p in cache.parent.iterdir()] == [allure_site.ALLURE_VERSION]  # no staging left


def test_a_failed_install_says_npms_error_and_leaves_no_cache(elsewhere, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tool_dir(tmp_path, elsewhere, fail=True)))
    with pytest.raises(ChaosError, match=r"npm install allure@3.18.0 failed \(exit 1.*\n.*ENOTFOUND"):
        allure_site.install_allure_cli(say=lambda line: None)
    assert not any((tmp_path / "cache" / "ray-chaos" / "allure").iterdir())


def test_without_npm_the_error_says_what_to_install(elsewhere, tmp_path, monkeypatch, capsys, allure_results):
    monkeypatch.setenv("PATH", str(tool_dir(tmp_path, None)))
    assert cli.main(["report", "--results", str(allure_results), "--report", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert "error: npm is not installed: the HTML report needs the Allure CLI (npm package allure@3.18.0)" in err
    assert "Node.js >= 20.19" in err


def test_the_pin_is_package_jsons():
    root = Path(allure_site.__file__).resolve().parents[1]
    pinned = json.loads((root / "package.json").read_text())["devDependencies"]["allure"]
    assert pinned == allure_site.ALLURE_VERSION, "package.json and chaos.allure_site.ALLURE_VERSION must agree"


def test_report_answers_help(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["report", "--help"])
    assert done.value.code == 0
    help_text = capsys.readouterr().out
    assert all(option in help_text for option in ("--results", "--report", "--history", "--summary"))
