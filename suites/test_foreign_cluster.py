"""The harness against a cluster it did not start, from outside it (chaos/embedded/foreign.py).

The foreign-cluster stand-in: machines that share nothing with this one but a bridge (their
own /tmp, /var/tmp, /dev/shm; the harness's checkout, venv and reports out of their sight;
Python and Ray at their own path) and nothing with each other (no shared filesystem: their
checkpoints go to S3 — moto behind the storage fault proxy on the bridge's address — with the
credentials the profile names by the variables the runner's environment holds), Ray started on
them by a script over SSH
(scripts/foreign-ray-start.sh), and the suites run by a pytest in a runner of its own — its
own PID, mount and network namespace, no raylet in sight — that reaches the cluster only
through a profile in vm-ssh.yaml's shape (the dashboard over HTTP, the GCS and raylet ports,
the hosts over SSH).  A canary file the runner writes must be unreadable on every host, as
must the checkout, the venv and the reports.

Raylet kills are SIGKILLs here (``--chaos-raylet-kill sigkill``): measured on Ray 2.60, after
Ray's own ``ShutdownRaylet(graceful=False)`` the node's ``ray start --block`` goes on blocking
without a raylet, so a service manager (systemd's Restart=always, the stand-in's unit) never
brings the node back; after a SIGKILL it exits and is restarted.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from chaos.transport.ssh import SSHTransport

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[1]
# What the runner checks and leaves before its pytest starts: no raylet among the processes it
# can see (its own PID namespace: no raylet or GCS binary), and a canary under /tmp and the reports on its side.
PREFLIGHT = """
import os, sys, psutil
seen = [p.info["cmdline"][:2] for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and os.path.basename(p.info["cmdline"][0]) in ("raylet", "gcs_server")]
assert not seen, f"a raylet is visible from the runner: {seen}"
for path in sys.argv[1:]:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").write("the harness's side\\n")
print(f"preflight: {len(psutil.pids())} processes visible, no raylet; canaries {sys.argv[1:]}", flush=True)
"""


@pytest.fixture(scope="module")
def foreign(request, tmp_path_factory, chaos_clusters):
    """The stand-in with 3 workers (the stub CUDA driver as the nodes' own) and no shared
    filesystem, and its profile; the session's other clusters closed first (two cores run one
    cluster at a time)."""
    from chaos.embedded.foreign import START_SCRIPT, ForeignCluster, ForeignConfig
    from chaos.embedded.testhost import testhosts_supported
    from chaos.profile import dump_profile
    from chaos.pytest_plugin import live_reporter
    from chaos.shim.cuda_stub import build_stub

    if request.config.getoption("chaos_profile"):
        pytest.skip("the foreign-cluster stand-in is a cluster of its own on this machine; with --chaos-profile "
                    "your own cluster is the foreign one")
    if request.config.getoption("chaos_dry_run"):
        pytest.skip("dry run: the foreign-cluster stand-in is a cluster this suite starts, and a dry run starts none")
    supported, why = testhosts_supported()
    if not supported:
        pytest.skip(f"the foreign-cluster stand-in's machines are test hosts, which are not possible here: {why}")
    if not START_SCRIPT.is_file():
        pytest.skip(f"the foreign-cluster stand-in tests the harness itself and needs its repository ({START_SCRIPT})")
    chaos_clusters.close()
    base = tmp_path_factory.mktemp("foreign")
    say = live_reporter(request.config).say
    say("starting the foreign-cluster stand-in: 1 head + 3 workers sharing nothing with this machine or each other "
        "(checkpoints on S3), Ray started over SSH by scripts/foreign-ray-start.sh")
    cluster = ForeignCluster(ForeignConfig(workers=3, base_dir=base / "cluster", shared_fs=False,
                                           cuda_driver_dir=build_stub(base / "cuda"))).up()
    try:
        profile = base / "profile.yaml"
        dump_profile(cluster.profile(), profile)
        say(f"foreign cluster up: dashboard {cluster.dashboard_url}; profile {profile}")
        yield cluster, profile, base
    finally:
        cluster.down()
        say("foreign cluster stopped")


def outside(request, foreign, selection: list[str], name: str) -> tuple[int, str, Path, list[Path]]:
    """``pytest -m chaos SELECTION`` run by the runner outside the cluster against the profile;
    (exit code, output, its reports dir, the canaries it wrote)."""
    from chaos.embedded.foreign import wait_healthy
    from chaos.pytest_plugin import live_reporter

    cluster, profile, base = foreign
    wait_healthy(cluster, timeout=180)
    reports = base / f"reports-{name}"
    canaries = [Path("/tmp") / f"chaos-canary-{base.name}-{name}", reports / "canary"]
    python = shlex.quote(sys.executable)
    command = (f"{python} -c {shlex.quote(PREFLIGHT)} {' '.join(shlex.quote(str(c)) for c in canaries)} && "
               f"{python} -m pytest -m chaos {' '.join(shlex.quote(s) for s in selection)} -p no:cacheprovider -rA "
               f"--chaos-profile {shlex.quote(str(profile))} --chaos-reports {shlex.quote(str(reports))} "
               "--chaos-raylet-kill sigkill")
    say = live_reporter(request.config).say
    code, out = cluster.run_outside(command, ROOT, timeout=1500, env=cluster.storage_env(),
                                    echo=lambda line: say(f"  outside | {line}"))
    return code, out, reports, canaries


def assert_nothing_of_the_harness_is_seen(foreign, canaries):
    """Nor any shared filesystem: no /mnt/shared, and a file in one host's /tmp on none other."""
    cluster, _, _ = foreign
    net = cluster.network
    paths = [*canaries, ROOT / "pyproject.toml", Path(sys.prefix) / "pyvenv.cfg", ROOT / "reports",
             Path("/mnt/shared"), Path(f"/tmp/chaos-private-{cluster.head.name}")]
    for host in [cluster.head, *cluster.workers]:
        t = SSHTransport(host.address, key_filename=net.ssh_key_path, known_hosts=net.known_hosts_path,
                         use_agent=False, connect_timeout=10, command_timeout=30)
        try:
            mine = host is cluster.head
            if mine:  # a file in its own /tmp, which no other host may see
                t.run(f"echo mine > /tmp/chaos-private-{host.name}", timeout=20).check()
            for path in paths[:-1] if mine else paths:
                seen = t.run(f"ls -A {shlex.quote(str(path))} 2>/dev/null | head -3; cat {shlex.quote(str(path))} "
                             "2>/dev/null | head -c 100", timeout=20)
                assert not seen.stdout.strip(), f"{host.name} sees {path}: {seen.stdout.strip()!r}"
        finally:
            t.close()


def passed(out: str) -> list[str]:
    return re.findall(r"^PASSED (\S+)", out, re.M)


@pytest.mark.extended
def test_a_raylet_kill_from_outside_a_cluster_the_harness_did_not_start(foreign, request):
    """A raylet SIGKILLed on the stand-in by a harness outside it, judged as on any cluster, and
    nothing of the harness's side seen by the cluster's hosts.  Per commit, the installed wheel
    does the same (tests/wheel/test_wheel.py, make chaos)."""
    code, out, reports, canaries = outside(request, foreign, [
        "suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity"], "raylet")
    assert "preflight:" in out and "no raylet" in out, out[-3000:]
    assert code == 0 and passed(out) == ["suites/test_raylet_kill.py::test_raylet_kill_with_spare_capacity"], \
        out[-5000:]
    [record] = json.loads((reports / "summary.json").read_text())["records"]
    assert record["outcome"] == "passed" and record["backend"] == "profile:foreign-standin", record
    assert "S3 requests of the run, as the fault proxy saw them" in out, "the run's checkpoints did not go to S3"
    assert_nothing_of_the_harness_is_seen(foreign, canaries)


SSH_FAMILIES = [
    "suites/test_ssh_faults.py::test_reboot_rank_1_node_without_spare_capacity",
    "suites/test_ssh_faults.py::test_rank_kill_then_partition_over_ssh",
    "suites/test_preemption.py::test_preemption_with_spare_capacity_is_charged_to_the_preemption_budget",
    "suites/test_cuda_faults.py::test_ecc_error_in_rank_1_after_checkpoint_2",
    "suites/test_cuda_faults.py::test_sticky_error_proves_the_old_process_could_not_go_on",
    "suites/test_cuda_faults.py::test_hang_is_caught_by_the_collective_timeout",
]


@pytest.mark.extended
def test_every_ssh_reachable_family_from_outside(foreign, request):
    """Node reboot, rank kill and partition (cut over SSH, which the cut keeps, healed over
    it), preemption and the CUDA faults (the shim delivered to the hosts over SSH, the stub
    driver their own) through the profile, from outside."""
    code, out, _, canaries = outside(request, foreign, SSH_FAMILIES, "families")
    assert code == 0 and sorted(passed(out)) == sorted(SSH_FAMILIES), out[-8000:]
    assert "the CUDA shim at /var/tmp/ray-chaos/shim/" in out, "the shim was not delivered to the hosts"
    assert_nothing_of_the_harness_is_seen(foreign, canaries)
