"""A cluster described by a profile, as in nightly CI against staging: here the stand-in is
an embedded cluster started separately (conftest.py's `standin`, shared with the script sessions).

Covers: a dry run submits, locks and records nothing, the cluster lock, protected profiles, a SIGKILLed session
cleaned up by `ray-chaos sweep` from another runner (and a live one's left alone), SIGTERM reverting on its
own, the health guard.  A suite
green through --chaos-profile, with no secret in what it wrote, is test_user_workloads.py's
healthy script (every script session runs through the stand-in's profile).
"""

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from chaos.backends.lock import LOCK_ID, ClusterLock
from chaos.ledger import Ledger
from chaos.profile import dump_profile
from chaos.waits import poll_until

load_yaml = YAML(typ="safe", pure=True).load

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def chaos_cmd(profile, reports, *args):
    return [sys.executable, "-m", "pytest", "-m", "chaos", "-p", "no:cacheprovider", "-q", "-s",
            "--chaos-profile", str(profile), "--chaos-reports", str(reports), *args]


def _ssh_overrides(profile):
    data = load_yaml(Path(profile).read_text())
    return [o for o in data["hosts"].get("overrides", []) if o.get("ssh", {}).get("key_file")]


def _jobs(profile):
    """Every job the stand-in's Jobs API holds: submission id -> status."""
    from ray.job_submission import JobSubmissionClient

    url = load_yaml(Path(profile).read_text())["ray"]["dashboard_url"]
    return {j.submission_id: str(j.status.value) for j in JobSubmissionClient(url).list_jobs()}


def test_dry_run_prints_the_plan_and_submits_locks_and_records_nothing(standin, tmp_path):
    """A dry run reads the node table and prints each test's plan; the Jobs API holds exactly
    the jobs it held before (no run, no lock, no cluster-side ledger entry) and no ledger file
    is written."""
    _, profile = standin
    before = _jobs(profile)
    p = subprocess.run(chaos_cmd(profile, tmp_path, "--chaos-dry-run", "-rs",
                                 "suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity",
                                 "suites/test_cuda_faults.py::test_ecc_error_in_rank_1_after_checkpoint_2"),
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:]
    out = p.stdout
    assert "DRY RUN plan of suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity" in out, out[-4000:]
    workers = [o["address"] for o in load_yaml(Path(profile).read_text())["safety"]["allowlist"]]
    assert f"eligible now ({len(workers)}): " in out and all(f"worker node {ip} " in out for ip in workers), out
    assert "refused now: head node" in out and "is never targeted unless safety.allow_head: true" in out
    assert "the cluster's lock: free" in out
    assert out.count("dry run: plan of 1 fault(s) printed; nothing submitted, locked, recorded or touched") == 1
    assert "SKIPPED [2]" in out, out[-3000:]
    assert _jobs(profile) == before, "a dry run left jobs in the Jobs API"
    assert not (tmp_path / "ledger.jsonl").exists(), "a dry run must not write the ledger"


def test_protected_profile_is_refused(standin, tmp_path):
    _, profile = standin
    data = load_yaml(profile.read_text())
    data["protected"] = True
    protected = tmp_path / "protected.yaml"
    dump_profile(data, protected)
    p = subprocess.run(chaos_cmd(protected, tmp_path, "suites/test_raylet_kill.py"), cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "is protected: the harness refuses to inject faults into this cluster" in p.stdout + p.stderr


def test_second_session_is_refused_by_the_cluster_lock(standin, tmp_path):
    """The lock (a job with a fixed id through the Jobs API) refuses a second session naming its
    holder; once the holder is killed, ``ray-chaos sweep`` on its machine releases it at once
    (its process is known gone: no heartbeat to wait out)."""
    _, profile = standin
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys; from chaos.backends.lock import ClusterLock; from chaos.profile import load_profile\n"
            f"ClusterLock(load_profile({str(profile)!r}).ray.dashboard_url).acquire()\n"
            "print('LOCKED', flush=True); sys.stdin.read()")],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "LOCKED"
        p = subprocess.run(chaos_cmd(profile, tmp_path, "suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity"),
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert p.returncode != 0
        assert f"another ray-chaos session holds this cluster's lock: session {holder.pid} (pid {holder.pid} on " \
            in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]
    finally:
        holder.kill()  # a killed session cannot release its lock
        holder.wait(timeout=30)
    swept = subprocess.run([sys.executable, "-m", "chaos.cli", "sweep", "--profile", str(profile), "--ledger",
                            str(tmp_path / "ledger.jsonl")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert f"sweep: released the cluster lock of a session that is gone (session {holder.pid} (pid {holder.pid} on " \
        in swept.stdout, swept.stdout + swept.stderr
    assert swept.returncode == 0 and LOCK_ID not in _jobs(profile)


def start_session(profile, reports, test):
    """A chaos session of ``test`` through ``profile`` in a session of its own, its output in
    reports/session.log (read when it ends before the point a test waits for)."""
    reports.mkdir(parents=True, exist_ok=True)
    with open(reports / "session.log", "wb") as out:
        return subprocess.Popen(chaos_cmd(profile, reports, test), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_injected(ledger_path, kind, session, timeout=400):
    """The ledger's injected ``kind`` entry; a session that ends first fails the test at once
    with its output (a fault that cannot be injected there, e.g. no CUDA driver on the nodes)."""
    def check():
        entries = Ledger(ledger_path).entries().values() if ledger_path.exists() else []
        hit = next((e for e in entries if e["fault"] == kind and e["state"] == "injected"), None)
        if hit is None and session.poll() is not None:
            log = (ledger_path.parent / "session.log").read_text(errors="replace")
            pytest.fail(f"the session ended (exit {session.returncode}) before a {kind} fault was injected:\n"
                        f"{log[-4000:]}")
        return hit, f"{len(list(entries))} ledger entries"
    return poll_until(check, timeout, f"a {kind} fault to be injected", interval=0.5)


def _control_len(path):
    with open(path, "rb") as f:
        return int.from_bytes(f.read(16)[12:16], "little")


def sweep_from_another_runner(profile, runner_dir, timeout=180):
    """``ray-chaos sweep --profile`` as a CI runner that shares nothing with the session's: its
    own UTS and PID namespaces (another hostname; the session's PIDs mean nothing there) and a
    fresh working directory with no reports, hence no ledger file of its own."""
    runner_dir.mkdir(parents=True, exist_ok=True)
    sweep = f"{shlex.quote(sys.executable)} -m chaos.cli sweep --profile {shlex.quote(str(profile))}"
    return subprocess.run(["unshare", "--uts", "--pid", "--mount", "--fork", "--mount-proc", "sh", "-c",
                           f"hostname second-runner && {sweep}"], cwd=runner_dir, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_lost_runners_fault_and_lock_are_swept_from_another_runner(standin, tmp_path):
    """Cleanup from any runner: while the session lives (here frozen mid-fault, its heartbeat still
    fresh), another runner's sweep leaves its lock and its armed fault alone and says so; once it
    is SIGKILLed and its reports directory deleted, the other runner's sweep finds the fault on the
    cluster side, disarms it and — its heartbeat stopped — releases its lock."""
    _, standin_profile = standin
    data = load_yaml(standin_profile.read_text())
    data["safety"].update({"lock_heartbeat_s": 10, "lock_stale_after_s": 30})
    profile = tmp_path / "profile.yaml"
    dump_profile(data, profile)
    reports = tmp_path / "reports"
    p = start_session(profile, reports, "suites/test_cuda_faults.py::test_hang_is_caught_by_the_collective_timeout")
    try:
        _sweep_from_another_runner_leaves_nothing(p, profile, reports, data, tmp_path)
    finally:
        if p.poll() is None:
            p.kill()
        # whatever failed above, nothing of it may stay for the tests after (this machine's sweep
        # sees the killed session's process gone at once)
        subprocess.run([sys.executable, "-m", "chaos.cli", "sweep", "--profile", str(profile)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)


def _sweep_from_another_runner_leaves_nothing(p, profile, reports, data, tmp_path):
    try:
        entry = _wait_injected(reports / "ledger.jsonl", "cuda", p)
        control = entry["revert"]["control"]
        # frozen, it reverts nothing meanwhile, and its last heartbeat (at most 10 s old) stays
        # fresh for at least 20 s more: the sweep below sees a live session
        os.kill(p.pid, signal.SIGSTOP)
        alive = sweep_from_another_runner(profile, tmp_path / "runner-2")
        assert alive.returncode == 0, alive.stdout + alive.stderr
        assert "sweep: left the cluster lock in place: held by a live session" in alive.stdout, alive.stdout
        assert f"sweep: left cuda ({entry['id']}) alone: its session {entry['session']} is alive (it holds the " \
               "cluster's lock with a fresh heartbeat)" in alive.stdout, alive.stdout
        assert _control_len(control) > 0 and LOCK_ID in _jobs(profile), "a live session's fault and lock were touched"
        os.kill(p.pid, signal.SIGKILL)  # mid-fault: the hang is armed, nobody left to disarm it
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    shutil.rmtree(reports)  # the lost runner's reports go with it
    assert _control_len(control) > 0, "the fault should still be armed after the SIGKILL"
    lock = ClusterLock(data["ray"]["dashboard_url"])

    def heartbeat_age():  # as another machine sees it: by the head's clock (here the PID would tell at once)
        holder = lock.holder()
        age = holder.head_now - holder.last_beat
        return age > 30, f"last heartbeat {age:.0f} s ago"

    poll_until(heartbeat_age, 120, "the killed session's heartbeat to go stale", interval=2)
    swept = sweep_from_another_runner(profile, tmp_path / "runner-3")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert f"sweep: reverted cuda ({entry['id']}) of session {entry['session']}" in swept.stdout, swept.stdout
    assert f"sweep: released the cluster lock of a session that is gone (session {entry['session']} (pid {p.pid} " \
           in swept.stdout, swept.stdout
    assert "sweep: nothing left armed (1 reverted)" in swept.stdout
    assert _control_len(control) == 0, "sweep did not disarm the CUDA shim"
    left = [j for j in _jobs(profile) if j.startswith("ray-chaos-")]
    assert not left, f"the lost session's records are still on the cluster: {left}"
    mine = Ledger(tmp_path / "runner-3" / "reports" / "ledger.jsonl").entries()
    assert mine[entry["id"]]["state"] == "reverted" and mine[entry["id"]]["by"] == "sweep"


def test_sigterm_reverts_on_its_way_out(standin, tmp_path):
    _, profile = standin
    p = start_session(profile, tmp_path, "suites/test_cuda_faults.py::test_hang_is_caught_by_the_collective_timeout")
    try:
        entry = _wait_injected(tmp_path / "ledger.jsonl", "cuda", p)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    out = (tmp_path / "session.log").read_text(errors="replace")
    assert p.returncode != 0
    assert Ledger(tmp_path / "ledger.jsonl").entries()[entry["id"]]["state"] == "reverted", out[-3000:]
    assert _control_len(entry["revert"]["control"]) == 0 if os.path.exists(entry["revert"]["control"]) else True


def test_sigkilled_partition_is_healed_by_sweep_and_hosts_come_back(standin, tmp_path):
    from chaos.embedded import netns

    _, profile = standin
    if not _ssh_overrides(profile):
        pytest.skip("the stand-in runs plain processes (no root for test hosts): no partition to heal")
    p = start_session(profile, tmp_path, "suites/test_ssh_faults.py::test_rank_kill_then_partition_over_ssh")
    try:
        entry = _wait_injected(tmp_path / "ledger.jsonl", "partition", p)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    name = entry["revert"]["netns"]
    assert netns.is_partitioned(name), "the partition should outlive the killed session"
    sweep = subprocess.run([sys.executable, "-m", "chaos.cli", "sweep", "--profile", str(profile),
                            "--ledger", str(tmp_path / "ledger.jsonl")], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert not netns.is_partitioned(name), "sweep left the partition rules in place"
    data = load_yaml(profile.read_text())
    from chaos.cluster import ClusterView

    view = ClusterView(data["ray"]["dashboard_url"], data["ray"]["gcs_address"])
    view.wait_alive_workers(len(_ssh_overrides(profile)), timeout=180)  # node recovery brings the host back


def test_health_guard_aborts_instead_of_failing(standin, tmp_path):
    _, profile = standin
    data = load_yaml(profile.read_text())
    workers = len(data["hosts"]["overrides"])
    data["safety"].update({"min_alive_nodes": workers, "unhealthy_for_s": 0.5})
    strict = tmp_path / "strict.yaml"
    dump_profile(data, strict)
    p = subprocess.run(chaos_cmd(strict, tmp_path, "-rs", "suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity"),
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:]
    assert "ABORTED (not failed)" in p.stdout and "stop condition" in p.stdout, p.stdout[-4000:]
    assert "1 skipped" in p.stdout
    assert not Ledger(tmp_path / "ledger.jsonl").open_entries()
