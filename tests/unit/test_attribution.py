"""Which fault a failure decision belongs to: by what failed and where, never by time alone.

Each false pass (a failure the timing would have charged to a fault) sits beside its
healthy twin (the same timeline where the fault's own rank or node failed).  Ranks run on
node n<rank> (127.0.1.<rank + 2>) in every attempt of a ``Script``.
"""

from chaos.timeline import Event
from chaos.attribution import attribute
from chaos.verdicts import Expect
from chaos.verdicts.budget import within_budget
from timelines import Script

EXPECT_ONE = Expect(charged={"worker_group": 1})
EXPECT_PREEMPTION = Expect(charged={"preemption": 1})
# what the recorder taped on real runs (tests/contract/fixtures), shortened
GLOO_PEER = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
             "by peer [127.0.1.3]:396. This is typically caused by a remote worker crashing.")
GLOO_TIMEOUT = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                "15000ms for recv operation to complete")
ACTOR_DIED = "ActorDiedError: The actor died unexpectedly before finishing this task.\n\tclass_name: RayTrainWorker"
HEALTH = "WorkerHealthCheckFailedError: A worker health check failed.\nWorker info: Worker("
CUDA = "RuntimeError: CUDA error: uncorrectable ECC error encountered (CUDA_ERROR_ECC_UNCORRECTABLE)"
CRASH = "ValueError: bad batch at step 13"
PREEMPTED = "Training was interrupted by node preemption (preempted_ranks=[1], drain_timed_out=False)."


def fails(s, errors, budget_class="worker_group", limit=3, decision="RETRY"):
    """The attempt's ranks fail with ``errors`` ({rank: "Type: message"}) and Ray decides: the
    decision carries the failure's classes, as the recorder takes them from Ray's record."""
    types = sorted({m.split(":", 1)[0] for m in errors.values()})
    first = errors[min(errors)]
    return s.worker_error(errors).decision(decision, budget_class, limit=limit, error=f"[Rank {min(errors)}] {first}",
                                           error_types=("WorkerGroupError", *types))


def charged(v):
    return {k: len(ds) for k, ds in v.evidence["attributed"].items()}


# -- (1) a crash on another node right after a fault is not the fault's ----------------------
def crash_after(fault, rank, error):
    s = fault(Script().start_attempt().steps(1, 12))
    return fails(s, {rank: error}).start_attempt().steps(11, 20).finish().timeline()


def test_a_crash_of_a_rank_on_another_node_after_a_fault_is_unrelated():
    """The fault (a CUDA error that never fired, or a node Ray never charged) is followed by a
    script's crash on rank 0: the timing alone would charge the crash to the fault and pass."""
    for fault in (lambda s: s.rank_fault("cuda", rank=1), lambda s: s.fault("n1")):
        v = within_budget(crash_after(fault, 0, CRASH), EXPECT_ONE)
        assert v.status == "fail" and v.diagnosis == "unrelated failure", v.line()
        assert v.message.startswith("unrelated failure: attempt 0 failed with ValueError: bad batch at step 13 "
                                    "(charged to max_failures)"), v.message
        assert ("rank 0 on node n0 (127.0.1.2) failed with ValueError, not on the fault's node n1 (127.0.1.3)"
                in v.message), v.message
        assert charged(v) == {"f1": 0}, "the fault claims nothing"
        [u] = v.evidence["unrelated"]
        assert (u["rank"], u["node"], u["outcome"]) == ("0", "n0 (127.0.1.2)", "other"), u


def test_twin_the_same_failure_of_the_faults_own_rank_is_the_faults():
    for fault in (lambda s: s.rank_fault("cuda", rank=1), lambda s: s.fault("n1")):
        v = within_budget(crash_after(fault, 1, CUDA), EXPECT_ONE)
        assert v.status == "pass", v.line()
        assert charged(v) == {"f1": 1} and v.evidence["unrelated"] == []
        assert v.evidence["attributed_why"]["f1"] == ["rank 1 on node n1 (127.0.1.3), the fault's node, failed "
                                                      "with RuntimeError"]


def test_a_crash_beside_the_faults_rank_is_judged_by_the_rank_that_failed_on_its_own():
    """Rank 0 crashed; rank 1 (on the fault's node) only lost its peer: the crash is unrelated."""
    s = Script().start_attempt().steps(1, 12).rank_fault("cuda", rank=1)
    tl = fails(s, {0: CRASH, 1: GLOO_PEER}).start_attempt().steps(11, 20).finish().timeline()
    v = within_budget(tl, EXPECT_ONE)
    assert v.diagnosis == "unrelated failure" and "rank 0 on node n0" in v.message, v.line()


# -- (2) a node killed under rank 1: the survivor's gloo error and the target's death -------
def raylet_kill(errors, node="n1"):
    s = Script().start_attempt().steps(1, 12).fault(node)
    return fails(s, errors).start_attempt().steps(11, 20).finish().timeline()


def test_a_killed_node_is_the_faults_whichever_rank_failed_first():
    for errors in ({0: GLOO_PEER, 1: ACTOR_DIED}, {0: GLOO_PEER, 1: HEALTH}, {1: HEALTH}):
        v = within_budget(raylet_kill(errors), EXPECT_ONE)
        assert v.status == "pass" and charged(v) == {"f1": 1}, (errors, v.line())
        assert "was lost" in v.evidence["attributed_why"]["f1"][0]


def test_the_survivors_broken_collective_alone_is_the_faults_when_its_node_was_in_the_attempt():
    """Ray's first poll can carry only the survivor's gloo error, and the decision only its class."""
    v = within_budget(raylet_kill({0: GLOO_PEER}), EXPECT_ONE)
    assert v.status == "pass", v.line()
    assert "lost a peer" in v.evidence["attributed_why"]["f1"][0]


def test_twin_a_broken_collective_in_an_attempt_that_ran_nothing_on_the_faults_node_is_unrelated():
    v = within_budget(raylet_kill({0: GLOO_PEER}, node="n7"), EXPECT_ONE)
    assert v.diagnosis == "unrelated failure", v.line()
    assert "rank 0 on node n0 (127.0.1.2) lost a peer (RuntimeError" in v.message
    assert "ran nothing on the fault's node n7" in v.message


# -- (3) a CUDA fault: the target rank's own exception, or its hang's collective timeout ----
def cuda(errors):
    s = Script().start_attempt().steps(1, 12).rank_fault("cuda", rank=1)
    return fails(s, errors).start_attempt().steps(11, 20).finish().timeline()


def test_a_cuda_error_of_the_target_rank_is_the_faults():
    v = within_budget(cuda({1: CUDA}), EXPECT_ONE)
    assert v.status == "pass" and charged(v) == {"f1": 1}, v.line()


def test_a_cuda_hang_ended_by_a_peers_collective_timeout_is_the_faults():
    v = within_budget(cuda({0: GLOO_TIMEOUT}), EXPECT_ONE)
    assert v.status == "pass" and charged(v) == {"f1": 1}, v.line()


def test_a_cuda_hang_ended_by_the_survivors_broadcast_timeout_through_ray_is_the_faults():
    # seen on a real CUDA hang: the hung rank 1 never errors; rank 0's error is Train's
    # broadcast timing out, wrapped by the remote call to the SynchronizationActor
    timeout = ("RayTaskError(BroadcastCollectiveTimeoutError): \x1b[36mray::SynchronizationActor."
               "broadcast_from_rank_zero()\x1b[39m (pid=319, ip=198.18.7.1) ... timed out")
    v = within_budget(cuda({0: timeout}), EXPECT_ONE)
    assert v.status == "pass" and charged(v) == {"f1": 1}, v.line()


def test_twin_the_same_cuda_error_of_another_rank_is_unrelated():
    v = within_budget(cuda({0: CUDA}), EXPECT_ONE)
    assert v.diagnosis == "unrelated failure", v.line()
    assert "rank 0 on node n0 (127.0.1.2) failed with RuntimeError, not on the fault's node n1" in v.message
    # a script's own timeout is its exception, not a collective's: only gloo/NCCL name themselves
    v = within_budget(cuda({0: "RuntimeError: timed out waiting for the data loader"}), EXPECT_ONE)
    assert v.diagnosis == "unrelated failure", v.line()


# -- (4) a preemption and a script crash ---------------------------------------------------------
def preempted(crash_during=False):
    s = Script().start_attempt().steps(1, 12, every=10).preemption()
    s.report({0: 13, 1: 13})
    if crash_during:  # rank 0 crashes while rank 1's node drains: Train fails fast, the preemption is never charged
        fails(s, {0: CRASH}).start_attempt().gone()
        return s.steps(11, 20, every=10).finish().timeline()
    s.gone().decision(budget_class="preemption", limit=None, error=PREEMPTED, error_types=("PreemptionError",))
    return s.start_attempt().steps(11, 20, every=10).finish().timeline()


def test_a_preemption_is_charged_to_its_budget():
    v = within_budget(preempted(), EXPECT_PREEMPTION)
    assert v.status == "pass" and v.evidence["charged_by_faults"] == {"preemption": 1}, v.line()
    assert "(PreemptionError)" in v.evidence["attributed_why"]["f1"][0]


def test_a_script_crash_in_a_later_attempt_is_unrelated_and_the_preemption_still_charged_as_expected():
    s = Script().start_attempt().steps(1, 12, every=10).preemption().gone()
    s.decision(budget_class="preemption", limit=None, error=PREEMPTED, error_types=("PreemptionError",))
    fails(s.start_attempt().steps(11, 14, every=10), {0: CRASH}).start_attempt().steps(11, 20, every=10).finish()
    v = within_budget(s.timeline(), EXPECT_PREEMPTION)
    assert v.diagnosis == "unrelated failure" and v.message.startswith("unrelated failure: attempt 1 failed with "
                                                                       "ValueError"), v.line()
    assert v.evidence["charged_by_faults"] == {"preemption": 1}
    assert "rank 0 on node n0 (127.0.1.2) failed with ValueError" in v.message


def test_a_script_crash_during_a_preemption_is_unrelated_not_a_wrong_budget_class():
    """Timing alone charged the crash to the preemption: 'charged to the wrong budget class'."""
    v = within_budget(preempted(crash_during=True), EXPECT_PREEMPTION)
    assert v.status == "fail" and v.diagnosis == "unrelated failure", v.line()
    assert charged(v) == {"f1": 0}


# -- a hard pod delete may be charged as a preemption, by Ray's own race; nothing else may ----
def lost_node(kind, budget_class, faults=1):
    """``faults`` losses of rank 1's node, each charged to ``budget_class`` by Ray."""
    s = Script().start_attempt().steps(1, 12)
    for _ in range(faults):
        fails(s.fault(kind=kind), {1: HEALTH}, budget_class=budget_class, limit=None)
        s.start_attempt().steps(11, 14)
    return s.finish().timeline()


def test_a_hard_pod_delete_charged_as_a_preemption_passes_and_says_it_was_rays_race():
    v = within_budget(lost_node("pod-delete", "preemption"), EXPECT_ONE)
    assert v.status == "pass", v.line()
    assert "charged 1 to max_preemption_failures=unlimited" in v.message
    assert "the pod-delete fault's failure (attempt 0) was charged to max_preemption_failures instead, by a race " \
           "in Ray: the kubelet SIGTERMs" in v.message
    assert v.evidence["raced"] == [{"attempt": 0, "fault": "pod-delete", "charged": "preemption",
                                    "counted_as": "worker_group"}]


def test_twin_a_raylet_kill_charged_as_a_preemption_is_the_wrong_budget_class():
    v = within_budget(lost_node("raylet-kill", "preemption"), EXPECT_ONE)
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class", v.line()
    assert v.evidence["raced"] == []


def test_a_hard_pod_delete_charged_to_the_controller_budget_is_still_the_wrong_class():
    v = within_budget(lost_node("pod-delete", "controller"), EXPECT_ONE)
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class", v.line()


def test_the_race_moves_only_the_hard_deletes_own_charges_never_the_count():
    """Two hard deletes, one charged each way: both counted; expecting three still fails."""
    s = Script().start_attempt().steps(1, 12)
    for cls in ("worker_group", "preemption"):
        fails(s.fault(kind="pod-delete"), {1: HEALTH}, budget_class=cls, limit=None)
        s.start_attempt().steps(11, 14)
    tl = s.finish().timeline()
    assert within_budget(tl, Expect(charged={"worker_group": 2})).status == "pass"
    v = within_budget(tl, Expect(charged={"worker_group": 3}))
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class", v.line()
    v = within_budget(tl, Expect(charged={"preemption": 2}))
    assert v.status == "fail", v.line()


# -- (5) missing evidence is never a pass ----------------------------------------------------
def bare(error_types=(), worker_error=None, **kw):
    s = Script(**kw).start_attempt().steps(1, 12).fault()
    if worker_error:
        s.worker_error(worker_error)
    return s.decision(error="", error_types=error_types, **({"decision": "RAISE", "limit": 0} if kw else {}))


def test_a_decision_with_nothing_recorded_about_its_failure_is_unverifiable_never_a_pass():
    for types in ((), ("WorkerGroupError",), ("WorkerGroupError", "RuntimeError")):
        v = within_budget(bare(types).start_attempt().steps(11, 20).finish().timeline(), EXPECT_ONE)
        assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no failure evidence", (types, v.line())
        assert v.message.startswith("unverifiable: no failure evidence: attempt 0's failure (charged to "
                                    "max_failures) came after the fault, but Ray recorded no rank's error"), v.message
        [d] = v.evidence["attributed_by_time_only"]
        assert d["outcome"] == "unknown" and v.evidence["charged_by_faults"] == {"worker_group": 1}
    assert "only the class(es) RuntimeError" in v.message


def test_twin_the_same_decision_with_the_ranks_errors_passes():
    v = within_budget(bare(worker_error={1: HEALTH}).start_attempt().steps(11, 20).finish().timeline(), EXPECT_ONE)
    assert v.status == "pass" and v.evidence["attributed_by_time_only"] == [], v.line()


def test_an_expected_exhaustion_claimed_by_time_only_is_unverifiable_not_expected():
    tl = bare(max_failures=0).finish("ERRORED").timeline()
    v = within_budget(tl, Expect(charged={"worker_group": 1}, budget_exhausted=True))
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no failure evidence", v.line()
    tl = bare(worker_error={1: HEALTH}, max_failures=0).finish("ERRORED").timeline()
    assert within_budget(tl, Expect(charged={"worker_group": 1}, budget_exhausted=True)).status == "expected"


def test_a_rank_error_without_the_attempts_placement_cannot_be_placed():
    s = Script().start_attempt().steps(1, 12).fault()
    s.events = [e for e in s.events if e.kind != "attempt_started"]
    fails(s, {0: CRASH})
    v = within_budget(s.start_attempt().steps(11, 20).finish().timeline(), EXPECT_ONE)
    assert v.diagnosis == "unverifiable: no failure evidence", v.line()
    assert "where it ran in attempt 0 was not recorded" in v.message


# -- reach, correlated and lasting faults, capacity --------------------------------------------------
def test_a_lost_rank_in_an_attempt_the_fault_could_not_reach_is_not_its_charge():
    """A CUDA fault that never fired; rank 0 crashed; attempt 1 ran on n0 and n2, and n2's rank died."""
    def run(nodes):
        s = fails(Script().start_attempt().steps(1, 12).rank_fault("cuda", rank=1), {0: CRASH})
        s.start_attempt().steps(11, 13)
        attempt = next(e for e in reversed(s.events) if e.kind == "attempt_started")
        attempt.data["placement"] = [{"rank": r, "node_id": n, "node_ip": f"127.0.1.{9 + r}", "pid": 40 + r}
                                     for r, n in enumerate(nodes)]
        return attribute(fails(s, {1: ACTOR_DIED}).start_attempt().steps(11, 20).finish().timeline())

    att = run(["n0", "n2"])
    assert att.by_fault == {"f1": []} and len(att.unrelated) == 2
    assert "began after the fault and ran nothing on its node n1" in att.reading(att.unrelated[1]).why
    att = run(["n0", "n1"])  # twin: the restart ran on the fault's node again (a fault that lasts there)
    assert [d.attempt for d in att.by_fault["f1"]] == [1] and len(att.unrelated) == 1


def correlated(s, nodes=("n0", "n1")):
    for i, node in enumerate(nodes):
        s.events.append(Event(s.t + 0.5 + 0.001 * i, "fault", "fault_injected",
                              {"fault": "raylet-kill", "ledger_id": f"g1-{i}", "group": "g1",
                               "target": {"node_id": node, "node_ip": f"127.0.1.{int(node[1:]) + 2}"}}))
    s.t += 1.0
    return s


def test_a_correlated_fault_explains_a_failure_on_any_members_node():
    s = correlated(Script(ranks=3).start_attempt().steps(1, 12), ("n1", "n2"))
    v = within_budget(fails(s, {2: CUDA}).start_attempt().steps(11, 20).finish().timeline(), EXPECT_ONE)
    assert v.status == "pass" and charged(v) == {"g1": 1}, v.line()
    s = correlated(Script(ranks=3).start_attempt().steps(1, 12), ("n1", "n2"))  # twin: rank 0 ran elsewhere
    v = within_budget(fails(s, {0: CRASH}).start_attempt().steps(11, 20).finish().timeline(), EXPECT_ONE)
    assert v.diagnosis == "unrelated failure", v.line()
    assert "not on the fault's node n1 (127.0.1.3), n2 (127.0.1.4)" in v.message, v.message


def xid(second):
    s = Script().start_attempt().steps(1, 11).xid(agent_after=2.0, back_after=30.0)
    fails(s, {1: CUDA}).start_attempt()
    fails(s, second)
    return s.at(max(e.t for e in s.events) + 1).start_attempt().steps(11, 15).finish().timeline()


def test_a_crash_elsewhere_inside_an_xids_window_is_unrelated_not_the_platforms():
    v = within_budget(xid({0: CRASH}), Expect(charge_outcomes=[{"worker_group": 1}]))
    assert v.diagnosis == "unrelated failure", v.line()
    assert v.evidence["charged_by_node_recovery_faults"] == {"worker_group": 1}
    # twin: the restart landed on the dead GPU again: both failures are the xid's
    v = within_budget(xid({1: CUDA}), Expect(charge_outcomes=[{"worker_group": 2}]))
    assert v.status == "pass" and v.evidence["charged_by_node_recovery_faults"] == {"worker_group": 2}, v.line()


def test_a_capacity_wait_is_a_consequence_never_a_faults_own_charge():
    s = Script().start_attempt().steps(1, 12).fault()
    s.decision("RETRY", "controller", limit=None, error="The worker group startup timed out after 8.0 seconds",
               error_types=("ControllerError", "WorkerGroupStartupTimeoutError"))
    fails(s, {0: GLOO_PEER, 1: HEALTH}).start_attempt().steps(11, 20).finish()
    v = within_budget(s.timeline(), EXPECT_ONE)
    assert v.status == "pass" and "while the worker group waited" in v.message, v.line()
    assert v.evidence["charged_by_faults"] == {"worker_group": 1}
