"""The recipes as a team copies them, their commands taken from the files and run against the
foreign-cluster stand-in (chaos/embedded/foreign.py) by a runner outside it, from a directory
of the team's:

* examples/github-actions/nightly-chaos.yml: its job's steps in order as GitHub runs them
  (tests/actions_job.py: ``bash -e``, ``if: always()``, the job's conclusion), the secrets the
  stand-in's SSH key and known_hosts, ``staging.yaml`` the stand-in's profile with the login
  (ubuntu, sudo) and key paths of examples/profiles/vm-ssh.yaml (the profile a team starts from);
* examples/kubernetes/chaos-cronjob.yaml: its container's command, args and env as its pod
  would run them (tests/pod_script.py), its volumes directories of the test's, its profile the
  stand-in's (an SSH profile where the ConfigMap's reaches KubeRay: the Kubernetes API is what
  the stand-in does not have).

What stands in, and only that (SUBSTITUTED): the install step is not run, the development
venv on PATH stands for it (tests/wheel installs the wheel as that step does; here it would
add minutes for nothing the step's own line does not show); the ``uses:`` steps are not run,
an upload or cache save stands as "every path it names exists"; the standard suites are one
(``PYTEST_ADDOPTS``, as tests/integration/test_doc_commands.py does: every suite would take an hour).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest
from actions_job import load, run_job
from pod_script import command_line, cronjob_container, environment
from ruamel.yaml import YAML
from test_doc_commands import ONE_SUITE, SIGKILL

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "github-actions" / "nightly-chaos.yml"
CRONJOB = ROOT / "examples" / "kubernetes" / "chaos-cronjob.yaml"
EXAMPLE_SSH = YAML(typ="safe").load((ROOT / "examples" / "profiles" / "vm-ssh.yaml").read_text())["hosts"]["defaults"]["ssh"]
SUBSTITUTED = {
    "install": "not run: the development venv on PATH stands for the installed wheel (tests/wheel installs it)",
    "uses": "not run: an upload or cache save stands as 'every path it names exists'",
    "suites": f"PYTEST_ADDOPTS={ONE_SUITE} {SIGKILL}",
}
STEP_TIMEOUT_S = 1200


def runner_env(home: Path) -> dict[str, str]:
    """A runner's environment: this venv's commands (for the install step), its own HOME, one suite."""
    return {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "PYTEST_ADDOPTS": SUBSTITUTED["suites"].split("=", 1)[1],
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}


def one_passed_raylet_kill(results: Path) -> None:
    found = [json.loads(p.read_text()) for p in results.glob("*-result.json")]
    assert [(r["fullName"].rsplit("#", 1)[-1], r["status"]) for r in found] == \
        [("test_raylet_kill_with_spare_capacity", "passed")], [(r.get("fullName"), r.get("status")) for r in found]


def test_the_nightly_workflow_runs_as_copied(foreign_standin, tmp_path):
    from chaos.embedded.foreign import wait_healthy
    from chaos.profile import dump_profile

    net = foreign_standin.network
    home, work, scripts = tmp_path / "home", tmp_path / "team-repo", tmp_path / "steps"
    for d in (home, work, scripts):
        d.mkdir()
    # as the example a team starts from logs in: its user, root's rights through sudo, its key paths
    profile = foreign_standin.profile(user=EXAMPLE_SSH["user"], become=EXAMPLE_SSH["become"])
    profile["hosts"]["defaults"]["ssh"].update(key_file=EXAMPLE_SSH["key_file"], known_hosts=EXAMPLE_SSH["known_hosts"])
    dump_profile(profile, work / "staging.yaml")
    values = {"secrets.CHAOS_SSH_KEY": net.ssh_key_path.read_text(),
              "secrets.CHAOS_KNOWN_HOSTS": net.known_hosts_path.read_text(),
              "github.run_id": "1", "github.run_number": "1", "runner.temp": str(tmp_path)}
    base = {**runner_env(home), "CI": "true", "GITHUB_WORKSPACE": str(work), "RUNNER_TEMP": str(tmp_path)}
    key, known_hosts = (Path(p.replace("~", str(home), 1)) for p in (EXAMPLE_SSH["key_file"], EXAMPLE_SSH["known_hosts"]))
    modes: dict[Path, int] = {}

    def execute(step, script, env):
        if script is None:
            paths = [p for p in str((step.spec.get("with") or {}).get("path", "")).split() if p]
            if step.uses.startswith(("actions/upload-artifact@", "actions/cache/save@")):
                missing = [p for p in paths if not (work / p).exists()]
                return (1 if missing else 0), f"{SUBSTITUTED['uses']}; missing: {missing}"
            return 0, SUBSTITUTED["uses"]
        if "pip install" in script:
            return 0, SUBSTITUTED["install"]
        path = scripts / f"{step.index:02d}.sh"
        path.write_text(script)
        code, out = foreign_standin.run_outside(f"bash -e {path} 2>&1", work, timeout=STEP_TIMEOUT_S, env=env)
        modes.update({p: stat.S_IMODE(p.stat().st_mode) for p in (key, known_hosts) if p.exists() and p not in modes})
        print(f"$ {step.name}\n{out[-3000:]}", file=sys.stderr)
        return code, out

    wait_healthy(foreign_standin, timeout=180)
    result = run_job(load(WORKFLOW), "chaos", values, base, execute)
    assert result.conclusion == "success", result.transcript()
    assert all(r.outcome == "success" for r in result.ran), result.transcript()
    outputs = {r.step.run.split()[1]: r.output for r in result.ran if (r.step.run or "").startswith("ray-chaos ")}
    assert set(outputs) == {"doctor", "run", "report", "sweep"}, sorted(outputs)
    assert re.search(r"^PASSED \S+::test_raylet_kill_with_spare_capacity$", outputs["run"], re.M), outputs["run"][-6000:]
    one_passed_raylet_kill(work / "reports" / "allure-results")
    assert (work / "reports" / "allure-report" / "index.html").is_file(), outputs["report"][-3000:]
    assert (work / "reports" / "history.jsonl").is_file() and (work / "reports" / "summary.json").is_file()
    assert "nothing left armed" in outputs["sweep"], outputs["sweep"][-3000:]
    assert modes == {key: 0o600, known_hosts: 0o600}, modes
    assert not key.exists() and known_hosts.exists()  # the last step removed the key


def test_the_cronjobs_container_runs_as_its_pod_would(foreign_standin, tmp_path):
    from chaos.embedded.foreign import wait_healthy
    from chaos.profile import dump_profile

    container = cronjob_container(CRONJOB)
    volumes, workdir = tmp_path / "volumes", tmp_path / "workdir"
    dirs = {m["mountPath"]: volumes / m["name"] for m in container["volumeMounts"]}
    dirs[container["workingDir"]] = workdir
    for d in dirs.values():
        d.mkdir(parents=True)
    dump_profile(foreign_standin.profile(), volumes / "profile" / "profile.yaml")  # the ConfigMap's key
    env = {**environment(container), **runner_env(tmp_path)}
    wait_healthy(foreign_standin, timeout=180)
    code, out = foreign_standin.run_outside(f"{command_line(container, dirs)} 2>&1", workdir,
                                            timeout=STEP_TIMEOUT_S, env=env)
    print(out[-6000:], file=sys.stderr)
    assert code == 0, out[-8000:]
    night = Path(re.search(r"^results: (\S+)$", out, re.M)[1])
    assert night.parent == volumes / "results", night
    one_passed_raylet_kill(night / "allure-results")
    assert (night / "summary.json").is_file() and (night / "ledger.jsonl").is_file(), sorted(night.iterdir())
    assert "nothing left armed" in out, out[-3000:]
