"""Backends: the registry picks one per profile, safety fails closed in the shared path,
hosts are looked up by node id and "the same host" is the backend's answer; faults take
their budget class from the catalog and keep per-injection state off the fault object."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import threading
import types

import pytest

from chaos import backends
from chaos.backends.base import Backend, Host
from chaos.cluster import ClusterView, Node, Target
from chaos.errors import ClusterError, InjectionError
from chaos.faults import catalog, registry
from chaos.faults.base import Fault, FaultContext, Injection
from chaos.faults import preempt
from chaos.faults.cuda import CudaFault
from chaos.faults.preempt import Preempt
from chaos.faults.raylet import RayletKill
from chaos.profile import profile_from_dict
from chaos.pytest_plugin import Chaos
from chaos.safety import NodeInfo, TargetRefused
from chaos.train.run import reference_spec, user_spec
from chaos.transport.base import CommandResult
from chaos.transport.local import LocalTransport
from chaos.verdicts import Expect
from chaos.verdicts.tolerance import STATE_RTOL

HEAD = Node("h" * 56, "10.0.0.1", True, True, 1.0, None, None, {}, {})
W2 = Node("a" * 56, "10.0.0.2", True, False, 1.0, None, None, {}, {"pool": "spot"})
W2_AGAIN = Node("b" * 56, "10.0.0.2", True, False, 9.0, None, None, {}, {"pool": "spot"})
W3 = Node("c" * 56, "10.0.0.3", True, False, 1.0, None, None, {}, {})


def profile(**extra):
    return profile_from_dict({"name": "staging", "ray": {"dashboard_url": "http://10.0.0.1:8265",
                                                         "gcs_address": "10.0.0.1:6379"},
                              "storage": {"path": "/mnt/shared/chaos"}, **extra})


class FakeView(ClusterView):
    def __init__(self, *nodes: Node):
        super().__init__("http://10.0.0.1:8265", "10.0.0.1:6379")
        self._nodes = list(nodes)

    def nodes(self):
        return list(self._nodes)

    def hostname(self, node_id):
        return f"host-{node_id[:2]}"


class FakeTransport:
    def __init__(self, host):
        self.host, self.commands, self.closed = host, [], False

    def run(self, command, timeout=30):
        self.commands.append(command)
        return CommandResult(self.host, command, 0, "", "")

    def launch(self, command):
        self.commands.append(command)

    def close(self):
        self.closed = True


class Minimal(Backend):
    """A backend that supplies the facts and nothing else: no safety settings of its own."""

    name = "minimal"
    label = "minimal"
    storage_path = "/tmp/storage"

    def _open(self):
        return self.cluster

    def _close(self):
        pass

    def node_info(self, node_id):
        node = self.cluster.node(node_id)
        return NodeInfo(node_id, node.ip, is_head=node.is_head) if node else None

    def host_key(self, node):
        return node.ip

    def connect(self, key):
        return FakeTransport(key)

    def _reach(self, key, node):
        return Host(key=key, name=f"machine-{key}", transport=self.connect(key))

    def healthy_workers(self):
        return True, "fine"

    def wait_healed(self, timeout):
        pass


def minimal(*nodes, **kwargs) -> Minimal:
    b = Minimal(**kwargs)
    b.cluster = FakeView(*nodes)
    return b


def target(node: Node) -> Target:
    return Target(node.node_id, node.ip, rank=1)


# -- registry -------------------------------------------------------------------------------
def test_a_profile_reached_over_ssh_or_locally_gets_the_ssh_backend():
    b = backends.for_profile(profile(hosts={"defaults": {"transport": "local"},
                                            "overrides": [{"match": {"address": "10.0.0.2"}, "transport": "ssh"}]}))
    assert isinstance(b, backends.SSHBackend) and b.label == "profile:staging"
    assert b.storage_path == "/mnt/shared/chaos"


def test_a_kubernetes_profile_is_served_by_the_kubernetes_backend_only():
    from chaos.backends.kubernetes import KubernetesBackend

    p = profile(hosts={"defaults": {"transport": "k8s"}}, kubernetes={"ray_cluster": "rc"})
    assert isinstance(backends.for_profile(p), KubernetesBackend)
    # A kubernetes section without a hosts section: still only the kubernetes backend claims it.
    assert isinstance(backends.for_profile(profile(kubernetes={"ray_cluster": "rc"})), KubernetesBackend)


def test_each_backend_class_declares_its_name_once_and_the_registry_maps_it():
    import inspect

    classes = [cls for _, cls in inspect.getmembers(backends, inspect.isclass)
               if issubclass(cls, Backend) and not inspect.isabstract(cls)]
    assert sorted(backends.BACKENDS) == sorted(cls.name for cls in classes) == ["embedded", "kubernetes", "ssh"]
    for cls in classes:
        assert "name" in vars(cls) and backends.BACKENDS[cls.name] is cls


def test_no_profile_picks_the_embedded_backend_through_the_registry_with_its_options():
    from chaos.embedded.cluster import EmbeddedConfig

    config = EmbeddedConfig(workers=3)
    b = backends.for_profile(None, config=config, storage_path="/tmp/s")
    assert isinstance(b, backends.EmbeddedBackend) and (b.config, b.storage_path) == (config, "/tmp/s")
    assert b.profile is None and b.live_faults.max_live == 3


def test_optional_capabilities_are_declared_on_every_backend_and_absent_by_default():
    b = minimal(HEAD)
    assert (b.kube, b.embedded, b.embedded_kubernetes) == (None, None, None)
    assert backends.EmbeddedBackend().kube is None
    cluster = object()
    k = backends.for_profile(profile(kubernetes={"ray_cluster": "rc"}), kube="api", embedded_kubernetes=cluster)
    assert (k.kube, k.embedded_kubernetes, k.external_drains) == ("api", cluster, False)


@pytest.mark.parametrize("kind", sorted(k for k in catalog.KINDS
                                         if registry.fault_class(k).__module__ == "chaos.faults.kube"))
def test_a_kubernetes_fault_kind_on_a_backend_without_the_api_is_refused_naming_both(kind):
    from chaos.faults.kube import kube_of

    with pytest.raises(InjectionError, match=rf"^{kind} needs the Kubernetes API .* backend minimal has none$"):
        kube_of(minimal(HEAD), kind)


def test_no_module_attaches_a_capability_to_a_backend_from_outside():
    """A backend sets its own capabilities: ``X.kube = ...`` (or setattr) with X not ``self``
    anywhere in chaos/ is a capability attached from outside."""
    import ast
    from pathlib import Path

    capabilities = {"kube", "embedded", "embedded_kubernetes"}
    assert all(name in vars(Backend) and getattr(Backend, name) is None for name in capabilities)
    root = Path(backends.__file__).resolve().parents[1]
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            attrs = [t for target in targets for t in ast.walk(target)
                     if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)]
            bad = [a for a in attrs if a.attr in capabilities
                   and not (isinstance(a.value, ast.Name) and a.value.id == "self")]
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in capabilities):
                bad.append(node)
            found += [f"{path.relative_to(root.parent)}:{b.lineno}" for b in bad]
    assert found == []


# -- safety, fail closed ----------------------------------------------------------------------
def test_a_backend_without_settings_refuses_every_node():
    b = minimal(HEAD, W2)
    with pytest.raises(TargetRefused) as e:
        b.check_target(target(W2))
    assert e.value.rule == "safety.allowlist"
    with pytest.raises(TargetRefused) as e:
        b.check_target(target(HEAD))
    assert e.value.rule == "safety.allow_head"


def test_an_unknown_node_is_refused_whatever_the_settings():
    from chaos.profile import SafetySettings

    b = minimal(HEAD, safety=SafetySettings(allow_all_workers=True, allow_head=True))
    with pytest.raises(TargetRefused, match="not a node of this cluster") as e:
        b.check_target(target(W3))
    assert e.value.rule == "node table"


def test_a_profiles_safety_section_applies_to_its_backend():
    p = profile(safety={"allowlist": [{"label": "pool=spot"}], "max_live_faults": 2})
    b = backends.for_profile(p)
    b.cluster = FakeView(HEAD, W2, W3)
    b.check_target(target(W2))  # allowlisted by label
    with pytest.raises(TargetRefused, match="matches none of safety.allowlist"):
        b.check_target(target(W3))
    assert b.live_faults.max_live == 2


def test_the_embedded_backend_allows_its_workers_and_never_the_head():
    b = backends.EmbeddedBackend()
    b.cluster = FakeView(HEAD, W2)
    b.check_target(target(W2))
    with pytest.raises(TargetRefused, match="never targeted unless safety.allow_head"):
        b.check_target(target(HEAD))


@pytest.mark.parametrize("method", ["check_target", "session"])
def test_a_backend_cannot_replace_the_shared_safety_path(method):
    with pytest.raises(TypeError, match=f"overrides {method}: safety checks and the session are shared"):
        type("Sloppy", (Minimal,), {method: lambda self, *a, **k: None})


# -- hosts by node id ---------------------------------------------------------------------------
def test_hosts_are_looked_up_by_node_id_and_shared_per_host():
    b = minimal(HEAD, W2, W2_AGAIN)
    first, again = b.host(W2.node_id), b.host(W2_AGAIN.node_id)
    assert first is again and first.name == "machine-10.0.0.2"
    assert b.same_host(first, W2_AGAIN) and not b.same_host(first, W3)
    b.close_hosts()
    assert first.transport.closed


def test_same_host_is_the_backends_answer_not_an_address_comparison():
    class ByName(Minimal):
        def host_key(self, node):  # e.g. a Kubernetes node name: the pod came back elsewhere
            return node.labels.get("pool", node.ip)

    b = ByName()
    b.cluster = FakeView(HEAD, W2, W3)
    moved = Node("d" * 56, "10.0.0.9", True, False, 9.0, None, None, {}, {"pool": "spot"})
    assert b.same_host(b.host(W2.node_id), moved)


def test_the_ssh_backend_builds_a_jump_host_transport():
    b = backends.for_profile(profile(hosts={"defaults": {"ssh": {"jump_host": "ops@bastion:2222",
                                                                   "key_file": "/k", "user": "ubuntu"}}}))
    t = b.connect("10.0.0.2")
    assert (t.host, t.user, t.jump_host.host, t.jump_host.port, t.jump_host.user) == \
        ("10.0.0.2", "ubuntu", "bastion", 2222, "ops")


# -- faults --------------------------------------------------------------------------------------
def test_fault_classes_take_their_budget_class_from_the_catalog():
    for name, kind in catalog.KINDS.items():
        if name in registry.implementations():
            cls = registry.fault_class(name)
            assert cls.kind == name and cls.budget_class == kind.budget_class


def test_a_fault_kind_missing_from_the_catalog_is_refused_at_definition():
    with pytest.raises(ValueError, match="unknown fault kind 'meteor'"):
        type("Meteor", (Fault,), {"kind": "meteor"})


def test_detection_deadline_is_the_faults_own():
    hang = CudaFault("ecc", mode="hang", collective_timeout_s=15, shim_path="/x")
    assert hang.detect_timeout(60) == 75 and RayletKill().detect_timeout(60) == 60


def test_preemption_is_charged_to_the_preemption_budget_and_waits_out_its_window():
    assert Preempt.budget_class == "preemption"
    assert Preempt(deadline_s=8).detect_timeout(60) == 90  # Ray's default 30 s window, at least


@pytest.mark.parametrize("kwargs, message", [
    ({"via": "spot"}, "preempt via='spot' unknown; expected one of"),
    ({"deadline_s": 0}, "deadline_s must be > 0"),
    ({"via": "drain", "kill_after_s": 5}, "kill_after_s is the SIGKILL after the SIGTERM"),
])
def test_bad_preemption_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Preempt(**kwargs)


def test_a_ray_without_the_preemption_budget_is_refused(monkeypatch):
    monkeypatch.setattr(preempt.ray, "__version__", "2.56.1")
    with pytest.raises(InjectionError, match=r"preempt needs Ray >= 2.58 .* this harness runs Ray 2.56.1"):
        Preempt()


class MapsSay(FakeTransport):
    """A host whose /proc/PID/maps check answers ``state`` (loaded, missing, gone)."""

    def __init__(self, host, state="loaded"):
        super().__init__(host)
        self.state = state

    def run(self, command, timeout=30):
        self.commands.append(command)
        return CommandResult(self.host, command, 0, f"{self.state}\n" if "/maps" in command else "", "")


class Shimmed(Minimal):
    """Hosts whose /proc/PID/maps check answers ``state``."""

    state = "loaded"

    def connect(self, key):
        return MapsSay(key, self.state)


def shimmed(state="loaded") -> Shimmed:
    b = Shimmed()
    b.state, b.cluster = state, FakeView(HEAD, W2)
    return b


def test_one_fault_object_injected_twice_keeps_each_injection_apart():
    fault = CudaFault("ecc", rank=1, shim_path="/x")
    b = shimmed()
    ctx = FaultContext(cluster=b.cluster, timeline=None, backend=b)
    injections = [Injection(fault, Target(W2.node_id, W2.ip, rank=1, pid=4242), b.host(W2.node_id)) for _ in range(2)]
    details = [fault.inject(ctx, inj) for inj in injections]
    assert details[0]["plan_id"] != details[1]["plan_id"]
    assert [i.evidence["plan"] for i in injections] == [d["plan"] for d in details]
    assert fault.revert_plan(injections[0])["host"] == "10.0.0.2"


class KeepingLocal(LocalTransport):
    """This machine, under another host's name, keeping the commands it ran."""

    def __init__(self, host):
        super().__init__(host)
        self.commands = []

    def run(self, command, timeout=30.0):
        self.commands.append(command)
        return super().run(command, timeout)


class LocalHosts(Minimal):
    """Every host is this machine."""

    def connect(self, key):
        return KeepingLocal(key)


def test_the_cuda_shim_is_put_on_every_worker_host_before_the_run_and_preloaded_from_there(tmp_path, monkeypatch):
    from chaos.shim import build

    monkeypatch.setattr(build, "REMOTE_ROOT", str(tmp_path / "remote"))
    b = LocalHosts()
    b.cluster = FakeView(HEAD, W2, W3)
    fault = CudaFault("ecc", rank=1)
    done = fault.prepare(FaultContext(cluster=b.cluster, timeline=None, backend=b))
    path = f"{tmp_path}/remote/{build.shim_hash('cc')}/libchaos_cuda.so"
    assert done == f"the CUDA shim at {path} on 2 worker hosts", done
    assert fault.run_env()["LD_PRELOAD"] == path
    assert all(b.reach(ip).transport.commands for ip in ("10.0.0.2", "10.0.0.3"))
    assert "10.0.0.1" not in b._hosts  # the head runs no rank: nothing is put there
    # a fault given a library already on the nodes puts nothing anywhere
    assert CudaFault("ecc", rank=1, shim_path="/opt/shim.so").prepare(None) is None


@pytest.mark.parametrize("state, pid, message", [
    ("missing", 4242, r"10.0.0.2: rank 1's process \(PID 4242\) has not loaded the CUDA shim /x \(not in /proc/4242/maps\)"),
    ("gone", 4242, r"10.0.0.2: rank 1's process \(PID 4242\) is gone"),
    ("loaded", None, r"10.0.0.2: no PID for rank 1 in the run's placement"),
])
def test_a_cuda_fault_is_not_armed_in_a_process_without_the_shim(state, pid, message):
    fault = CudaFault("ecc", rank=1, shim_path="/x")
    b = shimmed(state)
    transport = b.host(W2.node_id).transport
    with pytest.raises(InjectionError, match=message + ".*not armed"):
        fault.inject(FaultContext(cluster=b.cluster, timeline=None, backend=b),
                     Injection(fault, Target(W2.node_id, W2.ip, rank=1, pid=pid), b.host(W2.node_id)))
    assert not any(".ctl" in c for c in transport.commands)  # the control file was never written


# -- expectations from the faults -----------------------------------------------------------------
USER = user_spec("python train.py", "t-1", working_dir="/tmp")


def chaos_with(profile_=None, detect=None, recover=None, state_rtol=None) -> Chaos:
    options = {"chaos_slo_detect": detect, "chaos_slo_recover": recover, "chaos_state_rtol": state_rtol,
               "chaos_baseline": False}
    env = types.SimpleNamespace(backend=types.SimpleNamespace(profile=profile_))
    request = types.SimpleNamespace(config=types.SimpleNamespace(getoption=options.__getitem__, stash=pytest.Stash()))
    return Chaos(env, request)


def test_expectation_follows_from_the_faults_and_the_options():
    chaos = chaos_with(detect=12, recover=90)
    e = chaos._expectation(chaos.expect(), [(None, RayletKill()), (None, RayletKill(rank=0))], USER)
    assert (e.charged, e.budget_exhausted, e.slo_detect_s, e.slo_recover_s) == ({"worker_group": 2}, False, 12, 90)


def test_expectation_reads_the_profiles_slos_and_budget_per_kind():
    p = profile(faults={"raylet-kill": {"slo_detect_s": 5, "slo_recover_s": 50, "expected_budget": "preemption"},
                        "cuda": {"slo_detect_s": 8, "slo_recover_s": 40}})
    chaos = chaos_with(p)
    e = chaos._expectation(chaos.expect(), [(None, RayletKill()), (None, CudaFault(shim_path="/x"))], USER)
    assert e.charged == {"preemption": 1, "worker_group": 1}
    assert e.charge_by_kind == {"cuda": "worker_group", "raylet-kill": "preemption"}  # each fault's own class
    assert (e.slo_detect_s, e.slo_recover_s) == (5, 40)  # the strictest of the kinds'


def test_slos_an_option_given_wins_over_the_profile_and_the_profile_over_the_catalog():
    """--chaos-slo-* defaulted to 30/120 s and replaced every kind's own SLO without a profile (an
    Xid's 60/600 s judged at 30/120), while with a profile an option given on the command line was
    dropped.  Now: chaos.expect > the option given > the profile's for the kind > the catalog's."""
    from chaos.faults import catalog
    xid = [(None, types.SimpleNamespace(kind="xid"))]
    e = chaos_with(detect=None, recover=None)._expectation(chaos_with().expect(), xid, USER)
    assert (e.slo_detect_s, e.slo_recover_s) == (catalog.kind("xid").slo_detect_s, catalog.kind("xid").slo_recover_s)
    e = chaos_with(detect=7, recover=None)._expectation(chaos_with().expect(), xid, USER)
    assert (e.slo_detect_s, e.slo_recover_s) == (7, catalog.kind("xid").slo_recover_s)
    p = profile(faults={"raylet-kill": {"slo_detect_s": 5, "slo_recover_s": 50}})
    e = chaos_with(p, detect=None, recover=80)._expectation(chaos_with().expect(), [(None, RayletKill())], USER)
    assert (e.slo_detect_s, e.slo_recover_s) == (5, 80)
    e = chaos_with(p, detect=None, recover=80)._expectation(chaos_with().expect(slo_recover_s=33),
                                                            [(None, RayletKill())], USER)
    assert e.slo_recover_s == 33


def test_what_the_suite_says_overrides_what_the_faults_imply():
    chaos = chaos_with(profile(faults={"raylet-kill": {"slo_detect_s": 5}}))
    e = chaos._expectation(chaos.expect(charged={"worker_group": 3}, budget_exhausted=True, slo_detect_s=9),
                           [(None, RayletKill())], USER)
    assert (e.charged, e.budget_exhausted, e.slo_detect_s) == ({"worker_group": 3}, True, 9)
    assert e.charge_by_kind == {"raylet-kill": "worker_group"}  # totals of its own, in the kind's class: held
    same = chaos._expectation(chaos.expect(charged={"worker_group": 1}), [(None, RayletKill())], USER)
    assert same.charge_by_kind == {"raylet-kill": "worker_group"}  # what the kinds imply: each fault's class held
    moved = chaos._expectation(chaos.expect(charged={"preemption": 1}), [(None, RayletKill())], USER)
    assert moved.charge_by_kind == {"raylet-kill": None}  # totals in a class the kind does not cost: none claimed


def test_a_suites_own_totals_keep_each_named_class_per_fault_so_a_swapped_pair_still_fails():
    """A suite that expects fewer charges than its faults imply (one preemption absorbed)
    names both classes: a raylet kill charged to the preemption budget and a preemption to
    max_failures keep those totals, and each fault's own class still catches the swap."""
    from chaos.faults.preempt import Preempt
    from chaos.verdicts.budget import within_budget
    from timelines import Script

    chaos = chaos_with()
    faults = [(None, RayletKill()), (None, Preempt(rank=1)), (None, Preempt(rank=0))]
    e = chaos._expectation(chaos.expect(charged={"worker_group": 1, "preemption": 1}), faults, USER)
    assert e.charge_by_kind == {"preempt": "preemption", "raylet-kill": "worker_group"}

    def run(first, second):
        s = Script().start_attempt().steps(1, 12)
        s.fault(kind="raylet-kill").decision(budget_class=first, limit=3)
        s.start_attempt().steps(11, 16).preemption().gone()
        s.decision(budget_class=second, limit=3, error_types=("WorkerGroupError", "PreemptionError"))
        s.start_attempt().steps(16, 22).preemption(node_id="n0").gone(node_id="n0")  # absorbed: no decision
        return s.start_attempt().steps(21, 25).finish().timeline()

    v = within_budget(run("preemption", "worker_group"), e)
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class", v.line()
    assert within_budget(run("worker_group", "preemption"), e).status == "pass"  # the twin


def test_a_suites_own_state_tolerance_is_kept_and_an_explicit_option_only_tightens_it():
    """chaos.expect(state_rtol=...) was overwritten by --chaos-state-rtol's default (1e-4): a suite
    that loosened it for its noisy workload was judged at 1e-4, one that tightened it at 1e-4
    too.  The suite's wins over the default; where both are given, the smaller."""
    faults = [(None, RayletKill())]
    for option, suite, used in ((None, 1e-2, 1e-2), (None, 1e-6, 1e-6), (None, None, STATE_RTOL),
                                (1e-3, None, 1e-3), (1e-3, 1e-2, 1e-3), (1e-2, 1e-6, 1e-6)):
        chaos = chaos_with(state_rtol=option)
        e = chaos._expectation(chaos.expect(state_rtol=suite), faults, USER)
        assert e.rtol == used, (option, suite, e.rtol)
    with pytest.raises(ValueError, match="state_rtol=inf: a relative tolerance is a finite number >= 0"):
        Expect(state_rtol=float("inf"))  # it would reproduce every state
    assert Expect(state_rtol=0.0).rtol == 0.0  # the twin: exact is a tolerance


def test_chaos_deterministic_declares_a_profiles_own_script_deterministic_too():
    """--chaos-deterministic was read for --chaos-workload only: a profile's workload.entrypoint
    stayed undeclared, so a state that did not reproduce was a warning and the test passed."""
    p = profile(workload={"entrypoint": "python train.py"})
    for option, declared in ((True, True), (False, False)):
        options = {"chaos_deterministic": option, "chaos_workload": None}
        request = types.SimpleNamespace(config=types.SimpleNamespace(getoption=options.__getitem__, stash=pytest.Stash()),
                                        node=types.SimpleNamespace(name="test_x"))
        spec = Chaos(types.SimpleNamespace(backend=types.SimpleNamespace(profile=p)), request)._workload("/storage")
        assert spec.deterministic is declared, (option, spec)


def test_determinism_is_what_the_workload_declares_unless_the_suite_says():
    chaos = chaos_with()
    faults = [(None, RayletKill())]
    assert chaos._expectation(chaos.expect(), faults, USER).deterministic is False
    assert chaos._expectation(chaos.expect(), faults, reference_spec("r", "/tmp/s")).deterministic is True
    assert chaos._expectation(chaos.expect(deterministic=True), faults, USER).deterministic is True
    assert chaos._expectation(chaos.expect(deterministic=False), faults, reference_spec("r", "/tmp/s")).deterministic \
        is False



def test_the_fixtures_one_factory_takes_each_kinds_defaults_from_the_session():
    """``chaos.<kind>(...)`` builds through the kind's class (``Fault.build``): a raylet kill's
    method from --chaos-raylet-kill, an Xid's agent SLO and recovery time from the profile's
    SLOs for the kind (else the catalog's); what the suite passes wins."""
    from chaos.faults import catalog
    from chaos.faults.xid import Xid

    options = {"chaos_raylet_kill": "sigkill"}
    request = types.SimpleNamespace(config=types.SimpleNamespace(getoption=options.__getitem__, stash=pytest.Stash()))
    plain = Chaos(types.SimpleNamespace(backend=types.SimpleNamespace(profile=None, kube=None)), request)
    assert plain.raylet_kill(rank=0).method == "sigkill" and plain.raylet_kill(method="grpc").method == "grpc"
    xid = plain.xid(xid=48)
    assert isinstance(xid, Xid) and (xid.agent_slo_s, xid.recover_timeout_s) == (
        catalog.kind("xid").slo_detect_s, catalog.kind("xid").slo_recover_s)
    staging = profile(faults={"xid": {"slo_detect_s": 20, "slo_recover_s": 300}})
    on_profile = Chaos(types.SimpleNamespace(backend=types.SimpleNamespace(profile=staging, kube=None)), request)
    assert (on_profile.xid(xid=48).agent_slo_s, on_profile.xid(xid=48).recover_timeout_s) == (20, 300)
    assert on_profile.xid(xid=48, agent_slo_s=15).agent_slo_s == 15


def test_embedded_heal_waits_until_the_dead_node_is_seen_replaced(monkeypatch):
    """Right after a kill the cluster's own record can still show the dead node alive: heal
    waits on the same view the healed verdict reads, not on that record."""
    b = backends.EmbeddedBackend()
    answers = iter([(False, "hosts down: ['worker-2']")] * 3 + [(True, "all 3 worker hosts alive")])
    seen = []

    def healthy():
        seen.append(next(answers))
        return seen[-1]

    monkeypatch.setattr(b, "healthy_workers", healthy)
    b.wait_healed(10)
    assert len(seen) == 4 and seen[-1][0]


# -- the node table over HTTP ---------------------------------------------------------------------
@contextlib.contextmanager
def dashboard(*tables):
    """A dashboard on loopback whose GET /nodes?view=summary answers ``tables`` in turn (the
    last one from then on), each a list of (node id, hostname, raylet port)."""
    answers = list(tables)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            table = answers.pop(0) if len(answers) > 1 else answers[0]
            summary = [{"raylet": {"nodeId": n, "nodeManagerAddress": "10.0.0.9", "nodeManagerHostname": h,
                                   "nodeManagerPort": port, "state": "ALIVE"}} for n, h, port in table]
            body = json.dumps({"result": True, "data": {"summary": summary}}).encode()
            self.send_response(200 if self.path == "/nodes?view=summary" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield ClusterView(f"http://127.0.0.1:{server.server_port}", "127.0.0.1:1")
    finally:
        server.shutdown()
        server.server_close()


def test_hostnames_and_raylet_ports_come_from_the_dashboard_without_a_driver():
    with dashboard([("a" * 56, "gpu-1", 6380)]) as view:
        assert view.hostname("a" * 56) == "gpu-1" and view.raylet_endpoint("a" * 56) == ("10.0.0.9", 6380)


def test_a_node_that_just_joined_is_waited_for_and_one_that_never_shows_is_named():
    # the dashboard learns of a node after the GCS: its first answer lacks it
    with dashboard([], [("b" * 56, "gpu-2", 6390)]) as view:
        assert view.raylet_endpoint("b" * 56) == ("10.0.0.9", 6390)
    with dashboard([("a" * 56, "gpu-1", 6380)]) as view:
        with pytest.raises(ClusterError, match=r"node cccccccc is not in Ray's node table at http://127.0.0.1"):
            view.raylet("c" * 56, timeout=0.5)


def test_what_an_ended_job_still_holds_is_named_from_the_state_api(monkeypatch):
    """The healed verdict's leak check asks the state API (HTTP, no driver) for the job's own
    actors and placement groups: only live ones that reserve CPU, GPU or a custom resource."""
    import ray.util.state as state

    actor = lambda cls, st, res: types.SimpleNamespace(class_name=cls, actor_id="a" * 32, state=st,
                                                       required_resources=res, node_id="n" * 56)
    asked = {}

    def list_actors(filters, **kw):
        asked["actors"] = filters
        return [actor("Leaky", "ALIVE", {"CPU": 1.0}), actor("Gone", "DEAD", {"CPU": 1.0}),
                actor("Free", "ALIVE", {"memory": 100.0, "node:10.0.0.1": 0.001}),
                actor("Coming", "PENDING_CREATION", {"GPU": 1.0})]

    def list_placement_groups(filters, **kw):
        asked["groups"] = filters
        pg = lambda name, st: types.SimpleNamespace(name=name, placement_group_id="p" * 36, state=st,
                                                    bundles=[{"unit_resources": {"CPU": 1.0}},
                                                             {"unit_resources": {"CPU": 1.0, "memory": 5.0}}])
        return [pg("workers", "CREATED"), pg("old", "REMOVED")]

    monkeypatch.setattr(state, "list_actors", list_actors)
    monkeypatch.setattr(state, "list_placement_groups", list_placement_groups)
    held = ClusterView("http://127.0.0.1:1", "127.0.0.1:2").held_by_job("02000000")
    assert asked == {"actors": [("job_id", "=", "02000000")], "groups": [("creator_job_id", "=", "02000000")]}
    assert held == ["actor Leaky aaaaaaaa ALIVE with 1 CPU on node nnnnnnnn",
                    "actor Coming aaaaaaaa PENDING_CREATION with 1 GPU on node nnnnnnnn",
                    "placement group workers CREATED with 2 CPU"], held

    monkeypatch.setattr(state, "list_actors", lambda **kw: (_ for _ in ()).throw(ConnectionError("refused")))
    with pytest.raises(ClusterError, match="could not list job 02000000's actors and placement groups"):
        ClusterView("http://127.0.0.1:1", "127.0.0.1:2").held_by_job("02000000")


def test_a_worker_node_that_joins_during_the_run_gets_the_shim_before_a_fault_is_armed_there(tmp_path,
                                                                                             monkeypatch):
    """The node watcher hands each worker node that joins (not the head, not the nodes it
    started with) to the experiment, which puts the shim there at the path the run preloads."""
    import queue

    from chaos.experiment import Environment, Experiment
    from chaos.ledger import Ledger
    from chaos.shim import build
    from chaos.timeline import Timeline
    from chaos.triggers import AfterCheckpoint
    from chaos.verdicts import Expect

    monkeypatch.setattr(build, "REMOTE_ROOT", str(tmp_path / "remote"))
    b = LocalHosts()
    b.cluster = FakeView(HEAD, W2)
    fault = CudaFault("ecc", rank=1)
    ctx = FaultContext(cluster=b.cluster, timeline=Timeline(), backend=b)
    fault.prepare(ctx)
    path = fault.run_env()["LD_PRELOAD"]

    joined, timeline = queue.SimpleQueue(), Timeline()
    b.cluster.watch(timeline, interval=0.01, on_joined=joined.put)
    new_head = dataclasses.replace(HEAD, node_id="e" * 56)
    b.cluster._nodes += [W3, new_head]  # a worker and a (restarted) head join
    assert joined.get(timeout=10) == W3
    timeline.wait_for(lambda ev: len([e for e in ev if e.kind == "node_alive"]) == 2 or None, 10, "both joins")
    b.cluster.stop_watching()
    assert joined.empty(), "the head gets nothing: it runs no rank"

    env = Environment(backend=b, ledger=Ledger(tmp_path / "ledger.jsonl"), out_dir=tmp_path)
    exp = Experiment(env, spec=None, faults=[(AfterCheckpoint(2), fault)], expect=Expect(), test_id="t::join")
    said = []
    exp.reporter.say = said.append
    joined.put(W3)
    joined.put(None)
    exp._prepare_joined(ctx, joined)
    assert said == [f"prepare: the CUDA shim at {path} on machine-{W3.ip}, which joined during the run ({W3.short()})"]
    assert any("test -f" in c and path in c for c in b.reach(W3.ip).transport.commands)
    assert [e.data["node_id"] for e in exp.timeline.of("node_prepared")] == [W3.node_id]
    # a fault given a library already on the nodes puts nothing on a joined node either
    assert CudaFault("ecc", rank=1, shim_path="/opt/shim.so").prepare_node(ctx, W3) is None


def test_the_embedded_backend_views_the_cluster_it_started(monkeypatch):
    """_open as make chaos runs it, with the cluster's start faked: the view it hands the session
    reaches the cluster's dashboard and GCS (a call no per-commit test made, so a signature
    change of ClusterView would have failed only on a real cluster)."""
    from chaos.embedded import cluster as embedded

    class Started(embedded.EmbeddedCluster):
        def up(self):
            self.dashboard_port, self.gcs_port = 61001, 61000
            return self

    monkeypatch.setattr(embedded, "EmbeddedCluster", Started)
    b = backends.EmbeddedBackend()
    view = b._open()
    assert (view.dashboard_url, view.gcs_address) == ("http://127.0.1.1:61001", "127.0.1.1:61000")
    assert b.properties["nodes"] == "1 head + 3 workers"
