"""A node whose raylet missed Ray's fixed wait for its dashboard agent at start-up (a start beside
another session's run on 2 cores) is booted again, twice at most; any other death at start-up
still fails the start, naming the node.  No Ray: fake machines and a fake node table."""

from pathlib import Path

import pytest

from chaos.embedded.cluster import (AGENT_WAIT_RESTARTS, EmbeddedCluster, EmbeddedConfig, Machine,
                                    agent_wait_aborts)
from chaos.errors import ClusterError

ABORT = ("Check failed: statussetor3588.has_value() Timed out waiting for file .../dashboard_agent_listen_port_ab\n"
         "/venv/ray/core/src/ray/raylet/raylet(+0x2eeeea) [0x55bd] ray::raylet::NodeManager::WaitForDashboardAgentPorts()\n")


class FakeMachine(Machine):
    """A node that dies at each of its first ``deaths`` boots, writing ``why`` to its raylet.err
    (the session dir a restarted node shares with its earlier boot), then registers."""

    def __init__(self, cluster, host, deaths, why):
        super().__init__(cluster, host)
        self.deaths, self.why, self.boots = deaths, why, 1
        self.logs = cluster.temp_dir / host.name / "session_latest" / "logs"
        self.logs.mkdir(parents=True)
        host.last_log = self.logs.parent / "workload.log"
        host.last_log.write_text("ray start --block\n")
        self._die_or_register()

    def _die_or_register(self):
        if self.boots <= self.deaths:
            with (self.logs / "raylet.err").open("a") as f:
                f.write(self.why)
            self.host.down_since = 1.0
        else:
            self._found((1000 + self.boots, f"node-{self.host.name}-{self.boots}"), self.boots)

    def boot(self, argv, env):
        raise AssertionError("not booted through the cluster here")

    def check(self, now):
        pass

    def restart(self):
        self.host.down_since = None
        self.host.boots += 1
        self.boots += 1
        self._die_or_register()

    def state(self):
        return "fake"

    def stop(self):
        pass


def cluster_with(tmp_path, monkeypatch, deaths, why=ABORT):
    cluster = EmbeddedCluster(EmbeddedConfig(workers=2, base_dir=tmp_path / "base"))
    cluster.temp_dir = tmp_path / "rc"
    for host, n in zip(cluster.hosts, deaths):
        host.boots = 1
        host.machine = FakeMachine(cluster, host, n, why)
    monkeypatch.setattr(cluster, "gcs_nodes", lambda: [{"node_id": h.node_id, "alive": True} for h in cluster.hosts
                                                       if h.node_id])
    return cluster


def test_a_node_that_missed_the_agent_wait_is_booted_again_and_the_start_goes_on(tmp_path, monkeypatch):
    cluster = cluster_with(tmp_path, monkeypatch, deaths=[AGENT_WAIT_RESTARTS, 0])
    cluster.wait_workers_alive(timeout=5)
    assert [h.boots for h in cluster.hosts] == [AGENT_WAIT_RESTARTS + 1, 1]
    assert all(h.node_id for h in cluster.hosts)


def test_twin_a_node_that_keeps_missing_it_fails_the_start_naming_the_node(tmp_path, monkeypatch):
    cluster = cluster_with(tmp_path, monkeypatch, deaths=[AGENT_WAIT_RESTARTS + 1, 0])
    with pytest.raises(ClusterError, match=r"worker-1 \(.*\) died during start-up"):
        cluster.wait_workers_alive(timeout=5)
    assert cluster.hosts[0].boots == AGENT_WAIT_RESTARTS + 1


def test_twin_any_other_death_at_start_up_is_not_retried(tmp_path, monkeypatch):
    cluster = cluster_with(tmp_path, monkeypatch, deaths=[1, 0], why="Check failed: object store full\n")
    with pytest.raises(ClusterError, match=r"worker-1 \(.*\) died during start-up"):
        cluster.wait_workers_alive(timeout=5)
    assert cluster.hosts[0].boots == 1


def test_the_abort_is_counted_from_the_nodes_raylet_err_only(tmp_path):
    logs = tmp_path / "session_latest" / "logs"
    logs.mkdir(parents=True)
    assert agent_wait_aborts(tmp_path) == 0
    (logs / "raylet.out").write_text(ABORT)  # the same lines in raylet.out are not counted twice
    (logs / "raylet.err").write_text(ABORT + ABORT)
    assert agent_wait_aborts(tmp_path) == 2
    assert agent_wait_aborts(Path(tmp_path / "absent")) == 0
