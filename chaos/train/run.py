"""One Ray Train run under test, submitted as a Ray job through the Jobs API.

The part of the harness a job runs (chaos.train.job_package: the recorder, its channel, the
reference workload) travels in the job's runtime_env (``py_modules``) and the recorder is
switched on through ``RAY_TRAIN_CALLBACKS``; the user's script is not touched.
Job logs are streamed into a file as they arrive.  The job's end (``job_finished``) is
the end of that stream, or — sooner, once Train's run has finished — the job's status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shlex
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from chaos.cluster import ClusterView
from chaos.errors import WaitTimeout, WorkloadError
from chaos.timeline import Event, Timeline, latest_run
from chaos.triggers import run_ended
from chaos.waits import poll_until
from chaos.train.eventlog import EventLog
from chaos.train.job_package import job_package
from chaos.train.channel import ENV_EVENTS_LOG, ENV_STATE_METRIC, ENV_STEP_METRIC

log = logging.getLogger(__name__)

RECORDER = "chaos.train.recorder.Recorder"
TERMINAL_JOB_STATES = {"SUCCEEDED", "FAILED", "STOPPED"}
UNREACHABLE_S = 180.0  # how long a job's status may be unreadable (its head away) before it counts as ended


@dataclasses.dataclass
class RunSpec:
    """What to run: an entrypoint, the directory shipped with it, and how to read it."""

    entrypoint: str
    name: str
    working_dir: str | None = None
    step_metric: str = "auto"  # "auto" or comma-separated names (chaos.train.recording.step_metric_names)
    state_metric: str | None = None  # a per-step value a correct restore reproduces ("auto": the loss)
    deterministic: bool = False  # the same state at the same step gives the same metrics (chaos.verdicts.Expect)
    env_vars: dict[str, str] = dataclasses.field(default_factory=dict)
    runtime_env: dict = dataclasses.field(default_factory=dict)  # the user's own fields (pip, excludes, ...)
    params: dict = dataclasses.field(default_factory=dict)  # for reports only
    user_workload: bool = False


def reference_spec(name: str, storage_path: str, *, steps: int = 30, checkpoint_every: int = 5,
                   step_time: float = 0.3, num_workers: int | tuple[int, int] = 2, max_failures: int = 3,
                   max_preemption_failures: int = -1, device: str = "cpu", seed: int = 0,
                   checkpoint_on_preemption: bool = False, forget: tuple[str, ...] = (),
                   resize_interval_s: float | None = None, python: str = sys.executable) -> RunSpec:
    """``num_workers``: N ranks, or ``(min, max)`` for an elastic run that Train sizes to the
    capacity at each start and checks every ``resize_interval_s`` for room to grow (Ray's
    default 60 s).  ``forget``: the buggy twins, a restore that leaves these parts of the
    state fresh (reference.PARTS).  ``python``: the interpreter the entrypoint runs with on
    the cluster's head (its backend's: this one on the embedded cluster, the node's own on a
    profile's)."""
    elastic = isinstance(num_workers, (tuple, list))
    if elastic and not (len(num_workers) == 2 and 1 <= num_workers[0] <= num_workers[1]):
        raise WorkloadError(f"num_workers={num_workers!r}: an elastic run needs (min, max) with 1 <= min <= max")
    if resize_interval_s is not None and (not elastic or resize_interval_s < 0):
        raise WorkloadError(f"resize_interval_s={resize_interval_s!r}: only an elastic run (num_workers=(min, max)) "
                            "resizes, and the interval is >= 0 seconds")
    params = dict(steps=steps, checkpoint_every=checkpoint_every, step_time=step_time,
                  num_workers="-".join(map(str, num_workers)) if elastic else num_workers,
                  max_failures=max_failures, max_preemption_failures=max_preemption_failures, device=device,
                  seed=seed, checkpoint_on_preemption=int(checkpoint_on_preemption))
    if resize_interval_s is not None:
        params["resize_interval"] = resize_interval_s
    args = " ".join(f"--{k.replace('_', '-')} {shlex.quote(str(v))}" for k, v in params.items())
    args += "".join(f" --forget {shlex.quote(part)}" for part in forget)
    if elastic:
        params["num_workers"] = list(num_workers)
    if forget:
        params["forget"] = list(forget)
    params["python"] = python
    entry = (f"{shlex.quote(python)} -m chaos.train.workloads.reference {args} "
             f"--storage-path {shlex.quote(storage_path)} --name {shlex.quote(name)}")
    return RunSpec(entrypoint=entry, name=name, step_metric="step", state_metric="loss", deterministic=True,
                   params={"workload": "reference", **params})


def user_spec(command: str, name: str, step_metric: str = "auto", working_dir: str | None = None,
              state_metric: str | None = "auto", deterministic: bool = False) -> RunSpec:
    """The user's own Ray Train script, shipped with its directory, unchanged."""
    if not command.strip():
        raise WorkloadError("--chaos-workload is empty; give the command that starts your training script")
    return RunSpec(entrypoint=command, name=name, working_dir=working_dir or str(Path.cwd()),
                   step_metric=step_metric, state_metric=state_metric, deterministic=deterministic,
                   params={"workload": command}, user_workload=True)


# Compiled caches are never shipped: Ray hashes a directory twice per submission (once for the
# job's runtime_env, once to upload it), so a .pyc written in between (any process importing a
# script from the working_dir) leaves the job naming a package that was never uploaded.
PACKAGE_EXCLUDES = ["__pycache__", "*.pyc"]


def runtime_env(spec: RunSpec, harness_env: dict[str, str]) -> dict:
    """The job's runtime_env: the user's own fields, the harness's job package beside their modules,
    the recorder switched on, and ``harness_env`` (where the recorder sends its events, the
    fault's settings), then the spec's own variables."""
    user = {k: v for k, v in spec.runtime_env.items() if k not in ("env_vars", "py_modules", "excludes")}
    env = {
        "RAY_TRAIN_CALLBACKS": RECORDER,
        ENV_STEP_METRIC: spec.step_metric,
        **({ENV_STATE_METRIC: spec.state_metric} if spec.state_metric else {}),
        # The controller's poll tick: reports reach callbacks on it, so keep it short.
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
        **harness_env,
        **spec.env_vars,
    }
    renv: dict = {**user, "py_modules": [str(job_package()), *spec.runtime_env.get("py_modules", [])],
                  "env_vars": env, "excludes": [*spec.runtime_env.get("excludes", []), *PACKAGE_EXCLUDES]}
    if spec.working_dir:
        renv["working_dir"] = spec.working_dir
    return renv


@dataclasses.dataclass
class Submission:
    """One job of a run: the first, or a resubmission after its driver was lost."""

    job_id: str
    log_path: Path
    events: EventLog | None = None
    tail: threading.Thread | None = None
    log_complete: bool = False  # the whole log was fetched at the end: the follower stops writing
    end_seen: bool = False  # job_finished is emitted once, by whichever path sees the end first
    abandoned: bool = False  # its driver was lost and the run resubmitted: its end is no event
    ray_job_id: str | None = None  # Ray's id of its driver, once read
    given_up: threading.Event = dataclasses.field(default_factory=threading.Event)  # abandoned: stop looking


def continued_at(timeline: Timeline) -> tuple[str | None, int]:
    """The run a resubmission continues (the latest) and the attempt number its first attempt gets."""
    lost = latest_run(timeline.events)
    return lost, max((e.attempt for e in timeline.events if e.source == "recorder" and e.attempt is not None
                      and e.data.get("run_id") == lost), default=-1) + 1


def continuation(timeline: Timeline) -> Callable[[Event], Event]:
    """How a resubmission's recorder events join the timeline: as more attempts of the run
    whose driver was lost (its run id; attempts numbered on from its last), which is what a
    resubmission is to whoever waits on the training (a RayJob's retry) — so every verdict
    judges the resubmission's first attempt as a restart of that run.  The resubmission's own
    Train run id is kept as ``train_run_id``."""
    lost, offset = continued_at(timeline)

    def join(event: Event) -> Event:
        data = {**event.data, "train_run_id": event.data.get("run_id"), "run_id": lost}
        if event.attempt is not None:
            data["attempt"] = event.attempt + offset
        return dataclasses.replace(event, data=data)

    return join


class Run:
    """``clock(node_id)``: (that node's clock - this machine's, round trip), measured before
    its events are taken (the recorder stamps them on the controller's node).  A run whose
    driver a fault took is resubmitted (``resubmit``): the run then goes on in a new job."""

    def __init__(self, spec: RunSpec, cluster: ClusterView, timeline: Timeline, log_dir: Path,
                 extra_env: dict[str, str] | None = None,
                 clock: Callable[[str], tuple[float, float]] | None = None):
        self.spec = spec
        self.cluster = cluster
        self.dashboard_url = cluster.dashboard_url
        self.clock = clock
        self.timeline = timeline
        self.log_dir = Path(log_dir)
        self.extra_env = dict(extra_env or {})
        self.submissions: list[Submission] = [self._new_submission()]
        self._client = None
        self._log_lock = threading.Lock()

    def _new_submission(self) -> Submission:
        job_id = f"chaos-{self.spec.name}-{uuid.uuid4().hex[:6]}"
        return Submission(job_id, self.log_dir / f"{job_id}.log")

    @property
    def current(self) -> Submission:
        return self.submissions[-1]

    @property
    def job_id(self) -> str:
        return self.current.job_id

    @property
    def log_path(self) -> Path:
        return self.current.log_path

    @property
    def client(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self.dashboard_url)
        return self._client

    def runtime_env(self) -> dict:
        return runtime_env(self.spec, {ENV_EVENTS_LOG: self.job_id, **self.extra_env})

    def submit(self, transform: Callable[[Event], Event] | None = None, **facts) -> "Run":
        sub = self.current
        sub.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.client.submit_job(entrypoint=self.spec.entrypoint, submission_id=sub.job_id,
                               runtime_env=self.runtime_env())
        self.timeline.emit("harness", "job_submitted", job_id=sub.job_id, entrypoint=self.spec.entrypoint, **facts)
        sub.events = EventLog(self.cluster, sub.job_id, self.timeline, on_found=self._measure_clock,
                              transform=transform).start()
        sub.tail = threading.Thread(target=self._follow_logs, args=(sub,), name=f"logs-{sub.job_id}", daemon=True)
        sub.tail.start()
        return self

    def resubmit(self, why: str) -> str:
        """Give up the current job (its driver is gone: ``why``) and submit the run again under
        the same name and storage, so Train restores its latest committed checkpoint — what a
        RayJob's retry does.  Returns the new job's id."""
        lost = self.current
        with self._log_lock:
            lost.abandoned = True
        lost.given_up.set()
        try:
            self.client.stop_job(lost.job_id)
        except Exception as e:  # the Jobs API may keep calling a driverless job RUNNING, or not know it
            log.warning("could not stop the abandoned job %s: %s", lost.job_id, e)
        self.timeline.emit("harness", "job_abandoned", job_id=lost.job_id, why=why)
        unread = lost.events.drain() if lost.events is not None else None
        if unread is not None:  # a checkpoint the lost job committed may be among them
            run_id, next_attempt = continued_at(self.timeline)
            self.timeline.emit("harness", "events_unread", job_id=lost.job_id, run_id=run_id,
                               next_attempt=next_attempt, why=unread)
        self.submissions.append(self._new_submission())
        self.submit(transform=continuation(self.timeline), resubmits=lost.job_id)
        return self.job_id

    def head_may_go(self) -> None:
        """A fault is about to take the head away: the event log out of reach is then an
        outcome under test, never a reason to abort the waits."""
        if self.current.events is not None:
            self.current.events.lost_after_s = None

    def _follow_logs(self, sub: Submission) -> None:
        async def follow():
            with open(sub.log_path, "a") as f:
                async for chunk in self.client.tail_job_logs(sub.job_id):
                    with self._log_lock:
                        if sub.log_complete or sub.abandoned:
                            return
                        f.write(chunk)
                        f.flush()

        # The stream can also end because the websocket dropped: re-follow until the job's
        # status is terminal, and always say how it ended (never leave the waits hanging).  A
        # head that is away (a head fault) is waited for, a second between looks, for up to
        # UNREACHABLE_S: its job has not ended because nobody can say so.
        status, message = "UNKNOWN", ""
        streams, unreachable_since = 0, None
        while streams < 20 and not (sub.log_complete or sub.abandoned):
            try:
                asyncio.run(follow())
            except Exception as e:
                log.warning("log stream of %s broke: %s", sub.job_id, e)
            try:
                info = self.client.get_job_info(sub.job_id)
                status, message = str(info.status.value), info.message
            except Exception as e:
                status, message = "UNKNOWN", f"could not read the job's status: {e}"
                if "does not exist" in str(e):  # a head back with an empty GCS: the job is gone
                    break
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > UNREACHABLE_S:
                    break
                sub.given_up.wait(1.0)
                continue
            unreachable_since = None
            if status in TERMINAL_JOB_STATES:
                break
            streams += 1
        self._job_ended(sub, status, message)

    def _job_ended(self, sub: Submission, status: str, message: str) -> None:
        with self._log_lock:
            if sub.end_seen or sub.abandoned:
                return
            sub.end_seen = True
        self.timeline.emit("harness", "job_finished", job_id=sub.job_id, status=status, message=message)

    def status(self) -> str | None:
        """The Jobs API's status of the job now (None when it cannot be read)."""
        try:
            return str(self.client.get_job_status(self.job_id).value)
        except Exception as e:
            log.warning("could not read the status of job %s: %s", self.job_id, e)
            return None

    def ray_job_ids(self) -> list[str]:
        """Ray's ids (hex) of the drivers of every job of the run that started one; read while
        the cluster still knows them (``note_ray_job_id``), else now."""
        if not self.timeline.of("job_submitted"):
            return []
        for sub in self.submissions:
            if sub.ray_job_id is None:
                sub.ray_job_id = self.client.get_job_info(sub.job_id).job_id
        return [sub.ray_job_id for sub in self.submissions if sub.ray_job_id]

    def note_ray_job_id(self) -> None:
        """Read the current job's Ray id now, while its cluster knows it (a fault may lose the
        cluster's tables with its head); best effort."""
        try:
            self.current.ray_job_id = self.client.get_job_info(self.job_id).job_id
        except Exception as e:
            log.warning("could not read the Ray job id of %s: %s", self.job_id, e)

    def _terminal_status(self) -> tuple[tuple[str, str] | None, str]:
        info = self.client.get_job_info(self.job_id)
        status = str(info.status.value)
        return ((status, info.message) if status in TERMINAL_JOB_STATES else None), f"status {status}"

    # -- waits -------------------------------------------------------------------
    def _finished_reason(self, events: list[Event]) -> str | None:
        for e in events:
            if e.kind == "job_finished":
                return f"the job ended with status {e.data['status']}: {e.data.get('message')}"
        return None

    def wait_training_started(self, timeout: float) -> Event:
        """Wait for the first report; a job that dies first is a WorkloadError with its log tail."""
        try:
            first = self.timeline.wait_for(lambda ev: next((e for e in ev if e.kind == "report"), None), timeout,
                                           "the first training report", abort=self._finished_reason)
        except WaitTimeout as e:
            raise WorkloadError(
                f"the workload did not start training: {e}\njob {self.job_id} log tail ({self.log_path}):\n{self.log_tail()}"
            ) from e
        self.note_ray_job_id()
        return first

    def wait_finished(self, timeout: float, driver_exit_s: float) -> Event:
        """Wait until the job has ended, then collect every recorder event still in flight.

        Once Train's run has ended the job gets ``driver_exit_s`` to end too, its status read
        directly: Ray's log stream ends only on its own 1 s polls, seconds after the job did."""
        end = self.timeline.wait_for(run_ended, timeout, f"the run of job {self.job_id} to finish")
        if end.kind == "run_finished":
            self._job_ended(self.current, *poll_until(self._terminal_status, driver_exit_s,
                                                      f"job {self.job_id} to end after its Train run finished",
                                                      interval=0.2))
        job = self.timeline.wait_for(lambda ev: next((e for e in ev if e.kind == "job_finished"), None), timeout,
                                     f"job {self.job_id} to finish")
        if self.current.events is not None:
            self.current.events.drain()
        return job

    def _fetch_whole_log(self) -> bool:
        """An ended job's whole log in one call, in place of what the follower streamed (its
        stream would end only on Ray's next polls); False if it cannot be read."""
        sub = self.current
        try:
            text = self.client.get_job_logs(sub.job_id)
        except Exception as e:
            log.warning("could not read the log of job %s: %s", sub.job_id, e)
            return False
        with self._log_lock:
            sub.log_complete = True
            sub.log_path.write_text(text)
        return True

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log yet)"

    def _measure_clock(self, node_id: str) -> None:
        if self.clock is not None:
            self.timeline.set_clock_offset(*self.clock(node_id))

    def failure_policy_lines(self) -> list[str]:
        return [e.data["line"] for e in self.timeline.of("failure_decision") if e.data.get("line")]

    # -- cleanup -----------------------------------------------------------------
    def stop(self, wait: bool = True) -> None:
        """Stop the job if it still runs and collect the last events.  Not ``wait``ing (an
        interrupted session), its log stream and event log get a few seconds, not 40: a cluster
        gone under the session would hold it that long for nothing."""
        sub = self.current
        ended = False
        try:
            status = self.client.get_job_status(sub.job_id)
            ended = str(status.value) in TERMINAL_JOB_STATES
            if not ended:
                self.client.stop_job(sub.job_id)
        except Exception as e:
            log.warning("could not stop job %s: %s", sub.job_id, e)
        if not (ended and self._fetch_whole_log()) and sub.tail is not None:
            sub.tail.join(timeout=30 if wait else 3)
        if sub.events is not None:
            sub.events.drain(10.0 if wait else 1.0)
