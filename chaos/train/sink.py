"""The event channel from the recorder (inside the Train controller) to the harness.

A small async actor, pinned to the head node so that no worker-node fault can take it
down.  The recorder pushes events fire-and-forget; the harness long-polls them (a
blocking ``poll`` that returns as soon as anything new arrives), so events reach the
timeline without a sleep loop on either side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time

import ray

from chaos.errors import ClusterError
from chaos.timeline import Event, Timeline

log = logging.getLogger(__name__)

NAMESPACE = "ray-chaos"
ENV_SINK = "RAY_CHAOS_SINK"  # actor name, set in the job's env_vars


class EventSink:
    def __init__(self):
        self._events: list[dict] = []
        self._changed = asyncio.Event()

    async def push(self, event: dict) -> None:
        self._events.append(event)
        self._changed.set()

    async def poll(self, cursor: int, timeout: float) -> list[dict]:
        if len(self._events) <= cursor:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return self._events[cursor:]

    async def now(self) -> float:
        """The head's clock, for the harness's clock-offset probe."""
        return time.time()


def start_sink(name: str, head_node_id: str):
    """Create the sink actor for one run on the head node; returns its handle."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return (
        ray.remote(EventSink)
        .options(name=name, namespace=NAMESPACE, num_cpus=0, max_concurrency=64,
                 scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id, soft=False))
        .remote()
    )


def measure_clock_offset(sink, probes: int = 5) -> tuple[float, float]:
    """(head clock - harness clock, round trip) from the probe with the shortest round trip.

    Recorder events are stamped on the head; durations mixing them with the harness's own
    stamps (fault injected) need one clock."""
    best = None
    for _ in range(probes):
        t0 = time.time()
        head = ray.get(sink.now.remote(), timeout=30)
        t1 = time.time()
        if best is None or t1 - t0 < best[1]:
            best = (head - (t0 + t1) / 2, t1 - t0)
    return best


class SinkPump:
    """Harness-side thread: long-polls the sink and appends events to a timeline."""

    def __init__(self, sink, timeline: Timeline):
        self._sink = sink
        self._timeline = timeline
        self._cursor = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="sink-pump", daemon=True)
        self.error: Exception | None = None

    def start(self) -> "SinkPump":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = ray.get(self._sink.poll.remote(self._cursor, 1.0), timeout=30)
            except ray.exceptions.GetTimeoutError:
                continue  # a busy head; the sink is still there
            except Exception as e:  # the sink is gone: every wait must say so, not time out later
                if not self._stop.is_set():
                    self.error = e
                    log.warning("event sink unreachable: %s", e)
                    self._timeline.abort(f"the recorder's event sink was lost: {e}", ClusterError)
                return
            self._take(batch)

    def _take(self, batch: list[dict]) -> None:
        with self._lock:
            for raw in batch:
                event = Event.from_json(raw)
                self._timeline.add(dataclasses.replace(event, t=self._timeline.from_head(event.t)))
            self._cursor += len(batch)

    def drain(self) -> None:
        """Pull whatever is still in the sink, then stop (idempotent)."""
        self._stop.set()
        self._thread.join(timeout=35)
        try:
            self._take(ray.get(self._sink.poll.remote(self._cursor, 0.0), timeout=30))
        except Exception as e:
            log.warning("could not drain the event sink: %s", e)
