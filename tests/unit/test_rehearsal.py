"""A rehearsal (--chaos-rehearsal) runs the job up to every trigger and resolves and checks
each target there, injecting nothing and recording nothing; it runs a job on the cluster, so
its session takes the cluster's lock like any run.  A dry run takes none (its twin)."""

from __future__ import annotations

import contextlib
import threading
import types

import pytest

import chaos.experiment as experiment
from chaos.cluster import Target
from chaos.experiment import Environment, Experiment
from chaos.ledger import Ledger
from chaos.report import Reporter
from chaos.safety import LiveFaults, TargetRefused
from chaos.verdicts import Expect
from quiet_view import QuietView


class Backend:
    label, external_drains = "fake", True

    def __init__(self, refuse: bool = False):
        self.cluster, self.refuse = QuietView(), refuse
        self.head_away, self.live_faults = threading.Event(), LiveFaults(1)
        self.hosts_reached = []

    def healthy_workers(self):
        return True, "3 of 3 worker nodes alive"

    def wait_healed(self, timeout):
        pass

    def check_target(self, target):
        if self.refuse:
            raise TargetRefused(f"worker node {target.node_ip} matches none of safety.allowlist", "safety.allowlist")

    def host(self, node_id):
        self.hosts_reached.append(node_id)
        raise AssertionError("a rehearsal reaches no host")


class Fault:
    kind, one_shot, kills_node, budget_class = "raylet-kill", False, True, "worker_group"

    def describe(self):
        return "raylet kill on the node hosting rank 1"

    def resolve(self, ctx):
        return Target(node_id="a" * 56, node_ip="10.0.0.2", rank=1)

    def run_env(self):
        return {"LD_PRELOAD": "/var/tmp/shim.so"}

    def prepare(self, ctx):
        raise AssertionError("a rehearsal puts nothing on the hosts")

    def inject(self, ctx, inj):
        raise AssertionError("a rehearsal injects nothing")


class Trigger:
    def describe(self):
        return "after checkpoint 2 is committed"

    def wait(self, timeline, timeout):
        return types.SimpleNamespace(describe=lambda: "checkpoint 2 (step 10)")


class Run:
    made: list = []

    def __init__(self, spec, cluster, timeline, out_dir, extra_env, clock):
        self.extra_env, self.submissions, self.job_id, self.stopped = extra_env, [], "raysubmit_1", []
        Run.made.append(self)

    def submit(self):
        pass

    def wait_training_started(self, timeout):
        return types.SimpleNamespace(data={"step": 1}, attempt=0)

    def stop(self, wait=True):
        self.stopped.append(wait)

    def ray_job_ids(self):
        return []

    def failure_policy_lines(self):
        return []


@pytest.mark.parametrize("refuse", [False, True])
def test_a_rehearsal_goes_to_the_trigger_resolves_and_checks_the_target_and_injects_nothing(tmp_path, monkeypatch,
                                                                                             refuse):
    monkeypatch.setattr(experiment, "Run", Run)
    Run.made = []
    backend, said = Backend(refuse=refuse), []
    env = Environment(backend=backend, ledger=Ledger(tmp_path / "ledger.jsonl"), out_dir=tmp_path, rehearsal=True)
    exp = Experiment(env, spec=types.SimpleNamespace(params={}), faults=[(Trigger(), Fault())],
                     expect=Expect(), test_id="t::rehearsal", reporter=Reporter(echo=said.append))
    outcome = exp.run()
    text = "\n".join(said)
    if refuse:
        assert ("REHEARSAL: raylet kill on the node hosting rank 1 into rank 1 on node aaaaaaaa (10.0.0.2) would be "
                "REFUSED: worker node 10.0.0.2 matches none of safety.allowlist") in text, text
    else:
        assert "REHEARSAL: would inject raylet kill on the node hosting rank 1 into rank 1 on node aaaaaaaa" in text
    assert [t.node_ip for t in outcome.targets] == ["10.0.0.2"] and outcome.injections == []
    assert not (tmp_path / "ledger.jsonl").exists(), "a rehearsal records nothing"
    assert backend.hosts_reached == []
    [run] = Run.made
    assert "LD_PRELOAD" not in run.extra_env, "a rehearsal arms nothing in the run's environment"
    assert run.stopped == [True], "the rehearsed run is stopped once its triggers are through"


class LockingBackend:
    """Records whether the session locked the cluster or only observed it."""

    def __init__(self):
        self.opened = []
        self.properties = {}
        self.cluster_ledger = None

    @contextlib.contextmanager
    def session(self, reporter, lock=True, on_abort=None, owner=""):
        self.opened.append(("session", lock))
        yield self

    @contextlib.contextmanager
    def observe(self, reporter):
        self.opened.append(("observe", None))
        yield self


@pytest.mark.parametrize("options, opened", [
    ({"chaos_rehearsal": True}, [("session", True)]),
    ({"chaos_dry_run": True}, [("observe", None)]),
    ({}, [("session", True)]),
])
def test_a_rehearsal_takes_the_lock_like_any_run_and_a_dry_run_only_observes(tmp_path, options, opened):
    from chaos.pytest_plugin import _session

    values = {"chaos_dry_run": False, "chaos_rehearsal": False, "chaos_tape": False, "chaos_finish_timeout": 60.0,
              "allure_report_dir": None, **options}
    config = types.SimpleNamespace(getoption=lambda name, default=None: values.get(name, default))
    backend = LockingBackend()
    with _session(config, backend, tmp_path, Reporter(echo=lambda line: None)) as env:
        assert env.rehearsal == values["chaos_rehearsal"] and env.dry_run == values["chaos_dry_run"]
    assert backend.opened == opened
