"""Network plumbing for test hosts: a bridge, one network namespace + veth per host.

Kept apart from the host lifecycle because the network outlives boots: a host's
namespace, address and partition rules persist while its processes come and go, and a
crashed session's leftovers can be found and removed by name alone (see ``sweep``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import subprocess
from typing import Sequence

from chaos.errors import ClusterError

log = logging.getLogger(__name__)

NETNS_DIR = "/run/netns"

# RFC 2544's benchmarking block, where every test-host subnet lies: never a real destination.
TEST_HOST_RANGE = ipaddress.ip_network("198.18.0.0/15")
# The metric of the "unreachable" route each bridge leaves for its subnet (below the kernel's
# connected route, metric 0, while the bridge is up).
GONE_BRIDGE_METRIC = 4242

# Everything but loopback is dropped while partitioned. Rules match on interfaces, not
# addresses: loopback-source rules cannot tell hosts apart, interfaces can.
_PARTITION_RULES = (("INPUT", "!", "-i", "lo", "-j", "DROP"),
                    ("OUTPUT", "!", "-o", "lo", "-j", "DROP"))


def run_cmd(argv: Sequence[str], timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
    """Run a plumbing command; failures raise ClusterError with the command and its stderr."""
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise ClusterError(f"`{argv[0]}` is not installed (needed for test hosts): {e}") from e
    except subprocess.TimeoutExpired as e:
        raise ClusterError(f"`{' '.join(argv)}` did not finish within {timeout:.0f}s") from e
    if check and p.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def netns_exists(netns: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, netns))


def link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def in_netns(netns: str, *argv: str) -> list[str]:
    """argv that runs a command inside a named network namespace (nsenter: no /sys remount)."""
    return ["nsenter", f"--net={NETNS_DIR}/{netns}", "--", *argv]


def _iptables(netns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run_cmd(in_netns(netns, "iptables", "-w", "5", *args), check=check)


def partition(netns: str) -> None:
    """Drop all non-loopback traffic in and out of ``netns``. Idempotent."""
    for chain, *rule in _PARTITION_RULES:
        if _iptables(netns, "-C", chain, *rule, check=False).returncode != 0:
            _iptables(netns, "-A", chain, *rule)
    log.info("partitioned netns %s", netns)


def heal(netns: str) -> None:
    """Remove the partition rules from ``netns``. Idempotent; needs nothing but the name."""
    if not netns_exists(netns):
        return
    for chain, *rule in _PARTITION_RULES:
        while _iptables(netns, "-C", chain, *rule, check=False).returncode == 0:
            _iptables(netns, "-D", chain, *rule)
    log.info("healed netns %s", netns)


def is_partitioned(netns: str) -> bool:
    return any(_iptables(netns, "-C", chain, *rule, check=False).returncode == 0
               for chain, *rule in _PARTITION_RULES)


class Console:
    """Out-of-band access to a host through its network namespace: cut it off and heal it.

    The partition persists across the host's reboots.  Subclasses (a TestHost) provide
    ``netns`` themselves; ``Console(name)`` reaches a namespace by name alone, e.g. one a
    separately started embedded cluster owns.
    """

    def __init__(self, netns: str):
        self.netns = netns

    def partition(self) -> None:
        partition(self.netns)

    def heal(self) -> None:
        heal(self.netns)

    def is_partitioned(self) -> bool:
        return is_partitioned(self.netns)


def filter_rules(netns: str) -> list[str]:
    """The netns's filter rules as ``iptables -S`` prints them, minus the default policies."""
    out = _iptables(netns, "-S").stdout.splitlines()
    return [line for line in out if not line.startswith("-P ")]


@dataclasses.dataclass(frozen=True)
class HostLink:
    """One host's network: a named netns holding ``eth0``, whose peer is a bridge port."""

    netns: str
    veth: str
    address: ipaddress.IPv4Address
    prefixlen: int
    bridge: str

    def create(self) -> None:
        """Create the netns and veth and configure the address. Idempotent."""
        if not netns_exists(self.netns):
            run_cmd(["ip", "netns", "add", self.netns])
        # IPv6 off: only the configured IPv4 address speaks, so a partition is complete.
        run_cmd(in_netns(self.netns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                         "net.ipv6.conf.default.disable_ipv6=1"))
        if not link_exists(self.veth):
            run_cmd(["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0",
                     "netns", self.netns])
        run_cmd(["ip", "link", "set", self.veth, "master", self.bridge, "up"])
        run_cmd(["ip", "-n", self.netns, "addr", "replace", f"{self.address}/{self.prefixlen}", "dev", "eth0"])
        run_cmd(["ip", "-n", self.netns, "link", "set", "lo", "up"])

    def set_power(self, on: bool) -> None:
        """A powered-off host's NIC is down: peers see no ARP answer, as with a dead machine."""
        run_cmd(["ip", "-n", self.netns, "link", "set", "eth0", "up" if on else "down"])

    def destroy(self) -> None:
        """Remove veth and netns (deleting the veth removes both ends). Idempotent."""
        if link_exists(self.veth):
            run_cmd(["ip", "link", "del", self.veth])
        if netns_exists(self.netns):
            run_cmd(["ip", "netns", "del", self.netns])


@dataclasses.dataclass(frozen=True)
class Bridge:
    """The bridge the head sits on (its address) and every host's veth joins; no route out."""

    name: str
    address: ipaddress.IPv4Address
    prefixlen: int

    def up(self) -> None:
        """Create the bridge with its address. Idempotent."""
        if not link_exists(self.name):
            run_cmd(["ip", "link", "add", self.name, "type", "bridge"])
        run_cmd(["ip", "addr", "replace", f"{self.address}/{self.prefixlen}", "dev", self.name])
        run_cmd(["ip", "link", "set", self.name, "up"])
        # Once the bridge is gone its subnet must not leave the machine: without this route a
        # session still polling a head it had sends to the default route (seen here: an egress
        # proxy answered the dashboard's URL with 404 for minutes).  Kept after ``down`` on
        # purpose, and only inside TEST_HOST_RANGE, where no real network can be shadowed.
        subnet = ipaddress.ip_network(f"{self.address}/{self.prefixlen}", strict=False)
        if subnet.subnet_of(TEST_HOST_RANGE):
            run_cmd(["ip", "route", "replace", "unreachable", str(subnet), "metric", str(GONE_BRIDGE_METRIC)])

    def down(self) -> None:
        if link_exists(self.name):
            run_cmd(["ip", "link", "del", self.name])


def netns_names(prefix: str) -> list[str]:
    """Named network namespaces whose name starts with ``prefix``."""
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def netns_pids(netns: str) -> list[int]:
    """PIDs of every process inside ``netns`` (what `ip netns pids` reports, without a fork)."""
    try:
        st = os.stat(os.path.join(NETNS_DIR, netns))
    except FileNotFoundError:
        return []
    return processes_in_namespace("net", (st.st_dev, st.st_ino))


def processes_in_namespace(kind: str, ns_id: tuple[int, int]) -> list[int]:
    """PIDs whose ``/proc/PID/ns/<kind>`` is the namespace ``(st_dev, st_ino)``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/{kind}")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # exited while we looked, or a kernel thread
        if (st.st_dev, st.st_ino) == ns_id:
            pids.append(int(entry))
    return pids
