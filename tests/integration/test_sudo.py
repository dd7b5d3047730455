"""Sessions that log in to the foreign-cluster stand-in as a user other than root, as teams do
(chaos/embedded/foreign.py's USERS): as `ubuntu` with `ssh.become: sudo` a raylet SIGKILL and a
partition over SSH — both root's work on hosts where Ray runs as root — pass; as `nosudo` a
partition built by its class is refused when its trigger fires, before anything is recorded or
injected, the message naming the kind, the host, the privilege and the fix (one built by
``chaos.partition`` is refused at once: the session's preflight, ray-chaos doctor, found it
cannot run), and no chain is left on any host.  Two Ray runs (one stopped at its first trigger)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.profile import dump_profile, profile_from_dict
from chaos.transport.ssh import SSHTransport

pytestmark = pytest.mark.integration

SUITE = '''
import pytest

from chaos.faults.partition import Partition
from chaos.faults.raylet import RayletKill
from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos


def test_raylet_sigkill_then_partition(chaos):
    outcome = chaos.run(chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5),
                        faults=[(AfterCheckpoint(2), RayletKill(rank=1, method="sigkill")),
                                (AfterCheckpoint(4), Partition(rank=1))])
    outcome.assert_verdicts()
    escalated = {inj.host.transport.as_root("id -u") for inj in outcome.injections}
    assert escalated == {"sudo -n sh -c 'id -u'"}, escalated  # through sudo, not as root's login


def test_partition(chaos):
    chaos.run(chaos.workload(num_workers=2, max_failures=3, steps=20, checkpoint_every=5),
              faults=[(AfterCheckpoint(2), Partition(rank=1))]).assert_verdicts()


def test_partition_by_kind(chaos):
    chaos.run(chaos.workload(num_workers=2, max_failures=3, steps=20, checkpoint_every=5),
              faults=[(AfterCheckpoint(2), chaos.partition(rank=1))]).assert_verdicts()
'''


def session(cluster, tmp_path: Path, name: str, user: str, become: str | None, *tests: str):
    """``pytest -m chaos`` on SUITE's ``tests`` through the stand-in's profile as ``user``: (exit code, output, reports)."""
    from chaos.embedded.foreign import wait_healthy

    work = tmp_path / name
    work.mkdir()
    dump_profile(profile_from_dict(cluster.profile(user=user, become=become)), work / "staging.yaml")
    (work / "test_team.py").write_text(SUITE)
    wait_healthy(cluster, timeout=180)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "COLUMNS": "1000"}  # summary lines whole
    p = subprocess.run([sys.executable, "-m", "pytest", "-m", "chaos", "-p", "no:cacheprovider", "-rA", "-s",
                        *(f"test_team.py::{test}" for test in tests), "--chaos-profile", "staging.yaml", "--chaos-reports", "reports"],
                       cwd=work, capture_output=True, text=True, timeout=1200, env=env)
    return p.returncode, p.stdout + p.stderr, work / "reports"


def chains_left(cluster) -> list[str]:
    """The partition chains on every worker host, asked as root."""
    net, left = cluster.network, []
    for host in cluster.workers:
        t = SSHTransport(host.address, key_filename=net.ssh_key_path, known_hosts=net.known_hosts_path,
                         use_agent=False, connect_timeout=10, command_timeout=30)
        try:
            left += [f"{host.name}: {line}" for line in t.run("iptables -w 5 -S", timeout=20).check().stdout.splitlines()
                     if "chaos-" in line]
        finally:
            t.close()
    return left


def test_ubuntu_with_sudo_kills_and_partitions_over_ssh(foreign_standin, tmp_path):
    code, out, _ = session(foreign_standin, tmp_path, "ubuntu", "ubuntu", "sudo", "test_raylet_sigkill_then_partition")
    assert code == 0 and re.search(r"^PASSED test_team.py::test_raylet_sigkill_then_partition$", out, re.M), \
        out[-6000:]
    assert chains_left(foreign_standin) == []


def test_nosudo_is_refused_before_anything_is_injected(foreign_standin, tmp_path):
    from chaos.ledger import Ledger

    code, out, reports = session(foreign_standin, tmp_path, "nosudo", "nosudo", "sudo", "test_partition",
                                 "test_partition_by_kind")
    assert code != 0 and re.search(r"^FAILED test_team.py::test_partition - ", out, re.M), out[-6000:]
    assert re.search(r"^FAILED test_team.py::test_partition_by_kind - Failed: partition refused before any injection: the "
                     r"preflight \(ray-chaos doctor\) found it cannot run", out, re.M), out[-6000:]
    refused = re.search(r"partition refused on (\S+) before injecting anything: it needs root there for iptables "
                        r"\(add and remove iptables chains \(the partition's cut\)\), and `sudo -n` says a password "
                        r"is required.*Fix: set `ssh.become: sudo`.*nosudo ALL=\(ALL\) NOPASSWD: ALL", out)
    assert refused and refused.group(1) in {w.address for w in foreign_standin.workers}, out[-6000:]
    ledger = reports / "ledger.jsonl"
    assert not ledger.exists() or Ledger(ledger).entries() == {}, ledger.read_text()
    assert chains_left(foreign_standin) == []
