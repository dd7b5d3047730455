"""A SageMaker endpoint for boto3: the HyperPod node-recovery calls, answered by the HyperPod-like agent.

An aiohttp server on 127.0.0.1 speaking AWS JSON 1.1 the way botocore calls SageMaker:
``POST /`` with ``X-Amz-Target: SageMaker.<Operation>`` and
``Content-Type: application/x-amz-json-1.1`` (signatures are not checked; any credentials
do).  Point boto3 at it with ``endpoint_url=endpoint.url``.  Served operations
(shapes from botocore's ``sagemaker/2017-07-24/service-2.json``):

* ``BatchRebootClusterNodes`` / ``BatchReplaceClusterNodes``: each known instance id's
  node is labelled ``UnschedulablePendingReboot`` / ``...Replacement`` through the agent,
  exactly as ``kubectl label`` would ("both methods activate the same recovery
  processes"), and listed in ``Successful``; an unknown id goes to ``Failed`` with
  ``InstanceIdNotFound``; a node already being recovered to ``Failed`` with
  ``InvalidInstanceStatus`` (our choice: AWS does not document which code that case gets).
  ``NodeLogicalIds`` are not modelled: each goes to ``FailedNodeLogicalIds`` with
  ``InstanceIdNotFound``.
* ``DescribeCluster``: the cluster ``InService`` with one instance group per
  ``instance-group-name`` label (counts of its nodes), ``NodeRecovery: Automatic`` — what
  ``ray-chaos doctor`` reads to see that the credentials and the cluster name work.
* ``DescribeClusterNode`` / ``ListClusterNodes``: the HyperPod nodes with their instance
  group, type, launch time and status (``Running``, or ``Pending`` while the agent
  recovers the node — our mapping).

An unknown cluster answers the modelled ``ResourceNotFound`` error (botocore raises
``ClientError`` with that code).  Constraints botocore does not check itself (it checks
required members and *minimum* lengths only) answer ``ValidationException`` in the usual
AWS wording: more than 25 ids, an id not matching ``i-[a-f0-9]{8}(?:[a-f0-9]{9})?``, no id
list at all.  Instance ids map to nodes by the ``chaos.ray.io/instance-id`` label (ours),
else by the node name ``hyperpod-<id>`` (how real HyperPod EKS nodes are named).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import uuid
from typing import Any, Callable

from aiohttp import web

from chaos.embedded.kube.hyperpod import REBOOT, REPLACE, HyperPodAgent
from chaos.embedded.threaded import ThreadedServer
from chaos.hyperpod import HEALTH_LABEL, INSTANCE_GROUP_LABEL, INSTANCE_TYPE_LABEL, SCHEDULABLE, instance_id_of

CONTENT_TYPE = "application/x-amz-json-1.1"
NODE_ID = re.compile(r"i-[a-f0-9]{8}(?:[a-f0-9]{9})?")
MAX_IDS = 25


class AwsError(Exception):
    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def _validation(value: Any, member: str, constraint: str) -> AwsError:
    return AwsError("ValidationException",
                    f"1 validation error detected: Value '{value}' at '{member}' failed to satisfy constraint: "
                    f"{constraint}")


class SageMakerEndpoint(ThreadedServer):
    """``with SageMakerEndpoint(agent, cluster_name="ml-cluster") as sm:`` then boto3 with ``sm.url``."""

    thread_name = "sagemaker-endpoint"

    def __init__(self, agent: HyperPodAgent, cluster_name: str = "ml-cluster",
                 cluster_arn: str = "arn:aws:sagemaker:us-east-1:123456789012:cluster/emulated0001",
                 host: str = "127.0.0.1", port: int = 0):
        self.agent, self.cluster_name, self.cluster_arn = agent, cluster_name, cluster_arn
        self.host, self.port = host, port
        self.calls: list[tuple[str, dict]] = []  # (operation, request body) as received
        self._runner: web.AppRunner | None = None
        self._operations: dict[str, Callable[[dict], dict]] = {
            "BatchRebootClusterNodes": lambda body: self._batch(body, REBOOT),
            "BatchReplaceClusterNodes": lambda body: self._batch(body, REPLACE),
            "DescribeCluster": self._describe_cluster,
            "DescribeClusterNode": self._describe,
            "ListClusterNodes": self._list,
        }

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ---- HTTP ------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.Response:
        request_id = str(uuid.uuid4())
        try:
            target = request.headers.get("X-Amz-Target", "")
            service, _, operation = target.partition(".")
            if service != "SageMaker" or operation not in self._operations:
                raise AwsError("UnknownOperationException", f"Unknown operation {target!r}")
            raw = await request.read()
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                raise AwsError("SerializationException", "Request body is not valid JSON") from None
            self.calls.append((operation, body))
            result = await asyncio.get_running_loop().run_in_executor(None, self._operations[operation], body)
            return web.Response(body=json.dumps(result), status=200,
                                headers={"Content-Type": CONTENT_TYPE, "x-amzn-RequestId": request_id})
        except AwsError as err:
            return web.Response(body=json.dumps({"__type": err.code, "message": err.message}), status=err.status,
                                headers={"Content-Type": CONTENT_TYPE, "x-amzn-RequestId": request_id,
                                         "x-amzn-ErrorType": err.code})

    # ---- operations ------------------------------------------------------------------
    def _cluster(self, body: dict) -> None:
        name = body.get("ClusterName")
        if name is None:
            raise _validation(None, "clusterName", "Member must not be null")
        if name not in (self.cluster_name, self.cluster_arn):
            raise AwsError("ResourceNotFound", f"Cluster {name} not found.")

    def _nodes_by_instance(self) -> dict[str, dict]:
        found: dict[str, dict] = {}
        for node in self.agent.nodes():
            instance = instance_id_of(node)
            if instance:
                found[instance] = node
        return found

    def _batch(self, body: dict, action: str) -> dict:
        self._cluster(body)
        ids, logical = body.get("NodeIds"), body.get("NodeLogicalIds")
        if ids is None and logical is None:
            raise AwsError("ValidationException", "Either NodeIds or NodeLogicalIds must be provided.")
        for member, values in (("nodeIds", ids), ("nodeLogicalIds", logical)):
            if values is not None and not 1 <= len(values) <= MAX_IDS:
                raise _validation(values, member, f"Member must have length less than or equal to {MAX_IDS}"
                                  if len(values) > MAX_IDS else "Member must have length greater than or equal to 1")
        for value in ids or []:
            if not NODE_ID.fullmatch(value):
                raise _validation(value, "nodeIds.member", "Member must satisfy regular expression pattern: "
                                                            "i-[a-f0-9]{8}(?:[a-f0-9]{9})?")
        nodes = self._nodes_by_instance()
        active = self.agent.active()
        recovering = {instance: action for action, instance in active.values()}
        successful: list[str] = []
        failed: list[dict] = []
        for instance in ids or []:
            node = nodes.get(instance)
            if instance in recovering:  # a node being replaced has no Node object for a while
                failed.append({"NodeId": instance, "ErrorCode": "InvalidInstanceStatus",
                               "Message": f"Node {instance} is already being recovered ({recovering[instance]})."})
                continue
            if node is None:
                failed.append({"NodeId": instance, "ErrorCode": "InstanceIdNotFound",
                               "Message": f"Node {instance} not found in cluster {self.cluster_name}."})
                continue
            name = node["metadata"]["name"]
            health = (node["metadata"].get("labels") or {}).get(HEALTH_LABEL, SCHEDULABLE)
            if name in active or health.startswith("UnschedulablePending"):
                failed.append({"NodeId": instance, "ErrorCode": "InvalidInstanceStatus",
                               "Message": f"Node {instance} is already being recovered ({health})."})
                continue
            self.agent.request(name, action)
            successful.append(instance)
        result: dict[str, Any] = {"Successful": successful, "Failed": failed}
        if logical is not None:
            result["SuccessfulNodeLogicalIds"] = []
            result["FailedNodeLogicalIds"] = [
                {"NodeLogicalId": value, "ErrorCode": "InstanceIdNotFound",
                 "Message": "NodeLogicalIds are not modelled by this emulated endpoint."} for value in logical]
        return result

    def _summary(self, instance: str, node: dict, active: dict[str, str]) -> dict:
        meta = node["metadata"]
        labels = meta.get("labels") or {}
        launched = datetime.datetime.strptime(meta["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
        recovering = meta["name"] in active or labels.get(HEALTH_LABEL, SCHEDULABLE) != SCHEDULABLE
        status = {"Status": "Pending", "Message": f"node-health-status {labels.get(HEALTH_LABEL)}"} if recovering \
            else {"Status": "Running"}
        return {"InstanceGroupName": labels.get(INSTANCE_GROUP_LABEL, self.agent.instance_group),
                "InstanceId": instance,
                "InstanceType": labels.get(INSTANCE_TYPE_LABEL, self.agent.instance_type),
                "LaunchTime": launched, "InstanceStatus": status}

    def _describe_cluster(self, body: dict) -> dict:
        self._cluster(body)
        groups: dict[str, list[dict]] = {}
        for node in self._nodes_by_instance().values():
            labels = node["metadata"].get("labels") or {}
            groups.setdefault(labels.get(INSTANCE_GROUP_LABEL, self.agent.instance_group), []).append(labels)
        return {"ClusterArn": self.cluster_arn, "ClusterName": self.cluster_name, "ClusterStatus": "InService",
                "InstanceGroups": [{"InstanceGroupName": name, "CurrentCount": len(members),
                                    "TargetCount": len(members), "Status": "InService",
                                    "InstanceType": members[0].get(INSTANCE_TYPE_LABEL, self.agent.instance_type)}
                                   for name, members in sorted(groups.items())],
                "NodeRecovery": "Automatic"}

    def _describe(self, body: dict) -> dict:
        self._cluster(body)
        instance = body.get("NodeId")
        node = self._nodes_by_instance().get(instance or "")
        if node is None:
            raise AwsError("ResourceNotFound", f"Node {instance} not found in cluster {self.cluster_name}.")
        return {"NodeDetails": self._summary(instance, node, self.agent.active())}

    def _list(self, body: dict) -> dict:
        self._cluster(body)
        active = self.agent.active()
        return {"ClusterNodeSummaries": [self._summary(i, n, active)
                                         for i, n in sorted(self._nodes_by_instance().items())]}

    # ---- serving ---------------------------------------------------------------------
    def application(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/", self._handle)
        return app

    async def start_async(self) -> None:
        self._runner = web.AppRunner(self.application(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]

    async def stop_async(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
