"""How late the harness learns of a node death, against Ray's own death timestamp.

Starts an embedded cluster (one worker, plain hosts, automatic node recovery), watches it
with the harness's own `ClusterView.watch` (the watcher an experiment runs), and kills the
worker's raylet N times (SIGKILL of its PID; recovery boots the host again as a new node).
Per kill it records three times:

- kill:        just before the SIGKILL;
- Ray's death: the GCS's ``end_time_ms`` for the node (set when the GCS marks it DEAD after
               its health checks fail), which the watcher stamps the ``node_dead`` event with;
- harness saw: when that ``node_dead`` event reached the timeline.

and prints min/median/max of (harness saw - Ray's death) and (Ray's death - kill).  The
watcher polls the state API (``list_nodes`` over the dashboard) every 0.25 s, so the first
lag is up to that poll interval plus one poll's round trip (also printed); the second is
Ray's health checking (period 500 ms x threshold 3 on the embedded cluster).
Run: .venv/bin/python bench/bench_detection_lag.py [--kills N]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chaos.timeline import Event, Timeline  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Kill:
    """One raylet kill, unix seconds on this machine's clock (the head's is the same)."""

    killed_t: float
    ray_death_t: float
    seen_t: float

    @property
    def lag_s(self) -> float:
        return self.seen_t - self.ray_death_t

    @property
    def ray_detect_s(self) -> float:
        return self.ray_death_t - self.killed_t


class ArrivalTimeline(Timeline):
    """A Timeline that also notes when each event arrived (its ``t`` is Ray's own time)."""

    def __init__(self):
        super().__init__()
        self.arrived: dict[int, float] = {}

    def add(self, event: Event) -> None:
        self.arrived[id(event)] = time.time()
        super().add(event)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=5, help="raylet kills (default 5)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for each death to be seen and each host to rejoin (default 120)")
    args = p.parse_args(argv)
    if args.kills < 1:
        p.error(f"--kills {args.kills}: must be >= 1")
    if args.timeout <= 0:
        p.error(f"--timeout {args.timeout}: must be > 0")
    return args


def table(kills: Sequence[Kill]) -> str:
    if not kills:
        return "(no kills)"
    rows = [("harness saw - Ray's death", [k.lag_s for k in kills]),
            ("Ray's death - kill", [k.ray_detect_s for k in kills])]
    lines = [f"{'seconds (' + str(len(kills)) + ' kills)':28} {'min':>7} {'median':>7} {'max':>7}"]
    for name, values in rows:
        lines.append(f"{name:28} {min(values):7.3f} {statistics.median(values):7.3f} {max(values):7.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from chaos.cluster import ClusterView
    from chaos.embedded.cluster import EmbeddedCluster, EmbeddedConfig

    base = Path(tempfile.mkdtemp(prefix="rc-lag-"))
    cluster = EmbeddedCluster(EmbeddedConfig(workers=1, hosts="plain", base_dir=base))
    view, ok = None, False
    try:
        t0 = time.monotonic()
        cluster.up()
        print(f"embedded cluster up in {time.monotonic() - t0:.1f} s (slot {cluster.config.slot}, "
              f"{cluster.dashboard_url})", flush=True)
        view = ClusterView(cluster.dashboard_url, cluster.gcs_address, cluster.head_ip)
        timeline = ArrivalTimeline()  # same machine as the head: clock offset 0
        view.watch(timeline)
        host, kills = cluster.hosts[0], []
        for i in range(args.kills):
            node_id, pid = host.node_id, host.raylet_pid
            if node_id is None or pid is None:
                raise RuntimeError(f"{host.name} has no live raylet before kill {i + 1}: {cluster.status()}")
            killed = time.time()
            os.kill(pid, signal.SIGKILL)
            dead = timeline.wait_for(
                lambda evs: next((e for e in evs if e.kind == "node_dead" and e.data.get("node_id") == node_id), None),
                args.timeout, f"the node_dead event of node {node_id[:8]} (raylet PID {pid} killed)")
            kills.append(Kill(killed, dead.t, timeline.arrived[id(dead)]))
            print(f"  kill {i + 1}: Ray's death {kills[-1].ray_detect_s:.3f} s after the kill, "
                  f"seen {kills[-1].lag_s:.3f} s after that ({dead.data.get('death_reason')})", flush=True)
            new_id = cluster.wait_host_rejoined(host, node_id, args.timeout)
            # The watcher only reports the death of a node it has seen alive.
            timeline.wait_for(lambda evs: any(e.kind == "node_alive" and e.data.get("node_id") == new_id for e in evs),
                              args.timeout, f"the node_alive event of {host.name}'s new node {new_id[:8]}")
        polls = []
        for _ in range(10):  # what one watcher poll costs: the lag's floor
            t = time.monotonic()
            view.nodes()
            polls.append(time.monotonic() - t)
        h = cluster.config.health
        print(f"\nnode death: Ray's timestamp (GCS end_time_ms) vs the harness's node_dead, {len(kills)} raylet "
              f"SIGKILLs\n(health checks: period {h.period_ms} ms, timeout {h.timeout_ms} ms, threshold "
              f"{h.failure_threshold}; harness watcher polls every 0.25 s)")
        print(table(kills))
        print(f"one watcher poll (list_nodes over the dashboard): median {statistics.median(polls):.3f} s, "
              f"max {max(polls):.3f} s of 10")
        ok = True
        return 0
    finally:
        try:
            if view is not None:
                view.stop_watching()
        finally:
            cluster.down()
            if ok:
                shutil.rmtree(base, ignore_errors=True)
            else:
                print(f"bench_detection_lag: the cluster's logs are kept in {base}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
