"""The embedded cluster itself: real Ray nodes on loopback, node recovery, clean teardown."""

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from chaos.embedded.cluster import EmbeddedCluster, EmbeddedConfig
from chaos.errors import ClusterError
from chaos.faults.raylet import KILL_RAYLET_BY_NODE_ID
from chaos.procs import session_members
from chaos.transport.local import LocalTransport

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # slot 2, as pytest-xdist's third worker would have it: its own loopback block and ports
    c = EmbeddedCluster(EmbeddedConfig(workers=3, recovery_delay_s=0.5, base_dir=tmp_path_factory.mktemp("emb"), slot=2))
    c.up()
    yield c
    c.down()


def cluster_pids(c):
    leaders = [c.head.pid] + [h.process.pid for h in c.hosts if h.process]
    return {pid for leader in leaders for pid in session_members(leader)}


def test_nodes_live_on_their_own_loopback_addresses(cluster):
    nodes = cluster.gcs_nodes()
    assert sorted(n["ip"] for n in nodes) == ["127.0.3.1", "127.0.3.2", "127.0.3.3", "127.0.3.4"]
    assert all(n["alive"] for n in nodes)
    ports = cluster.config.ports()
    assert cluster.gcs_port in ports and cluster.dashboard_port in ports, (cluster.gcs_port, ports)
    assert ports == range(62000, 62500)


def test_no_ray_connection_leaves_loopback(cluster):
    loopback = ipaddress.ip_network("127.0.0.0/8")
    outside = []
    for pid in cluster_pids(cluster):
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:
            continue
        for c in conns:
            if c.raddr and not ipaddress.ip_address(c.raddr.ip.removeprefix("::ffff:")) in loopback:
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
    with pytest.raises(ClusterError, match=r"the Ray head exited with code 1 during start-up; see .*head\.log") as err:
        c.up()
    assert "GCS port taken" in str(err.value)
    assert not session_members(c.head.pid)


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="at least 1 worker"):
        EmbeddedConfig(workers=0)
    with pytest.raises(ValueError, match=r"slot=8: expected 0-7"):
        EmbeddedConfig(slot=8)


def test_command_line_up_status_down(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "chaos.embedded", *a, "--dir", str(tmp_path)],
                                    cwd=ROOT, capture_output=True, text=True, timeout=300)
    up = run("up", "--workers", "3")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "embedded cluster up: dashboard http://" in up.stdout
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
