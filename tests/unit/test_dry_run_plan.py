"""A dry run's plan (chaos.plan) from fakes: what each fault is, how its target will be chosen,
which nodes the safety rules allow now and why the others are refused, the trigger, the
expected charge, the SLOs, and what only a live run resolves.  And the whole path: a dry run
of a standard suite starts no cluster, writes no ledger and skips with its plan."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

from chaos import plan
from chaos.cluster import Node
from chaos.errors import ClusterError
from chaos.faults.correlated import Correlated
from chaos.faults.head import GcsKill
from chaos.faults.raylet import RayletKill
from chaos.faults.worker import TrainWorkerKill
from chaos.profile import SafetySettings
from chaos.safety import NodeInfo, Safety
from chaos.train.run import reference_spec, user_spec
from chaos.triggers import AfterCheckpoint, AtStep
from chaos.verdicts import Expect

ROOT = Path(__file__).resolve().parents[2]


def node(i: int, head: bool = False) -> Node:
    return Node(node_id=f"{i}" * 56, ip=f"10.0.0.{i}", alive=True, is_head=head, start_time=None, end_time=None,
                death_reason=None, resources={})


class FakeView:
    dashboard_url = "http://10.0.0.1:8265"

    def __init__(self, nodes, broken=False):
        self._nodes, self.broken = nodes, broken

    def nodes(self):
        if self.broken:
            raise ClusterError("could not list nodes from the Ray dashboard at http://10.0.0.1:8265: refused")
        return self._nodes


class FakeBackend:
    """A profile's backend as the plan reads it: Ray's node table and the safety rules."""

    label = "profile:staging"

    def __init__(self, settings: SafetySettings, nodes, broken=False):
        self.settings, self.safety = settings, Safety(settings)
        self.cluster = FakeView(nodes, broken)
        self.profile = types.SimpleNamespace(name="staging")

    def node_info(self, node_id):
        n = next(n for n in self.cluster.nodes() if n.node_id == node_id)
        return NodeInfo(node_id=n.node_id, ip=n.ip, hostname=f"host-{n.ip[-1]}", is_head=n.is_head)


NODES = [node(1, head=True), node(2), node(3)]
ALLOW_2 = SafetySettings(allowlist=[{"address": "10.0.0.2"}], max_live_faults=1)


def text(backend, faults, spec=None, expect=None, lock="free"):
    spec = spec or reference_spec("t", "/mnt/shared", max_failures=3)
    expect = expect or Expect(charged={"worker_group": len(faults)}, slo_detect_s=30, slo_recover_s=120)
    return "\n".join(plan.lines("suites/test_x.py::test_y", backend, spec, faults, expect, plan.Nodes.read(backend),
                                lock))


def test_the_plan_names_the_fault_its_target_rule_the_nodes_allowed_and_refused_and_the_expectations():
    out = text(FakeBackend(ALLOW_2, NODES), [(AfterCheckpoint(2), RayletKill(rank=1))])
    assert "DRY RUN plan of suites/test_x.py::test_y: nothing is submitted, locked, recorded or touched" in out
    assert "fault 1: raylet-kill: raylet kill via ShutdownRaylet(graceful=False) on the node hosting rank 1" in out
    assert "trigger: after checkpoint 2 is committed" in out
    assert ("target: the node hosting rank 1 in the attempt running when the trigger fires (the recorder's "
            "placement), if the safety rules allow that node then; parameters: method=grpc, rank=1") in out
    assert "eligible now (1): worker node 10.0.0.2 (hostname host-2, node 22222222)" in out
    assert ("refused now: head node 10.0.0.1 (hostname host-1, node 11111111) is never targeted unless "
            "safety.allow_head: true") in out
    assert ("refused now: worker node 10.0.0.3 (hostname host-3, node 33333333, labels none) matches none of "
            "safety.allowlist [address=10.0.0.2]; add a selector for it to safety.allowlist") in out
    assert "expected charge: 1 to worker_group (limit max_failures=3)" in out
    assert "SLOs: fault to node DEAD within 30 s, fault to the next attempt's first report within 120 s" in out
    assert "faults live at once: at most 1 (safety.max_live_faults)" in out
    assert "the cluster's lock: free" in out
    assert "only a live run resolves: which node hosts each rank when the trigger fires" in out


def test_twin_a_profile_that_allows_no_node_says_the_fault_cannot_run_and_how_to_allow_one():
    out = text(FakeBackend(SafetySettings(), NODES), [(AfterCheckpoint(2), RayletKill(rank=1))])
    assert "eligible now (0): none: this fault cannot run here as the profile stands" in out
    assert "safety.allowlist is empty, so nothing is; add a selector for it to safety.allowlist" in out


def test_each_member_of_a_correlated_fault_and_a_worker_kill_say_how_their_targets_are_chosen():
    group = Correlated.on_ranks(RayletKill, [0, 1])
    out = text(FakeBackend(ALLOW_2, NODES), [(AfterCheckpoint(1), group), (AtStep(20), TrainWorkerKill(rank=0))],
               expect=Expect(charged={"worker_group": 2}, slo_detect_s=30, slo_recover_s=120))
    assert "2 members injected in one instant, each on a node of its own (one refusal: none is injected)" in out
    assert "target: the node hosting rank 0 in the attempt" in out and "target: the node hosting rank 1" in out
    assert "fault 2: worker-kill" in out and "trigger: at step 20" in out
    assert "target: the training worker process of rank 0 (its PID from the recorder's placement" in out
    assert "expected charge: 2 to worker_group (limit max_failures=3)" in out


def test_a_head_fault_is_planned_on_the_head_only():
    out = text(FakeBackend(ALLOW_2, NODES), [(AfterCheckpoint(2), GcsKill())], expect=Expect(charged={}))
    assert "target: the cluster's live head node when the trigger fires (only if safety.allow_head: true)" in out
    assert "eligible now (0): none" in out and "refused now: head node 10.0.0.1" in out
    assert "refused now: worker node" not in out
    assert "expected charge: none (no fault of this test is charged to a retry budget)" in out
    allowed = text(FakeBackend(SafetySettings(allow_head=True), NODES), [(AfterCheckpoint(2), GcsKill())],
                   expect=Expect(charged={}))
    assert "eligible now (1): head node 10.0.0.1" in allowed


def test_a_users_script_leaves_its_limits_to_the_live_run_and_a_held_lock_is_named():
    spec = user_spec("python train.py", "t", working_dir="/src")
    out = text(FakeBackend(ALLOW_2, NODES), [(AfterCheckpoint(2), RayletKill(rank=1))], spec=spec,
               lock="held (RUNNING) by pid 7 on ci-1: a session now would be refused")
    assert "workload: your script `python train.py` (from /src)" in out
    assert "1 to worker_group (limit max_failures: your script's FailureConfig, read from the live run)" in out
    assert "your script's FailureConfig limits and checkpoint cadence" in out
    assert "the cluster's lock: held (RUNNING) by pid 7 on ci-1: a session now would be refused" in out


def test_an_unreadable_node_table_or_an_unstarted_cluster_is_said_not_guessed():
    out = text(FakeBackend(ALLOW_2, NODES, broken=True), [(AfterCheckpoint(2), RayletKill(rank=1))])
    assert "nodes: the node table could not be read: could not list nodes" in out
    assert "eligible now" not in out
    from chaos.backends import EmbeddedBackend

    out = text(EmbeddedBackend(), [(AfterCheckpoint(2), RayletKill(rank=1))], lock="none")
    assert ("nodes: the embedded cluster is not started in a dry run: it would have 3 worker nodes, every worker "
            "targetable, never the head") in out


def test_a_dry_run_of_a_standard_suite_starts_no_cluster_and_writes_no_ledger(tmp_path):
    """The whole path without a profile: the plan is printed and the test skipped, and nothing
    was started (no embedded cluster, so no Ray process) or written (no ledger)."""
    reports = tmp_path / "reports"
    p = subprocess.run([sys.executable, "-m", "pytest", "-m", "chaos", "-p", "no:cacheprovider", "-rs", "-s",
                        "suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity", "--chaos-dry-run",
                        "--chaos-reports", str(reports)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "DRY RUN: not starting the embedded cluster" in p.stdout
    assert "embedded cluster up" not in p.stdout
    assert "DRY RUN plan of suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity" in p.stdout
    assert "target: the node hosting rank 1 in the attempt running when the trigger fires" in p.stdout
    assert "SKIPPED [1]" in p.stdout and "dry run: plan of 1 fault(s) printed; nothing submitted" in p.stdout
    assert not (reports / "ledger.jsonl").exists()
    assert not (reports / "embedded").exists(), "an embedded cluster was started"


def test_dry_run_and_rehearsal_exclude_each_other():
    p = subprocess.run([sys.executable, "-m", "pytest", "-m", "chaos", "-p", "no:cacheprovider", "--co", "-q",
                        "suites/test_raylet_kill.py", "--chaos-dry-run", "--chaos-rehearsal"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "--chaos-dry-run and --chaos-rehearsal exclude each other" in p.stdout + p.stderr
