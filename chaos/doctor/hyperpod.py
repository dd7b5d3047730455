"""doctor on SageMaker HyperPod: do AWS credentials resolve, and does the profile's cluster
answer — read-only (``DescribeCluster``), before a ``via="boto3"`` node recovery needs both.

The batch reboot/replace permissions themselves cannot be asked without calling them (IAM's
policy simulator needs rights of its own), so the line says they are not checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.doctor.check import Check
from chaos.transport.kube_access import sagemaker_client, unsigned_allowed

if TYPE_CHECKING:
    from chaos.profile import Profile

SUBJECT = "hyperpod"
KINDS = ("hyperpod-reboot", "node-replace")  # their via="boto3" calls SageMaker; via="label" does not
USABLE = ("InService", "Updating", "SystemUpdating")  # ClusterStatus values a node recovery can be asked in
CREDENTIALS_FIX = ("give this runner AWS credentials for the cluster's account (AWS_PROFILE, AWS_ACCESS_KEY_ID/"
                   "AWS_SECRET_ACCESS_KEY, ~/.aws, an instance role or IRSA), or use via='label'")


def checks(profile: "Profile", kinds: set[str]) -> list[Check]:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    hp = profile.kubernetes.hyperpod
    users = tuple(k for k in KINDS if k in kinds)
    if hp is None or not users:
        return []
    where = f"{hp.cluster_name} in {hp.region}" + (f" at {hp.endpoint_url}" if hp.endpoint_url else "")
    credentials = boto3.session.Session(region_name=hp.region).get_credentials()
    if credentials is None and not unsigned_allowed(hp):
        return [Check(SUBJECT, "AWS credentials", False, "none found in the environment, ~/.aws or an instance role "
                      f"(needed by {', '.join(users)} via='boto3')", CREDENTIALS_FIX, users)]
    out = [Check(SUBJECT, "AWS credentials", True,
                 f"from {credentials.method}" if credentials is not None
                 else "none; the endpoint is on loopback (the emulated one), which takes unsigned requests")]
    what = f"DescribeCluster {where}"
    try:
        answer = sagemaker_client(hp, profile.kubernetes.request_timeout_s).describe_cluster(ClusterName=hp.cluster_name)
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        fix = ("set kubernetes.hyperpod.cluster_name and region to a HyperPod cluster these credentials see "
               "(aws sagemaker list-clusters)") if code in ("ResourceNotFound", "ValidationException") else \
            ("let these credentials call sagemaker:DescribeCluster, sagemaker:BatchRebootClusterNodes and "
             "sagemaker:BatchReplaceClusterNodes on the cluster") if code in ("AccessDeniedException", "AccessDenied") \
            else CREDENTIALS_FIX
        return out + [Check(SUBJECT, what, False, f"{code}: {e}", fix, users)]
    except BotoCoreError as e:
        return out + [Check(SUBJECT, what, False, f"{type(e).__name__}: {e}",
                            "check kubernetes.hyperpod.endpoint_url and region, and that this runner reaches the "
                            "SageMaker API", users)]
    status = answer.get("ClusterStatus")
    groups = ", ".join(f"{g.get('InstanceGroupName')} ({g.get('CurrentCount')} nodes)"
                       for g in answer.get("InstanceGroups") or []) or "no instance groups"
    detail = (f"{status}, {groups}, node recovery {answer.get('NodeRecovery', '?')}; BatchReboot/ReplaceClusterNodes "
              "permissions not checked (no read-only way)")
    if status not in USABLE:
        return out + [Check(SUBJECT, what, False, detail, f"wait until the cluster is InService (it is {status})",
                            users)]
    return out + [Check(SUBJECT, what, True, detail)]
