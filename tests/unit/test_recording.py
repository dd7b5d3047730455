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
