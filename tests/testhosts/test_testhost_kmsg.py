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
