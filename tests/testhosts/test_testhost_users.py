"""The foreign-cluster stand-in's login users on a real test host (sshd, sudo, iptables; no
Ray): `ubuntu` gets root through passwordless sudo — the probe says so, a privileged command
runs as uid 0, a partition's cut over SSH is made and healed, a reboot is issued — while
without `become` the same login is refused and its privileged command fails; `nosudo` is refused
with sudo's own words; root needs nothing.  This machine's user database is not touched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chaos.backends.base import Host
from chaos.cluster import Target
from chaos.embedded.foreign import USERS
from chaos.embedded.testhost import Isolation
from chaos.faults.base import Injection
from chaos.faults.partition import Partition
from chaos.privileges import probe
from chaos.transport.ssh import SSHTransport

pytestmark = pytest.mark.skipif(shutil.which("sudo") is None, reason="needs sudo (scripts/setup-system.sh installs it)")

MACHINE = ("/etc/passwd", "/etc/group", "/etc/shadow")


@pytest.fixture
def machine_before():
    files = {p: Path(p).read_bytes() for p in MACHINE}
    rules = sorted(p.name for p in Path("/etc/sudoers.d").iterdir())
    yield
    assert {p: Path(p).read_bytes() for p in MACHINE} == files, "the test host wrote this machine's user database"
    assert sorted(p.name for p in Path("/etc/sudoers.d").iterdir()) == rules


@pytest.fixture
def users_host(network, machine_before):
    host = network.add_host("rc-users-1", isolation=Isolation(users=USERS))
    host.boot()
    return host


def login(network, host, user, become=None):
    return SSHTransport(host.address, user=user, become=become, key_filename=network.ssh_key_path,
                        known_hosts=network.known_hosts_path, use_agent=False, connect_timeout=5, command_timeout=20)


def test_ubuntu_gets_root_through_sudo_for_what_needs_it(network, users_host):
    t = login(network, users_host, "ubuntu", "sudo")
    try:
        esc = probe(t, t.become)
        assert (esc.ok, esc.how, esc.user) == (True, "sudo -n", "ubuntu"), esc
        assert t.run("id -un; id -u", timeout=10).check().stdout.split() == ["ubuntu", "2000"]
        assert t.run("id -u", timeout=10, privileged=True).check().stdout.strip() == "0"
        # the partition's cut over SSH as ubuntu: its self-heal timer left running does not hold sudo's exit
        p = Partition(self_heal_s=120)
        inj = Injection(p, Target(node_id="n" * 56, node_ip=users_host.address, rank=1),
                        Host(key=users_host.address, name=None, transport=t))
        p.revert_plan(inj)
        p.inject(None, inj)
        assert p.is_partitioned(inj)
        assert t.run(f"ps -o user= -p {inj.evidence['timer_pid']}", timeout=10).stdout.strip() == "root"

        class Ctx:
            class timeline:
                emit = staticmethod(lambda *a, **k: None)

        assert p.revert(Ctx, inj) and not p.is_partitioned(inj)
        # a reboot issued through sudo (secure_path reaches the host's own systemctl)
        before, boot = users_host.boot_id, users_host.boot_count
        t.launch("systemctl reboot", privileged=True)
        t.close()
        assert users_host.wait_up(after_boot=boot, timeout=30) > boot and users_host.boot_id != before
    finally:
        t.close()


def test_without_become_or_sudo_rights_privileged_commands_are_refused(network, users_host):
    plain = login(network, users_host, "ubuntu")
    nosudo = login(network, users_host, "nosudo", "sudo")
    root = login(network, users_host, "root", "sudo")
    try:
        esc = probe(plain, None)
        assert not esc.ok and esc.reason == "the login user ubuntu is not root and ssh.become is unset", esc
        failed = plain.run("iptables -w 5 -S", timeout=10, privileged=True)
        assert not failed.ok and "ermission denied" in failed.stderr, failed
        esc = probe(nosudo, "sudo")
        assert not esc.ok and "a password is required" in esc.reason, esc
        assert not nosudo.run("id -u", timeout=10, privileged=True).ok
        assert probe(root, "sudo").how == "root"
    finally:
        for t in (plain, nosudo, root):
            t.close()
