"""The HyperPod agent's ``Hosts`` on test hosts: the agent powers the node's host off (its init is
SIGKILLed, so the kernel kills every process in it at once, pods included), deletes the pods, then
a reboot boots the same host again and a replace removes it and boots a new one.

The evidence of a reboot is a new boot id (``/proc/sys/kernel/random/boot_id`` inside the host,
``status.nodeInfo.bootID`` on the Node, which the kubelet keeps true to the host).  A replacement
is a new machine: a new test host with a new address, instance id and node name
(``hyperpod-<instance id>``, as real HyperPod EKS nodes are named); the HyperPod agent creates
its Node object and the kubelet fills in its status.

A node's kernel log is its host's ``/dev/kmsg``: in each boot a fresh regular file the host's
init bind-mounts there (chaos.embedded.testhost_init), read from this machine through the init's
``/proc/<pid>/root`` (the host's own mount namespace), as an agent DaemonSet reads it through a
hostPath.  This machine's ``/dev/kmsg`` is never the answer.
"""

from __future__ import annotations

import secrets
from typing import Any

from chaos.embedded.kube.hyperpod import HostInfo, Hosts
from chaos.embedded.kube.kubelet import HostMachine, Kubelet
from chaos.embedded.testhost import TestHost, TestHostNetwork
from chaos.errors import ClusterError


def new_instance_id() -> str:
    """An EC2-shaped instance id: ``i-`` and 17 hex digits."""
    return "i-" + secrets.token_hex(9)[:17]


class TestHostHosts(Hosts):
    """``HyperPodAgent(api, TestHostHosts(network, kubelet))``: the nodes are ``kubelet``'s, their
    hosts on ``network``.  ``power_off`` blocks until the host's boot has ended, ``reboot`` and
    ``replace`` until the (new) host is up."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, network: TestHostNetwork, kubelet: Kubelet, boot_timeout: float | None = None):
        self.network, self.kubelet = network, kubelet
        self.boot_timeout = boot_timeout or network.boot_timeout + 5

    def _host(self, node_name: str) -> TestHost:
        try:
            machine = self.kubelet.machine(node_name)
        except KeyError as err:
            raise ClusterError(f"node {node_name}: {err.args[0]}") from err
        if not isinstance(machine, HostMachine):
            raise ClusterError(f"node {node_name} runs on {machine.hostname}, not on a test host: it cannot be "
                               f"powered off, rebooted or replaced")
        return machine.host

    def kernel_log(self, node_name: str) -> str | None:
        """``/proc/<init>/root/dev/kmsg`` of the node's host while it is up: only once up has its init
        mounted the stand-in over /dev/kmsg.  None while down, or for a node not on a test host."""
        try:
            machine = self.kubelet.machine(node_name)
        except KeyError:
            return None  # e.g. a replaced node the watch still lists
        if not isinstance(machine, HostMachine) or not machine.host.is_up:
            return None
        init = machine.host.pids().get("init")
        return f"/proc/{init}/root/dev/kmsg" if init else None

    def power_off(self, node_name: str) -> None:
        """Cut the host's power and keep it off.  Returns once its boot has ended, which is once every
        process in its PID namespace is gone: the namespace's init is reaped only after all of them."""
        host = self._host(node_name)
        try:
            host.power_off()
        except ClusterError as err:  # WaitTimeout included
            raise ClusterError(f"node {node_name}: power-off of host {host.name} failed: {err}") from err

    def reboot(self, node_name: str) -> dict[str, Any]:
        """Boot the node's host again (a reboot is a power cycle: the power-off is a no-op when
        ``power_off`` has run); return ``{"bootID": ...}`` once it is up in a new boot."""
        host = self._host(node_name)
        before, boot = host.boot_id, host.boot_count
        try:
            host.power_off()
            host.boot(wait=False)
            host.wait_up(after_boot=boot, timeout=self.boot_timeout)
        except ClusterError as err:  # WaitTimeout included
            raise ClusterError(f"node {node_name}: reboot of host {host.name} failed: {err}") from err
        if host.boot_id == before:
            raise ClusterError(f"node {node_name}: host {host.name} is up but kept boot id {before}")
        return {"bootID": host.boot_id}

    def replace(self, node_name: str) -> HostInfo:
        """Remove the node's host (powered off already, or now), boot a new one and give it to the kubelet."""
        old = self._host(node_name)
        instance_id = new_instance_id()
        new_name = f"hyperpod-{instance_id}"
        try:
            self.network.remove_host(old.name)  # the instance is terminated
            self.kubelet.remove_node(node_name)
            host = self.network.add_host(new_name)
            host.boot(wait=True, timeout=self.boot_timeout)
        except ClusterError as err:
            raise ClusterError(f"node {node_name}: replacement by {new_name} failed: {err}") from err
        self.kubelet.add_node(new_name, HostMachine(host), register=False)
        return HostInfo(instance_id, node_name=new_name,
                        addresses=({"type": "InternalIP", "address": host.address},
                                   {"type": "Hostname", "address": host.name}))
