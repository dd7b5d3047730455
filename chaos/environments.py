"""The cluster an experiment runs against: the embedded cluster, or one a profile describes.

Both yield the same `Environment`, so suites do not know which one they got.  A profile
environment adds what a shared staging cluster needs: the protected-profile refusal, the
target allowlist, the live-fault limit, a cluster-wide lock and the health guard.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from pathlib import Path

import ray

import chaos
from chaos.cluster import ClusterView
from chaos.embedded import netns
from chaos.errors import ChaosError, ClusterError
from chaos.experiment import Environment
from chaos.ledger import Ledger
from chaos.report import Reporter
from chaos.transport.local import LocalTransport

log = logging.getLogger(__name__)

LOCK_NAME = "ray-chaos-lock"
NAMESPACE = "ray-chaos"


class ClusterLock:
    """One harness session per cluster at a time.

    The lock is a named actor owned by this driver: Ray removes it when its owner dies,
    so a killed session never leaves the cluster locked.
    """

    class _Holder:
        def __init__(self, who: dict):
            self.who = who

        def holder(self) -> dict:
            return self.who

    def __init__(self):
        self._actor = None

    def acquire(self, head_node_id: str) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        who = {"pid": os.getpid(), "host": os.uname().nodename, "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            existing = ray.get_actor(LOCK_NAME, namespace=NAMESPACE)
        except ValueError:
            existing = None
        if existing is not None:
            raise ClusterError(f"another ray-chaos session holds this cluster's lock: {ray.get(existing.holder.remote())}; "
                               "two sessions never inject into one cluster at the same time")
        try:
            self._actor = ray.remote(self._Holder).options(
                name=LOCK_NAME, namespace=NAMESPACE, num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id, soft=False)).remote(who)
            ray.get(self._actor.holder.remote(), timeout=60)
        except ValueError as e:  # lost a race for the name
            raise ClusterError(f"another ray-chaos session took this cluster's lock first: {e}") from e

    def release(self) -> None:
        if self._actor is not None:
            ray.kill(self._actor)
            self._actor = None


def _connect(gcs_address: str, driver_ip: str | None) -> None:
    kwargs = {"_node_ip_address": driver_ip} if driver_ip else {}
    ray.init(address=gcs_address, namespace=NAMESPACE, runtime_env={"py_modules": [os.path.dirname(chaos.__file__)]},
             log_to_driver=False, logging_level=logging.WARNING, **kwargs)


@contextlib.contextmanager
def embedded_environment(out: Path, cfg, dry_run: bool = False, reporter: Reporter | None = None):
    """Start the embedded cluster (EmbeddedConfig ``cfg``) for the session and stop it after."""
    from chaos.embedded.cluster import EmbeddedCluster
    from chaos.transport.ssh import SSHTransport

    reporter = reporter or Reporter()
    t0 = time.monotonic()
    cluster = EmbeddedCluster(cfg).up()
    ssh_cache: dict[str, SSHTransport] = {}
    try:
        _connect(cluster.gcs_address, cluster.head_ip)
        view = ClusterView(cluster.dashboard_url, cluster.gcs_address, cluster.head_ip)
        head = next(n for n in view.nodes() if n.is_head)
        reporter.say(f"embedded cluster up in {time.monotonic() - t0:.1f} s: {cluster.dashboard_url}")
        net = cluster.network

        def fresh_transport(ip):
            if net is None:
                return LocalTransport(ip)
            return SSHTransport(ip, key_filename=str(net.ssh_key_path), known_hosts=str(net.known_hosts_path),
                                use_agent=False)

        def transport(ip):
            if net is None:
                return LocalTransport(ip)
            if ip not in ssh_cache:
                ssh_cache[ip] = fresh_transport(ip)
            return ssh_cache[ip]

        def healthy():
            alive = {n.node_id for n in view.alive_workers()}
            down = [h.name for h in cluster.hosts if h.node_id not in alive]
            return (not down, f"all {len(cluster.hosts)} worker hosts alive" if not down else f"hosts down: {down}")

        env = Environment(
            cluster=view, head_node_id=head.node_id, ledger=Ledger(out / "ledger.jsonl"), out_dir=out,
            backend=f"embedded-{cfg.hosts}", transport_for=transport, fresh_transport_for=fresh_transport,
            console_for=lambda ip: next((h.testhost for h in cluster.hosts if h.ip == ip and h.testhost), None),
            python=sys.executable,
            host_name_for=lambda ip: next((h.name for h in cluster.hosts if h.ip == ip), None),
            healthy_workers=healthy, wait_healed=cluster.wait_workers_alive, dry_run=dry_run,
            storage_path=str(out / "storage"),
        )
        env.embedded = cluster
        env.properties = _embedded_properties(cluster)
        yield env
    finally:
        for t in ssh_cache.values():
            t.close()
        ray.shutdown()
        cluster.down()
        reporter.say("embedded cluster stopped")


def _embedded_properties(cluster) -> dict:
    h = cluster.config.health
    return {
        "ray.version": ray.__version__,
        "cluster": f"embedded ({cluster.config.hosts} hosts)",
        "nodes": f"1 head + {len(cluster.hosts)} workers",
        "node.recovery": f"{'automatic' if cluster.config.node_recovery else 'off'} "
                         f"(delay {cluster.config.recovery_delay_s} s)",
        "health_check_period_ms": h.period_ms,
        "health_check_timeout_ms": h.timeout_ms,
        "health_check_failure_threshold": h.failure_threshold,
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    }


def profile_transports(profile):
    """node ip -> a new Transport, as the profile's hosts section says."""
    from chaos.transport.ssh import SSHTransport

    def fresh_transport(ip):
        access = profile.access_for(ip)
        if access.transport == "local":
            return LocalTransport(ip)
        if access.transport == "ssh":
            s = access.ssh
            return SSHTransport(ip, port=s.port, user=s.user, key_filename=str(s.key_path) if s.key_path else None,
                                known_hosts=str(s.known_hosts_path), trust_on_first_use=s.trust_on_first_use,
                                connect_timeout=s.connect_timeout_s, command_timeout=s.command_timeout_s,
                                use_agent=s.use_agent, jump_host=s.jump_host)
        raise ChaosError(f"transport {access.transport!r} for {ip} is not available yet (profile {profile.name})")

    return fresh_transport


@contextlib.contextmanager
def profile_environment(profile, out: Path, dry_run: bool = False, reporter: Reporter | None = None):
    """Connect to the cluster a profile describes; refuse protected profiles; hold the lock."""
    from chaos.safety import HealthGuard, LiveFaults, NodeInfo, Safety

    reporter = reporter or Reporter()
    profile.ensure_not_protected()
    for note in profile.notes():
        reporter.say(f"profile note: {note}")
    try:
        _connect(profile.ray.gcs_address, profile.ray.driver_ip)
    except Exception as e:
        raise ClusterError(f"cannot reach the Ray cluster of profile {profile.name!r} at "
                           f"{profile.ray.gcs_address}: {e}") from e
    lock = ClusterLock()
    transports: dict[str, object] = {}
    guard_stop = threading.Event()
    try:
        view = ClusterView(profile.ray.dashboard_url, profile.ray.gcs_address, profile.ray.driver_ip)
        nodes = view.nodes()
        head = next((n for n in nodes if n.is_head), None)
        if head is None:
            raise ClusterError(f"no head node in the node table at {profile.ray.dashboard_url}")
        if not dry_run:
            lock.acquire(head.node_id)
        baseline = len(view.alive_workers())
        safety = Safety(profile.safety)

        fresh_transport = profile_transports(profile)

        def transport(ip):
            if ip not in transports:
                transports[ip] = fresh_transport(ip)
            return transports[ip]

        def healthy():
            alive = len(view.alive_workers())
            return alive >= baseline, f"{alive} of {baseline} worker nodes alive"

        def wait_healed(timeout):
            view.wait_alive_workers(baseline, timeout)

        def check_target(target):
            node = next((n for n in view.nodes() if n.node_id == target.node_id), None)
            safety.check_target(NodeInfo(node_id=target.node_id, ip=target.node_ip,
                                         hostname=view.hostname(target.node_id),
                                         labels=node.labels if node else {}, is_head=bool(node and node.is_head)))

        def console(ip):
            netns_name = profile.access_for(ip).netns
            return netns.Console(netns_name) if netns_name else None

        env = Environment(
            cluster=view, head_node_id=head.node_id, ledger=Ledger(out / "ledger.jsonl"), out_dir=out,
            backend=f"profile:{profile.name}", console_for=console, transport_for=transport, fresh_transport_for=fresh_transport,
            healthy_workers=healthy, wait_healed=wait_healed, dry_run=dry_run,
            storage_path=profile.storage.path, check_target=check_target,
            live_faults=LiveFaults(profile.safety.max_live_faults), allow_head=profile.safety.allow_head,
        )
        env.profile = profile
        env.properties = {"ray.version": ray.__version__, "cluster": f"profile {profile.name}",
                          "nodes": f"{baseline} workers alive at start", "dashboard": profile.ray.dashboard_url}
        guard = HealthGuard.from_settings(profile.safety, lambda: len(view.alive_workers()))

        def watch():
            while not guard_stop.wait(1.0):
                try:
                    reason = guard.observe()
                except Exception as e:
                    log.warning("health guard: %s", e)
                    continue
                if reason:
                    env.abort(f"stop condition: {reason}")
                    return

        threading.Thread(target=watch, name="health-guard", daemon=True).start()
        yield env
    finally:
        guard_stop.set()
        for t in transports.values():
            t.close()
        lock.release()
        ray.shutdown()
