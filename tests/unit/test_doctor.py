"""ray-chaos doctor's checks, each failing case with its healthy twin; fakes only at the
boundaries: the dashboard's version answer, the Jobs API (tests/unit/fake_jobs.py), and a
host's shell (the probe runs in a real ``sh`` whose PATH holds stand-ins for id, sudo and the
tools)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from chaos import doctor
from chaos.backends.lock import BEAT_PREFIX, LOCK_ID
from chaos.cluster import Node
from chaos.doctor import Check, cluster, ssh
from chaos.errors import TransportError
from chaos.profile import profile_from_dict
from chaos.ray_support import RayVersionError, installed_ray_version
from chaos.safety import NodeInfo, Safety
from chaos.transport.base import CommandResult
from tests.unit.fake_jobs import FakeJobs, FakeStore

HOST_KINDS = ["raylet-kill", "worker-kill", "node-reboot", "partition", "cuda", "preempt", "xid"]


def profile(**extra):
    data = {"name": "staging", "ray": {"dashboard_url": "http://10.0.0.1:8265", "gcs_address": "10.0.0.1:6379"},
            "storage": {"path": "/mnt/shared/chaos"}, "safety": {"allow_all_workers": True}}
    return profile_from_dict({**data, **extra})


# -- the table and the exit rule ---------------------------------------------------------
def test_a_fix_is_given_exactly_when_a_check_fails():
    with pytest.raises(ValueError, match="a fix is given exactly when"):
        Check("cluster", "x", False, "seen")
    with pytest.raises(ValueError, match="a fix is given exactly when"):
        Check("cluster", "x", True, "seen", fix="do this")


def test_all_passed_exits_zero():
    checks = [Check("cluster", "Ray dashboard", True, "answers"), Check("host 10.0.0.2", "login", True, "as root")]
    assert doctor.exit_code(checks) == doctor.OK
    assert doctor.table(checks).splitlines() == ["✔ cluster        Ray dashboard: answers",
                                                 "✔ host 10.0.0.2  login: as root",
                                                 "doctor: all 2 checks passed"]


def test_a_failed_check_names_what_it_stops_and_its_fix_and_exits_non_zero():
    checks = [Check("cluster", "Ray dashboard", True, "answers"),
              Check("host 10.0.0.2", "tools", False, "not found: iptables (for partition)", "install iptables",
                    ("partition",))]
    assert doctor.exit_code(checks) == doctor.FAILED
    text = doctor.table(checks)
    assert "✗ host 10.0.0.2  tools: not found: iptables (for partition)" in text
    assert "stops: partition" in text and "fix: install iptables" in text
    assert text.endswith("doctor: 1 of 2 checks failed; cannot run: partition")
    assert doctor.blocked(checks) == {"partition": [checks[1]]} and doctor.blocks_all(checks) == []


def test_a_failed_check_without_kinds_stops_every_kind():
    checks = [Check("cluster", "Ray dashboard", False, "refused", "reach it")]
    assert doctor.blocks_all(checks) == checks
    assert "stops: every fault kind" in doctor.table(checks)
    assert doctor.table(checks).endswith("cannot run: every fault kind")


class Capable:
    kube = head = object_storage = storage_proxy = None


def test_enabled_kinds_leave_out_what_the_backend_cannot_do():
    kinds, left_out = doctor.enabled_kinds(Capable())
    assert kinds == HOST_KINDS
    assert left_out["pod-delete"] == "needs kube" and left_out["gcs-kill"] == "needs head"
    with_kube = Capable()
    with_kube.kube = object()
    assert "pod-delete" in doctor.enabled_kinds(with_kube)[0]


def test_a_capability_that_cannot_be_reached_now_still_enables_its_kinds():
    from chaos.errors import ClusterError

    class Unreachable(Capable):
        @property
        def kube(self):
            raise ClusterError("no kubeconfig at ~/.kube/config")

    assert "pod-delete" in doctor.enabled_kinds(Unreachable())[0]


# -- the cluster side ----------------------------------------------------------------------
@pytest.fixture
def same_ray(monkeypatch):
    monkeypatch.setattr(cluster, "dashboard_ray_version", lambda url, timeout: installed_ray_version())


def test_a_reachable_cluster_with_the_harness_ray_a_free_lock_and_no_open_entries_passes(same_ray):
    seen = cluster.checks(profile(), store=FakeStore(FakeJobs()))
    assert seen.reachable and all(c.ok for c in seen.checks), seen.checks
    assert [(c.subject, c.what, c.detail) for c in seen.checks][1:] == [
        ("lock", "the cluster's lock", "free"), ("lock", "open ledger entries on the cluster", "none")]
    assert f"Ray {installed_ray_version()}, the harness's own" in seen.checks[0].detail


def test_an_unreachable_dashboard_fails_naming_the_url_and_stops_there(monkeypatch):
    def refused(url, timeout):
        raise RayVersionError(f"could not read the cluster's Ray version from {url}/api/version: Connection refused")

    monkeypatch.setattr(cluster, "dashboard_ray_version", refused)
    seen = cluster.checks(profile())
    assert not seen.reachable and [c.ok for c in seen.checks] == [False]
    assert seen.checks[0].detail == "http://10.0.0.1:8265/api/version: Connection refused"
    assert "correct ray.dashboard_url" in seen.checks[0].fix and seen.checks[0].kinds == ()


def test_another_ray_fails_with_the_install_line(monkeypatch):
    monkeypatch.setattr(cluster, "dashboard_ray_version", lambda url, timeout: "2.58.0")
    seen = cluster.checks(profile())
    if installed_ray_version() == "2.58.0":
        pytest.skip("the installed Ray is the one this test stands the cluster's for")
    assert not seen.reachable and seen.checks[0].what == "Ray version"
    assert seen.checks[0].fix == "pip install 'ray[train,default]==2.58.0' in the harness's environment"


def test_a_jobs_api_that_does_not_answer_fails(same_ray):
    jobs = FakeJobs()
    jobs.down = True
    seen = cluster.checks(profile(), store=FakeStore(jobs))
    assert not seen.reachable and seen.checks[-1].what == "Jobs API" and not seen.checks[-1].ok


def _locked(jobs: FakeJobs, owner: str, at: float) -> None:
    """A lock of session ``owner`` on another machine, taken and last beaten at ``at`` (head clock)."""
    now = jobs.clock
    jobs.clock = lambda: at
    jobs.submit_job("sleep 60", LOCK_ID, {"owner": owner, "host": "elsewhere", "boot_id": "other", "pid": "7",
                                          "heartbeat_s": "60", "stale_after_s": "300"})
    jobs.submit_job("true", f"{BEAT_PREFIX}{owner}-1", {"owner": owner})
    jobs.clock = now


def test_a_lock_held_by_a_live_session_fails_naming_it(same_ray):
    jobs = FakeJobs()
    _locked(jobs, "s1", at=jobs.clock() - 10)
    lock = next(c for c in cluster.checks(profile(), store=FakeStore(jobs)).checks if c.what == "the cluster's lock")
    assert not lock.ok and "another ray-chaos session holds this cluster's lock: session s1" in lock.detail
    assert "wait until that session ends" in lock.fix


def test_a_lock_of_a_lost_session_fails_with_the_sweep(same_ray):
    jobs = FakeJobs()
    _locked(jobs, "s1", at=jobs.clock() - 1000)
    lock = next(c for c in cluster.checks(profile(), store=FakeStore(jobs)).checks if c.what == "the cluster's lock")
    assert not lock.ok and "a session that is gone" in lock.detail and "no heartbeat for 1000 s" in lock.detail
    assert lock.fix.startswith("ray-chaos sweep --profile staging.yaml")


def test_an_ended_lock_job_is_free_to_take(same_ray):
    jobs = FakeJobs()
    _locked(jobs, "s1", at=jobs.clock())
    jobs.jobs[LOCK_ID]["status"] = "STOPPED"
    lock = next(c for c in cluster.checks(profile(), store=FakeStore(jobs)).checks if c.what == "the cluster's lock")
    assert lock.ok and lock.detail.startswith("free to take")


def test_open_ledger_entries_on_the_cluster_fail_with_the_sweep(same_ray):
    import json

    jobs = FakeJobs()
    entry = {"id": "e1", "fault": "partition", "target": {"node_ip": "10.0.0.3"}, "session": "s9"}
    jobs.submit_job("true", "ray-chaos-ledger-e1", {"ray-chaos": "ledger-entry", "entry": json.dumps(entry)})
    check = cluster.checks(profile(), store=FakeStore(jobs)).checks[-1]
    assert not check.ok and check.detail == "1 fault(s) not reverted: partition (e1) on 10.0.0.3 by session s9"
    assert check.fix.startswith("ray-chaos sweep --profile staging.yaml reverts them")


def test_the_live_lock_holder_s_own_entries_are_its_faults_now_not_a_sweep_s(same_ray):
    import json

    jobs = FakeJobs()
    _locked(jobs, "s1", at=jobs.clock() - 10)
    entry = {"id": "e2", "fault": "cuda", "target": {"node_ip": "10.0.0.3"}, "session": "s1"}
    jobs.submit_job("true", "ray-chaos-ledger-e2", {"ray-chaos": "ledger-entry", "entry": json.dumps(entry)})
    check = cluster.checks(profile(), store=FakeStore(jobs)).checks[-1]
    assert not check.ok and check.detail == "1 fault(s) live now, of session s1 that holds the lock: cuda on 10.0.0.3"
    assert check.fix == "wait until that session ends: it reverts its own faults"


def test_a_protected_profile_fails(same_ray):
    seen = cluster.checks(profile(protected=True), store=FakeStore(FakeJobs()))
    assert not seen.checks[0].ok and "is protected: the harness refuses to inject faults" in seen.checks[0].detail


# -- which nodes, which hosts ------------------------------------------------------------
def node(node_id, ip, is_head=False):
    return Node(node_id * 56, ip, True, is_head, None, None, None, {})


HEAD, W1, W2 = node("h", "10.0.0.1", is_head=True), node("a", "10.0.0.2"), node("b", "10.0.0.3")


class FakeView:
    def __init__(self, nodes):
        self._nodes = nodes

    def nodes(self):
        return list(self._nodes)

    def hostname(self, node_id):
        return f"host-{node_id[:2]}"


class FakeBackend:
    def __init__(self, prof, transports=None, nodes=(HEAD, W1, W2)):
        self.profile = prof
        self.safety = Safety(prof.safety)
        self.cluster = FakeView(nodes)
        self.transports = transports or {}

    def node_info(self, node_id):
        n = next(n for n in self.cluster.nodes() if n.node_id == node_id)
        return NodeInfo(node_id, n.ip, is_head=n.is_head)

    def host_key(self, node):
        return node.ip

    def reach(self, key, node=None):
        import types

        transport = self.transports[key]
        if isinstance(transport, Exception):
            raise transport
        return types.SimpleNamespace(transport=transport)


def test_targetable_nodes_pass_and_every_live_worker_host_is_checked():
    prof = profile(safety={"allowlist": [{"address": "10.0.0.2"}]})
    check, hosts = cluster.targets(FakeBackend(prof))
    assert check.ok and check.detail == "1 of 3 live nodes (10.0.0.2)"
    assert {k: p.target for k, p in hosts.items()} == {"10.0.0.2": True, "10.0.0.3": False}


def test_no_targetable_node_fails_naming_the_safety_settings():
    check, _ = cluster.targets(FakeBackend(profile(safety={})))
    assert not check.ok and check.kinds == () and "safety.allowlist" in check.fix
    assert "10.0.0.2: " in check.detail


# -- a host -----------------------------------------------------------------------------
class ShellHost:
    """A host's shell: the probe runs in a real sh whose PATH has only what the host has —
    ``tools``, an ``id`` answering ``uid``, a ``sudo`` that works or asks for a password."""

    def __init__(self, tmp_path: Path, uid: int = 0, tools=("iptables", "systemctl", "python3"), sudo: bool = True):
        self.host = "10.0.0.2"
        self.bin = tmp_path / "bin"
        self.bin.mkdir(parents=True)
        for real in ("sh", "cat", "dirname", "head", "env"):
            os.symlink(shutil.which(real), self.bin / real)
        # sudo runs its command as root: id then answers uid 0
        self._script("id", f'u=${{AS_UID:-{uid}}}; case "$1" in -u) echo $u;; -un) [ $u = 0 ] && echo root || '
                           'echo ubuntu;; esac')
        for tool in tools:
            self._script(tool, "exit 0")
        self._script("sudo", ('[ "$1" = -n ] && shift; exec env AS_UID=0 "$@"' if sudo else
                              'echo "sudo: a password is required" >&2; exit 1'))

    def _script(self, name, body):
        path = self.bin / name
        path.write_text(f"#!{shutil.which('sh')}\n{body}\n")
        path.chmod(0o755)

    def run(self, command, timeout=30):
        done = subprocess.run([str(self.bin / "sh"), "-c", command], capture_output=True, text=True, timeout=timeout,
                              env={"PATH": str(self.bin)})
        return CommandResult(self.host, command, done.returncode, done.stdout, done.stderr)

    def close(self):
        pass


def host_checks(transport, become=None, target=True):
    ssh_settings = {"become": become} if become else {}
    prof = profile(hosts={"defaults": {"ssh": ssh_settings}})
    plan = cluster.HostPlan(W1, target)
    return {c.what.split(" (")[0]: c for c in ssh.host_checks(FakeBackend(prof, {"10.0.0.2": transport}),
                                                               "10.0.0.2", plan, HOST_KINDS)}


def test_a_root_host_with_every_tool_passes(tmp_path):
    checks = host_checks(ShellHost(tmp_path))
    assert list(checks) == ["login", "privileges", "tools", "boot id", "CUDA shim's directories"]
    assert all(c.ok for c in checks.values()), checks
    assert checks["privileges"].what == "privileges (iptables, kmsg, reboot, signal-ray)"
    assert checks["tools"].detail == "iptables, kill, python3, systemctl"


def test_a_user_who_is_not_root_without_become_fails_the_privileged_kinds(tmp_path):
    check = host_checks(ShellHost(tmp_path, uid=1000))["privileges"]
    assert not check.ok and check.detail == "the login user ubuntu is not root and ssh.become is unset"
    assert check.kinds == ("raylet-kill", "worker-kill", "node-reboot", "partition", "preempt", "xid")
    assert "ssh.become: sudo" in check.fix


def test_become_sudo_with_passwordless_sudo_passes(tmp_path):
    checks = host_checks(ShellHost(tmp_path, uid=1000), become="sudo")
    assert checks["privileges"].ok and checks["privileges"].detail == "ubuntu through sudo -n (passwordless)"
    assert checks["tools"].ok and "root's PATH through sudo" in checks["tools"].detail


def test_become_sudo_that_asks_for_a_password_fails(tmp_path):
    check = host_checks(ShellHost(tmp_path, uid=1000, sudo=False), become="sudo")["privileges"]
    assert not check.ok and "`sudo -n` says a password is required" in check.detail
    assert "NOPASSWD" in check.fix


def test_a_missing_tool_fails_the_kinds_that_run_it(tmp_path):
    check = host_checks(ShellHost(tmp_path, tools=("systemctl", "python3")))["tools"]
    assert not check.ok and check.kinds == ("partition",) and "iptables (for partition)" in check.detail
    either = host_checks(ShellHost(tmp_path / "b", tools=("iptables", "python3")))["tools"]
    assert either.kinds == ("node-reboot",) and "systemctl or reboot (for node-reboot)" in either.detail


def test_reboot_stands_in_for_systemctl(tmp_path):
    assert host_checks(ShellHost(tmp_path, tools=("iptables", "reboot", "python3")))["tools"].ok


def test_a_host_that_cannot_be_logged_in_to_fails_naming_host_error_and_fix():
    error = TransportError("root@10.0.0.2:22: cannot connect within 10.0s: NoValidConnectionsError: refused")
    check = host_checks(error)["login"]
    assert not check.ok and check.subject == "host 10.0.0.2" and check.detail == str(error)
    assert check.fix.startswith("make 10.0.0.2's SSH port reachable") and check.kinds == tuple(HOST_KINDS)
    auth = host_checks(TransportError("ubuntu@10.0.0.2:22: authentication failed (tried: key file k): x"))["login"]
    assert "ssh.user and key_file" in auth.fix


def test_a_host_that_is_no_target_is_checked_for_the_shim_only(tmp_path):
    checks = host_checks(ShellHost(tmp_path, uid=1000), target=False)
    assert list(checks) == ["login", "tools", "CUDA shim's directories"]
    assert checks["tools"].detail == "python3" and checks["login"].detail.endswith("(not a target: the CUDA shim only)")


def test_an_unreadable_boot_id_and_an_unwritable_shim_directory_fail_their_kinds():
    seen = {"uid": "0", "boot_id_error": "cat: boot_id: Permission denied", "writable./var/tmp": "no",
            "writable./dev/shm": "yes", "writable./tmp": "yes"}
    [boot] = ssh._boot_id("host h", seen, HOST_KINDS)
    [shim] = ssh._shim("host h", seen, HOST_KINDS)
    assert not boot.ok and boot.kinds == ("node-reboot", "xid") and "Permission denied" in boot.detail
    assert not shim.ok and shim.kinds == ("cuda", "xid") and shim.detail == "not writable by the login user: /var/tmp"
