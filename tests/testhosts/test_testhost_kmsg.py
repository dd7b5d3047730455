"""A test host's kernel log: /dev/kmsg inside it is a file of the boot, never this machine's kernel log."""

from __future__ import annotations

import os
import stat
import subprocess
import uuid
from pathlib import Path

from chaos.embedded.kube.kubelet import HostMachine, Kubelet
from chaos.embedded.kube.testhost_hosts import TestHostHosts


def machine_kmsg_is_the_device() -> bool:
    st = os.stat("/dev/kmsg")
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 11)


def test_kmsg_inside_a_host_is_its_boots_own_file(network, host, ssh, tmp_path):
    kubelet = Kubelet(tmp_path / "pods")
    try:
        kubelet.add_node(host.name, HostMachine(host))
        hosts = TestHostHosts(network, kubelet)
        token = uuid.uuid4().hex
        line = f"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=chaos-test-{token}, GPU has fallen off the bus."
        assert ssh.run("stat -c %F /dev/kmsg").check().stdout.strip() == "regular empty file"
        ssh.run(f"printf '<3>{line}\\n' >> /dev/kmsg").check()

        path = hosts.kernel_log(host.name)
        assert path == f"/proc/{host.pids()['init']}/root/dev/kmsg"
        assert Path(path).read_text() == f"<3>{line}\n"
        dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30)
        assert dmesg.returncode == 0, dmesg.stderr
        assert token not in dmesg.stdout, "the line reached this machine's kernel log"
        assert machine_kmsg_is_the_device()

        host.power_off()
        assert hosts.kernel_log(host.name) is None, "a host that is down has no kernel log to read"
        host.boot()
        after = hosts.kernel_log(host.name)
        assert after != path and Path(after).read_text() == "", "a new boot starts with an empty kernel log"
    finally:
        kubelet.close()


def test_the_xid_fault_writes_a_hosts_kernel_log_over_ssh_and_sweep_empties_it(host, ssh):
    """The xid fault's way to a kernel log through a host's own transport (SSH as root): the
    line lands in the host's stand-in, never in this machine's; sweep empties the stand-in
    (a regular file), disarms the plan and removes its control file."""
    from chaos.faults.xid import Xid, xid_line

    token = uuid.uuid4().hex[:12]
    line = xid_line(48, 1, name=f"chaos-test-{token}")
    out = Xid._kmsg_by_transport(ssh, line)
    assert out.endswith("written to /dev/kmsg (stand-in file)"), out
    kmsg = Path(f"/proc/{host.pids()['init']}/root/dev/kmsg")
    assert kmsg.read_text() == f"<3>{line}\n"
    assert token not in subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30).stdout

    class Backend:  # what sweep uses of a backend: reach a host by its ledger key, its python, its capabilities
        python = "python3"
        profile = None
        kube = None  # no Kubernetes API: a test host reached over SSH

        @staticmethod
        def reach(key):
            assert key == host.name
            return type("Host", (), {"transport": ssh})

    control = f"/dev/shm/chaos-xid-test-{token}.ctl"
    try:
        assert Xid.sweep({"action": "disarm-xid", "host": host.name, "control": control}, Backend) is True
        assert kmsg.read_text() == "", "sweep left the Xid line in the host's kernel-log stand-in"
        # disarmed (a process that still maps the file sees no plan), then removed from the host
        assert not Path(control).exists(), "sweep left the control file on the host"
    finally:
        Path(control).unlink(missing_ok=True)
