"""``chaos.workload(**params)`` sets up the reference workload; a session that runs the user's own
script (``--chaos-workload``, a profile's ``workload.entrypoint``) cannot honour them, so they fail
the test naming them instead of being dropped."""

import types

import pytest

from chaos.profile import profile_from_dict
from chaos.pytest_plugin import Chaos

PROFILE = {"name": "staging", "ray": {"dashboard_url": "http://10.0.0.1:8265", "gcs_address": "10.0.0.1:6379"},
           "storage": {"path": "/mnt/shared/chaos"}}


def chaos_with(workload=None, profile_workload=None) -> Chaos:
    options = {"chaos_workload": workload, "chaos_workload_dir": "/tmp", "chaos_step_metric": "auto",
               "chaos_state_metric": "auto", "chaos_deterministic": False, "chaos_seed": 0}
    profile = None
    if profile_workload is not None:
        profile = profile_from_dict({**PROFILE, "workload": profile_workload})
    backend = types.SimpleNamespace(profile=profile, python="/usr/bin/python3", storage_path="/mnt/shared/chaos")
    request = types.SimpleNamespace(config=types.SimpleNamespace(getoption=options.__getitem__),
                                    node=types.SimpleNamespace(name="test_x"))
    return Chaos(types.SimpleNamespace(backend=backend), request)


@pytest.mark.parametrize("session, source", [
    (dict(workload="python my_train.py"), "--chaos-workload"),
    (dict(profile_workload={"entrypoint": "python train.py"}), "the profile's workload.entrypoint"),
])
def test_params_with_the_users_own_script_fail_naming_them(session, source):
    chaos = chaos_with(**session)
    assert chaos.user_workload
    with pytest.raises(pytest.fail.Exception) as failed:
        chaos.workload(num_workers=2, max_failures=0)
    message = str(failed.value)
    assert "chaos.workload(num_workers=2, max_failures=0)" in message and f"({source})" in message, message
    assert "Call chaos.workload() without arguments" in message


@pytest.mark.parametrize("session, entrypoint", [
    (dict(workload="python my_train.py"), "python my_train.py"),
    (dict(profile_workload={"entrypoint": "python train.py"}), "python train.py"),
])
def test_the_users_script_without_params_runs_as_it_is(session, entrypoint):
    spec = chaos_with(**session).workload()
    assert spec.user_workload and spec.entrypoint == entrypoint


@pytest.mark.parametrize("session", [dict(), dict(profile_workload={"reference": {}})])
def test_the_reference_workload_takes_the_params(session):
    chaos = chaos_with(**session)
    assert not chaos.user_workload
    spec = chaos.workload(num_workers=3, max_failures=0, steps=20)
    assert not spec.user_workload
    assert (spec.params["num_workers"], spec.params["max_failures"], spec.params["steps"]) == (3, 0, 20)


def test_a_profiles_reference_settings_reach_the_run_under_the_suites_own_arguments():
    """The profile's workload.reference (steps, step time, workers, budgets) was validated and then
    dropped: every run used reference_spec's defaults, whatever the profile said."""
    reference = {"steps": 12, "step_time": 0.1, "num_workers": [2, 3], "resize_interval_s": 5, "max_failures": 1}
    spec = chaos_with(profile_workload={"reference": reference}).workload()
    assert (spec.params["steps"], spec.params["step_time"], spec.params["num_workers"],
            spec.params["resize_interval"], spec.params["max_failures"]) == (12, 0.1, [2, 3], 5.0, 1), spec.params
    spec = chaos_with(profile_workload={"reference": reference}).workload(steps=40, max_failures=0)
    assert (spec.params["steps"], spec.params["max_failures"], spec.params["step_time"]) == (40, 0, 0.1), spec.params
    spec = chaos_with(profile_workload={"reference": {}}).workload()  # the twin: nothing set, the defaults
    assert (spec.params["steps"], spec.params["num_workers"]) == (30, 2), spec.params
