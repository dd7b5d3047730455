"""Elastic runs (``ScalingConfig(num_workers=(min, max))``): a lost node without spare capacity.

What Ray 2.58-2.60 does, measured on the embedded cluster (3 worker hosts, one rank each):

* After the loss Train sizes the next group from Ray Data's AutoscalingCoordinator, whose view
  of the cluster is refreshed every 20 s.  The first restart therefore asks for the old size
  and waits for it; only a start that times out (``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``,
  60 s by default, a ControllerError charged to ``controller_failure_limit``) lets the next
  decision see the smaller cluster.  With the default timeout and a node back within it, an
  elastic run waits for the node just as a fixed one does; these suites set 10 s.
* The loss is charged once to ``max_failures``, as for a fixed run.
* Growing back is no failure: once the capacity is back and ``elastic_resize_monitor_interval_s``
  has passed, the healthy group goes RUNNING -> RESIZING, Train shuts it down and starts a
  bigger one (a new attempt, from the latest committed checkpoint), and the failure policy is
  never asked.

The lost host's return is timed by the suite: held down until the run has reported without
it (the per-commit suite), or back after a fixed delay, the same for a fixed and an elastic
run (the comparison).
"""

import threading

import pytest

from chaos.errors import ChaosError
from chaos.pytest_plugin import live_reporter
from chaos.summary import elastic_figures
from chaos.timeline import Event, recovery_metrics
from chaos.triggers import AfterCheckpoint
from chaos.waits import poll_until

pytestmark = pytest.mark.chaos

START_TIMEOUT_S = 10  # RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S: see the module docstring
RESIZE_INTERVAL_S = 5.0
# The fixed vs elastic comparison: the lost host back this long after its raylet died (+ its
# boot), the same for both runs.  Longer than the coordinator's 20 s tick plus a boot's spread,
# so the elastic run's smaller group is sized before the host can be seen back.
NODE_BACK_AFTER_S = 25.0
HELD_S = 600.0  # a host held down until the run has gone on without it (released then, or after this)


def _embedded_with_node_recovery(chaos):
    if chaos.user_workload or chaos.env.backend.profile is not None:
        pytest.skip("the elastic suites run the reference workload on the embedded cluster "
                    "(num_workers=(min, max), and a node recovery the suite times)")
    cluster = chaos.embedded
    if cluster is None or not cluster.config.node_recovery:
        pytest.skip("needs the embedded cluster with automatic node recovery")
    return cluster


@pytest.fixture
def node_back_after(chaos):
    """The embedded cluster brings a dead node back only after NODE_BACK_AFTER_S (restored after
    the test)."""
    cluster = _embedded_with_node_recovery(chaos)
    before, cluster.config.recovery_delay_s = cluster.config.recovery_delay_s, NODE_BACK_AFTER_S
    yield NODE_BACK_AFTER_S
    cluster.config.recovery_delay_s = before


def _went_on(events) -> Event | None:
    """The first report of an attempt started after the fault: the run has gone on (without the
    lost host, if it is elastic)."""
    fault = next((e for e in events if e.kind == "fault_injected"), None)
    started = {e.attempt for e in events if fault is not None and e.kind == "attempt_started" and e.t > fault.t}
    return next((e for e in events if e.kind == "report" and e.attempt in started), None)


@pytest.fixture
def node_back_once_the_run_went_on(chaos):
    """A dead node stays down until the run the test starts has reported from the attempt after
    the fault, then comes back at once: the elastic run's shrink and growth, each in turn,
    whatever the coordinator's tick (a host back by a fixed delay can race the shrink)."""
    cluster = _embedded_with_node_recovery(chaos)
    before, cluster.config.recovery_delay_s = cluster.config.recovery_delay_s, HELD_S
    done = threading.Event()

    def release():
        try:
            exp = poll_until(lambda: (chaos.experiments[-1] if chaos.experiments else None, "no run yet"), HELD_S,
                             "the test's run to start", stop=done)
            exp.timeline.wait_for(_went_on, HELD_S, "the run's first report after the fault")
        except ChaosError:  # the run ended or never went on: the test's assertions say how
            pass
        finally:
            cluster.config.recovery_delay_s = 0.0

    thread = threading.Thread(target=release, name="release-the-lost-host", daemon=True)
    thread.start()
    yield
    done.set()
    thread.join(timeout=HELD_S)
    cluster.config.recovery_delay_s = before


def workload(chaos, workers, **params):
    """The reference workload, ``workers`` ranks (an int, or (min, max): elastic), every rank on
    a host of its own, with the start timeout the module docstring explains."""
    elastic = isinstance(workers, tuple)
    spec = chaos.workload(num_workers=workers, resize_interval_s=RESIZE_INTERVAL_S if elastic else None,
                          max_failures=3, checkpoint_every=5, **params)
    spec.env_vars["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(START_TIMEOUT_S)
    return spec


def test_an_elastic_run_goes_on_without_the_lost_node_and_grows_back(chaos, node_back_once_the_run_went_on):
    """3 hosts, ranks (2, 3): rank 1's raylet killed after checkpoint 2.  Train goes on with 2
    ranks (charged once to max_failures); the host, held down until then, comes back and the
    run grows back to 3 with no charge, and every rank of the grown group — rank 2 too, which
    did not run while the checkpoint it resumes from was taken — resumes right after the
    latest checkpoint, from the state that checkpoint saved."""
    n = len(chaos.env.cluster.alive_workers())
    # 80 steps of 0.5 s: the growth comes within a boot, a coordinator tick (20 s) and the
    # resize interval after the release, at most ~60 steps into the smaller group
    outcome = chaos.run(workload(chaos, (n - 1, n), steps=80, step_time=0.5),
                        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))])
    outcome.assert_verdicts()
    figures = elastic_figures(outcome.timeline)
    [loss] = figures["losses"]
    assert (loss["world_size_before"], loss["world_size"]) == (n, n - 1), figures
    # Ray's own accounting: the loss once to max_failures, nothing to the preemption budget
    decisions = [(d.data["budget_class"], d.data["decision"], d.data["count"])
                 for d in outcome.timeline.of("failure_decision") if d.data.get("budget_class") != "controller"]
    assert decisions == [("worker_group", "RETRY", 1)], decisions
    [resize] = figures["resizes"]
    assert (resize["from"], resize["to"], resize["charged"]) == (n - 1, n, []), resize
    grown = outcome.verdict(f"resumed-from-latest (attempt {resize['attempt']})")
    assert set(grown.evidence["ranks"]) == set(range(n)), grown.evidence
    reporter = live_reporter(chaos.request.config)
    reporter.say(f"elastic: first report {loss['time_to_first_report_s']:.1f} s after the loss, at {n - 1} of {n} "
                 f"workers; capacity back after {loss['capacity_back_s']:.1f} s; grown back "
                 f"{resize['first_report_after_capacity_back_s']:.1f} s after it (resize interval "
                 f"{RESIZE_INTERVAL_S:g} s, resize restart {resize['restart_s']:.1f} s); "
                 f"{loss['degraded_s']:.1f} s below full size")
    reporter.attach_json("elastic figures", figures)


@pytest.mark.extended
@pytest.mark.parametrize("mode", ["fixed", "elastic"])
def test_a_fixed_run_waits_for_the_node_an_elastic_run_goes_on_without(chaos, node_back_after, mode):
    """The same loss to a fixed run of 3 ranks and to an elastic one of (2, 3), one session (make
    integration runs both, in this order): the fixed run's next attempt starts, with 3 ranks,
    only once the lost host is back; the elastic one's goes on with 2.  Each one's time to its
    first report after the loss goes to the report and to summary.json, where `ray-chaos
    project` compares them; neither is asserted on (tests never assert on wall-clock speed)."""
    n = len(chaos.env.cluster.alive_workers())
    elastic = mode == "elastic"
    outcome = chaos.run(workload(chaos, (n - 1, n) if elastic else n, steps=60, step_time=0.5),
                        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))])
    outcome.assert_verdicts()
    fault = outcome.timeline.first("fault_injected")
    recovered = next(a for a in outcome.timeline.of("attempt_started") if a.t > fault.t)
    back = next(e for e in outcome.timeline.of("node_alive") if e.t > fault.t)
    size = len(recovered.data["placement"])
    if elastic:  # a group without the lost host
        assert size == n - 1, recovered
    else:  # the whole group, a rank per host: not before the lost host is back
        assert size == n and recovered.t > back.t, (recovered, back)
    [recovery] = recovery_metrics(outcome.timeline)
    live_reporter(chaos.request.config).say(
        f"{mode} run of {n} ranks: first report {recovery.time_to_recover:.1f} s after the loss, with {size} ranks; "
        f"the lost host was back after {back.t - fault.t:.1f} s")
