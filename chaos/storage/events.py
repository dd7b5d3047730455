"""The timeline's ``storage`` events: what the fault proxy saw of a run's S3 requests, and
each checkpoint's upload read from them.

``collect`` adds one ``storage_request`` event per request the proxy logged under a run's
folder (``<bucket>/<prefix>/<run name>/``), at the time the request reached the proxy (the
proxy's clock: the embedded cluster's and the stand-in's run on this machine; a profile's
proxy elsewhere should keep its clock in sync).  ``uploads`` and ``restores`` read them per
checkpoint folder — pure functions of the timeline, for the verdicts and the picture.

    storage  storage_request  run_id, run_name, method, key (under the run's folder),
                              checkpoint (its checkpoint_<time> folder, or None), query,
                              status, client, fault (storage-errors/slow rule kind, or None),
                              t_end
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import urllib.parse

from chaos.timeline import Event, Timeline

log = logging.getLogger(__name__)

WRITES = ("PUT", "POST")


def _run_folders(timeline: Timeline) -> dict[str, tuple[str, str]]:
    """key prefix ``bucket/prefix/name/`` -> (run id, run name), for each Train run on S3."""
    out = {}
    for e in timeline.of("controller_started"):
        path = str(e.data.get("storage_path") or "")
        if path.startswith("s3://") and e.data.get("run_name"):
            u = urllib.parse.urlsplit(path)
            out[f"{u.netloc}/{u.path.strip('/')}/{e.data['run_name']}/".replace("//", "/")] = (
                e.data.get("run_id"), e.data["run_name"])
    return out


def collect(backend, timeline: Timeline) -> int:
    """Add the proxy's records of the timeline's S3 runs as storage events (once: records
    already on the timeline are not added again); how many were added.  Nothing without a run
    on S3 storage or a fault proxy to ask."""
    folders = _run_folders(timeline)
    if not folders:
        return 0
    proxy = backend.storage_proxy
    if proxy is None:
        return 0
    since = min((e.t for e in timeline.of("job_submitted")), default=0.0)
    seen = {e.data.get("seq") for e in timeline.of("storage_request")}
    added = 0
    for rec in proxy.log():
        if rec["t"] < since or rec["seq"] in seen:
            continue
        prefix = next((p for p in folders if rec["key"].startswith(p)), None)
        if prefix is None:
            continue
        run_id, run_name = folders[prefix]
        key = rec["key"][len(prefix):]
        folder = key.split("/", 1)[0]
        timeline.add(Event(rec["t"], "storage", "storage_request", {
            "seq": rec["seq"], "run_id": run_id, "run_name": run_name, "method": rec["method"], "key": key,
            "checkpoint": folder if "/" in key and folder.startswith("checkpoint_") else None,
            "query": rec.get("query", []),
            "status": rec.get("status"), "client": rec.get("client"), "fault": rec.get("fault"),
            "t_end": rec.get("t_end", rec["t"])}))
        added += 1
    return added


@dataclasses.dataclass
class Transfer:
    """One checkpoint folder's upload (or one client's restore of it), as the proxy saw it."""

    checkpoint: str
    start: float
    end: float
    ok: bool  # every object ended with a 2xx answer (an upload: and its multipart uploads completed)
    requests: int
    failed: int  # requests answered with an error (injected or not)
    faulted: int  # requests a storage fault's rule answered or held
    client: str | None = None

    @property
    def took(self) -> float:
        return self.end - self.start


def _requests(timeline: Timeline, run_id: str | None) -> list[Event]:
    return [e for e in timeline.of("storage_request")
            if e.data.get("checkpoint") and (run_id is None or e.data.get("run_id") == run_id)]


def _transfer(folder: str, reqs: list[Event], ok: bool, client: str | None = None) -> Transfer:
    return Transfer(folder, reqs[0].t, max(e.data.get("t_end", e.t) for e in reqs), ok, len(reqs),
                    sum(1 for e in reqs if not _ok(e)), sum(1 for e in reqs if e.data.get("fault")), client)


def _ok(e: Event) -> bool:
    return isinstance(e.data.get("status"), int) and 200 <= e.data["status"] < 300


def _finishes(e: Event) -> bool:
    """Whether a write leaves its object whole: a plain PUT, or the POST that completes a
    multipart upload (not the one that begins it, not a part)."""
    query = e.data.get("query") or []
    if e.data["method"] == "PUT":
        return "partNumber" not in query
    return "uploadId" in query and "uploads" not in query


def uploads(timeline: Timeline, run_id: str | None = None) -> list[Transfer]:
    """Each checkpoint folder's upload, in the order they began: its writes (PUT, POST).  Done
    (``ok``) when every object's last write succeeded and no multipart upload was left open."""
    by_folder: dict[str, list[Event]] = {}
    for e in _requests(timeline, run_id):
        if e.data["method"] in WRITES:
            by_folder.setdefault(e.data["checkpoint"], []).append(e)
    out = []
    for folder, reqs in by_folder.items():
        last: dict[str, Event] = {}
        for e in reqs:
            last[e.data["key"]] = e
        objects = [e for k, e in last.items() if not k.endswith("/")]
        done = bool(objects) and all(_finishes(e) and _ok(e) for e in objects) and all(map(_ok, last.values()))
        out.append(_transfer(folder, reqs, done))
    return sorted(out, key=lambda u: u.start)


def restores(timeline: Timeline, run_id: str | None = None) -> list[Transfer]:
    """Each client's reads (GET, HEAD) of a checkpoint folder's objects after its upload: a
    restart's restore, ``ok`` when its last GET succeeded (one that failed at its first HEAD
    fetched nothing).  A look at the folder itself — the controller's, before deleting it —
    reads no object and is no restore."""
    written = {u.checkpoint: u.end for u in uploads(timeline, run_id)}
    starts = sorted(a.t for a in timeline.attempts() if run_id is None or a.data.get("run_id") == run_id)
    groups: dict[tuple[str, str, int], list[Event]] = {}
    for e in _requests(timeline, run_id):
        folder = e.data["checkpoint"]
        if e.data["method"] in ("GET", "HEAD") and folder in written and e.t >= written[folder]:
            attempt = sum(1 for t in starts if t <= e.t)  # each attempt's restore is one of its own
            groups.setdefault((folder, e.data.get("client") or "?", attempt), []).append(e)
    out = []
    for (folder, client, _), reqs in groups.items():
        reads = [e for e in reqs if "/" in e.data["key"].rstrip("/")]  # of an object, not of the folder
        gets = [e for e in reads if e.data["method"] == "GET"]
        if reads:
            out.append(_transfer(folder, reqs, bool(gets) and _ok(gets[-1]), client))
    return sorted(out, key=lambda r: r.start)


def usual_upload_s(transfers: list[Transfer], but: Transfer) -> float | None:
    """The median time of the run's other completed uploads untouched by a fault (None: none)."""
    others = [u.took for u in transfers if u is not but and u.ok and not u.faulted]
    return statistics.median(others) if others else None
