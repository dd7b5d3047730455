"""Privileges at injection time: a fault kind that needs root on its host (the catalog's
privileges) is refused there before its ledger entry when the host's login cannot get root —
the kind, the host, the privilege and the fix named — and injected where it can; each host is
asked once a session; and every command of the SSH kinds that needs root asks its transport
for it (``privileged=True``), which the SSH transport turns into sudo where the profile says."""

from __future__ import annotations

import threading

import pytest

from chaos import backends
from chaos.cluster import Node, Target
from chaos.experiment import Environment, Experiment
from chaos.faults.base import Fault, FaultContext, Injection, placement_target
from chaos.faults.correlated import Correlated
from chaos.faults.partition import Partition
from chaos.faults.preempt import _kill_raylet
from chaos.faults.raylet import RayletKill
from chaos.faults.reboot import NodeReboot
from chaos.faults.worker import TrainWorkerKill
from chaos.faults.xid import Xid
from chaos.ledger import Ledger
from chaos.privileges import PrivilegeRefused
from chaos.profile import profile_from_dict
from chaos.report import Reporter
from chaos.timeline import Timeline
from chaos.transport.base import CommandResult
from chaos.transport.ssh import SSHTransport
from chaos.verdicts import Expect
from test_backends import HEAD, FakeView

UBUNTU = Node("a" * 56, "10.0.0.2", True, False, 1.0, None, None, {}, {})
NOSUDO = Node("c" * 56, "10.0.0.3", True, False, 1.0, None, None, {}, {})
ROOT = Node("d" * 56, "10.0.0.4", True, False, 1.0, None, None, {}, {})
# What each login answers, as real hosts did (tests/unit/test_privileges.py says where from).
LOGINS = {"ubuntu": ("1000", (0, "0\n", "")), "nosudo": ("1001", (1, "", "sudo: a password is required\n")),
          "root": ("0", None)}


@pytest.fixture
def asked(monkeypatch):
    """SSH transports that answer as LOGINS says, without a network; what each host was asked."""
    seen: list[tuple[str, str]] = []

    def run(self, command, timeout=None, privileged=False):
        cmd = self.as_root(command) if privileged else command
        seen.append((self.host, cmd))
        uid, sudo = LOGINS[self.user]
        if cmd == "id -u; id -un":
            return CommandResult(self.host, cmd, 0, f"{uid}\n{self.user}\n", "")
        if cmd == "sudo -n sh -c 'id -u'":
            return CommandResult(self.host, cmd, *sudo)
        raise AssertionError(f"{self.host}: unexpected command {cmd!r}")

    monkeypatch.setattr(SSHTransport, "run", run)
    return seen


def ssh_backend():
    profile = profile_from_dict({
        "name": "staging", "ray": {"dashboard_url": "http://10.0.0.1:8265", "gcs_address": "10.0.0.1:6379"},
        "storage": {"path": "/mnt/shared/chaos"},
        "hosts": {"defaults": {"ssh": {"user": "ubuntu", "become": "sudo", "use_agent": False, "key_file": "/k"}},
                  "overrides": [{"match": {"address": "10.0.0.3"}, "ssh": {"user": "nosudo"}},
                                {"match": {"address": "10.0.0.4"}, "ssh": {"user": "root", "become": None}}]},
        "safety": {"allow_all_workers": True}})
    b = backends.for_profile(profile)
    b.cluster = FakeView(HEAD, UBUNTU, NOSUDO, ROOT)
    return b


class Cut(Fault):
    """A partition whose inject only counts: what matters is whether it is reached."""

    kind = "partition"

    def __init__(self, rank, calls):
        self.rank, self.calls = rank, calls

    def resolve(self, ctx):
        return placement_target(ctx, self.rank)

    def inject(self, ctx, inj):
        self.calls.append(inj.target.rank)
        return {"cut": True}


class Arm(Cut):
    kind = "cuda"  # needs no privileges


def experiment(tmp_path, backend):
    env = Environment(backend=backend, ledger=Ledger(tmp_path / "ledger.jsonl"), out_dir=tmp_path)
    exp = Experiment(env, spec=None, faults=[], expect=Expect(), test_id="t::privileges", reporter=Reporter())
    exp.timeline = Timeline()
    exp.timeline.emit("recorder", "attempt_started", attempt=0, placement=[
        {"rank": r, "node_id": n.node_id, "node_ip": n.ip, "pid": 100 + r} for r, n in enumerate((UBUNTU, NOSUDO, ROOT))])
    return exp, FaultContext(backend.cluster, exp.timeline, backend)


def test_a_host_without_root_refuses_the_kind_before_its_ledger_entry(tmp_path, asked):
    backend, calls = ssh_backend(), []
    exp, ctx = experiment(tmp_path, backend)
    with pytest.raises(PrivilegeRefused) as refused:
        exp._inject(ctx, Cut(1, calls))
    text = str(refused.value)
    assert text.startswith("partition refused on 10.0.0.3 before injecting anything: it needs root there for "
                           "iptables (add and remove iptables chains (the partition's cut)), and `sudo -n` says a "
                           "password is required"), text
    assert "Fix: set `ssh.become: sudo`" in text and "nosudo ALL=(ALL) NOPASSWD: ALL" in text
    assert calls == [] and exp.env.ledger.entries() == {} and exp._armed == [] and len(backend.live_faults) == 0
    assert asked == [("10.0.0.3", "id -u; id -un"), ("10.0.0.3", "sudo -n sh -c 'id -u'")]


def test_hosts_that_get_root_are_injected_and_each_host_is_asked_once(tmp_path, asked):
    backend, calls = ssh_backend(), []
    exp, ctx = experiment(tmp_path, backend)
    for rank in (0, 2, 0, 2):  # ubuntu through sudo; root as is
        exp._inject(ctx, Cut(rank, calls))
        exp._revert_all(ctx)
    assert calls == [0, 2, 0, 2]
    assert sorted(e["state"] for e in exp.env.ledger.entries().values()) == ["nothing-to-revert"] * 4
    assert asked == [("10.0.0.2", "id -u; id -un"), ("10.0.0.2", "sudo -n sh -c 'id -u'"),
                     ("10.0.0.4", "id -u; id -un")]
    assert backend.escalation(backend.host(UBUNTU.node_id)).how == "sudo -n"
    assert backend.escalation(backend.host(ROOT.node_id)).how == "root"


def test_a_kind_that_needs_no_privileges_asks_nothing(tmp_path, asked):
    backend, calls = ssh_backend(), []
    exp, ctx = experiment(tmp_path, backend)
    exp._inject(ctx, Arm(1, calls))
    assert calls == [1] and asked == []


def test_one_member_without_root_means_no_member_is_injected(tmp_path, asked):
    backend, calls = ssh_backend(), []
    exp, ctx = experiment(tmp_path, backend)
    with pytest.raises(Exception, match=r"nothing injected, 1 of 3 members refused: rank 1 on node cccccccc .*: "
                                        r"partition refused on 10.0.0.3"):
        exp._inject_group(ctx, Correlated([Cut(r, calls) for r in (0, 1, 2)]))
    assert calls == [] and exp.env.ledger.entries() == {} and len(backend.live_faults) == 0


def test_hosts_the_harness_reaches_as_root_itself_are_not_asked(asked):
    """The embedded cluster's test hosts (root over SSH) and local hosts: no escalation to check."""
    from chaos.backends.base import Host
    from chaos.transport.local import LocalTransport

    assert ssh_backend().escalation(Host(key="10.0.0.9", name=None, transport=LocalTransport("10.0.0.9"))) is None
    assert backends.EmbeddedBackend.escalation is backends.Backend.escalation


# -- every privileged command asks for root ---------------------------------------------------------

class Recording:
    """A host's transport that keeps (command, privileged) and answers as the fault expects."""

    host = "10.0.0.2"

    def __init__(self):
        self.seen: list[tuple[str, bool]] = []

    def run(self, command, timeout=30.0, privileged=False):
        cmd = command if isinstance(command, str) else " ".join(command)
        self.seen.append((cmd, privileged))
        out = "cut 77" if "-N chaos-" in cmd else "healed" if "iptables -w 5 -S" in cmd else "123 default"
        return CommandResult(self.host, cmd, 0, out, "")

    def launch(self, command, privileged=False):
        self.seen.append((command, privileged))

    def close(self):
        pass


def injection(fault, transport):
    from chaos.backends.base import Host

    return Injection(fault, Target(node_id="a" * 56, node_ip="10.0.0.2", rank=1, pid=4242),
                     Host(key="10.0.0.2", name=None, transport=transport))


def _ctx():
    class Backend:
        def boot_id(self, host):
            return "boot-1"

    return FaultContext(None, Timeline(), Backend())


def test_each_ssh_kinds_root_commands_ask_for_root():
    t = Recording()
    RayletKill(method="sigkill").inject(_ctx(), injection(RayletKill(method="sigkill"), t))
    TrainWorkerKill().inject(_ctx(), injection(TrainWorkerKill(), t))
    NodeReboot().inject(_ctx(), injection(NodeReboot(), t))
    p = Partition()
    inj = injection(p, t)
    p.revert_plan(inj)
    p.inject(_ctx(), inj)
    p.revert(_ctx(), inj)
    _kill_raylet(t, "a" * 56, "killed")
    Xid._kmsg_by_transport(t, "NVRM: Xid (PCI:0000:00:00): 79")
    unprivileged = [c for c, privileged in t.seen if not privileged]
    assert unprivileged == [], unprivileged
    assert [c.split()[0] for c, _ in t.seen][:3] == ["id=" + "a" * 56, "kill", "systemctl"], t.seen
    assert len(t.seen) == 9, t.seen  # raylet, worker, reboot; cut, heal, check, timer; raylet at a deadline; kmsg


def test_the_ssh_backend_hands_its_hosts_the_become_of_their_access():
    b = ssh_backend()
    assert (b.connect("10.0.0.2").user, b.connect("10.0.0.2").become) == ("ubuntu", "sudo")
    assert (b.connect("10.0.0.3").user, b.connect("10.0.0.3").become) == ("nosudo", "sudo")
    assert (b.connect("10.0.0.4").user, b.connect("10.0.0.4").become) == ("root", None)


def test_a_refusal_is_thread_safe_per_host(asked):
    """Correlated members may ask at once: one probe per host."""
    b = ssh_backend()
    host = b.host(UBUNTU.node_id)
    threads = [threading.Thread(target=b.escalation, args=(host,)) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert asked.count(("10.0.0.2", "id -u; id -un")) == 1
