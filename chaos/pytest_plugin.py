"""pytest plugin (entry point ``pytest11: chaos``): options, markers, fixtures.

Chaos tests only run when selected with ``-m chaos``: they start a Ray cluster and kill
parts of it, which nobody wants from a plain ``pytest``.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import uuid
from pathlib import Path

import pytest

from chaos import summary
from chaos.errors import Aborted
from chaos.experiment import Environment, Experiment, Outcome
from chaos.faults.raylet import RayletKill
from chaos.report import Reporter
from chaos.train.run import RunSpec, reference_spec, user_spec
from chaos.verify import Expectation

log = logging.getLogger(__name__)

_RECORDS = pytest.StashKey[dict]()  # nodeid -> Experiment, for reports/summary.json
_OUTCOME = pytest.StashKey[str]()  # passed | failed (a verdict) | broken (the harness) | aborted | skipped
_PROFILE = pytest.StashKey[object]()  # the loaded --chaos-profile


def pytest_addoption(parser):
    g = parser.getgroup("chaos", "ray-chaos-harness")
    g.addoption("--chaos-workload", default=None, metavar="CMD",
                help="put your own Ray Train script under chaos, e.g. \"python my_train.py --foo 1\" "
                     "(run from the current directory, which is shipped as the job's working_dir)")
    g.addoption("--chaos-workload-dir", default=None, metavar="DIR",
                help="directory shipped with --chaos-workload as its working_dir (default: the current directory)")
    g.addoption("--chaos-step-metric", default="step", metavar="NAME",
                help="the reported metric that counts training steps (default: step)")
    g.addoption("--chaos-workers", type=int, default=3, metavar="N", help="embedded cluster: worker nodes (default 3; the suites assume >= 3)")
    g.addoption("--chaos-gpus-per-worker", type=int, default=0, metavar="N",
                help="embedded cluster on a GPU machine: GPUs each worker node advertises (they may share one)")
    g.addoption("--chaos-hosts", choices=["auto", "plain", "namespaces"], default="auto",
                help="embedded workers as loopback processes (plain) or test hosts with their own network/PID "
                     "namespaces, sshd and boot id (namespaces, needs root); auto picks namespaces when possible")
    g.addoption("--chaos-node-recovery", choices=["automatic", "off"], default="automatic",
                help="embedded cluster: bring a node whose raylet died back, as SageMaker HyperPod does")
    g.addoption("--chaos-recovery-delay", type=float, default=2.0, metavar="S",
                help="embedded cluster: seconds before a dead node is brought back")
    g.addoption("--chaos-slo-detect", type=float, default=30.0, metavar="S", help="SLO: fault → node DEAD")
    g.addoption("--chaos-slo-recover", type=float, default=120.0, metavar="S",
                help="SLO: fault → first report of the next attempt")
    g.addoption("--chaos-raylet-kill", choices=list(RayletKill.METHODS), default="grpc",
                help="raylet kill through Ray's ShutdownRaylet gRPC, or SIGKILL of the raylet PID")
    g.addoption("--chaos-seed", type=int, default=0, metavar="N",
                help="seed of the reference workload (model init and data); recorded with each test")
    g.addoption("--chaos-reports", default="reports", metavar="DIR", help="where run artefacts go")
    g.addoption("--chaos-profile", default=None, metavar="YAML",
                help="run against the cluster this profile describes instead of the embedded cluster")
    g.addoption("--chaos-dry-run", action="store_true",
                help="resolve and print every target and action, inject nothing")


def pytest_configure(config):
    config.addinivalue_line("markers", "chaos: a chaos suite (starts a Ray cluster and injects faults); "
                                       "runs only with -m chaos")
    config.addinivalue_line("markers", "gpu: needs a real NVIDIA GPU")
    config.addinivalue_line("markers", "integration: runs real Ray clusters (minutes, not seconds)")
    for name, minimum in (("chaos_workers", 1), ("chaos_recovery_delay", 0), ("chaos_slo_detect", 0.001),
                          ("chaos_slo_recover", 0.001)):
        value = config.getoption(name)
        if value < minimum:
            raise pytest.UsageError(f"--{name.replace('_', '-')}={value}: must be >= {minimum}")
    if config.getoption("chaos_workload") is not None and not config.getoption("chaos_workload").strip():
        raise pytest.UsageError("--chaos-workload is empty: give the command that starts your training script")
    if config.getoption("chaos_workload"):
        from chaos.profile import secret_in_command

        secret = secret_in_command(config.getoption("chaos_workload"))
        if secret:
            raise pytest.UsageError(f"--chaos-workload contains {secret}: the command is written into reports; "
                                    "pass secrets through the environment of your script's own config instead")
    workdir = config.getoption("chaos_workload_dir")
    if workdir is not None and not Path(workdir).is_dir():
        raise pytest.UsageError(f"--chaos-workload-dir {workdir}: not a directory")
    config.stash[_RECORDS] = {}
    if config.getoption("chaos_profile"):
        from chaos.errors import ProfileError
        from chaos.profile import load_profile

        try:
            config.stash[_PROFILE] = load_profile(config.getoption("chaos_profile"))
        except ProfileError as e:
            raise pytest.UsageError(f"--chaos-profile: {e}") from e
    # SIGTERM (CI cancelling the job) must run the same cleanup as Ctrl-C: revert, stop, heal.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_collection_modifyitems(config, items):
    if "chaos" in (config.option.markexpr or ""):
        return
    skipped = [i for i in items if i.get_closest_marker("chaos")]
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = [i for i in items if not i.get_closest_marker("chaos")]


def live_reporter(config) -> Reporter:
    """A Reporter whose progress lines reach the terminal as they happen, even under capture."""
    capman = config.pluginmanager.getplugin("capturemanager")

    def echo(text: str) -> None:
        if capman is None:
            print(text, flush=True)
            return
        with capman.global_and_fixture_disabled():
            print(text, flush=True)

    return Reporter(echo=echo)


# -- the cluster -------------------------------------------------------------------
@pytest.fixture(scope="session")
def chaos_env(request) -> Environment:
    """The cluster under test: the one --chaos-profile describes, else the embedded cluster."""
    from chaos.allure_site import write_environment
    from chaos.embedded.cluster import EmbeddedConfig
    from chaos.embedded.testhost import testhosts_supported
    from chaos.environments import embedded_environment, profile_environment

    opt = request.config.getoption
    out = Path(opt("chaos_reports")).resolve()
    reporter = live_reporter(request.config)
    profile = request.config.stash.get(_PROFILE, None)
    if profile is not None:
        reporter.say(f"profile {profile.name}: {profile.ray.dashboard_url}"
                     + (" (DRY RUN: nothing will be injected)" if opt("chaos_dry_run") else ""))
        context = profile_environment(profile, out, dry_run=opt("chaos_dry_run"), reporter=reporter)
    else:
        hosts = opt("chaos_hosts")
        supported, why = testhosts_supported()
        if hosts == "namespaces" and not supported:
            pytest.exit(f"--chaos-hosts namespaces: test hosts are not possible here: {why}", returncode=4)
        if hosts == "auto":
            hosts = "namespaces" if supported else "plain"
        cfg = EmbeddedConfig(workers=opt("chaos_workers"), node_recovery=opt("chaos_node_recovery") == "automatic",
                             recovery_delay_s=opt("chaos_recovery_delay"), base_dir=out / "embedded", hosts=hosts,
                             gpus_per_worker=opt("chaos_gpus_per_worker"))
        where = ("test hosts in network/PID/mount/UTS namespaces on a 198.18.x.0/24 bridge" if hosts == "namespaces"
                 else "loopback processes on 127.0.1.x" + ("" if supported else f" (no test hosts: {why})"))
        reporter.say(f"starting the embedded cluster: 1 head + {cfg.workers} workers, {where}; "
                     f"node recovery {'automatic' if cfg.node_recovery else 'off'}")
        context = embedded_environment(out, cfg, dry_run=opt("chaos_dry_run"), reporter=reporter)
    with context as env:
        results = request.config.getoption("allure_report_dir", None)
        if results:
            Path(results).mkdir(parents=True, exist_ok=True)
            write_environment(results, env.properties)
        yield env


# -- what suites use ---------------------------------------------------------------
@dataclasses.dataclass
class Chaos:
    """The `chaos` fixture: build workloads, faults and expectations; run experiments."""

    env: Environment
    request: pytest.FixtureRequest
    experiments: list = dataclasses.field(default_factory=list)

    @property
    def _opt(self):
        return self.request.config.getoption

    @property
    def user_workload(self) -> bool:
        return self._opt("chaos_workload") is not None

    def workload(self, **params) -> RunSpec:
        """The reference workload with ``params`` — or the user's own script if given."""
        # Unique per call: Train resumes from any checkpoint already under storage/name.
        name = self.request.node.name.replace("[", "-").replace("]", "")[:40].strip("-_") + "-" + uuid.uuid4().hex[:6]
        if self.user_workload:
            return user_spec(self._opt("chaos_workload"), name, step_metric=self._opt("chaos_step_metric"),
                             working_dir=self._opt("chaos_workload_dir"))
        profile = getattr(self.env, "profile", None)
        if profile is not None and profile.workload.kind == "entrypoint":
            w = profile.workload
            spec = user_spec(w.entrypoint, name, step_metric=w.step_metric, working_dir=w.working_dir)
            spec.env_vars.update((w.runtime_env or {}).get("env_vars", {}))
            return spec
        params.setdefault("seed", self._opt("chaos_seed"))
        return reference_spec(name, self.env.storage_path, **params)

    def raylet_kill(self, rank: int = 1) -> RayletKill:
        return RayletKill(rank=rank, method=self._opt("chaos_raylet_kill"))

    def expect(self, charged: dict[str, int] | None = None, budget_exhausted: bool = False,
               fault_kind: str | None = None) -> Expectation:
        """SLOs from the profile's entry for ``fault_kind`` when a profile is used, else the options."""
        detect, recover = self._opt("chaos_slo_detect"), self._opt("chaos_slo_recover")
        profile = getattr(self.env, "profile", None)
        if profile is not None and fault_kind:
            detect, recover = profile.slo_for(fault_kind)
        return Expectation(charged=charged or {}, budget_exhausted=budget_exhausted,
                           slo_detect_s=detect, slo_recover_s=recover)

    def run(self, workload: RunSpec, faults: list, expect: Expectation) -> Outcome:
        exp = Experiment(self.env, workload, faults, expect, self.request.node.nodeid,
                         reporter=live_reporter(self.request.config))
        self.experiments.append(exp)
        try:
            outcome = exp.run()
        except Aborted as e:
            pytest.skip(f"ABORTED (not failed): {e}")
        if self.env.dry_run:
            pytest.skip("dry run: targets resolved and printed, nothing injected")
        return outcome

    @property
    def embedded(self):
        return getattr(self.env, "embedded", None)


@pytest.fixture
def chaos(chaos_env, request) -> Chaos:
    helper = Chaos(chaos_env, request)
    yield helper
    for exp in helper.experiments:
        request.config.stash[_RECORDS][request.node.nodeid] = exp


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if report.passed:
            outcome = "passed"
        elif report.skipped:
            outcome = "aborted" if "ABORTED" in str(report.longrepr) else "skipped"
        else:
            outcome = "failed" if call.excinfo and call.excinfo.errisinstance(AssertionError) else "broken"
        item.stash[_OUTCOME] = outcome
    return report


def pytest_sessionfinish(session, exitstatus):
    records = session.config.stash.get(_RECORDS, {})
    if not records:
        return
    out = Path(session.config.getoption("chaos_reports")).resolve()
    for item in session.items:
        exp = records.get(item.nodeid)
        if exp is not None:
            summary.append_record(out / "summary.d", exp.record(item.stash.get(_OUTCOME, "broken")))
    summary.write_summary(out / "summary.d", out / "summary.json")
    results = session.config.getoption("allure_report_dir", None)
    if results:
        from chaos.allure_site import write_categories, write_executor

        write_categories(results)
        write_executor(results)
