"""The recorder's logic (chaos.train.recording) without Ray: facts in, events out."""

import pytest

from chaos.train.recording import Recording


def recorded(state_metric, *reports):
    """The report events a Recording with ``state_metric`` makes of ``reports`` (each a list
    of per-rank metric dicts)."""
    events = []
    r = Recording("auto", state_metric, events.append)
    r.take("controller_started", 1.0, {"run_id": "r", "run_name": "n", "storage_path": "/s", "num_workers": 2,
                                       "failure_config": {}})
    r.take("worker_group_started", 2.0, {"workers": [{"rank": 0}, {"rank": 1}]})
    for i, metrics in enumerate(reports):
        r.take("reported", 3.0 + i, {"metrics": metrics, "checkpoint": None})
    return [e["data"] for e in events if e["kind"] == "report"]


def test_auto_state_metric_takes_the_training_loss_under_its_usual_names():
    [first, second] = recorded("auto", [{"step": 1, "train_loss": 0.5}, {"step": 1, "train_loss": 0.25}],
                               [{"step": 2, "train_loss": 0.4}, {"step": 2, "train_loss": 0.2}])
    assert first["states"] == {"0": 0.5, "1": 0.25} and first["state_metric"] == "train_loss"
    assert second["states"] == {"0": 0.4, "1": 0.2}
    [only] = recorded("auto", [{"step": 1, "loss": 0.5, "train_loss": 9.0}, {"step": 1, "loss": 0.25}])
    assert only["state_metric"] == "loss" and only["states"]["0"] == 0.5


def test_a_state_metric_that_is_not_a_number_is_refused_with_its_type_not_dropped():
    [e] = recorded("auto", [{"step": 1, "loss": "0.5"}, {"step": 1, "loss": 0.25}])
    assert e["states"] == {"0": None, "1": 0.25}
    assert e["state_refused"] == {"0": "loss = '0.5' (str)"}


def test_no_loss_reported_records_no_state_and_a_named_metric_is_read_as_named():
    [e] = recorded("auto", [{"step": 1, "acc": 0.5}, {"step": 1, "acc": 0.6}])
    assert e["states"] == {"0": None, "1": None} and "state_refused" not in e
    [e] = recorded("acc", [{"step": 1, "acc": 0.5}, {"step": 1, "acc": 0.6}])
    assert e["states"] == {"0": 0.5, "1": 0.6} and "state_metric" not in e  # the setting names it already
    [e] = recorded(None, [{"step": 1, "loss": 0.5}, {"step": 1, "loss": 0.6}])
    assert e["states"] is None


def survivors_round(relax, preempted):
    """Three ranks; Train's watcher names ``preempted``; Ray commits a round of two reports."""
    events = []
    r = Recording("auto", None, events.append)
    r.take("controller_started", 1.0, {"run_id": "r", "run_name": "n", "storage_path": "/s", "num_workers": 3,
                                       "failure_config": {"relax_collectives_on_preemption": relax}})
    r.take("worker_group_started", 2.0, {"workers": [{"rank": 0}, {"rank": 1}, {"rank": 2}]})
    r.take("poll_preemption", 3.0, {"preempted_ranks": preempted})
    r.take("reported", 4.0, {"metrics": [{"step": 7}, {"step": 7}], "checkpoint": "/s/checkpoint_7"})
    return events


def test_under_relaxed_collectives_a_round_without_the_preempted_rank_is_the_survivors():
    events = survivors_round(True, [1])
    [notice] = [e["data"] for e in events if e["kind"] == "train_preemption_notice"]
    assert notice["preempted_ranks"] == [1] and notice["attempt"] == 0
    [report] = [e["data"] for e in events if e["kind"] == "report"]
    assert report["steps"] == {"0": 7, "2": 7}  # not renumbered 0, 1: rank 1 is the one that went
    assert report["without_ranks"] == [1]  # the verdicts take the run's checkpoint step for rank 1 from it
    # the twin: without the run's relax setting Ray never commits a partial round; a short list
    # is numbered as Ray lists it
    [report] = [e["data"] for e in survivors_round(False, [1]) if e["kind"] == "report"]
    assert report["steps"] == {"0": 7, "1": 7} and "without_ranks" not in report


@pytest.mark.parametrize("value, expected", [(7, 7), (7.0, 7), (7.5, 7.5), ("7", None), (True, None),
                                             (float("nan"), None)])
def test_step_values_ints_whole_floats_and_scalars(value, expected):
    import numpy as np

    from chaos.train.recording import as_number

    assert as_number(value) == expected
    assert as_number(np.int64(7)) == 7 and isinstance(as_number(np.int64(7)), int)
    assert as_number(np.float32(3.0)) == 3


def test_auto_step_metric_names():
    from chaos.train.recording import AUTO_STEP_METRICS, step_metric_names

    assert step_metric_names("auto") == AUTO_STEP_METRICS
    assert step_metric_names("global_step, step") == ("global_step", "step")
    assert step_metric_names("it,auto")[0] == "it"


def elastic_run(*steps):
    """An elastic run (2-3 workers) as Ray 2.60 drives it (measured on the embedded cluster):
    ``steps`` are the hook calls after the first start, e.g. a failure and a resize."""
    events = []
    r = Recording("auto", None, events.append)
    r.take("controller_started", 1.0, {"run_id": "r", "run_name": "n", "storage_path": "/s", "num_workers": [2, 3],
                                       "elastic": {"min_workers": 2, "max_workers": 3, "resize_interval_s": 5.0},
                                       "failure_config": {}})
    r.take("state_changed", 1.1, {"prev": "INITIALIZING", "cur": "SCHEDULING", "terminal": False, "error": None})
    r.take("resize_decision", 1.1, {"num_workers": 3})
    r.take("worker_group_started", 2.0, {"workers": [{"rank": 0}, {"rank": 1}, {"rank": 2}]})
    for t, (hook, facts) in enumerate(steps, 3):
        r.take(hook, float(t), facts)
    return [e for e in events if e["kind"] in ("controller_started", "resize_decision", "attempt_started")]


def state(prev, cur):
    return "state_changed", {"prev": prev, "cur": cur, "terminal": False, "error": None}


LOSS = [state("RUNNING", "RESTARTING"), ("policy_logged", {"message": "[FailurePolicy] RETRY\n  Source: worker group\n"
                                                                     "  Error count: 1 (max allowed: 3)",
                                                           "error_types": ["WorkerGroupError"]}),
        ("failure_decision", {"decision": "RETRY"}), state("RESTARTING", "SCHEDULING"),
        ("resize_decision", {"num_workers": 2}), ("worker_group_started", {"workers": [{"rank": 0}, {"rank": 1}]})]
UPSIZE = [state("RUNNING", "RESIZING"), state("RESIZING", "SCHEDULING"), ("resize_decision", {"num_workers": 3}),
          ("worker_group_started", {"workers": [{"rank": 0}, {"rank": 1}, {"rank": 2}]})]


def test_each_attempt_says_its_world_size_and_whether_a_failure_or_a_resize_started_it():
    started, *rest = elastic_run(*LOSS, *UPSIZE)
    assert started["data"]["elastic"] == {"min_workers": 2, "max_workers": 3, "resize_interval_s": 5.0}
    sized = [(e["kind"], e["data"].get("attempt"), e["data"].get("num_workers") or e["data"].get("world_size"),
              e["data"]["cause"]) for e in rest]
    assert sized == [("resize_decision", -1, 3, "start"), ("attempt_started", 0, 3, "start"),
                     ("resize_decision", 0, 2, "restart"), ("attempt_started", 1, 2, "restart"),
                     ("resize_decision", 1, 3, "resize"), ("attempt_started", 2, 3, "resize")]


def test_a_start_after_a_resize_that_failed_is_a_restart_not_a_resize():
    """The twin: a resized group that fails while starting is retried after a failure
    decision, and the group that then starts is a restart."""
    failed_start = [state("SCHEDULING", "RESCHEDULING"), ("failure_decision", {"decision": "RETRY"}),
                    state("RESCHEDULING", "SCHEDULING"), ("resize_decision", {"num_workers": 3}),
                    ("worker_group_started", {"workers": [{"rank": 0}, {"rank": 1}, {"rank": 2}]})]
    *_, last = elastic_run(*LOSS, *UPSIZE[:3], *failed_start)
    assert last["kind"] == "attempt_started" and last["data"]["cause"] == "restart"
    # a fixed run's tape from before elastic runs: no elastic facts, every start still says why
    events = []
    r = Recording("auto", None, events.append)
    r.take("controller_started", 1.0, {"run_id": "r", "run_name": "n", "storage_path": "/s", "num_workers": 2,
                                       "failure_config": {}})
    r.take("worker_group_started", 2.0, {"workers": [{"rank": 0}, {"rank": 1}]})
    assert events[0]["data"]["elastic"] is None and events[1]["data"]["cause"] == "start"
