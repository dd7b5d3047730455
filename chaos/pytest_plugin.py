"""pytest plugin (entry point ``pytest11: chaos``): options, markers, fixtures.

Chaos tests only run when selected with ``-m chaos``: they start a Ray cluster and kill
parts of it, which nobody wants from a plain ``pytest``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from pathlib import Path

import pytest

from chaos import summary
from chaos.errors import ChaosError, ClusterError
from chaos.experiment import Environment, Experiment, Outcome, Timeouts
from chaos.faults.raylet import RayletKill
from chaos.ledger import Ledger
from chaos.report import Reporter
from chaos.train.run import RunSpec, reference_spec, user_spec
from chaos.transport.local import LocalTransport
from chaos.verify import Expectation

log = logging.getLogger(__name__)

_RECORDS = pytest.StashKey[dict]()  # nodeid -> Experiment, for reports/summary.json
_OUTCOME = pytest.StashKey[str]()  # passed | failed (a verdict) | broken (the harness)


def pytest_addoption(parser):
    g = parser.getgroup("chaos", "ray-chaos-harness")
    g.addoption("--chaos-workload", default=None, metavar="CMD",
                help="put your own Ray Train script under chaos, e.g. \"python my_train.py --foo 1\" "
                     "(run from the current directory, which is shipped as the job's working_dir)")
    g.addoption("--chaos-workload-dir", default=None, metavar="DIR",
                help="directory shipped with --chaos-workload as its working_dir (default: the current directory)")
    g.addoption("--chaos-step-metric", default="step", metavar="NAME",
                help="the reported metric that counts training steps (default: step)")
    g.addoption("--chaos-workers", type=int, default=3, metavar="N", help="embedded cluster: worker nodes (>= 3)")
    g.addoption("--chaos-node-recovery", choices=["automatic", "off"], default="automatic",
                help="embedded cluster: bring a node whose raylet died back, as SageMaker HyperPod does")
    g.addoption("--chaos-recovery-delay", type=float, default=2.0, metavar="S",
                help="embedded cluster: seconds before a dead node is brought back")
    g.addoption("--chaos-slo-detect", type=float, default=30.0, metavar="S", help="SLO: fault → node DEAD")
    g.addoption("--chaos-slo-recover", type=float, default=120.0, metavar="S",
                help="SLO: fault → first report of the next attempt")
    g.addoption("--chaos-raylet-kill", choices=list(RayletKill.METHODS), default="grpc",
                help="raylet kill through Ray's ShutdownRaylet gRPC, or SIGKILL of the raylet PID")
    g.addoption("--chaos-reports", default="reports", metavar="DIR", help="where run artefacts go")
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
    workdir = config.getoption("chaos_workload_dir")
    if workdir is not None and not Path(workdir).is_dir():
        raise pytest.UsageError(f"--chaos-workload-dir {workdir}: not a directory")
    config.stash[_RECORDS] = {}


def pytest_collection_modifyitems(config, items):
    if "chaos" in (config.option.markexpr or ""):
        return
    skipped = [i for i in items if i.get_closest_marker("chaos")]
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = [i for i in items if not i.get_closest_marker("chaos")]


# -- the cluster -------------------------------------------------------------------
@pytest.fixture(scope="session")
def chaos_env(request) -> Environment:
    """The cluster under test: the embedded cluster (no profile)."""
    import ray

    import chaos
    from chaos.allure_site import write_environment
    from chaos.cluster import ClusterView
    from chaos.embedded.cluster import HEAD_IP, EmbeddedCluster, EmbeddedConfig

    opt = request.config.getoption
    out = Path(opt("chaos_reports")).resolve()
    cfg = EmbeddedConfig(workers=opt("chaos_workers"), node_recovery=opt("chaos_node_recovery") == "automatic",
                         recovery_delay_s=opt("chaos_recovery_delay"), base_dir=out / "embedded")
    reporter = Reporter()
    reporter.say(f"starting the embedded cluster: 1 head + {cfg.workers} workers on 127.0.1.x "
                 f"(node recovery {'automatic' if cfg.node_recovery else 'off'})")
    t0 = time.monotonic()
    cluster = EmbeddedCluster(cfg).up()
    try:
        ray.init(address=cluster.gcs_address, _node_ip_address=HEAD_IP, namespace="ray-chaos",
                 runtime_env={"py_modules": [os.path.dirname(chaos.__file__)]}, log_to_driver=False,
                 logging_level=logging.WARNING)
        view = ClusterView(cluster.dashboard_url, cluster.gcs_address, HEAD_IP)
        head = next(n for n in view.nodes() if n.is_head)
        reporter.say(f"embedded cluster up in {time.monotonic() - t0:.1f} s: {cluster.dashboard_url}")
        results = request.config.getoption("allure_report_dir", None)
        if results:
            Path(results).mkdir(parents=True, exist_ok=True)
            write_environment(results, _environment_props(cluster))

        def healthy():
            alive = {n.node_id for n in view.alive_workers()}
            down = [h.name for h in cluster.hosts if h.node_id not in alive]
            return (not down, f"all {len(cluster.hosts)} worker hosts alive" if not down else f"hosts down: {down}")

        def wait_healed(timeout):
            cluster.wait_workers_alive(timeout)

        env = Environment(
            cluster=view, head_node_id=head.node_id, ledger=Ledger(out / "ledger.jsonl"), out_dir=out,
            backend="embedded", transport_for=lambda ip: LocalTransport(ip),
            host_name_for=lambda ip: next((h.name for h in cluster.hosts if h.ip == ip), None),
            healthy_workers=healthy, wait_healed=wait_healed, dry_run=opt("chaos_dry_run"),
        )
        env.embedded = cluster
        yield env
    finally:
        ray.shutdown()
        cluster.down()
        reporter.say("embedded cluster stopped")


def _environment_props(cluster) -> dict:
    import ray

    h = cluster.config.health
    return {
        "ray.version": ray.__version__,
        "cluster": "embedded",
        "nodes": f"1 head + {len(cluster.hosts)} workers",
        "node.recovery": f"{'automatic' if cluster.config.node_recovery else 'off'} "
                         f"(delay {cluster.config.recovery_delay_s} s)",
        "health_check_period_ms": h.period_ms,
        "health_check_timeout_ms": h.timeout_ms,
        "health_check_failure_threshold": h.failure_threshold,
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    }


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
        return reference_spec(name, str(self.env.out_dir / "storage"), **params)

    def raylet_kill(self, rank: int = 1) -> RayletKill:
        return RayletKill(rank=rank, method=self._opt("chaos_raylet_kill"))

    def expect(self, charged: dict[str, int] | None = None, budget_exhausted: bool = False) -> Expectation:
        return Expectation(charged=charged or {}, budget_exhausted=budget_exhausted,
                           slo_detect_s=self._opt("chaos_slo_detect"), slo_recover_s=self._opt("chaos_slo_recover"))

    def run(self, workload: RunSpec, faults: list, expect: Expectation) -> Outcome:
        exp = Experiment(self.env, workload, faults, expect, self.request.node.nodeid)
        self.experiments.append(exp)
        return exp.run()

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
    if report.when == "call" or (report.when == "setup" and report.failed):
        item.stash[_OUTCOME] = "passed" if report.passed else ("failed" if call.excinfo and
                                                                call.excinfo.errisinstance(AssertionError) else "broken")
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
