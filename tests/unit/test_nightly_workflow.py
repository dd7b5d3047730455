"""examples/github-actions/nightly-chaos.yml without a cluster: how its job ends when a step
fails (red, with the report, the artifacts and the sweep still run), that its secrets reach
the scripts only through env: and land where the example profile looks for them, and that it
installs the wheel as the README does.  Its scripts run against the foreign-cluster stand-in
in tests/integration/test_recipes.py."""

import copy
import re
import shlex
from pathlib import Path

import pytest
from actions_job import load, run_job, runs_now, steps, substitute
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "github-actions" / "nightly-chaos.yml"
VALUES = {"secrets.CHAOS_SSH_KEY": "key", "secrets.CHAOS_KNOWN_HOSTS": "hosts", "github.run_id": "1",
          "github.run_number": "1"}


def step_running(workflow: dict, command: str) -> str:
    """The name of the one step whose script runs ``command``."""
    [name] = [s.name for s in steps(workflow, "chaos") if s.run and re.search(rf"^\s*{command}\b", s.run, re.M)]
    return name


def outcome(workflow: dict, failing: str | None = None):
    """The job's run with every step succeeding but the one named ``failing``."""
    return run_job(workflow, "chaos", VALUES, {},
                   lambda step, script, env: (1 if step.name == failing else 0, ""))


def test_every_step_runs_and_the_job_is_green_when_nothing_fails():
    result = outcome(load(WORKFLOW))
    assert result.conclusion == "success"
    assert all(r.outcome == "success" for r in result.ran), [(r.step.name, r.outcome) for r in result.ran]


@pytest.mark.parametrize("command", ["ray-chaos run", "ray-chaos doctor"])
def test_a_failed_chaos_step_or_preflight_turns_the_job_red_and_the_report_artifacts_and_sweep_still_run(command):
    workflow = load(WORKFLOW)
    failing = step_running(workflow, command)
    result = outcome(workflow, failing)
    assert result.conclusion == "failure"
    for after in ("ray-chaos report", "ray-chaos sweep"):
        assert result.of(step_running(workflow, after)).outcome == "success", after
    uploads = [r for r in result.ran if (r.step.uses or "").startswith("actions/upload-artifact@")]
    assert uploads and all(r.outcome == "success" for r in uploads)
    assert result.of(step_running(workflow, "rm -f")).outcome == "success"  # the key goes on every path


def test_continue_on_error_on_the_chaos_step_would_hide_a_failure():
    """The twin of the test above: the old recipe's continue-on-error makes the same failure green."""
    workflow = copy.deepcopy(load(WORKFLOW))
    chaos = step_running(workflow, "ray-chaos run")
    [spec] = [s for s in workflow["jobs"]["chaos"]["steps"] if s.get("name") == chaos]
    spec["continue-on-error"] = True
    assert outcome(workflow, chaos).conclusion == "success"
    assert not any(s.continue_on_error for s in steps(load(WORKFLOW), "chaos"))


def test_secrets_reach_the_scripts_only_through_env_and_are_written_0600_where_the_example_profile_looks():
    workflow = load(WORKFLOW)
    for step in steps(workflow, "chaos"):
        assert "${{" not in (step.run or ""), f"{step.name}: an expression in a script is spliced into it as code"
    [writer] = [s for s in steps(workflow, "chaos") if any("secrets." in v for v in s.env.values())]
    assert {substitute(v, VALUES) for v in writer.env.values()} == {"key", "hosts"}
    ssh = YAML(typ="safe").load((ROOT / "examples" / "profiles" / "vm-ssh.yaml").read_text())["hosts"]["defaults"]["ssh"]
    script = writer.run or ""
    for path, secret in ((ssh["key_file"], "CHAOS_SSH_KEY"), (ssh["known_hosts"], "CHAOS_KNOWN_HOSTS")):
        assert re.search(rf'"\${secret}" > {re.escape(path)}$', script, re.M), (path, script)
        assert re.search(rf"^chmod 0600 .*{re.escape(path)}", script, re.M), (path, script)
    assert re.search(r"^umask 077$", script, re.M)  # never readable by others, not even for a moment


def test_it_installs_the_wheel_and_the_ray_the_harness_pins_as_the_readme_does():
    workflow = load(WORKFLOW)
    [install] = [s for s in steps(workflow, "chaos") if s.run and "pip install" in s.run]
    assert shlex.split(install.run) == ["python", "-m", "pip", "install", "$HARNESS", "$RAY"]
    assert re.fullmatch(r"ci/ray_chaos_harness-[\d.]+-py3-none-any\.whl", workflow["env"]["HARNESS"])
    pinned = re.search(r"^ray==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)[1]
    assert workflow["env"]["RAY"] == f"ray[train,default]=={pinned}"
    readme = (ROOT / "README.md").read_text()
    assert re.search(rf'^pip install ray_chaos_harness-\S+\.whl "ray\[train,default\]=={re.escape(pinned)}"$',
                     readme, re.M)


def test_the_runner_refuses_what_it_does_not_emulate():
    with pytest.raises(KeyError, match="secrets.OTHER"):
        substitute("${{ secrets.OTHER }}", VALUES)
    assert substitute("a ${{ secrets.CHAOS_SSH_KEY }} b", VALUES) == "a key b"
    with pytest.raises(ValueError, match="not emulated"):
        runs_now("github.event_name == 'schedule'", failed=False)
    assert [runs_now(c, failed) for c in ("", "always()", "${{ always() }}", "failure()") for failed in (False, True)] \
        == [True, False, True, True, True, True, False, True]
    with pytest.raises(ValueError, match="shell"):
        steps({"jobs": {"j": {"steps": [{"run": "true", "shell": "python"}]}}}, "j")
