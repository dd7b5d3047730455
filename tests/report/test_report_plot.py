"""The timeline picture: derived numbers first, then that a real PNG comes out."""

import pytest
from matplotlib.image import imread

from chaos.plot import plot_data, render_timeline
from chaos.timeline import Timeline


def assert_png(path):
    assert path.is_file() and path.stat().st_size > 20_000, f"{path} is missing or suspiciously small"
    pixels = imread(path)
    height, width = pixels.shape[:2]
    assert width >= 800 and height >= 400
    assert pixels.std() > 0.05, "the image is (nearly) a single colour"


def test_recovered_run_numbers(recovered_timeline):
    data = plot_data(recovered_timeline)
    assert data.has_steps
    assert sorted(data.attempts) == [0, 1]
    assert [p.step for p in data.attempts[0]] == list(range(1, 12))
    assert [p.step for p in data.attempts[1] if p.checkpoint] == [12, 15, 18]
    # attempt 1 resumed at step 10 after reaching 11: steps 10 and 11 were done twice
    [lost] = data.lost
    assert (lost.attempt, lost.first_step, lost.last_step, lost.steps) == (1, 10, 11, 2)
    assert (lost.x0, lost.x1) == (17.0, 20.0)
    [recovery] = data.recoveries
    assert recovery.fault_x == 12.5
    assert recovery.time_to_detect == pytest.approx(2.5)
    assert recovery.time_to_recover == pytest.approx(6.5)
    kinds = [m.kind for m in data.markers]
    assert kinds == ["attempt_started", "fault_injected", "node_dead", "attempt_started", "node_alive", "run_finished"]
    assert data.markers[1].label == "fault: raylet_kill"


def test_recovered_run_png(recovered_timeline, tmp_path):
    assert_png(render_timeline(recovered_timeline, tmp_path / "t.png", title="raylet kill"))


def test_budget_exhausted_has_no_recovery(exhausted_timeline, tmp_path):
    data = plot_data(exhausted_timeline)
    assert list(data.attempts) == [0]
    assert data.lost == []
    [recovery] = data.recoveries
    assert recovery.time_to_detect == pytest.approx(2.0)
    assert recovery.time_to_recover is None
    assert [m.label for m in data.markers if m.kind == "run_finished"] == ["run ERRORED"]
    assert_png(render_timeline(exhausted_timeline, tmp_path / "t.png"))


def test_no_step_metric(stepless_timeline, tmp_path):
    data = plot_data(stepless_timeline)
    assert not data.has_steps
    assert data.lost == []  # nothing to compare without steps
    assert [len(points) for points in data.attempts.values()] == [5, 5]
    path = render_timeline(stepless_timeline, tmp_path / "t.png", title="no steps")
    assert_png(path)


def test_title_says_when_steps_are_missing(stepless_timeline, recovered_timeline, monkeypatch, tmp_path):
    titles = []
    monkeypatch.setattr("matplotlib.axes.Axes.set_title", lambda self, text, **kw: titles.append(text))
    render_timeline(stepless_timeline, tmp_path / "a.png", title="run")
    render_timeline(recovered_timeline, tmp_path / "b.png", title="run")
    assert titles == ["run (no step metric: report times only)", "run"]


def test_many_attempts(many_attempts_timeline, tmp_path):
    data = plot_data(many_attempts_timeline)
    assert len(data.attempts) == 12
    assert [span.steps for span in data.lost] == [3] * 11
    assert_png(render_timeline(many_attempts_timeline, tmp_path / "t.png"))


def test_zero_faults_and_empty_timeline(recovered_timeline, tmp_path):
    calm = Timeline(e for e in recovered_timeline.events if e.kind != "fault_injected")
    assert plot_data(calm).recoveries == []
    assert_png(render_timeline(calm, tmp_path / "calm.png"))
    empty = plot_data(Timeline())
    assert (empty.attempts, empty.markers, empty.lost, empty.recoveries) == ({}, [], [], [])
    assert render_timeline(Timeline(), tmp_path / "empty.png").is_file()


def test_ranks_that_disagree_get_a_line_each(tmp_path):
    """Rank 1 restarts from scratch while rank 0 resumes at 11: one line per rank for that
    attempt (the attempt's single line showed rank 0 only, and the bug was invisible)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from timelines import Script

    tl = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
          .steps(11, 20, rank_step=lambda r, s: s - 10 if r == 1 else s).finish().timeline())
    data = plot_data(tl)
    assert sorted(data.attempts) == [0]  # its ranks agreed: one line
    assert sorted(data.ranks) == [(1, 0), (1, 1)]
    assert [p.step for p in data.ranks[(1, 0)]][:2] == [11, 12]
    assert [p.step for p in data.ranks[(1, 1)]][:2] == [1, 2]
    assert_png(render_timeline(tl, tmp_path / "ranks.png", title="rank 1 from scratch"))


def test_the_automatic_node_recovery_chain_is_on_the_picture(tmp_path):
    """An xid's links, each a marker with what it was: the kernel-log line, each agent signal,
    the node down and back."""
    from chaos.timeline import Event

    t = 1000.0
    events = [Event(t, "fault", "fault_injected", {"fault": "xid", "ledger_id": "f1"}),
              Event(t, "fault", "xid_logged", {"xid": 79, "ledger_id": "f1"}),
              Event(t + 0.2, "fault", "node_agent_signal", {"signal": "condition", "value": {"type": "NvidiaErrorReplace"}}),
              Event(t + 0.3, "fault", "node_agent_signal", {"signal": "label", "value":
                    "sagemaker.amazonaws.com/node-health-status=UnschedulablePendingReplacement"}),
              Event(t + 0.4, "fault", "node_down", {"deleted": True}),
              Event(t + 0.7, "fault", "node_recovered", {"action": "replace"})]
    data = plot_data(Timeline(events))
    assert [m.label for m in data.markers] == [
        "fault: xid", "kernel log: Xid 79", "agent: condition NvidiaErrorReplace",
        "agent: label UnschedulablePendingReplacement", "node deleted", "node replaced"]
    assert render_timeline(Timeline(events), tmp_path / "xid.png").is_file()


def _xid_chain(t=1000.0):
    """What the embedded cluster's automatic node recovery does within 1.5 s: every link."""
    from chaos.timeline import Event

    return Timeline([
        Event(t - 20, "recorder", "attempt_started", {"attempt": 0, "run_id": "r"}),
        Event(t, "fault", "fault_injected", {"fault": "xid", "ledger_id": "f1"}),
        Event(t, "fault", "xid_logged", {"xid": 79, "ledger_id": "f1"}),
        Event(t + 0.2, "fault", "node_agent_signal", {"signal": "condition", "value": {"type": "NvidiaErrorReplace"}}),
        Event(t + 0.3, "fault", "node_agent_signal", {"signal": "label", "value":
              "sagemaker.amazonaws.com/node-health-status=UnschedulablePendingReplacement"}),
        Event(t + 0.4, "fault", "node_down", {"deleted": True}),
        Event(t + 0.5, "cluster", "node_dead", {"node_ip": "198.18.0.3"}),
        Event(t + 0.7, "fault", "node_recovered", {"action": "replace"}),
        Event(t + 1.0, "cluster", "node_alive", {"node_ip": "198.18.0.5"}),
        Event(t + 1.2, "recorder", "attempt_started", {"attempt": 1, "run_id": "r"}),
        Event(t + 1.5, "recorder", "attempt_started", {"attempt": 2, "run_id": "r"}),
        Event(t + 60, "recorder", "run_finished", {"state": "FINISHED", "run_id": "r"})])


def lane_texts(fig):
    """(lane, text, its extent in pixels) of every label the lanes drew."""
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    return [(t.get_gid()[len("lane:"):], t.get_text().strip(), t.get_window_extent(renderer))
            for ax in fig.axes for t in ax.texts if (t.get_gid() or "").startswith("lane:")]


def test_labels_in_one_lane_never_overlap_for_a_dense_chain():
    """The Xid chain's links, 1.5 s apart on a 60 s axis, each labelled in its source's lane
    and no two labels of a lane overlapping (their drawn extents); the chain is dense enough
    that labels on one line would (the check can fail)."""
    from chaos.plot import build_figure

    tl = _xid_chain()
    texts = lane_texts(build_figure(tl, "xid chain"))
    assert sorted({lane for lane, _, _ in texts}) == ["Ray nodes", "Train", "fault", "node agent"]
    assert len(texts) == len(plot_data(tl).markers)
    for lane in {lane for lane, _, _ in texts}:
        boxes = [(text, box) for ln, text, box in texts if ln == lane]
        for i, (a, box_a) in enumerate(boxes):
            for b, box_b in boxes[i + 1:]:
                assert not box_a.overlaps(box_b), f"lane {lane}: {a!r} overlaps {b!r}"
    agent = [box for ln, _, box in texts if ln == "node agent"]
    one_line = [box.translated(0, agent[0].y0 - box.y0) for box in agent]
    assert any(a.overlaps(b) for i, a in enumerate(one_line) for b in one_line[i + 1:]), \
        "the chain is not dense enough for the check to mean anything"


def test_the_storage_lane_shows_each_upload_and_the_fault_window(tmp_path):
    """Uploads from the proxy's requests, named by the step Train committed them at (the failed
    one by what it is), and the storage fault's window from its first match to its end."""
    from chaos.timeline import Event

    def req(t, method, key, status, query=()):
        return Event(t, "storage", "storage_request", {"run_id": "r", "method": method, "key": key, "status": status,
                                                       "query": list(query), "checkpoint": key.split("/")[0],
                                                       "t_end": t + 0.05})

    tl = Timeline([
        Event(100.0, "recorder", "attempt_started", {"attempt": 0, "run_id": "r"}),
        req(101.0, "PUT", "checkpoint_a/state.pt", 200),
        Event(101.5, "recorder", "report", {"attempt": 0, "run_id": "r", "step": 5, "steps": {"0": 5},
                                            "checkpoint": "bkt/p/run/checkpoint_a"}),
        Event(102.0, "fault", "fault_injected", {"fault": "storage-errors", "ledger_id": "f1"}),
        req(103.0, "PUT", "checkpoint_b/state.pt", 503), req(104.0, "PUT", "checkpoint_b/state.pt", 503),
        Event(108.0, "fault", "storage_window_ended", {"fault": "storage-errors", "ledger_id": "f1", "started": 103.0}),
        Event(110.0, "recorder", "attempt_started", {"attempt": 1, "run_id": "r"}),
        req(111.0, "GET", "checkpoint_a/state.pt", 206),
        Event(130.0, "recorder", "run_finished", {"state": "FINISHED", "run_id": "r"})])
    data = plot_data(tl)
    assert [(u.x0, u.label, u.ok) for u in data.uploads] == [(1.0, "step 5", True), (3.0, "upload failed", False)]
    assert [(w.x0, w.x1, w.label) for w in data.windows] == [(3.0, 8.0, "storage-errors window")]
    assert [(r.x0, r.label, r.ok) for r in data.restores] == [(11.0, "restore step 5", True)]
    from chaos.plot import build_figure

    assert {text for lane, text, _ in lane_texts(build_figure(tl)) if lane == "storage"} == {
        "step 5", "upload failed", "restore step 5"}
    assert_png(render_timeline(tl, tmp_path / "storage.png", title="storage errors"))
