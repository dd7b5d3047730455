"""A seeded fault campaign: one long training run through a whole schedule of mixed faults.

Marker ``soak`` only, not ``chaos``: ``make chaos`` (``-m "chaos and ..."``) never selects
it and a plain ``pytest`` deselects it; ``make soak DURATION=S`` runs it.  The schedule is
drawn from ``--chaos-seed`` (which also seeds the reference workload) or replayed from
``--chaos-schedule FILE``; the one used is printed, attached to the report as JSON and
written to ``reports/runs/test_campaign/schedule.json`` before the run starts, so a
failing campaign can be replayed exactly.  Each fault is detected and recovered from
before the next trigger is awaited (chaos.experiment); every restart is judged by
resumed-from-latest, the charges of all faults together by within-budget (each kind's
budget class, from the catalog or the profile), plus recovery time per fault, the run's
end and healing.
"""

import pytest

from chaos.campaign import Schedule, ScheduleError, check_kinds, draw
from chaos.pytest_plugin import live_reporter
from chaos.transport.ssh import SSHTransport

pytestmark = pytest.mark.soak

# The run's shape.  A step of 1 s leaves room to land "just before"/"during" a commit (the
# controller sees reports on a 0.5 s poll); 2 ranks on the embedded cluster's 3 worker hosts
# leave one spare, so a restart need not wait for node recovery.
STEP_TIME_S = 1.0
CHECKPOINT_EVERY = 5
NUM_WORKERS = 2
# Sizing the run from --chaos-duration: submission to first report, and per fault its
# detection plus the next worker group's first report (measured 20-25 s on a busy 2-core box).
START_S = 30.0
RESTART_S = 30.0
STEP_OVERHEAD = 1.1  # a step's report round on top of its step time
SECONDS_PER_FAULT = 100.0  # the default number of faults: one per this many seconds, at least 2


def steps_for(duration_s: float, faults: int) -> int:
    """Steps that fill ``duration_s`` once start-up and ``faults`` restarts are paid for."""
    return int((duration_s - START_S - faults * RESTART_S) / (STEP_TIME_S * STEP_OVERHEAD))


def backend_kinds(chaos) -> list[str]:
    """The kinds this session's backend injects reliably (charged as the catalog says)."""
    if chaos.env.backend.kube is not None:
        return ["pod-delete", "hyperpod-reboot", "raylet-kill"]
    kinds = ["raylet-kill", "worker-kill", "preempt"]
    workers = chaos.env.cluster.alive_workers()
    if workers and isinstance(chaos.env.backend.host(workers[0].node_id).transport, SSHTransport):
        kinds += ["node-reboot", "partition"]  # need a host reached over SSH (test hosts)
    return kinds


@pytest.fixture
def schedule(chaos, request) -> Schedule:
    """The campaign: replayed from --chaos-schedule, else drawn from --chaos-seed and sized
    from --chaos-duration; recorded before anything is injected."""
    opt = request.config.getoption
    if chaos.user_workload or (chaos.env.backend.profile is not None
                               and chaos.env.backend.profile.workload.kind == "entrypoint"):
        pytest.skip("a campaign sizes the reference workload (steps, checkpoints, step time); "
                    "your own script's steps are not the harness's to set")
    if opt("chaos_schedule"):
        s = Schedule.load(opt("chaos_schedule"))
        source = f"replayed from {opt('chaos_schedule')}"
    else:
        duration = opt("chaos_duration")
        faults = opt("chaos_campaign_faults") or max(2, int(duration // SECONDS_PER_FAULT))
        kinds = (check_kinds(k.strip() for k in opt("chaos_campaign_kinds").split(",") if k.strip())
                 if opt("chaos_campaign_kinds") else backend_kinds(chaos))
        steps = steps_for(duration, faults)
        try:
            s = draw(opt("chaos_seed"), kinds, faults=faults, ranks=NUM_WORKERS, steps=max(steps, 1),
                     checkpoint_every=CHECKPOINT_EVERY, step_time=STEP_TIME_S)
        except ScheduleError as e:
            pytest.fail(f"--chaos-duration {duration:g} s sizes a {steps}-step run for {faults} faults: {e} "
                        "(raise --chaos-duration or lower --chaos-campaign-faults)", pytrace=False)
        source = f"drawn from --chaos-seed {s.seed} for --chaos-duration {duration:g} s"
    # The longest wait for a trigger is about two slots of the run: it must fit the trigger timeout.
    slot_s = s.workload.steps / len(s.entries) * s.workload.step_time * STEP_OVERHEAD
    if 2 * slot_s > chaos.env.timeouts.trigger_s:
        pytest.fail(f"the campaign's faults are {slot_s:.0f} s of training apart, up to twice that between two "
                    f"triggers, beyond the {chaos.env.timeouts.trigger_s:.0f} s trigger timeout: draw more faults "
                    "(--chaos-campaign-faults) or a shorter run", pytrace=False)
    path = s.dump(f"{opt('chaos_reports')}/runs/{request.node.name}/schedule.json")
    reporter = live_reporter(request.config)
    reporter.say(f"campaign {source}; written to {path} (replay: --chaos-schedule {path})\n{s.describe()}")
    reporter.attach_json("schedule", s.to_json())
    reporter.parameter("campaign seed", s.seed)
    return s


def test_campaign(chaos, schedule):
    """Every fault of the schedule in one run: each restart resumes from the latest
    checkpoint, the faults together cost what their kinds should (each budget one more
    than its charges, so a wrong or extra charge shows as a verdict, not a hang), the run
    finishes, the cluster heals."""
    w = schedule.workload
    alive = len(chaos.env.cluster.alive_workers())
    if w.num_workers > alive:
        pytest.fail(f"the schedule runs {w.num_workers} ranks and this cluster has {alive} worker nodes",
                    pytrace=False)
    charges = schedule.charges(chaos.env.backend.profile)
    spec = chaos.workload(num_workers=w.num_workers, steps=w.steps, checkpoint_every=w.checkpoint_every,
                          step_time=w.step_time, seed=schedule.seed,
                          max_failures=charges.get("worker_group", 0) + 1,
                          max_preemption_failures=charges.get("preemption", 0) + 1)
    outcome = chaos.run(spec, faults=schedule.to_faults(chaos))
    outcome.assert_verdicts()
    resumes = [v for v in outcome.verdicts if v.name.startswith("resumed-from-latest")]
    assert len(resumes) >= len(schedule.entries), (
        f"{len(schedule.entries)} faults but {len(resumes)} restarts judged: "
        + "; ".join(v.line() for v in outcome.verdicts))
