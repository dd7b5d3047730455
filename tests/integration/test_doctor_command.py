"""`ray-chaos doctor --profile P`, run as a team runs it — the literal command, from a runner
outside the cluster (the foreign-cluster stand-in: real sshd, real Ray, hosts that share
nothing with the runner): every check passes on the stand-in and nothing changes there (no
job in the Jobs API, no lock, no ledger entry, no shim directory); a host that cannot be logged
in to is a ✗ line naming the host, its error and the fix, and the exit status is 1.

The output is printed verbatim (run with -s to see it)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}


def _jobs(dashboard_url: str) -> list[tuple[str, str]]:
    from ray.job_submission import JobSubmissionClient

    return sorted((j.submission_id or j.job_id or "", str(j.status)) for j in
                  JobSubmissionClient(dashboard_url).list_jobs())


def _doctor(cluster, profile: dict, tmp_path: Path) -> tuple[int, str]:
    from chaos.profile import dump_profile, profile_from_dict

    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    dump_profile(profile_from_dict(profile), work / "staging.yaml")
    code, out = cluster.run_outside("ray-chaos doctor --profile staging.yaml 2>&1", work, timeout=300,
                                    env=_env(tmp_path))
    print(f"$ ray-chaos doctor --profile staging.yaml   (exit {code})\n{out}", file=sys.stderr)
    return code, out


def _shim_dirs(cluster) -> list[str]:
    """The CUDA shim's directory on each worker, where one exists (doctor must create none)."""
    from chaos.shim.build import REMOTE_ROOT
    from chaos.transport.ssh import SSHTransport

    net, found = cluster.network, []
    for w in cluster.workers:
        with SSHTransport(w.address, key_filename=net.ssh_key_path, known_hosts=net.known_hosts_path,
                          use_agent=False) as t:
            if t.run(f"test -e {REMOTE_ROOT}", timeout=30).ok:
                found.append(w.address)
    return found


def test_doctor_passes_on_the_stand_in_and_changes_nothing(foreign_standin, tmp_path):
    from chaos.embedded.foreign import wait_healthy

    wait_healthy(foreign_standin, timeout=180)
    jobs, shims = _jobs(foreign_standin.dashboard_url), _shim_dirs(foreign_standin)
    code, out = _doctor(foreign_standin, foreign_standin.profile(), tmp_path)
    assert code == 0, out
    assert "✗" not in out and re.search(r"^doctor: all \d+ checks passed$", out, re.M), out
    assert "✔ lock" in out and "the cluster's lock: free" in out and "open ledger entries on the cluster: none" in out
    for w in foreign_standin.workers:
        for what in ("login: as root over SSHTransport", "privileges (iptables, kmsg, reboot, signal-ray): logged in "
                     "as root", "tools: ", "boot id: ", "CUDA shim's directories"):
            assert re.search(rf"^✔ host {re.escape(w.address)} +{re.escape(what)}", out, re.M), (what, out)
    assert "✔ safety" in out and f"{len(foreign_standin.workers)} of {len(foreign_standin.workers) + 1} live " \
                                  "nodes" in out, out
    assert _jobs(foreign_standin.dashboard_url) == jobs, "doctor changed the Jobs API's jobs"
    assert _shim_dirs(foreign_standin) == shims, "doctor created the CUDA shim's directory"


def test_doctor_names_a_host_it_cannot_log_in_to_and_exits_1(foreign_standin, tmp_path):
    from chaos.embedded.foreign import wait_healthy

    wait_healthy(foreign_standin, timeout=180)
    closed, stranger, shell_less = (w.address for w in foreign_standin.workers[:3])
    profile = foreign_standin.profile()
    profile["hosts"]["overrides"] = [
        {"match": {"address": closed}, "ssh": {"port": 2, "connect_timeout_s": 3}},  # nothing listens there
        {"match": {"address": stranger}, "ssh": {"user": "ray-chaos-no-such-user"}},
        {"match": {"address": shell_less}, "ssh": {"user": "nobody"}},  # logs in; its shell runs nothing
    ]
    jobs = _jobs(foreign_standin.dashboard_url)
    code, out = _doctor(foreign_standin, profile, tmp_path)
    assert code == 1, out
    assert re.search(rf"^✗ host {re.escape(closed)} +login: root@{re.escape(closed)}:2: cannot connect within 3.0s",
                     out, re.M), out
    assert f"fix: make {closed}'s SSH port reachable from this machine" in out, out
    assert re.search(rf"^✗ host {re.escape(stranger)} +login: ray-chaos-no-such-user@{re.escape(stranger)}:22: "
                     "authentication failed", out, re.M), out
    assert "fix: check hosts.*.ssh.user and key_file" in out
    assert re.search(rf"^✗ host {re.escape(shell_less)} +login: the probe gave no answer", out, re.M), out
    assert out.count("stops: raylet-kill, worker-kill, node-reboot, partition, cuda, preempt, xid") == 3, out
    assert re.search(r"^doctor: 3 of \d+ checks failed; cannot run: cuda, node-reboot, partition, preempt, "
                     r"raylet-kill, worker-kill, xid$", out, re.M), out
    assert "Traceback" not in out
    assert _jobs(foreign_standin.dashboard_url) == jobs
