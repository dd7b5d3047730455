"""How late the recorder's events reach the harness without a Ray driver, side by side.

Starts an embedded cluster (plain hosts), submits one reference run (no fault) with the
harness's own Run, and follows its events log twice at once: as the harness does
(chaos.train.eventlog: a file request every 0.2 s while nothing new came) and with Ray's
follow-mode log stream, which the harness gave up because its server side never ends once
nobody reads it (docs/profiles.md).  For every event it takes the lag from the recorder's
stamp (on the controller's node, the same machine here) to its arrival, and prints
min/median/max per channel, their ratio, and the run's time from submission to the first
report's arrival.
Run: .venv/bin/python bench/bench_event_channel.py [--steps N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chaos.cluster import ClusterView  # noqa: E402
from chaos.embedded.cluster import EmbeddedCluster, EmbeddedConfig  # noqa: E402
from chaos.timeline import Timeline  # noqa: E402
from chaos.train.channel import EVENTS_LOG_DIR, chunk_name  # noqa: E402
from chaos.train.run import Run, reference_spec  # noqa: E402


class Arrivals(Timeline):
    """A timeline that notes when each recorder event arrived."""

    def __init__(self):
        super().__init__()
        self.arrived: dict[tuple, float] = {}

    def add(self, event):
        if event.source == "recorder":
            self.arrived.setdefault((event.kind, round(event.t, 6)), time.time())
        return super().add(event)


def stream(dashboard: str, node_id: str, filename: str, arrived: dict, stop: threading.Event) -> None:
    """Ray's follow-mode stream of ``filename``, each line's arrival noted (until ``stop``)."""
    query = urllib.parse.urlencode({"node_id": node_id, "filename": filename, "lines": -1, "interval": 0.1,
                                    "media_type": "stream", "timeout": 30})
    with urllib.request.urlopen(f"{dashboard}/api/v0/logs/stream?{query}", timeout=120) as response:
        for raw in response:
            if raw.endswith(b"\n"):
                e = json.loads(raw)
                arrived.setdefault((e["kind"], round(e["t"], 6)), time.time())
            if stop.is_set():
                return


def summary(name: str, lags: list[float]) -> str:
    return (f"{name:28} n={len(lags):3d}  min {min(lags) * 1000:6.1f} ms  median {statistics.median(lags) * 1000:6.1f} "
            f"ms  max {max(lags) * 1000:6.1f} ms")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-events-"))
    cluster = EmbeddedCluster(EmbeddedConfig(workers=2, hosts="plain", base_dir=base)).up()
    try:
        view = ClusterView(cluster.dashboard_url, cluster.gcs_address)
        timeline = Arrivals()
        spec = reference_spec(f"bench-{int(time.time())}", str(base / "storage"), steps=args.steps, step_time=0.3,
                              num_workers=2)
        run = Run(spec, view, timeline, base / "run").submit()
        first = run.wait_training_started(300)
        streamed: dict[tuple, float] = {}
        stop = threading.Event()
        head = next(n.node_id for n in view.nodes() if n.is_head)
        follower = threading.Thread(target=stream, args=(cluster.dashboard_url, head,
                                                         f"{EVENTS_LOG_DIR}/{run.job_id}/{chunk_name(0)}", streamed,
                                                         stop), daemon=True)
        follower.start()
        run.wait_finished(600, 120)
        stop.set()
        submitted = timeline.of("job_submitted")[0].t
        later = {k: v for k, v in timeline.arrived.items() if k[1] >= first.t}  # both channels were open
        polled = [v - k[1] for k, v in later.items()]
        streamed_lags = [streamed[k] - k[1] for k in later if k in streamed]
        print(f"one reference run, {args.steps} steps of 0.3 s, 2 ranks, plain embedded cluster")
        print(summary("file requests (the harness)", polled))
        print(summary("follow-mode stream", streamed_lags))
        print(f"median lag ratio file/stream: {statistics.median(polled) / statistics.median(streamed_lags):.2f}")
        print(f"submission -> first report arrived: {timeline.arrived[('report', round(first.t, 6))] - submitted:.1f} s")
        run.stop()
    finally:
        cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
