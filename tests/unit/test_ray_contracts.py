"""Fail loudly if the pinned Ray changes an internal the harness relies on.

The recorder (chaos/train/recorder.py) is the only user of ray.train.v2._internal and
chaos/transport/ray.py the only user of Ray's gRPC stubs, chaos/cluster.py of the dashboard's
node summary; each fact they rely on is pinned here against the installed Ray.
"""

import dataclasses
import inspect
import logging
import types
from pathlib import Path

import ray
from ray.train.v2._internal.execution import callback as cb
from ray.train.v2._internal.execution.context import DistributedContext, TrainRunContext
from ray.train.v2._internal.execution.controller.state import FinishedState, RunningState
from ray.train.v2._internal.execution.failure_handling.default import DefaultFailurePolicy
from ray.train.v2._internal.execution.training_report import _TrainingReport
from ray.train.v2._internal.execution.worker_group.poll import WorkerGroupPollStatus, WorkerStatus
from ray.train.v2._internal.execution.worker_group.worker import ActorMetadata, Worker
from ray.train.v2.api.config import FailureConfig
from ray.train.v2.api.preemption import PreemptionInfo
from ray.train.v2.api.exceptions import ControllerError, WorkerGroupError

from chaos.train import recorder, recording


def params(fn):
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_ray_version_is_the_pinned_one():
    """The default Ray (constraints.txt) is the one installed: the internals below and the
    contract fixtures were checked on it."""
    pins = [line.split("==", 1)[1].strip() for line in (Path(__file__).parents[2] / "constraints.txt").read_text()
            .splitlines() if line.startswith("ray==")]
    assert pins == [ray.__version__], f"constraints.txt pins Ray {pins}, found {ray.__version__}: run make setup"


def test_callback_hooks_have_the_signatures_the_recorder_implements():
    expected = {
        cb.ControllerCallback.after_controller_start: ["train_run_context"],
        cb.ControllerCallback.after_controller_state_update: ["previous_state", "current_state"],
        cb.ControllerCallback.before_controller_execute_failure_decision: ["failure_decision"],
        cb.ControllerCallback.before_controller_execute_resize_decision: ["resize_decision"],
        cb.ControllerCallback.after_controller_finish: ["result"],
        cb.WorkerGroupCallback.after_worker_group_start: ["worker_group"],
        cb.WorkerGroupCallback.after_worker_group_poll_status: ["worker_group_status"],
        cb.ReportCallback.after_report: ["training_report", "metrics"],
    }
    for hook, names in expected.items():
        assert params(hook) == names, f"{hook.__qualname__} changed: {params(hook)} != {names}"
        assert params(getattr(recorder.Recorder, hook.__name__)) == names, f"Recorder.{hook.__name__} is stale"


def test_env_var_callback_loading_is_still_there():
    from ray.train.v2._internal.callbacks import env_callback
    from ray.train.v2._internal.constants import RAY_TRAIN_CALLBACKS_ENV_VAR

    assert RAY_TRAIN_CALLBACKS_ENV_VAR == "RAY_TRAIN_CALLBACKS"
    assert hasattr(env_callback, "_initialize_env_callbacks")


def test_placement_and_context_fields():
    assert {f.name for f in dataclasses.fields(ActorMetadata)} >= {"node_id", "node_ip", "pid", "hostname"}
    assert {f.name for f in dataclasses.fields(Worker)} >= {"metadata", "distributed_context"}
    assert {f.name for f in dataclasses.fields(DistributedContext)} >= {"world_rank", "local_rank"}
    assert {f.name for f in dataclasses.fields(TrainRunContext)} >= {"run_config", "scaling_config"}
    assert hasattr(WorkerGroupPollStatus, "errors")
    assert RunningState()._state_type.name == "RUNNING" and not RunningState().is_terminal()
    assert FinishedState().is_terminal()


def _policy_records(policy, error):
    """The decision and the log records Ray's failure policy wrote for it."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger(recorder.FAILURE_POLICY_LOGGER)
    old = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        decision = policy.make_decision(error)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    return decision, records


def _decision_log(policy, error):
    decision, records = _policy_records(policy, error)
    return decision, [recording.parse_failure_policy_line(r.getMessage()) for r in records]


def test_failure_policy_still_logs_its_accounting_in_the_parsed_format():
    policy = DefaultFailurePolicy(FailureConfig(max_failures=1))
    error = WorkerGroupError("boom", worker_failures={0: RuntimeError("rank died")})
    decision, [parsed] = _decision_log(policy, error)
    assert decision.value == "RETRY"
    assert parsed["decision"] == "RETRY" and parsed["budget_class"] == "worker_group"
    assert parsed["count"] == 1 and parsed["limit"] == 1
    decision, [parsed] = _decision_log(policy, error)
    assert decision.value == "RAISE" and parsed["count"] == 2 and parsed["limit"] == 1


def test_unlimited_budgets_parse_as_none():
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError

    policy = DefaultFailurePolicy(FailureConfig())
    error = ControllerError(WorkerGroupStartupTimeoutError(num_workers=2))
    _, [parsed] = _decision_log(policy, error)
    assert parsed["budget_class"] == "controller" and parsed["limit"] is None


def test_raylet_shutdown_grpc_stub_is_still_there():
    from ray.core.generated import node_manager_pb2, node_manager_pb2_grpc

    assert hasattr(node_manager_pb2_grpc.NodeManagerServiceStub, "__init__")
    assert "graceful" in node_manager_pb2.ShutdownRayletRequest.DESCRIPTOR.fields_by_name
    assert "ShutdownRaylet" in node_manager_pb2.DESCRIPTOR.services_by_name["NodeManagerService"].methods_by_name


def test_failure_policy_record_carries_the_error_and_its_causes():
    """The recorder attributes decisions to faults by the failure's classes, taken from the
    exc_info of Ray's [FailurePolicy] record (ControllerError.controller_failure,
    WorkerGroupError.worker_failures)."""
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError

    _, timeout = _policy_records(DefaultFailurePolicy(FailureConfig()),
                                 ControllerError(WorkerGroupStartupTimeoutError(2)))
    _, crash = _policy_records(DefaultFailurePolicy(FailureConfig()),
                               WorkerGroupError("boom", worker_failures={1: RuntimeError("CUDA error")}))
    records = timeout + crash
    assert [recorder.error_types(r.exc_info[1]) for r in records] == [
        ["ControllerError", "WorkerGroupStartupTimeoutError"], ["WorkerGroupError", "RuntimeError"]]


def test_train_run_context_has_a_run_id_and_reports_have_per_worker_metrics():
    assert "run_id" in {f.name for f in dataclasses.fields(TrainRunContext)}
    params = inspect.signature(cb.ReportCallback.after_report).parameters
    assert list(params) == ["self", "training_report", "metrics"]


def test_a_poll_carries_each_ranks_report_with_its_persisted_checkpoint():
    """The recorder's checkpoint_persisted events: a rank's report (checkpoint and metrics)
    in the poll status, before Ray consolidates every rank's into one commit."""
    status = WorkerGroupPollStatus(worker_statuses={
        0: WorkerStatus(running=True, training_report=_TrainingReport(
            checkpoint=types.SimpleNamespace(path="/s/checkpoint_1"), metrics={"step": 5}, validation=False)),
        1: WorkerStatus(running=True)})
    taken = []
    rec = recorder.Recorder()
    rec._take = lambda hook, **facts: taken.append((hook, facts))
    rec.after_worker_group_poll_status(status)
    assert taken == [("poll_checkpoints", {"reports": {"0": {"checkpoint": "/s/checkpoint_1",
                                                             "metrics": {"step": 5}}}})]



def test_a_poll_carries_the_ranks_trains_preemption_watcher_names():
    """The recorder's poll_preemption facts (relax_collectives_on_preemption: Ray then commits
    the survivors' reports alone, and the recorder must know whose they are)."""
    info = PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"n1": [1], "n2": [2]})
    status = WorkerGroupPollStatus(worker_statuses={0: WorkerStatus(running=True, preemption_info=info),
                                                    1: WorkerStatus(running=True, preemption_info=info)})
    taken = []
    rec = recorder.Recorder()
    rec._take = lambda hook, **facts: taken.append((hook, facts))
    rec.after_worker_group_poll_status(status)
    rec.after_worker_group_poll_status(status)  # only changes are facts
    assert taken == [("poll_preemption", {"preempted_ranks": [1, 2]})]
    assert FailureConfig().relax_collectives_on_preemption is False


def test_the_recorder_reports_the_catalogs_failure_config_fields():
    """controller_started's failure_config names the catalog's fields (the limits the verdicts
    read by budget class, and the newer ones), on this Ray and on one without the newer ones."""
    from chaos.faults.catalog import BUDGET_LIMIT_FIELDS, NEWER_FAILURE_CONFIG_FIELDS

    def reported(fc):
        taken = []
        rec = recorder.Recorder()
        rec._take = lambda hook, **facts: taken.append(facts)
        run_config = types.SimpleNamespace(name="r", storage_path="/s", failure_config=fc)
        logger = logging.getLogger(recorder.FAILURE_POLICY_LOGGER)
        handlers, level = list(logger.handlers), logger.level
        try:
            rec.after_controller_start(types.SimpleNamespace(run_id="run1", run_config=run_config,
                                                             scaling_config=types.SimpleNamespace(num_workers=2)))
        finally:  # the policy-log handler it installs stays out of the other tests
            logger.handlers[:] = handlers
            logger.setLevel(level)
        return taken[0]["failure_config"]

    fields = [*BUDGET_LIMIT_FIELDS.values(), *NEWER_FAILURE_CONFIG_FIELDS]
    assert reported(FailureConfig(max_failures=2)) == {f: getattr(FailureConfig(max_failures=2), f) for f in fields}
    older = types.SimpleNamespace(max_failures=2, max_preemption_failures=-1, controller_failure_limit=-1)
    assert reported(older) == {"max_failures": 2, "max_preemption_failures": -1, "controller_failure_limit": -1,
                               **NEWER_FAILURE_CONFIG_FIELDS}


def test_train_reads_the_poll_intervals_the_harness_sets():
    """chaos/train/run.py shortens the controller's poll tick and chaos/faults/preempt.py
    the preemption poll by these variable names; a rename would silently undo both."""
    from ray.train.v2._internal import constants

    from chaos.faults.preempt import PREEMPTION_POLL_S, Preempt

    assert constants.HEALTH_CHECK_INTERVAL_S_ENV_VAR == "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
    assert constants.PREEMPTION_POLL_INTERVAL_S_ENV_VAR == "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"
    assert constants.DEFAULT_PREEMPTION_POLL_INTERVAL_S == PREEMPTION_POLL_S
    assert Preempt(via="drain", deadline_s=8).run_env() == {"RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "2"}
    assert Preempt(via="drain", deadline_s=60).run_env() == {}


def test_gcs_client_drain_node_takes_what_chaos_transport_ray_sends():
    """chaos/transport/ray.py drains a node the way `ray drain-node` does."""
    from ray.core.generated import autoscaler_pb2

    # GcsClient forwards to InnerGcsClient, which has the method
    assert hasattr(ray._raylet.InnerGcsClient, "drain_node")
    assert autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION") > 0
    source = inspect.getsource(__import__("ray.scripts.scripts", fromlist=["drain_node"]).drain_node.callback)
    assert "gcs_client.drain_node(" in source and "deadline_timestamp_ms" in source, source


def test_the_dashboards_node_summary_carries_each_nodes_gcs_record_under_raylet():
    """chaos/cluster.py reads hostnames and raylet ports from GET /nodes?view=summary (no driver
    needed): each entry's ``raylet`` is the GCS's node record, in the dashboard's camelCase."""
    from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled
    from ray.dashboard.modules.node import datacenter, node_head

    routes = inspect.getsource(node_head.NodeHead.get_all_nodes)
    assert 'view == "summary"' in routes and "summary=all_node_summary" in routes, routes
    info = inspect.getsource(datacenter.DataOrganizer.get_node_info)
    assert 'node_info["raylet"].update(node)' in info, info
    assert params(get_auth_headers_if_auth_enabled) == ["user_headers"]


def test_the_recorder_finds_its_nodes_logs_directory():
    """chaos/train/recorder.py's events log: a worker's node says where its logs are."""
    from ray._private import node, worker

    assert "worker.node = node" in inspect.getsource(worker.connect)
    assert isinstance(worker.global_worker, worker.Worker)
    assert params(node.Node.get_logs_dir_path) == []


def test_the_dashboard_lists_and_reads_a_nodes_log_files_as_chaos_cluster_asks():
    """chaos/cluster.py's log_files and read_log (the recorder's event channel): the listing
    takes node_id and glob and answers {category: [file, ...]}; a ``file`` request reads the
    whole file (``lines=-1``) and ends — only ``stream`` keeps the server following it (with no
    timeout), which is why the harness never asks for it."""
    from ray.dashboard.modules.log import log_manager
    from ray.dashboard.modules.state import state_head
    from ray.util.state.common import GetLogOptions

    listing = inspect.getsource(state_head.StateHead.list_logs)
    assert 'req.query.get("glob"' in listing and 'req.query.get("node_id"' in listing, listing
    assert "/api/v0/logs/{media_type}" in inspect.getsource(state_head)
    fields = {f.name for f in dataclasses.fields(GetLogOptions)}
    assert {"node_id", "filename", "lines", "media_type", "timeout"} <= fields, fields
    streaming = inspect.getsource(log_manager.LogsManager.stream_logs)
    assert 'keep_alive = options.media_type == "stream"' in streaming, streaming


def test_an_elastic_resize_replaces_the_whole_group_with_no_failure_decision():
    """What the recorder's ``cause`` of an attempt rests on (measured on the embedded cluster,
    suites/test_elastic.py): a healthy elastic group that can grow goes RUNNING -> RESIZING
    -> SCHEDULING, the controller calls before_controller_execute_resize_decision with the new
    size and starts a new worker group (a new attempt) — the failure policy is not asked."""
    from ray.train.v2._internal.execution.controller.controller import TrainController
    from ray.train.v2._internal.execution.controller.state import ResizingState, TrainControllerStateType
    from ray.train.v2._internal.execution.scaling_policy import ResizeDecision

    assert {"RESIZING", "SCHEDULING", "RESCHEDULING", "RESTARTING"} <= set(TrainControllerStateType.__members__)
    assert ResizingState(ResizeDecision(3, {"CPU": 1}))._state_type.name == "RESIZING"
    assert {f.name for f in dataclasses.fields(ResizeDecision)} >= {"num_workers"}
    step = inspect.getsource(TrainController._step)
    assert "next_state = ResizingState(" in step and "SchedulingState(" in step, step
    resize = inspect.getsource(TrainController._execute_resize_decision)
    assert '"before_controller_execute_resize_decision", decision' in resize, resize
    assert "_shutdown_worker_group()" in resize and "_start_worker_group(" in resize, resize
    assert "_failure_policy" not in resize, resize


def test_the_recorder_reads_an_elastic_runs_range_from_its_scaling_config():
    from ray.train.v2.api.config import ScalingConfig

    assert recorder.elastic_range(ScalingConfig(num_workers=(2, 4), elastic_resize_monitor_interval_s=7.0)) == {
        "min_workers": 2, "max_workers": 4, "resize_interval_s": 7.0}
    assert recorder.elastic_range(ScalingConfig(num_workers=3)) is None  # the twin: a fixed group


def test_an_elastic_restart_is_sized_from_a_cluster_view_refreshed_every_20_s():
    """Why suites/test_elastic.py sets RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S: the elastic policy
    reads the AutoscalingCoordinator's reservation, whose view of the nodes only its 20 s tick
    refreshes, so the restart after a loss asks for the old size and its start must time out
    before the smaller cluster is seen (with the default 60 s it waits for the node instead)."""
    from ray.data._internal.cluster_autoscaler import default_autoscaling_coordinator as coordinator
    from ray.train.v2._internal import constants
    from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy

    assert coordinator._AutoscalingCoordinatorActor.TICK_INTERVAL_S == 20
    tick = inspect.getsource(coordinator._AutoscalingCoordinatorActor._tick)
    assert "self._update_cluster_node_resources()" in tick, tick
    request = inspect.getsource(coordinator._AutoscalingCoordinatorActor.request_resources)
    assert "_update_cluster_node_resources" not in request, request  # a request does not refresh the view
    reserved = inspect.getsource(ElasticScalingPolicy._get_reserved_resources)
    assert "get_reserved_resources.remote(" in reserved and "recompute" not in reserved, reserved
    assert constants.WORKER_GROUP_START_TIMEOUT_S_ENV_VAR == "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
    assert constants.DEFAULT_WORKER_GROUP_START_TIMEOUT_S == 60.0
