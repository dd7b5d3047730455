"""Correlated faults: fail-closed safety, a real parallel fan-out, per-member ledger results,
failures named by host, and one recovery (not k) in the metrics and verdicts."""

import threading

import pytest

from chaos.backends.base import Host
from chaos.errors import InjectionError
from chaos.experiment import Environment, Experiment
from chaos.faults.base import Fault, FaultContext, placement_target
from chaos.faults.correlated import Correlated, fan_out
from chaos.ledger import Ledger
from chaos.report import Reporter
from chaos.safety import LiveFaults, TargetRefused
from chaos.summary import metrics_for
from chaos.timeline import Event, Timeline, fault_groups, recovery_metrics
from chaos.verdicts import Expect
from chaos.verdicts.recovery import recovery_time
from chaos.verdicts.budget import within_budget
from timelines import Script


class FakeBackend:
    """Safety check, hosts and live-fault slots, as the experiment asks a backend for them."""

    label = "fake"

    def __init__(self, refuse=(), max_live=3):
        self.refuse, self.checked = set(refuse), []
        self.live_faults = LiveFaults(max_live)

    def check_target(self, target):
        self.checked.append(target.node_id)
        if target.node_id in self.refuse:
            raise TargetRefused(f"node {target.node_id} is not on the allowlist", "safety.allowlist")

    def check_privileges(self, kind, target):
        """Every member's host gives root (a refusal is test_privilege_refusal.py's)."""

    def host(self, node_id):
        return Host(key=node_id, name=f"host-{node_id}", transport=None)


class BarrierFault(Fault):
    """A raylet kill whose inject only returns once every member is inside inject at the
    same time: a sequential fan-out breaks the barrier and fails."""

    kind = "raylet-kill"

    def __init__(self, rank, barrier, fail=None, calls=None):
        self.rank, self.barrier, self.fail, self.calls = rank, barrier, fail, calls if calls is not None else []

    def describe(self):
        return f"fake kill of rank {self.rank}"

    def resolve(self, ctx):
        return placement_target(ctx, self.rank)

    def inject(self, ctx, inj):
        self.calls.append(self.rank)
        self.barrier.wait()  # BrokenBarrierError after its timeout unless every member is here at once
        if self.fail:
            raise InjectionError(self.fail)
        return {"killed_rank": self.rank}

    def after_detect(self, ctx, inj):
        self.barrier.wait()  # the same proof for the waits after detection


def placement(ranks=3):
    tl = Timeline()
    tl.emit("recorder", "attempt_started", attempt=0,
            placement=[{"rank": r, "node_id": f"n{r}", "node_ip": f"198.18.0.{r + 2}", "pid": 100 + r}
                       for r in range(ranks)])
    return tl


def experiment(tmp_path, backend, lines):
    """An experiment whose timeline already holds attempt 0's placement, and its fault context."""
    env = Environment(backend=backend, ledger=Ledger(tmp_path / "ledger.jsonl"), out_dir=tmp_path)
    exp = Experiment(env, spec=None, faults=[], expect=Expect(), test_id="t::correlated",
                     reporter=Reporter(echo=lines.append))
    exp.timeline = placement()
    return exp, FaultContext(None, exp.timeline, backend)


def group(ranks, barrier, fail=None, calls=None):
    return Correlated([BarrierFault(r, barrier, (fail or {}).get(r), calls) for r in ranks])


def test_one_refused_member_means_nothing_is_injected(tmp_path):
    backend, lines, calls = FakeBackend(refuse={"n1"}), [], []
    exp, ctx = experiment(tmp_path, backend, lines)
    with pytest.raises(InjectionError, match=r"nothing injected, 1 of 3 members refused: rank 1 on node n1 "
                                             r"\(host-n1\): node n1 is not on the allowlist"):
        exp._inject_group(ctx, group([0, 1, 2], threading.Barrier(3, timeout=1), calls=calls))
    assert backend.checked == ["n0", "n1", "n2"], "every member is checked before anything is injected"
    assert calls == [] and exp._injections == [] and exp._armed == []
    assert exp.env.ledger.entries() == {} and exp.timeline.of("fault_injected") == []
    assert len(backend.live_faults) == 0


def test_not_enough_live_fault_slots_means_nothing_is_injected(tmp_path):
    backend, calls = FakeBackend(max_live=2), []
    exp, ctx = experiment(tmp_path, backend, [])
    with pytest.raises(InjectionError, match=r"nothing injected: refusing fake kill of rank 2: at most 2 faults"):
        exp._inject_group(ctx, group([0, 1, 2], threading.Barrier(3, timeout=1), calls=calls))
    assert calls == [] and exp.env.ledger.entries() == {} and len(backend.live_faults) == 0


def test_members_are_injected_at_once_each_with_its_ledger_entry_and_result(tmp_path):
    backend, lines = FakeBackend(), []
    exp, ctx = experiment(tmp_path, backend, lines)
    targets = exp._inject_group(ctx, group([0, 2], threading.Barrier(2, timeout=5)))
    assert [t.node_id for t in targets] == ["n0", "n2"]
    entries = exp.env.ledger.entries()
    assert len(entries) == 2 and len({e["group"] for e in entries.values()}) == 1
    for inj in exp._injections:
        e = entries[inj.ledger_id]
        assert e["state"] == "injected" and e["killed_rank"] == inj.target.rank
        assert e["result"]["ok"] and e["result"]["host"] == f"host-{inj.target.node_id}"
        assert e["result"]["took_s"] >= 0 and e["revert"]["action"] == "none"
        assert inj.evidence["correlated"]["members"] == 2 and inj.slot is not None
    injected = exp.timeline.of("fault_injected")
    assert len(injected) == 2 and len({e.data["group"] for e in injected}) == 1
    assert len(exp.timeline.of("fault_returned")) == 2
    assert any("2 of 2 hosts injected, issued within" in line for line in lines), lines
    assert any("host-n2 (rank 2): ok in" in line for line in lines), lines


def test_a_sequential_fan_out_would_break_the_barrier():
    """The test's own fake proves something: run one member after the other and it fails."""
    barrier = threading.Barrier(2, timeout=0.3)
    with pytest.raises(threading.BrokenBarrierError):
        BarrierFault(0, barrier).inject(None, None)


def test_a_failed_member_is_named_by_host_stays_armed_and_is_reverted(tmp_path):
    backend, lines = FakeBackend(), []
    exp, ctx = experiment(tmp_path, backend, lines)
    with pytest.raises(InjectionError, match=r"correlated injection failed on 1 of 2 hosts: host-n1 \(rank 1\): "
                                             r"FAILED in [0-9.]+ s: InjectionError: permission denied"):
        exp._inject_group(ctx, group([0, 1], threading.Barrier(2, timeout=5), fail={1: "permission denied"}))
    entries = exp.env.ledger.entries()
    by_rank = {e["target"]["rank"]: e for e in entries.values()}
    assert by_rank[0]["state"] == "injected" and by_rank[0]["result"]["ok"]
    assert by_rank[1]["state"] == "failed" and "permission denied" in by_rank[1]["error"]
    assert by_rank[1]["result"] == by_rank[1]["result"] | {"ok": False, "host": "host-n1", "rank": 1}
    assert len(exp._armed) == 2, "the failed member is still armed, so it is reverted"
    exp._revert_all(ctx, final=True)
    assert {e["state"] for e in exp.env.ledger.entries().values()} == {"nothing-to-revert"}
    assert len(ctx.timeline.of("fault_reverted")) == 2 and len(backend.live_faults) == 0
    assert {e.data["group"] for e in ctx.timeline.of("fault_reverted")} == {by_rank[0]["group"]}


def test_members_that_cannot_start_together_are_none_of_them_issued(monkeypatch):
    """With one thread for two members the barrier breaks: every member says why, none is issued."""
    import concurrent.futures

    from chaos.faults import correlated

    real = concurrent.futures.ThreadPoolExecutor
    monkeypatch.setattr(correlated.concurrent.futures, "ThreadPoolExecutor",
                        lambda max_workers, thread_name_prefix: real(max_workers=1))
    issued = []
    res = fan_out([_FakeInj("a"), _FakeInj("b")], lambda inj: issued.append(inj) or {}, start_timeout_s=0.2)
    assert issued == [] and [r.ok for r in res] == [False, False]
    assert all("did not all reach the start barrier within 0 s" in r.error for r in res)


class _FakeInj:
    def __init__(self, name):
        self.host = Host(key=name, name=name, transport=None)


def test_after_detect_runs_for_every_member_in_parallel(tmp_path):
    backend = FakeBackend()
    exp, ctx = experiment(tmp_path, backend, [])
    exp._inject_group(ctx, group([0, 1, 2], threading.Barrier(3, timeout=5)))
    exp._after_detect(ctx, exp._injections)  # each member's after_detect waits for the others: parallel or broken


def test_two_ranks_on_one_node_are_refused_before_anything():
    backend = FakeBackend()
    tl = Timeline()
    tl.emit("recorder", "attempt_started", attempt=0,
            placement=[{"rank": 0, "node_id": "n0", "node_ip": "a"}, {"rank": 1, "node_id": "n0", "node_ip": "a"}])
    targets = [placement_target(FaultContext(None, tl, backend), r) for r in (0, 1)]
    with pytest.raises(InjectionError, match="are on the same node"):
        Correlated.check_distinct(targets)


def test_a_group_is_one_fault_kind_on_distinct_ranks():
    b = threading.Barrier(1)
    with pytest.raises(ValueError, match=r"rank\(s\) \[1\] named twice"):
        Correlated.on_ranks(lambda rank: BarrierFault(rank, b), [1, 0, 1])
    with pytest.raises(ValueError, match="at least one member"):
        Correlated([])
    g = Correlated.on_ranks(lambda rank: BarrierFault(rank, b), [0, 1])
    assert (g.kind, g.budget_class, g.kills_node) == ("raylet-kill", "worker_group", True)


def correlated_kill(s, nodes=("n0", "n1"), group_id="g1", detect=(1.5, 2.5)):
    """Two members of one correlated raylet kill, as the experiment records them."""
    t0 = s.t + 0.5
    for i, node in enumerate(nodes):
        s.events.append(Event(t0 + 0.001 * i, "fault", "fault_injected",
                              {"fault": "raylet-kill", "ledger_id": f"{group_id}-{i}", "group": group_id,
                               "target": {"node_id": node}}))
        s.events.append(Event(t0 + 0.05, "fault", "fault_returned",
                              {"ledger_id": f"{group_id}-{i}", "group": group_id}))
        s.events.append(Event(t0 + detect[i], "cluster", "node_dead", {"node_id": node}))
        s.events.append(Event(t0 + detect[i], "fault", "fault_detected",
                              {"ledger_id": f"{group_id}-{i}", "group": group_id, "by": "node_dead"}))
    s.t = t0 + max(detect)
    return s


def test_a_correlated_fault_is_one_recovery_and_one_charge():
    s = Script(ranks=2).start_attempt().steps(1, 12)
    tl = correlated_kill(s).decision().start_attempt(dt=5.0).steps(11, 20).finish().timeline()
    assert [len(g) for g in fault_groups(tl)] == [2]
    [m] = recovery_metrics(tl)
    assert m.members == 2 and m.time_to_detect == pytest.approx(2.5), "detected once the last member was"
    assert m.recovered_attempt == 1 and m.steps_lost == 2 and m.inject_took == pytest.approx(0.05)
    metrics = metrics_for(tl, {"max_failures": 3})
    assert len(metrics["faults"]) == 1 and metrics["charged"]["worker_group"]["count"] == 1
    [verdict] = recovery_time(tl, Expect(slo_detect_s=30, slo_recover_s=120))
    assert verdict.name == "recovery-time (fault 1)" and verdict.status == "pass"
    budget = within_budget(tl, Expect(charged={"worker_group": 1}))
    assert budget.status == "pass", budget.message
    # the group claims the decision as one fault (not its last member alone)
    assert {k: len(v) for k, v in budget.evidence["attributed"].items()} == {"g1": 1}, budget.evidence


def test_ungrouped_faults_stay_separate_recoveries():
    s = Script(ranks=2).start_attempt().steps(1, 10).fault("n0").decision().start_attempt().steps(6, 12)
    s = correlated_kill(s, ("n0", "n1"), "g2").decision().start_attempt(dt=3.0).steps(11, 15).fault("n1")
    tl = s.decision().start_attempt().steps(11, 20).finish().timeline()
    assert [len(g) for g in fault_groups(tl)] == [1, 2, 1]
    assert [m.members for m in recovery_metrics(tl)] == [1, 2, 1]
