"""An isolated test host (the foreign-cluster stand-in's machines) shares none of this
machine's filesystem but what it binds: its own /tmp, /var/tmp and /dev/shm, the harness's
checkout, venv and reports hidden, Python and Ray reached at the node's own path — across
a reboot too.  Its twin, a plain test host, shares them (what the embedded cluster's do)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from chaos.embedded.testhost import Isolation
from chaos.transport.ssh import SSHTransport

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)


def ssh_to(network, host):
    return SSHTransport(host.address, key_filename=network.ssh_key_path, known_hosts=network.known_hosts_path,
                        use_agent=False, connect_timeout=5, command_timeout=20)


def readable(transport, path) -> bool:
    return transport.run(f"test -r {path} && cat {path} >/dev/null", timeout=10).ok


@pytest.fixture
def canary(tmp_path):
    """A file this side writes under /tmp (pytest's tmp_path), /dev/shm, the checkout and the reports."""
    paths = [tmp_path / "canary", Path("/dev/shm") / f"chaos-canary-{tmp_path.name}", ROOT / "reports" / f".canary-{tmp_path.name}"]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("harness side\n")
    yield paths
    for p in paths:
        p.unlink(missing_ok=True)


def test_an_isolated_host_sees_none_of_the_harness_machine_but_its_binds(network, tmp_path, canary):
    disk = tmp_path / "disk"
    disk.mkdir()
    iso = Isolation(binds=((str(VENV), "/opt/node-python"), (str(disk), "/opt/disk")),
                    hide=(str(ROOT), str(VENV), str(ROOT / "reports")))
    host = network.add_host("rc-iso-1", isolation=iso)
    host.boot()
    t = ssh_to(network, host)
    try:
        for path in canary + [ROOT / "pyproject.toml", VENV / "pyvenv.cfg"]:
            assert not readable(t, path), f"{path} is readable inside the isolated host"
        assert t.run("ls -A /tmp /var/tmp /dev/shm", timeout=10).check().stdout.split() == \
            ["/dev/shm:", "/tmp:", "/var/tmp:"]
        got = t.run("/opt/node-python/bin/python -c 'import ray, sys; print(ray.__version__, sys.prefix)'",
                    timeout=60).check().stdout.split()
        import ray

        assert got == [ray.__version__, "/opt/node-python"], got
        # the harness's own package is not installed there: a job gets it through its runtime_env
        assert not t.run("/opt/node-python/bin/python -c 'import chaos'", timeout=30).ok
        t.run("echo kept > /opt/disk/state; echo gone > /tmp/scratch", timeout=10).check()
        assert (disk / "state").read_text() == "kept\n" and not Path("/tmp/scratch").exists()
        boot = host.boot_count
        host.power_cycle()
        host.wait_up(after_boot=boot, timeout=20)
        t.close()
        t = ssh_to(network, host)
        assert t.run("cat /opt/disk/state; ls -A /tmp", timeout=10).check().stdout.split() == ["kept"]
    finally:
        t.close()


def test_twin_a_plain_host_shares_the_machines_files(network, canary):
    host = network.add_host("rc-iso-2")
    host.boot()
    t = ssh_to(network, host)
    try:
        assert readable(t, canary[0]) and readable(t, canary[2]) and readable(t, ROOT / "pyproject.toml")
    finally:
        t.close()


def test_a_bind_target_that_would_touch_this_machine_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least two levels deep under /opt, /mnt, /srv"):
        Isolation(binds=((str(tmp_path), "/opt"),))
    with pytest.raises(ValueError, match="at least two levels deep under /opt, /mnt, /srv"):
        Isolation(binds=((str(tmp_path), "/usr/local/x"),))
    with pytest.raises(ValueError, match="does not exist"):
        Isolation(binds=((str(tmp_path / "nope"), "/opt/x"),))
