"""Power semantics of test hosts: a reboot is a power cut of the whole PID namespace."""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from chaos.embedded.testhost import HostState
from chaos.embedded.testhost_init import INIT_MARKER
from chaos.errors import ClusterError, TransportError
from chaos.transport.ssh import SSHTransport
from chaos.waits import poll_until
from testhost_waits import wait_text


def snapshot(pids):
    """(pid, start time) pairs, so a reused PID is not mistaken for a survivor."""
    return {(p.pid, p.create_time()) for p in map(psutil.Process, pids)}


def survivors(snap):
    alive = set()
    for pid, started in snap:
        try:
            if psutil.Process(pid).create_time() == started:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_host_sees_its_own_machine(ssh, host):
    out = ssh.run("hostname; tr '\\0' ' ' </proc/1/cmdline; echo; ls /proc | grep -c '^[0-9]';"
                  "grep -c nsfs /proc/self/mountinfo").stdout
    name, init_cmdline, nprocs, netns_mounts = out.strip().split("\n")
    assert name == host.name
    assert INIT_MARKER in init_cmdline
    assert int(nprocs) < 10  # init, sshd, workload, this session: not the whole machine
    assert netns_mounts == "0"  # no copies that would keep other hosts' netns alive


def test_systemctl_reboot_over_ssh(network, host, ssh):
    host.boot_delay = 2.0  # long enough to observe the host down
    boot, old_boot_id = host.boot_count, host.boot_id
    # "up" means sshd answers; the init may report the workload's PID just after that
    poll_until(lambda: (host.pids().get("workload"), f"PIDs reported: {host.pids()}"), 10,
               "the host's init to report its workload's PID")
    old = snapshot(host.namespace_pids())
    assert len(old) >= 3 and host.pids()["workload"] in {pid for pid, _ in old}

    ssh.launch(host.reboot_command)  # the dropped connection is not an error
    host.wait_down(boot, timeout=5)
    with pytest.raises(TransportError, match="cannot connect"):
        SSHTransport(host.address, key_filename=network.ssh_key_path, known_hosts=network.known_hosts_path,
                     use_agent=False, connect_timeout=0.5).run("true")
    assert host.wait_up(after_boot=boot, timeout=10) == boot + 1

    new_boot_id = ssh.run("cat /proc/sys/kernel/random/boot_id").check().stdout.strip()
    assert new_boot_id == host.boot_id != old_boot_id
    assert survivors(old) == set()
    assert [e.detail for e in host.events if e.state is HostState.OFF] == ["reboot"]


def test_power_commands_refuse_to_run_outside_a_host(host):
    """The power script must never act on the real machine."""
    p = subprocess.run([str(host.state_dir / "bin" / "systemctl"), "reboot"], capture_output=True, text=True)
    assert p.returncode == 1 and "not inside a chaos test host" in p.stderr


def test_poweroff_from_inside_stays_off(host):
    boot = host.boot_count
    host.reboot_from_inside("poweroff")
    assert host.state is HostState.OFF and host.events[-1].detail == "poweroff"
    with pytest.raises(ClusterError, match="powered off"):
        host.wait_up(after_boot=boot, timeout=2)


def test_power_off_boot_and_power_cycle_from_python(host):
    first = host.boot_id
    old = snapshot(host.namespace_pids())
    host.power_off()
    assert host.state is HostState.OFF and survivors(old) == set()
    host.boot()
    assert host.is_up and host.boot_count == 2 and host.boot_id != first
    host.power_cycle()
    assert host.wait_up(after_boot=2, timeout=10) == 3


def test_workload_gets_env_and_log_per_boot(network):
    h = network.add_host("rc-t-2", workload=["sh", "-c", 'echo "hello $GREETING from $(hostname)"; exec sleep infinity'],
                         env={"GREETING": "there"})
    h.boot()
    wait_text(h.workload_log, "hello there from rc-t-2")
    h.power_cycle()
    h.wait_up(after_boot=1)
    wait_text(h.workload_log, "hello there from rc-t-2", count=2)
    assert h.workload_log.read_text().count("==== rc-t-2 boot #") == 2


def test_reboot_when_workload_exits(network):
    """Automatic node recovery: a host whose workload died comes back by itself."""
    marker = network.state_dir / "booted-once"
    first_boot_fails = f"[ -e {marker} ] && exec sleep infinity; touch {marker}; exit 7"
    h = network.add_host("rc-t-2", workload=["sh", "-c", first_boot_fails], reboot_when_workload_exits=True)
    h.boot(wait=False)
    assert h.wait_up(after_boot=1, timeout=10) == 2
    assert "workload exited (7)" in (h.state_dir / "init.log").read_text()
    assert [e.detail for e in h.events if e.state is HostState.OFF] == ["reboot"]


def test_workload_that_cannot_start_is_logged_and_the_host_stays_up(network):
    h = network.add_host("rc-t-2", workload=["/nonexistent/binary"])
    h.boot()
    wait_text(h.workload_log, "cannot start workload ['/nonexistent/binary']")
    assert h.is_up


def test_listeners_see_every_state_change_before_waiters_return(network):
    seen = []
    h = network.add_host("rc-t-2")
    h.add_listener(lambda event: seen.append((event.state, event.boot_count)))
    h.boot()
    h.power_off()
    assert seen == [(HostState.BOOTING, 1), (HostState.UP, 1), (HostState.OFF, 1)]
    assert [e.detail for e in h.events][-1] == "power-off"


def test_writes_to_home_stay_inside_the_boot(ssh, host, tmp_path):
    """A power cut must not leave half-written files in the real machine's home."""
    probe = f"/root/.rc-probe-{host.boot_id}"
    ssh.run(f"touch {probe} && ls {probe}").check()
    assert not os.path.exists(probe)
    host.power_cycle()
    host.wait_up(after_boot=1)
    assert ssh.run(f"ls {probe}").exit_code != 0
