"""What the recorder (inside the run) and the harness (outside the cluster) agree on: the
environment variables that switch the recorder's features on, and where and how it writes
the events log the harness reads over the dashboard (chaos.train.eventlog).

Kept apart from the recorder so that the harness's side imports no Ray Train: the harness
runs where no raylet is, and ``import ray.train`` is the slowest part of its start-up.
"""

from __future__ import annotations

ENV_STEP_METRIC = "RAY_CHAOS_STEP_METRIC"  # "auto", or comma-separated metric names tried in order
ENV_STATE_METRIC = "RAY_CHAOS_STATE_METRIC"  # a per-step value a correct restore reproduces (e.g. loss)
# Append every event to logs/chaos/<this name>/events-NNNNN.jsonl under the Ray logs directory
# of the controller's node, which the harness reads over the dashboard (chaos.train.eventlog).
ENV_EVENTS_LOG = "RAY_CHAOS_EVENTS_LOG"
EVENTS_LOG_DIR = "chaos"  # under the node's Ray logs directory
CHUNK_LINES = 100  # events per file of the events log


def chunk_name(index: int) -> str:
    """The events log's ``index``-th file: CHUNK_LINES events each, so the harness reads a
    bounded file each time it looks."""
    return f"events-{index:05d}.jsonl"
