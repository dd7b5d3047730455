"""The embedded cluster itself: real Ray nodes on loopback, node recovery, clean teardown."""

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from chaos.embedded import testhost
from chaos.embedded.cluster import SLOT_LOCKS, EmbeddedCluster, EmbeddedConfig
from chaos.embedded.redis import ping
from chaos.errors import ClusterError
from chaos.faults.raylet import KILL_RAYLET_BY_NODE_ID
from chaos.procs import session_members
from chaos.profile import load_profile
from chaos.transport.local import LocalTransport
from chaos.waits import poll_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # no slot given: it claims the highest free one (its own loopback block and ports)
    c = EmbeddedCluster(EmbeddedConfig(workers=3, recovery_delay_s=0.5, base_dir=tmp_path_factory.mktemp("emb")))
    c.up()
    yield c
    c.down()


def cluster_pids(c):
    leaders = [c.head.pid] + [h.process.pid for h in c.hosts if h.process]
    return {pid for leader in leaders for pid in session_members(leader)}


def test_nodes_live_on_their_own_loopback_addresses(cluster):
    nodes = cluster.gcs_nodes()
    slot = cluster.config.slot
    assert slot is not None and (SLOT_LOCKS / f"slot{slot}.lock").exists()
    assert sorted(n["ip"] for n in nodes) == [f"127.0.{slot + 1}.{i}" for i in (1, 2, 3, 4)]
    assert all(n["alive"] for n in nodes)
    ports = cluster.config.ports()
    assert cluster.gcs_port in ports and cluster.dashboard_port in ports, (cluster.gcs_port, ports)
    assert ports == range(61000 + 500 * slot, 61500 + 500 * slot)


def test_a_slot_is_held_while_the_cluster_runs(cluster):
    """Another process cannot take the running cluster's slot, and says whose it is."""
    code = ("from chaos.embedded.cluster import claim_slot\n"
            f"claim_slot({cluster.config.slot}, bridge=False)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and f"slot {cluster.config.slot} is held by another process" in p.stderr, p.stderr


def test_no_ray_connection_leaves_loopback(cluster):
    loopback = ipaddress.ip_network("127.0.0.0/8")
    outside = []
    for pid in cluster_pids(cluster):
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:
            continue
        for c in conns:
            if c.raddr and ipaddress.ip_address(c.raddr.ip.removeprefix("::ffff:")) not in loopback:
                outside.append((pid, c.raddr))
    assert not outside, f"Ray connections to non-loopback addresses: {outside}"
    assert cluster_pids(cluster), "found no cluster processes to check"


def test_automatic_node_recovery_brings_a_killed_node_back_as_a_new_node(cluster):
    host = cluster.hosts[1]
    old = host.node_id
    result = LocalTransport().run(KILL_RAYLET_BY_NODE_ID.format(node_id=old), timeout=20)
    assert result.ok, result.stderr
    new = cluster.wait_host_rejoined(host, old, timeout=120)
    assert new != old and host.history[-2:] == [old, new]
    cluster.wait_workers_alive(60)
    assert {n["node_id"]: n["alive"] for n in cluster.gcs_nodes()}.get(old) is False


def test_startup_failure_names_what_failed_and_leaves_nothing(tmp_path, monkeypatch):
    fake = tmp_path / "ray"
    fake.write_text("#!/bin/sh\necho 'ray: cannot start: GCS port taken' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr("chaos.embedded.cluster._ray_bin", lambda: str(fake))
    c = EmbeddedCluster(EmbeddedConfig(workers=3, base_dir=tmp_path, start_timeout_s=30))
    with pytest.raises(ClusterError, match=r"the Ray head exited with code 1 during start-up; see .*head\.boot1\.log") as err:
        c.up()
    assert "GCS port taken" in str(err.value)
    assert not session_members(c.head.pid)


@pytest.mark.parametrize("head_host", ["local", "testhost"])
def test_gcs_fault_tolerance_keeps_the_worker_nodes_through_head_restarts(tmp_path, head_host):
    """With Redis behind the GCS, a killed GCS (the head's `ray start` then exits), a head
    reboot and a restarted Redis (the GCS exits with it) each bring the head back on the same
    address, and the worker node keeps its Ray node id; a test-host head comes back in a new
    boot each time.  Teardown stops Redis too."""
    if head_host == "testhost":
        supported, why = testhost.testhosts_supported()  # (imported by module: pytest collects test* names)
        if not supported:
            pytest.skip(f"test hosts are not possible here: {why}")
    cfg = EmbeddedConfig(workers=1, gcs_ft=True, recovery_delay_s=0.5, base_dir=tmp_path, head_host=head_host,
                         hosts="namespaces" if head_host == "testhost" else "plain")
    c = EmbeddedCluster(cfg).up()
    try:
        assert ping(c.redis.port, host=c.redis.host) == "+PONG" and c.redis.port in c.config.ports()
        worker = c.hosts[0].node_id
        for fault in (c.kill_gcs, c.kill_head, c.restart_redis):
            boot, address = c.head_boots, c.gcs_address
            before = c.head_testhost.boot_id if c.head_testhost else None
            fault()
            up = c.wait_head_up(after=boot, timeout=120)
            assert c.gcs_address == address
            if c.head_testhost:
                assert up["boot_id"] != before and up["host"] == "rc-head", up
            poll_until(lambda: ({n["node_id"]: n["alive"] for n in c.gcs_nodes()}.get(worker),
                                f"nodes {c.gcs_nodes()}"), 60, f"worker node {worker[:8]} alive after {fault.__name__}")
        events = [e["event"] for e in c.head_history]
        assert events.count("up") == 4 and events.count("down") == 3, events
        assert c.hosts[0].history == [worker], "the worker node was restarted: it should have reconnected"
    finally:
        c.down()
    assert not c.redis.proc.alive()
    assert not (c.head and session_members(c.head.pid))


def test_head_faults_name_what_is_missing(tmp_path):
    c = EmbeddedCluster(EmbeddedConfig(workers=1, base_dir=tmp_path))
    with pytest.raises(ClusterError, match="without GCS fault tolerance: there is no Redis to restart"):
        c.restart_redis()
    with pytest.raises(ClusterError, match="the head is not running"):
        c.kill_head()
    with pytest.raises(ClusterError, match="runs no gcs_server"):
        c.kill_gcs()
    with pytest.raises(ValueError, match="gcs_reconnect_timeout_s must be > 0"):
        EmbeddedConfig(gcs_reconnect_timeout_s=0)
    with pytest.raises(ValueError, match="head_host='testhost' needs hosts='namespaces'"):
        EmbeddedConfig(head_host="testhost")


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="at least 1 worker"):
        EmbeddedConfig(workers=0)
    with pytest.raises(ValueError, match=r"slot=8: expected 0-7"):
        EmbeddedConfig(slot=8)


def test_command_line_up_status_down(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "chaos.embedded", *a, "--dir", str(tmp_path)],
                                    cwd=ROOT, capture_output=True, text=True, timeout=300)
    profile = tmp_path / "profile.yaml"
    up = run("up", "--workers", "3", "--profile-out", str(profile))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "embedded cluster up: dashboard http://" in up.stdout
        # the caller's next command reads it (it was once written after `up` had returned)
        assert load_profile(profile).ray.dashboard_url in up.stdout
        state = json.loads((tmp_path / "state.json").read_text())
        leaders = [state["head_pid"]] + [h["pid"] for h in state["hosts"] if h["pid"]]
        st = run("status")
        assert st.returncode == 0 and json.loads(st.stdout)["supervisor_alive"]
    finally:
        down = run("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(session_members(p) for p in leaders), "processes left after `down`"
    if state["bridge"]:
        from chaos.embedded import netns

        assert not netns.netns_names(f"{state['bridge']}-") and not netns.link_exists(state["bridge"]), \
            "test hosts left after `down`"
    assert run("status").returncode == 1


def test_command_line_kubernetes_up_kubectl_down(tmp_path):
    """`up --kubernetes`: the real kubectl sees the RayCluster's pods Running on HyperPod-labelled
    nodes, the written profile is the kubernetes backend's, and `down` leaves nothing."""
    import shutil

    from chaos.backends import KubernetesBackend, for_profile
    from chaos.embedded import netns
    from chaos.embedded.testhost import testhosts_supported
    from chaos.profile import load_profile

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not on this machine: no kubectl on PATH (the gcloud kubectl package provides it)")
    supported, why = testhosts_supported()
    if not supported:
        pytest.skip(f"the embedded Kubernetes cluster's nodes are test hosts: {why}")
    base, profile_path, home = tmp_path / "k8s", tmp_path / "k8s.yaml", tmp_path / "home"
    home.mkdir()
    run = lambda *a: subprocess.run([sys.executable, "-m", "chaos.embedded", *a, "--dir", str(base)],
                                    cwd=ROOT, capture_output=True, text=True, timeout=180)
    up = run("up", "--kubernetes", "--workers", "2", "--profile-out", str(profile_path))
    state = {}
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((base / "state.json").read_text())
        assert f"kubectl --kubeconfig {state['kubeconfig']} get pods -n ray" in up.stdout, up.stdout

        def kube(*args):
            done = subprocess.run([kubectl, "--kubeconfig", state["kubeconfig"], *args, "-o", "json"],
                                  env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
            return json.loads(done.stdout)["items"]

        pods = kube("get", "pods", "-n", "ray", "-l", "ray.io/cluster=raytrain")
        assert sorted((p["metadata"]["labels"]["ray.io/node-type"], p["status"]["phase"]) for p in pods) == \
            [("head", "Running"), ("worker", "Running"), ("worker", "Running")], pods
        labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kube("get", "nodes")}
        workers = {p["spec"]["nodeName"] for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker"}
        assert len(workers) == 2 and workers <= set(labels), (workers, sorted(labels))
        for name in workers:
            assert {"sagemaker.amazonaws.com/compute-type": "hyperpod",
                    "sagemaker.amazonaws.com/instance-group-name": "workers",
                    "sagemaker.amazonaws.com/node-health-status": "Schedulable"}.items() <= labels[name].items(), \
                labels[name]

        profile = load_profile(profile_path)
        assert isinstance(for_profile(profile), KubernetesBackend)
        assert (profile.kubernetes.kubeconfig, profile.ray.gcs_address) == (state["kubeconfig"], state["gcs_address"])
        st = run("status")
        assert st.returncode == 0 and json.loads(st.stdout)["supervisor_alive"], st.stdout + st.stderr
    finally:
        down = run("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "removed what the supervisor left" not in down.stdout, down.stdout  # the supervisor tore it all down
    sessions = [p["session"] for p in state["pods"]] + [n["host_pids"]["unshare"] for n in state["nodes"]
                                                         if n["test_host"]]
    assert None not in sessions and len(sessions) == 5, state
    recorded = set(sessions) | {p["main_pid"] for p in state["pods"]} | {state["serve_pid"]} | \
        {pid for n in state["nodes"] for pid in n["host_pids"].values()}
    assert not any(session_members(s) for s in sessions), "container or test-host processes left after `down`"
    assert not [pid for pid in recorded if _running(pid)], "recorded processes left after `down`"
    assert not netns.netns_names(f"{state['bridge']}-") and not netns.link_exists(state["bridge"]), \
        "test hosts left after `down`"
    assert not Path(state["ray_tmp_root"]).exists()
    assert run("status").returncode == 1


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan that PID 1 has not reaped yet is gone already)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
