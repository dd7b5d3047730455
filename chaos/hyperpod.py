"""SageMaker HyperPod facts that the harness's faults and its emulated HyperPod both use: the
node labels and their values, and how a node's instance id is found.

Kept out of the emulator (chaos/embedded/kube/hyperpod.py) so that production code never
imports the emulator for a constant.
"""

from __future__ import annotations

# AWS doc "Resilience-related Kubernetes labels":
# https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-eks-resiliency-node-labels.html
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
SCHEDULABLE = "Schedulable"
PENDING_REBOOT = "UnschedulablePendingReboot"
PENDING_REPLACEMENT = "UnschedulablePendingReplacement"
# Seen on real HyperPod EKS nodes in public manifests and scripts (not in the AWS label doc).
INSTANCE_GROUP_LABEL = "sagemaker.amazonaws.com/instance-group-name"
COMPUTE_TYPE_LABEL = "sagemaker.amazonaws.com/compute-type"  # "hyperpod"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"  # well-known Kubernetes label
# No AWS label carrying the EC2 instance id was found (real node names are "hyperpod-<id>"):
# this one is ours.
INSTANCE_ID_LABEL = "chaos.ray.io/instance-id"
# The node conditions the health-monitoring agent sets: AWS's documented detection event is
# NvidiaErrorReboot (reason XidHardwareFailure); NvidiaErrorReplace is the emulator's name.
NVIDIA_ERROR_REBOOT = "NvidiaErrorReboot"
NVIDIA_ERROR_REPLACE = "NvidiaErrorReplace"


def instance_id_of(node: dict) -> str | None:
    """The node's instance id: our label, else the ``hyperpod-<id>`` node name real HyperPod EKS nodes have."""
    meta = node.get("metadata", {})
    instance = (meta.get("labels") or {}).get(INSTANCE_ID_LABEL)
    if instance is None and meta.get("name", "").startswith("hyperpod-"):
        instance = meta["name"][len("hyperpod-"):]
    return instance
