"""Privilege escalation over SSH (chaos.privileges): the one wrapping of a privileged command
(root as is, `sudo -n sh -c '…'` with become: sudo, quoted so the host's shell gets the exact
command back), and the probe's answer for every way a host can say yes or no.

The fake host answers with what real hosts printed (sudo 1.9.13, Debian 12, each case set up
with its sudoers rule): NOPASSWD → `0`; no rule, or not in sudoers with authentication on →
`sudo: a password is required`; not in sudoers with `Defaults !authenticate` → `NAME is not in
the sudoers file.`; `Defaults requiretty` → `sudo: sorry, you must have a tty to run sudo`; a
runas_default of nobody → `65534`; no sudo → dash's `sh: 1: sudo: not found`, exit 127."""

from __future__ import annotations

import shlex

import pytest

from chaos.errors import TransportError
from chaos.faults.partition import CUT, HEAL
from chaos.faults.raylet import KILL_RAYLET_BY_NODE_ID
from chaos.privileges import Escalation, escalate, probe
from chaos.transport.base import CommandResult
from chaos.transport.ssh import SSHTransport

SUDO_ID = "sudo -n sh -c 'id -u'"


class FakeHost:
    """A host that answers ``id`` as ``uid``/``user`` and ``sudo -n id -u`` with ``sudo``
    (exit code, stdout, stderr); every command is kept."""

    def __init__(self, uid: int, user: str, sudo: tuple[int, str, str] | None = None, host: str = "10.0.0.2"):
        self.host, self.uid, self.user, self.sudo = host, uid, user, sudo
        self.commands: list[str] = []

    def run(self, command, timeout=30.0, privileged=False):
        assert not privileged, "the probe states its own commands"
        self.commands.append(command)
        if command == "id -u; id -un":
            return CommandResult(self.host, command, 0, f"{self.uid}\n{self.user}\n", "")
        if command == SUDO_ID and self.sudo is not None:
            return CommandResult(self.host, command, *self.sudo)
        raise AssertionError(f"unexpected command {command!r}")

    def launch(self, command, privileged=False):
        raise AssertionError("the probe launches nothing")

    def close(self):
        pass


# -- the wrapping ------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [KILL_RAYLET_BY_NODE_ID.format(node_id=shlex.quote("ab'c")),
                                     CUT.format(chain="chaos-1", heal=HEAL.format(chain="chaos-1"), self_heal_s=30),
                                     "echo 'it''s' \"$HOME\" `id` $(id -u); exit 3"])
def test_sudo_gets_the_exact_command_back(command):
    wrapped = escalate(command, "sudo")
    assert shlex.split(wrapped) == ["sudo", "-n", "sh", "-c", command]


def test_no_become_leaves_the_command_alone_and_an_unknown_one_is_an_error():
    assert escalate("kill -9 1", None) == "kill -9 1"
    with pytest.raises(ValueError, match="become 'doas' is none of sudo"):
        escalate("kill -9 1", "doas")


@pytest.mark.parametrize("user, become, expected", [
    ("root", None, "kill -9 42"),
    ("root", "sudo", "kill -9 42"),  # root needs no sudo (nor sudo installed)
    ("ubuntu", "sudo", "sudo -n sh -c 'kill -9 42'"),
    ("ubuntu", None, "kill -9 42"),  # runs as ubuntu; the probe refuses it before
])
def test_the_ssh_transport_decides_by_login_user_and_become(user, become, expected):
    t = SSHTransport("10.0.0.2", user=user, become=become, use_agent=False, key_filename=None)
    assert t.as_root("kill -9 42") == expected
    assert t.as_root(["kill", "-9", "42"]) == expected


def test_only_privileged_commands_are_wrapped(monkeypatch):
    t = SSHTransport("10.0.0.2", user="ubuntu", become="sudo", use_agent=False)
    opened = []

    def open_session(cmd):
        opened.append(cmd)
        raise TransportError("not connected")  # what was asked for is all this test needs

    monkeypatch.setattr(t, "_open_session", open_session)
    for kwargs in ({}, {"privileged": True}):
        with pytest.raises(TransportError):
            t.run("iptables -S", **kwargs)
    with pytest.raises(TransportError):
        t.launch("systemctl reboot", privileged=True)
    assert opened == ["iptables -S", "sudo -n sh -c 'iptables -S'", "sudo -n sh -c 'systemctl reboot'"]
    assert [e.command for e in t.transcript] == opened[:2]  # the transcript shows what ran


# -- the probe ---------------------------------------------------------------------------------

def test_root_login_needs_nothing_and_sudo_is_not_asked():
    host = FakeHost(0, "root")
    esc = probe(host, "sudo")
    assert esc == Escalation("10.0.0.2", "root", "root") and esc.ok
    assert host.commands == ["id -u; id -un"]
    assert esc.line() == "privileged commands run as root: logged in as root"


def test_passwordless_sudo():
    esc = probe(FakeHost(1000, "ubuntu", (0, "0\n", "")), "sudo")
    assert esc.ok and esc.how == "sudo -n" and esc.user == "ubuntu"
    assert esc.line() == "privileged commands run as root: sudo -n"


def test_not_root_and_no_become():
    host = FakeHost(1000, "ubuntu")
    esc = probe(host, None)
    assert not esc.ok and host.commands == ["id -u; id -un"]
    assert esc.reason == "the login user ubuntu is not root and ssh.become is unset"
    assert "`ssh.become: sudo`" in esc.fix and "ubuntu ALL=(ALL) NOPASSWD: ALL" in esc.fix and "`ssh.user: root`" in esc.fix


@pytest.mark.parametrize("sudo, reason", [
    ((1, "", "sudo: a password is required\n"), "`sudo -n` says a password is required (nosudo has no NOPASSWD rule"),
    ((1, "", "nosudo is not in the sudoers file.\n"), "nosudo may not use sudo (nosudo is not in the sudoers file.)"),
    ((127, "", "sh: 1: sudo: not found\n"), "sudo is not installed (sh: 1: sudo: not found)"),
    ((0, "65534\n", ""), "`sudo -n` runs nosudo's commands as uid 65534, not root"),
    ((1, "", "sudo: sorry, you must have a tty to run sudo\n"), "sudo requires a terminal for nosudo"),
    ((1, "", "sudo: unable to resolve host fc-worker-1\nsudo: some new refusal\n"),
     "`sudo -n` failed (exit 1): sudo: some new refusal"),
])
def test_each_way_sudo_says_no(sudo, reason):
    host = FakeHost(1001, "nosudo", sudo)
    esc = probe(host, "sudo")
    assert not esc.ok and esc.how is None
    assert esc.reason.startswith(reason), esc.reason
    assert host.commands == ["id -u; id -un", SUDO_ID]
    assert esc.fix and esc.fix in esc.line()


def test_the_refusal_names_the_kind_host_privilege_and_fix():
    esc = probe(FakeHost(1001, "nosudo", (1, "", "sudo: a password is required\n")), "sudo")
    text = esc.refusal("partition", ("iptables",))
    assert text.startswith("partition refused on 10.0.0.2 before injecting anything: it needs root there for "
                           "iptables (add and remove iptables chains (the partition's cut))")
    assert "a password is required" in text and "Fix: set `ssh.become: sudo`" in text


def test_an_unreachable_host_is_the_transports_error_and_garbage_is_not_a_user():
    class Down(FakeHost):
        def run(self, command, timeout=30.0, privileged=False):
            return CommandResult(self.host, command, 255, "", "connection refused")

    with pytest.raises(TransportError, match="connection refused"):
        probe(Down(0, "root"), "sudo")

    class Odd(FakeHost):
        def run(self, command, timeout=30.0, privileged=False):
            return CommandResult(self.host, command, 0, "0\n", "")

    with pytest.raises(ValueError, match="not a uid and a name"):
        probe(Odd(0, "root"), None)
