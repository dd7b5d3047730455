"""pytest plugin (entry point ``pytest11: chaos``): options, markers, fixtures.

Chaos tests only run when selected with ``-m chaos``: they start a Ray cluster and kill
parts of it, which nobody wants from a plain ``pytest``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import re
import signal
import sys
import threading
import uuid
from pathlib import Path
from typing import Iterable, Iterator

import pytest

from chaos import summary
from chaos.errors import Aborted
from chaos.experiment import Environment, Experiment, Judging, Outcome, Timeouts
from chaos.faults import catalog
from chaos.faults.catalog import expected_charge
from chaos.faults.raylet import RayletKill
from chaos.progress import CRASH_LOOP_FAILURES
from chaos.ray_support import RayVersionError, check_supported
from chaos.report import Reporter
from chaos.train.run import RunSpec, reference_spec, user_spec
from chaos.verdicts import Diagnosis, Expect
from chaos.verdicts.tolerance import STATE_RTOL, valid_rtol

log = logging.getLogger(__name__)

_RECORDS = pytest.StashKey[dict]()  # nodeid -> Experiment, for reports/summary.json
_OUTCOME = pytest.StashKey[str]()  # passed | failed (a verdict) | broken (the harness) | aborted | skipped
_PROFILE = pytest.StashKey[object]()  # the loaded --chaos-profile
_BLOCKED = pytest.StashKey[dict]()  # kind -> why the preflight found it cannot run (set once it ran)
#: the exit status of a session the preflight stopped (pytest's own for a setup it cannot run with)
PREFLIGHT_FAILED = pytest.ExitCode.USAGE_ERROR


def pytest_addoption(parser):
    g = parser.getgroup("chaos", "ray-chaos-harness")
    g.addoption("--chaos-workload", default=None, metavar="CMD",
                help="put your own Ray Train script under chaos, e.g. \"python my_train.py --foo 1\" "
                     "(run from the current directory, which is shipped as the job's working_dir)")
    g.addoption("--chaos-workload-dir", default=None, metavar="DIR",
                help="directory shipped with --chaos-workload as its working_dir (default: the current directory)")
    g.addoption("--chaos-step-metric", default="auto", metavar="NAME[,NAME...]",
                help="the reported metric(s) that count training steps, tried in order; 'auto' (default) tries "
                     "the names Ray's own framework callbacks report (step, global_step, ...)")
    g.addoption("--chaos-state-metric", default="auto", metavar="NAME",
                help="a metric a correct restore reproduces at a re-done step; 'auto' (default) takes the training "
                     "loss (loss, train_loss, training_loss) when your script reports one")
    g.addoption("--chaos-deterministic", action="store_true",
                help="your script (--chaos-workload, or a profile's workload.entrypoint) gives the same metrics "
                     "from the same state at the same step: a state value that does not reproduce fails ('state not "
                     "restored'); without it that is a warning ('state differs')")
    g.addoption("--chaos-unverifiable", choices=["fail", "warn"], default="fail",
                help="an unverifiable verdict (missing evidence) fails the test (default) or only warns")
    g.addoption("--chaos-stall-limit", type=float, default=None, metavar="S",
                help="fail as 'training stalled' when no rank reports for S seconds (default: 3x the longest "
                     "silence the run has shown, at least 60)")
    g.addoption("--chaos-crash-loop", type=int, default=CRASH_LOOP_FAILURES, metavar="N",
                help="under an unlimited budget (max_failures=-1), N failures in a row without a new step are "
                     f"a 'crash loop' finding (default {CRASH_LOOP_FAILURES})")
    g.addoption("--chaos-finish-timeout", type=float, default=Timeouts.finish_s, metavar="S",
                help="fail as 'run did not finish' (or 'driver did not exit', where Train's run ended) when the job "
                     f"has not ended S seconds after the last fault's recovery (default {Timeouts.finish_s:.0f}), "
                     f"or min(S, {Timeouts.driver_exit_s:.0f}) seconds after Train's run ended")
    g.addoption("--chaos-workers", type=int, default=3, metavar="N", help="embedded cluster: worker nodes (default 3; the suites assume >= 3)")
    g.addoption("--chaos-gpus-per-worker", type=int, default=0, metavar="N",
                help="embedded cluster on a GPU machine: GPUs each worker node advertises (they may share one)")
    g.addoption("--chaos-hosts", choices=["auto", "plain", "namespaces"], default="auto",
                help="embedded workers as loopback processes (plain) or test hosts with their own network/PID "
                     "namespaces, sshd and boot id (namespaces, needs root); auto picks namespaces when possible")
    g.addoption("--chaos-kubernetes", action="store_true",
                help="embedded cluster as KubeRay on the emulated Kubernetes API with HyperPod-like node recovery "
                     "(test hosts as nodes, needs root); the kubernetes backend drives it, as a real cluster")
    g.addoption("--chaos-node-recovery", choices=["automatic", "off"], default="automatic",
                help="embedded cluster: bring a node whose raylet died back, as SageMaker HyperPod does")
    g.addoption("--chaos-recovery-delay", type=float, default=2.0, metavar="S",
                help="embedded cluster: seconds before a dead node is brought back")
    g.addoption("--chaos-slo-detect", type=float, default=None, metavar="S",
                help="SLO: fault → node DEAD, for every kind (unset: the profile's for the kind, else the kind's "
                     "own in docs/reference/fault-kinds.md); a suite's chaos.expect(slo_detect_s=) wins")
    g.addoption("--chaos-slo-recover", type=float, default=None, metavar="S",
                help="SLO: fault → first report of the next attempt, for every kind (unset: the profile's for the "
                     "kind, else the kind's own); a suite's chaos.expect(slo_recover_s=) wins")
    g.addoption("--chaos-raylet-kill", choices=list(RayletKill.METHODS), default="grpc",
                help="raylet kill through Ray's ShutdownRaylet gRPC, or SIGKILL of the raylet PID")
    g.addoption("--chaos-seed", type=int, default=0, metavar="N",
                help="seed of the reference workload (model init and data); recorded with each test; in a "
                     "campaign (-m soak) the same seed also draws the fault schedule")
    g.addoption("--chaos-schedule", default=None, metavar="FILE",
                help="campaign (-m soak): replay this schedule.json exactly (its seed and run size too) "
                     "instead of drawing one from --chaos-seed")
    g.addoption("--chaos-duration", type=float, default=240.0, metavar="S",
                help="campaign (-m soak): seconds the long run should take; its steps follow from it (default 240)")
    g.addoption("--chaos-campaign-faults", type=int, default=None, metavar="N",
                help="campaign (-m soak): faults to draw (default: one per 100 s of --chaos-duration, at least 2)")
    g.addoption("--chaos-campaign-kinds", default=None, metavar="KIND[,KIND...]",
                help="campaign (-m soak): fault kinds to draw from (default: those the session's backend can "
                     "inject, see suites/test_campaign.py)")
    g.addoption("--chaos-baseline", action="store_true",
                help="follow every test's run step by step against a fault-free run of the same workload and "
                     "seed (state-trajectory verdict: names the first step that leaves it); the baseline runs "
                     "first and is cached like the final-state check's")
    g.addoption("--chaos-state-rtol", type=float, default=None, metavar="R",
                help=f"relative tolerance for a state value (loss) to reproduce: re-done steps, the trajectory, "
                     f"the final state (default {STATE_RTOL:g}; raise it for non-deterministic training); a suite's "
                     "own chaos.expect(state_rtol=...) wins over the default, and where both are given the smaller "
                     "(a tolerance only lets more through: neither loosens what the other asked)")
    g.addoption("--chaos-refresh-baselines", action="store_true",
                help="final-state and trajectory checks: make every fault-free baseline anew instead of reusing "
                     "the one cached under <reports>/baselines for the same workload, parameters and seed")
    g.addoption("--chaos-reports", default="reports", metavar="DIR", help="where run artefacts go")
    g.addoption("--chaos-profile", default=None, metavar="YAML",
                help="run against the cluster this profile describes instead of the embedded cluster")
    g.addoption("--chaos-dry-run", action="store_true",
                help="print each test's plan (faults, how each target will be chosen, which nodes the safety rules "
                     "allow now, triggers, expected charges, SLOs) from read-only state, and skip it: no job is "
                     "submitted, no lock taken, no ledger entry written, no host touched")
    g.addoption("--chaos-rehearsal", action="store_true",
                help="run each test's job up to every trigger and resolve and check each target there, injecting "
                     "nothing: a job runs on the cluster, so the session takes the cluster's lock like any run")
    g.addoption("--chaos-tape", action="store_true",
                help="tape every fact the recorder takes from Ray Train into the run's directory "
                     "(<reports>/runs/<test>/tape.jsonl, written by the Train controller on the head node) "
                     "with judging.json: what tests/contract replays without a cluster")


def pytest_configure(config):
    try:
        check_supported()  # a Ray outside the supported range is refused before anything runs
    except RayVersionError as e:
        raise pytest.UsageError(str(e)) from e
    config.addinivalue_line("markers", "chaos: a chaos suite (starts a Ray cluster and injects faults); "
                                       "runs only with -m chaos")
    config.addinivalue_line("markers", "gpu: needs a real NVIDIA GPU")
    config.addinivalue_line("markers", "kubernetes: a chaos suite of Kubernetes/HyperPod faults "
                                       "(--chaos-kubernetes, or a profile with a kubernetes section)")
    config.addinivalue_line("markers", "head_faults(gcs_ft=True, gcs_reconnect_timeout_s=60): a chaos suite of head "
                                       "faults, on an embedded cluster of its own whose head may be hit (on a test "
                                       "host of its own, started again when it goes), with or without GCS fault "
                                       "tolerance (an external Redis)")
    config.addinivalue_line("markers", "integration: runs real Ray clusters (minutes, not seconds)")
    config.addinivalue_line("markers", "extended: a chaos suite whose fault kind and budget class a per-commit "
                                       "suite already covers (make integration runs it, make chaos does not; "
                                       "-m chaos runs it as any other)")
    config.addinivalue_line("markers", "soak: a seeded fault campaign through one long run: runs only with -m soak "
                                       "(make soak; make chaos ends with a short one)")
    for name, minimum in (("chaos_workers", 1), ("chaos_recovery_delay", 0), ("chaos_slo_detect", 0.001),
                          ("chaos_slo_recover", 0.001), ("chaos_stall_limit", 1), ("chaos_duration", 1),
                          ("chaos_campaign_faults", 1), ("chaos_crash_loop", 1),
                          ("chaos_finish_timeout", 1)):
        value = config.getoption(name)
        if value is not None and value < minimum:
            raise pytest.UsageError(f"--{name.replace('_', '-')}={value}: must be >= {minimum}")
    if not [n for n in config.getoption("chaos_step_metric").split(",") if n.strip()]:
        raise pytest.UsageError("--chaos-step-metric is empty: name the metric that counts steps, or 'auto'")
    if config.getoption("chaos_workload") is not None and not config.getoption("chaos_workload").strip():
        raise pytest.UsageError("--chaos-workload is empty: give the command that starts your training script")
    if config.getoption("chaos_workload"):
        from chaos.profile import secret_in_command

        secret = secret_in_command(config.getoption("chaos_workload"))
        if secret:
            raise pytest.UsageError(f"--chaos-workload contains {secret}: the command is written into reports; "
                                    "pass secrets through the environment of your script's own config instead")
    if config.getoption("chaos_dry_run") and config.getoption("chaos_rehearsal"):
        raise pytest.UsageError("--chaos-dry-run and --chaos-rehearsal exclude each other: a dry run submits nothing, "
                                "a rehearsal runs the job up to every trigger")
    rtol = config.getoption("chaos_state_rtol")
    if rtol is not None and not valid_rtol(rtol):
        raise pytest.UsageError(f"--chaos-state-rtol={rtol}: a relative tolerance is a finite number >= 0 (an "
                                "infinite one reproduces every state)")
    _check_campaign_options(config)
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


def _check_campaign_options(config) -> None:
    """A schedule that will not load, or a kind no campaign draws, stops the session before
    any cluster starts."""
    from chaos.campaign import Schedule, ScheduleError, check_kinds

    checks = (("chaos_schedule", Schedule.load),
              ("chaos_campaign_kinds", lambda v: check_kinds(k.strip() for k in v.split(",") if k.strip())))
    for name, check in checks:
        value = config.getoption(name)
        if value is not None:
            try:
                check(value)
            except ScheduleError as e:
                raise pytest.UsageError(f"--{name.replace('_', '-')}: {e}") from e


def pytest_collection_modifyitems(config, items):
    # chaos and soak tests start clusters: each runs only when -m names its marker
    for marker in ("chaos", "soak"):
        if asks_for(config.option.markexpr, marker, [{m.name for m in i.iter_markers()} for i in items]):
            continue
        skipped = [i for i in items if i.get_closest_marker(marker)]
        if skipped:
            config.hook.pytest_deselected(items=skipped)
            items[:] = [i for i in items if not i.get_closest_marker(marker)]
    # Grouped by the cluster they need (stable: file order within a group), so a session
    # starts each kind of cluster once: the foreign stand-in, the embedded one, head-loss
    # clusters, Kubernetes.  The foreign stand-in's file, the longest, comes first: xdist's
    # loadfile (make's JOBS, --no-loadscope-reorder) hands files out in this order.
    items.sort(key=_cluster_order)


def asks_for(markexpr: str | None, marker: str, tests: Iterable[set[str]] = ()) -> bool:
    """Whether ``-m markexpr``, read as pytest reads it, asks for the tests marked ``marker``:
    it names the marker and selects one of ``tests`` (each given by its marks) that carries it
    (``-m chaos``, ``-m "chaos and extended"``, ``-m "chaos or not chaos"`` do; ``-m "not
    nochaos"``, ``-m "not chaos"``, ``-m "not extended"`` do not: chaos tests start clusters, so
    they run only when asked for by name).  No ``tests``: a test carrying ``marker`` alone.
    The one use of pytest's private expression module (tests/unit/test_marker_expression.py fails
    loudly if it changes)."""
    from _pytest.mark.expression import Expression

    if not markexpr:
        return False
    expression = Expression.compile(markexpr)  # pytest's own syntax and errors
    if marker not in _MARK_NAME.findall(markexpr):
        return False
    carrying = [marks for marks in tests if marker in marks] or [{marker}]
    return any(expression.evaluate(lambda name, /, marks=marks, **kwargs: not kwargs and name in marks)
               for marks in carrying)


#: a marker name as pytest's expression scanner reads one (its IDENT token)
_MARK_NAME = re.compile(r"(?:\w|:|\+|-|\.|\[|\])+")


def _cluster_order(item) -> tuple:
    if "foreign" in getattr(item, "fixturenames", ()):  # suites/test_foreign_cluster.py: a cluster of its own
        return 0, ""
    head = item.get_closest_marker("head_faults")
    if head is not None:
        return 2, Clusters.head_kind(head)
    return (3, "") if item.get_closest_marker("kubernetes") else (1, "")


def live_reporter(config) -> Reporter:
    """A Reporter whose progress lines reach the terminal as they happen, even under capture."""
    capman = config.pluginmanager.getplugin("capturemanager")
    worker = _xdist_worker(config)

    # An xdist worker's stdout is its channel to the controller; its stderr, with capture
    # suspended, is the terminal's.
    stream = (lambda: sys.stderr) if worker else (lambda: sys.stdout)
    prefix = f"[{worker}] " if worker else ""

    def write(line: str) -> None:
        # One write per line, newline included: the workers share the terminal's stderr, and
        # execnet starts them with ``python -u`` (as PYTHONUNBUFFERED=1 does any process), where
        # print() is two writes, the text and then "\n", so two workers' lines could merge
        # into one ("[gw1] ... a[gw0] ... b").  A pipe write of at most PIPE_BUF bytes is atomic.
        out = stream()
        out.write(prefix + line + "\n")
        out.flush()

    def echo(text: str) -> None:
        if capman is None:
            write(text)
            return
        with capman.global_and_fixture_disabled():
            write(text)

    return Reporter(echo=echo)


# -- the cluster -------------------------------------------------------------------
@pytest.fixture(scope="session")
def chaos_clusters(request) -> "Clusters":
    """This session's clusters, one open at a time (two cores run one cluster at a time)."""
    clusters = Clusters(request)
    yield clusters
    clusters.close()


@pytest.fixture
def chaos_env(chaos_clusters, request) -> Environment:
    """The cluster under test: the backend that serves --chaos-profile; else the embedded
    Kubernetes cluster for ``kubernetes``-marked suites (all suites under --chaos-kubernetes);
    else the embedded cluster (``head_faults``-marked suites: the head-fault one)."""
    kind = Clusters.kind_for(request)
    if kind == "profile" and request.node.get_closest_marker("head_faults"):
        # Before the profile's cluster is reached at all: the harness faults only a head it runs.
        profile = request.config.stash[_PROFILE]
        if not profile.safety.allow_head:
            pytest.fail(f"head faults refused: profile {profile.name} does not allow the head "
                        "(safety.allow_head: false)", pytrace=False)
        pytest.skip(f"head faults run on the embedded cluster only; profile {profile.name}'s cluster is not "
                    "restarted by the harness")
    return chaos_clusters.get(kind)


def _state_rtol(suite: float | None, option: float | None) -> float | None:
    """The state tolerance of a run: the suite's own (chaos.expect(state_rtol=...)) or
    --chaos-state-rtol, whichever is given; where both are, the smaller — a tolerance only
    lets more through, so neither loosens the check the other asked for (None: STATE_RTOL)."""
    given = [r for r in (suite, option) if r is not None]
    return min(given) if given else None


def profile_workload_spec(w, name: str, deterministic: bool = False) -> RunSpec:
    """A profile's entrypoint workload (``WorkloadSettings``) as a run: its runtime_env's
    fields travel with the job (pip, excludes, its own py_modules...), not only its env_vars.
    Deterministic where the profile or ``--chaos-deterministic`` (``deterministic``) says so."""
    extra = dict(w.runtime_env)
    spec = user_spec(w.entrypoint, name, step_metric=w.step_metric,
                     working_dir=extra.pop("working_dir", None) or w.working_dir,
                     state_metric=w.state_metric, deterministic=w.deterministic or deterministic)
    spec.env_vars.update(extra.pop("env_vars", {}))
    spec.runtime_env = extra
    return spec


class Clusters:
    """Opens the cluster a test needs and closes the previous one of another kind first (two
    cores run one cluster at a time), so one session can run the embedded, the head-fault
    and the Kubernetes suites (each xdist worker switches as its files need)."""

    def __init__(self, request):
        self.request = request
        self.kind: str | None = None
        self.env: Environment | None = None
        self._stack = contextlib.ExitStack()
        self._failed: dict[str, BaseException] = {}

    @staticmethod
    def kind_for(request) -> str:
        opt = request.config.getoption
        if request.config.stash.get(_PROFILE, None) is not None:
            return "profile"
        if opt("chaos_kubernetes") or request.node.get_closest_marker("kubernetes"):
            return "kubernetes"
        head = request.node.get_closest_marker("head_faults")
        return Clusters.head_kind(head) if head is not None else "embedded"

    @staticmethod
    def head_kind(marker) -> str:
        """``head:gcs_ft=...,gcs_reconnect_timeout_s=...``: one cluster per distinct marker."""
        options = {"gcs_ft": True, "gcs_reconnect_timeout_s": 60.0, **marker.kwargs}
        unknown = set(options) - {"gcs_ft", "gcs_reconnect_timeout_s"}
        if marker.args or unknown:
            raise pytest.UsageError(f"@pytest.mark.head_faults takes gcs_ft= and gcs_reconnect_timeout_s= only, "
                                    f"got {marker.args or ''} {sorted(unknown) or ''}")
        return "head:" + ",".join(f"{k}={options[k]}" for k in sorted(options))

    def get(self, kind: str) -> Environment:
        if kind in self._failed:  # one clear error per kind, not one start per test
            raise self._failed[kind]
        if kind != self.kind:
            self.close()
            try:
                self.env = self._stack.enter_context(self._open(kind))
            except BaseException as e:  # _open's own with-blocks have undone what it started
                self._failed[kind] = e
                raise
            self.kind = kind
        return self.env

    def close(self) -> None:
        self.kind, self.env = None, None
        self._stack.close()

    @contextlib.contextmanager
    def _open(self, kind: str) -> Iterator[Environment]:
        from chaos import backends

        config = self.request.config
        out = Path(config.getoption("chaos_reports")).resolve()
        reporter = live_reporter(config)
        dry = config.getoption("chaos_dry_run")
        if kind == "profile":
            profile = config.stash[_PROFILE]
            if _BLOCKED not in config.stash:
                config.stash[_BLOCKED] = _preflight(config, profile, reporter)
            reporter.say(f"profile {profile.name}: {profile.ray.dashboard_url}"
                         + (" (DRY RUN: read-only, nothing submitted)" if dry else
                            " (REHEARSAL: runs go to every trigger, nothing is injected)"
                            if config.getoption("chaos_rehearsal") else ""))
            with _session(config, backends.for_profile(profile), out, reporter) as env:
                yield env
        elif dry and kind != "embedded":
            pytest.skip(f"dry run: {'Kubernetes' if kind == 'kubernetes' else 'head-fault'} suites run on a cluster "
                        "the harness starts for them, which a dry run does not start (with --chaos-profile, your own "
                        "cluster's plan is read from it)")
        elif kind == "kubernetes":
            with _embedded_kubernetes(config, out, reporter) as backend, \
                    _session(config, backend, out, reporter) as env:
                yield env
        elif kind.startswith("head:"):
            options = dict(part.split("=") for part in kind[len("head:"):].split(","))
            backend = _embedded_backend(config, out, reporter, gcs_ft=options["gcs_ft"] == "True",
                                        gcs_reconnect_timeout_s=float(options["gcs_reconnect_timeout_s"]))
            with _session(config, backend, out, reporter) as env:
                yield env
        else:
            with _session(config, _embedded_backend(config, out, reporter), out, reporter) as env:
                yield env


def _preflight(config, profile, reporter: Reporter) -> dict[str, list[str]]:
    """Doctor's checks, once per session (per xdist worker), before its first test reaches the
    profile's cluster: a cluster no kind can run on stops the session with the table
    (PREFLIGHT_FAILED) instead of a traceback per test; returns {kind: why it cannot run} for
    the kinds refused in their own tests (``Chaos.fault``).  A dry run reads the cluster side
    only and stops only when the cluster cannot be read (a held lock is in its plan)."""
    from chaos import doctor

    dry = config.getoption("chaos_dry_run")
    checks = doctor.run(profile, hosts=not dry, say=reporter.say)
    stopping = [c for c in doctor.blocks_all(checks) if not dry or c.subject == "cluster"]
    text = doctor.table(checks).splitlines()
    for line in text if stopping or dry else text[-1:]:
        reporter.say(line)
    where = f"ray-chaos doctor --profile {profile.source or profile.name}"
    if stopping:
        pytest.exit(f"preflight ({where}): {'; '.join(f'{c.subject}: {c.what}: {c.detail}' for c in stopping)}",
                    returncode=PREFLIGHT_FAILED)
    if dry:
        return {}
    return {k: [f"{c.subject}: {c.what}: {c.detail}; fix: {c.fix}" for c in cs]
            for k, cs in doctor.blocked(checks).items()}


def _embedded_backend(config, out: Path, reporter: Reporter, gcs_ft: bool | None = None,
                      gcs_reconnect_timeout_s: float = 60.0):
    """The embedded cluster the options ask for; ``gcs_ft`` not None: a head-fault cluster
    (its head on a test host of its own where test hosts are possible, 2 workers, GCS fault
    tolerance on or off, the head started again when it goes)."""
    from chaos import backends
    from chaos.embedded.cluster import EmbeddedConfig
    from chaos.embedded.testhost import testhosts_supported

    opt = config.getoption
    hosts = opt("chaos_hosts")
    supported, why = testhosts_supported()
    if hosts == "namespaces" and not supported:
        pytest.exit(f"--chaos-hosts namespaces: test hosts are not possible here: {why}", returncode=4)
    if hosts == "auto":
        hosts = "namespaces" if supported else "plain"
    slot = _slot(config, 0)
    head_faults = gcs_ft is not None
    cfg = EmbeddedConfig(workers=2 if head_faults else opt("chaos_workers"),
                         node_recovery=opt("chaos_node_recovery") == "automatic",
                         recovery_delay_s=opt("chaos_recovery_delay"), hosts=hosts,
                         base_dir=out / "embedded" / (f"slot{slot}" if slot is not None else "") /
                         ("head-faults" if head_faults else ""),
                         gpus_per_worker=opt("chaos_gpus_per_worker"), slot=slot,
                         gcs_ft=bool(gcs_ft), gcs_reconnect_timeout_s=gcs_reconnect_timeout_s,
                         head_host="testhost" if head_faults and hosts == "namespaces" else "local")
    where = ("test hosts in network/PID/mount/UTS namespaces on a 198.18.x.0/24 bridge" if hosts == "namespaces"
             else f"loopback processes on {cfg.loopback_block()}.x" + ("" if supported else f" (no test hosts: {why})"))
    if head_faults:
        where += ("; the head on a test host of its own" if cfg.head_host == "testhost" else
                  "; the head a local process tree (a head reboot SIGKILLs it)")
        where += f"; GCS fault tolerance {'on (external Redis)' if gcs_ft else 'off'}, for head faults"
    reporter.say(f"{'DRY RUN: not starting' if opt('chaos_dry_run') else 'starting'} the embedded cluster: 1 head + "
                 f"{cfg.workers} workers, {where}; node recovery {'automatic' if cfg.node_recovery else 'off'}")
    return backends.for_profile(None, config=cfg, storage_path=str(out / "storage"), head_faults=head_faults)


@contextlib.contextmanager
def _session(config, backend, out: Path, reporter: Reporter) -> Iterator[Environment]:
    from chaos.allure_site import write_environment
    from chaos.ledger import Ledger

    env = Environment(backend, Ledger(out / "ledger.jsonl"), out, dry_run=config.getoption("chaos_dry_run"),
                      rehearsal=config.getoption("chaos_rehearsal"), tape=config.getoption("chaos_tape"),
                      timeouts=Timeouts(finish_s=config.getoption("chaos_finish_timeout")))
    # A dry run reads the cluster and touches nothing; a rehearsal runs jobs, so it is locked as any run.
    opened = (backend.observe(reporter) if env.dry_run else
              backend.session(reporter, on_abort=env.abort, owner=env.ledger.session))
    with opened:
        env.ledger.cluster = backend.cluster_ledger  # open entries kept on the cluster too (a profile's)
        results = config.getoption("allure_report_dir", None)
        if results:
            Path(results).mkdir(parents=True, exist_ok=True)
            write_environment(results, backend.properties)
        yield env


@contextlib.contextmanager
def _embedded_kubernetes(config, out: Path, reporter: Reporter):
    """The embedded Kubernetes cluster, driven through its profile by the kubernetes backend."""
    import time

    from chaos import backends
    from chaos.embedded.kubernetes import EmbeddedKubernetes, KubeClusterConfig
    from chaos.embedded.testhost import testhosts_supported
    from chaos.profile import profile_from_dict

    supported, why = testhosts_supported()
    if not supported:
        if config.getoption("chaos_kubernetes"):
            pytest.exit(f"--chaos-kubernetes: its nodes are test hosts, which are not possible here: {why}",
                        returncode=4)
        pytest.skip(f"the embedded Kubernetes cluster's nodes are test hosts, which are not possible here: {why}")
    slot = _slot(config, 1)
    cfg = KubeClusterConfig(workers=config.getoption("chaos_workers"), slot=slot,
                            base_dir=out / "embedded-k8s" / (f"slot{slot}" if slot is not None else ""))
    reporter.say(f"starting the embedded Kubernetes cluster: RayCluster {cfg.namespace}/{cfg.ray_cluster}, 1 head + "
                 f"{cfg.workers} worker pods on HyperPod-labelled test-host nodes; emulated API server, kubelet, "
                 "KubeRay-like reconciler, HyperPod-like agent and SageMaker endpoint")
    t0 = time.monotonic()
    cluster = EmbeddedKubernetes(cfg).up()
    try:
        reporter.say(f"embedded Kubernetes cluster up in {time.monotonic() - t0:.1f} s: API {cluster.server.url}, "
                     f"kubeconfig {cluster.kubeconfig}, dashboard {cluster.dashboard_url}")
        yield backends.for_profile(profile_from_dict(cluster.profile(), source="--chaos-kubernetes"),
                                   embedded_kubernetes=cluster)
    finally:
        cluster.down()
        reporter.say("embedded Kubernetes cluster stopped")


def _xdist_worker(config) -> str | None:
    """``gwN`` in a pytest-xdist worker — not in a session a worker's test started (which
    inherits PYTEST_XDIST_WORKER but is a session of its own)."""
    return getattr(config, "workerinput", {}).get("workerid")


def _slot(config, offset: int) -> int | None:
    """The cluster slot of this pytest-xdist worker (gwN): 2N for the embedded cluster,
    2N+1 for the embedded Kubernetes one; None without xdist: the cluster claims the
    highest free slot (chaos.embedded.cluster.claim_slot)."""
    from chaos.embedded.cluster import SLOTS

    worker = _xdist_worker(config) or ""
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        return None
    slot = 2 * int(worker[2:]) + offset
    if slot >= SLOTS:
        pytest.exit(f"pytest-xdist worker {worker}: at most {SLOTS // 2} workers (-n) can each have an embedded "
                    "cluster and an embedded Kubernetes cluster", returncode=4)
    return slot


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
    def _script_source(self) -> str | None:
        """Where the user's own training script comes from, or None (the reference workload runs)."""
        if self._opt("chaos_workload") is not None:
            return "--chaos-workload"
        profile = self.env.backend.profile
        if profile is not None and profile.workload.kind == "entrypoint":
            return "the profile's workload.entrypoint"
        return None

    @property
    def user_workload(self) -> bool:
        """The session runs the user's own script (``--chaos-workload`` or a profile's entrypoint)."""
        return self._script_source is not None

    def workload(self, storage: str = "default", **params) -> RunSpec:
        """The reference workload with ``params`` — or the user's own script, when the session
        has one (``--chaos-workload``, a profile's ``workload.entrypoint``).  A script sets its
        own workers, budget and steps, so with one, ``params`` fail the test naming them:
        ignoring them would judge the script against settings it never had.
        ``storage="s3"``: checkpoints on the backend's S3 storage (the profile's, or the
        embedded cluster's own moto server behind the fault proxy), which a backend without one
        skips; every run on S3 storage gets its endpoint and credentials in its environment."""
        if storage not in ("default", "s3"):
            raise ValueError(f"storage={storage!r}: 'default' (the backend's) or 's3'")
        backend = self.env.backend
        store = backend.object_storage if storage == "s3" or backend.storage_path.startswith("s3://") else None
        if storage == "s3" and store is None:
            pytest.skip(f"needs S3 storage: this session's backend ({backend.label}) checkpoints to "
                        f"{backend.storage_path} (a profile's storage.path: s3://bucket/prefix)")
        spec = self._workload(store.path if storage == "s3" else backend.storage_path, **params)
        if store is not None:
            spec.env_vars = {**store.job_env(), **spec.env_vars}
        return spec

    def _workload(self, storage_path: str, **params) -> RunSpec:
        # Unique per call: Train resumes from any checkpoint already under storage/name.
        name = self.request.node.name.replace("[", "-").replace("]", "")[:40].strip("-_") + "-" + uuid.uuid4().hex[:6]
        if self.user_workload and params:
            given = ", ".join(f"{k}={v!r}" for k, v in params.items())
            pytest.fail(f"chaos.workload({given}): this session runs your own training script "
                        f"({self._script_source}), which cannot take these: they set up the reference workload, and "
                        "your script sets its own (workers, FailureConfig, steps, checkpoints). Call chaos.workload() "
                        "without arguments in a test meant for your script, or run this test without a script of "
                        "your own", pytrace=False)
        if self._opt("chaos_workload") is not None:
            return user_spec(self._opt("chaos_workload"), name, step_metric=self._opt("chaos_step_metric"),
                             working_dir=self._opt("chaos_workload_dir"), state_metric=self._opt("chaos_state_metric"),
                             deterministic=self._opt("chaos_deterministic"))
        profile = self.env.backend.profile
        if profile is not None and profile.workload.kind == "entrypoint":
            return profile_workload_spec(profile.workload, name, deterministic=self._opt("chaos_deterministic"))
        if profile is not None and profile.workload.reference is not None:
            # The profile sizes the reference workload for its cluster; a suite's own arguments
            # are what that test is about, so they win where both are given.
            for key, value in profile.workload.reference.model_dump(exclude_unset=True).items():
                params.setdefault(key, value)
        params.setdefault("seed", self._opt("chaos_seed"))
        params.setdefault("python", self.env.backend.python)
        return reference_spec(name, storage_path, **params)

    def fault(self, kind: str, **params):
        """A fault of catalog kind ``kind`` with ``params`` (``rank=``, ...), built by its class's
        factory (``Fault.build``: defaults from the profile and the command line).  A kind that
        needs a capability this session's backend lacks (the Kubernetes API, control of the
        head) skips the test saying so.  ``chaos.raylet_kill(rank=1)`` is
        ``chaos.fault("raylet-kill", rank=1)``: every kind is an attribute, ``-`` spelt ``_``."""
        from chaos.faults.base import FaultSettings
        from chaos.faults.registry import fault_class

        entry = catalog.kind(kind)
        backend = self.env.backend
        if entry.needs is not None and getattr(backend, entry.needs) is None:
            pytest.skip(f"{kind} needs {catalog.CAPABILITIES[entry.needs]}: this session's backend is {backend.label}")
        refused = self.request.config.stash.get(_BLOCKED, {}).get(kind)
        if refused:
            pytest.fail(f"{kind} refused before any injection: the preflight (ray-chaos doctor) found it cannot run "
                        f"on this cluster: {' | '.join(refused)}", pytrace=False)
        return fault_class(kind).build(FaultSettings(profile=backend.profile, raylet_kill=self._opt("chaos_raylet_kill")),
                                       **params)

    def __getattr__(self, name: str):
        kind = name.replace("_", "-")
        if name.startswith("_") or kind not in catalog.KINDS:
            raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r} (fault kinds: "
                                 f"{', '.join(k.replace('-', '_') for k in catalog.KINDS)})")
        return functools.partial(self.fault, kind)

    def correlated(self, fault, ranks, start_timeout_s: float = 30.0):
        """``fault`` (anything called with ``rank=``: ``chaos.raylet_kill``, ``NodeReboot``) on
        the nodes of every rank in ``ranks`` in one instant, as a rack or power domain goes;
        one charge expected (what Ray 2.60 does, README)."""
        from chaos.faults.correlated import Correlated

        return Correlated.on_ranks(fault, ranks, start_timeout_s=start_timeout_s)

    # ``chaos.expect(...)`` is the Expect itself (keyword-only): what a suite says should happen, its
    # unset fields derived by ``run`` (``_expectation``).
    expect = staticmethod(Expect)

    def _expectation(self, expect: Expect, faults: list, workload: RunSpec) -> Expect:
        """``expect`` with its unset fields derived from ``faults``, the profile and the options."""
        profile = self.env.backend.profile
        kinds = sorted({f.kind for _, f in faults})
        by_kind = {k: expected_charge(k, profile) for k in kinds}
        # a kind whose charge is measured (xid, storage) is judged by charge_outcomes instead
        implied = dict(collections.Counter(c for _, f in faults if (c := by_kind[f.kind])
                                           and not catalog.kind(f.kind).charge_measured))
        charged = implied if expect.charged is None else expect.charged
        named = {k: v for k, v in charged.items() if v}
        if named != implied:  # the suite's own totals: a kind whose class they do not name claims none
            by_kind = {k: c if c in named else None for k, c in by_kind.items()}
        slos = [self._slo_for(k) for k in kinds] or [self._slo_for(None)]
        return dataclasses.replace(
            expect, charged=charged,
            charge_by_kind=expect.charge_by_kind if expect.charge_by_kind is not None else by_kind,
            slo_detect_s=expect.slo_detect_s if expect.slo_detect_s is not None else min(d for d, _ in slos),
            slo_recover_s=expect.slo_recover_s if expect.slo_recover_s is not None else min(r for _, r in slos),
            deterministic=workload.deterministic if expect.deterministic is None else expect.deterministic,
            baseline=expect.baseline or bool(self._opt("chaos_baseline")),
            state_rtol=_state_rtol(expect.state_rtol, self._opt("chaos_state_rtol")))

    def _slo_for(self, kind: str | None) -> tuple[float, float]:
        """(detect, recover) SLOs for a fault kind: an option given on the command line, else the
        profile's for the kind, else the catalog's (None: no fault, the catalog's defaults)."""
        profile = self.env.backend.profile
        own = (profile.slo_for(kind) if profile is not None and kind is not None else
               (catalog.kind(kind).slo_detect_s, catalog.kind(kind).slo_recover_s) if kind is not None else
               (catalog.DEFAULT_SLO_DETECT_S, catalog.DEFAULT_SLO_RECOVER_S))
        given = (self._opt("chaos_slo_detect"), self._opt("chaos_slo_recover"))
        return (given[0] if given[0] is not None else own[0], given[1] if given[1] is not None else own[1])

    def run(self, workload: RunSpec, faults: list, expect: Expect | None = None) -> Outcome:
        """Run ``faults`` [(trigger, fault)] against ``workload``; ``expect`` overrides what
        the faults imply.  A fault-free baseline of the workload is made (or taken from the
        cache) first where the suite compares with one, and after the run where a
        deterministic run re-did too few steps to show its restored state (chaos.verdicts.state)."""
        expectation = self._expectation(expect or Expect(), faults, workload)
        reporter = live_reporter(self.request.config)
        judging = Judging(self._opt("chaos_unverifiable"), self._opt("chaos_stall_limit"), self._opt("chaos_crash_loop"))
        if self.env.dry_run:
            self._plan(workload, faults, expectation, reporter)
        try:
            if (expectation.final_state or expectation.baseline) and not self.env.rehearsal:  # same cluster, first
                expectation = dataclasses.replace(expectation, reference=self._baseline(workload, faults, reporter,
                                                                                          judging))
            exp = Experiment(self.env, workload, faults, expectation, self.request.node.nodeid, reporter=reporter,
                             judging=judging)
            self.experiments.append(exp)
            outcome = exp.run()
            if not self.env.rehearsal and any(v.diagnosis is Diagnosis.TOO_FEW_REDONE for v in outcome.verdicts):
                reference = expectation.reference or self._baseline(workload, faults, reporter, judging)
                exp.rejudge(dataclasses.replace(expectation, baseline=True, reference=reference))
        except Aborted as e:
            pytest.skip(f"ABORTED (not failed): {e}")
        if self.env.rehearsal:
            pytest.skip("rehearsal: the run went to every trigger and each target was resolved and checked; nothing "
                        "was injected")
        return outcome

    def _baseline(self, workload: RunSpec, faults: list, reporter: Reporter, judging: Judging):
        from chaos.baseline import baseline_for

        return baseline_for(self.env, workload, faults, self.request.node.nodeid, reporter, judging,
                            refresh=self._opt("chaos_refresh_baselines"))

    def _plan(self, workload: RunSpec, faults: list, expectation: Expect, reporter: Reporter) -> None:
        """Print (and attach) the test's plan from read-only state, then skip it (chaos.plan)."""
        from chaos import plan

        backend = self.env.backend
        text = plan.lines(self.request.node.nodeid, backend, workload, faults, expectation, plan.Nodes.read(backend),
                          backend.lock_state(), baseline=expectation.final_state or expectation.baseline)
        for line in text:
            reporter.say(line)
        reporter.attach_text("dry-run plan", "\n".join(text))
        pytest.skip(f"dry run: plan of {len(faults)} fault(s) printed; nothing submitted, locked, recorded or touched")

    @property
    def embedded(self):
        """The embedded cluster (chaos.embedded.cluster.EmbeddedCluster), None on a profile's cluster."""
        return self.env.backend.embedded

    @property
    def embedded_kubernetes(self):
        """The embedded Kubernetes cluster (chaos.embedded.kubernetes.EmbeddedKubernetes) under
        --chaos-kubernetes, else None."""
        return self.env.backend.embedded_kubernetes


@pytest.fixture
def chaos(chaos_env, request) -> Chaos:
    helper = Chaos(chaos_env, request)
    yield helper
    for exp in helper.experiments:
        request.config.stash[_RECORDS][request.node.nodeid] = exp


def _skip_not_started():
    """A dry run's test (or fixture) that needs the embedded cluster it does not start is
    skipped, saying why."""
    from chaos.experiment import NotStarted

    try:
        return (yield)
    except NotStarted as e:
        pytest.skip(f"dry run: {e}")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    return (yield from _skip_not_started())


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    return (yield from _skip_not_started())


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
