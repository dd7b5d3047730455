"""Health monitoring for the HyperPod-like agent: Xid lines in each node's kernel log.

SageMaker HyperPod's health-monitoring agent (HMA) watches, among other things, the Xid lines
the NVIDIA driver writes to a node's kernel log, and reboots or replaces the node through its
labels (AWS's HyperPod resiliency docs).  ``HealthMonitor`` reproduces the kernel-log part: it follows
every worker node's log the way ``tail -F`` does and hands each Xid line to the agent, which
sets the node condition and labels (chaos/embedded/kube/hyperpod.py).

Which Xid the real HMA answers with a reboot and which with a replacement is **not public**.
``DEFAULT_XID_ACTIONS`` is this emulator's choice, informed by NVIDIA's Xid catalog
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html: its resolution buckets
say whether a GPU reset — on a node, a reboot — is the remedy or whether support/RMA is next)
and by other agents' public tables (Crusoe's counts 32/48/64/74/79/95 as unhealthy,
119/120/140/143 as degraded):

* 48 double-bit ECC error, 63 row-remapping event, 64 row-remapping failure, 94 contained ECC
  error, 74 NVLink error, 119/120 GSP RPC timeout / GSP error: taken as cleared by a reset ->
  reboot;
* 79 GPU has fallen off the bus, 95 uncontained ECC error: taken as the GPU itself being
  suspect -> replace.

Anything else (13 graphics engine exception, 31 page fault: usually the application's fault)
is recorded as seen and left alone.  Pass ``xid_actions`` to the agent for another table.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

log = logging.getLogger(__name__)

REBOOT, REPLACE = "reboot", "replace"  # the agent's two recoveries (hyperpod.py imports them from here)
DEFAULT_XID_ACTIONS: dict[int, str] = {48: REBOOT, 63: REBOOT, 64: REBOOT, 74: REBOOT, 79: REPLACE, 94: REBOOT,
                                       95: REPLACE, 119: REBOOT, 120: REBOOT}

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=123, name=python, GPU has fallen off the bus." anywhere in a
# line, so that a "<3>" priority, a /dev/kmsg record prefix ("3,1234,5678,-;") or a dmesg
# timestamp may come first.
_XID = re.compile(r"NVRM: Xid \((?P<device>[^)]*)\): (?P<xid>\d+)\b.*")


@dataclass(frozen=True)
class Xid:
    """One Xid line: the code, the device (``PCI:0000:3b:00``) and the line from ``NVRM:`` on."""

    xid: int
    device: str
    message: str


def parse_xid(line: str) -> Xid | None:
    match = _XID.search(line)
    if match is None:
        return None
    return Xid(int(match["xid"]), match["device"], match[0].rstrip())


class KernelLogs(Protocol):
    """What monitoring needs of host control (``hyperpod.Hosts`` has it): each node's kernel log."""

    def kernel_log(self, node_name: str) -> str | None: ...


class HealthMonitor:
    """``HealthMonitor(hosts, nodes, report, stop).start()``: every ``poll_s`` seconds, reads what
    each node of ``nodes()`` added to its kernel log (``hosts.kernel_log(node)``) and calls
    ``report(node, xid)`` for each Xid line, in order, until ``stop`` is set.

    Per node it keeps (boot, offset): a new file behind the path (a reboot's, or a replacement's)
    is a new boot and is read from its start, as a reader of ``/dev/kmsg`` gets the ring buffer
    since boot; so is a node seen for the first time.  The path is part of the boot: a fresh
    tmpfs may give the new file the old one's device and inode numbers.  A partial last line
    waits for its newline.  A log that cannot be read is skipped (logged once per error), and
    one that is not a regular file is never read: the machine's own ``/dev/kmsg`` is no node's.
    """

    def __init__(self, hosts: KernelLogs, nodes: Callable[[], Iterable[str]],
                 report: Callable[[str, Xid], None], stop: threading.Event, poll_s: float = 0.2):
        self.hosts, self._nodes, self._report, self._stop, self.poll_s = hosts, nodes, report, stop, poll_s
        self._logs: dict[str, tuple[tuple, int]] = {}  # node -> ((path, st_dev, st_ino), offset)
        self._errors: dict[str, str] = {}  # node -> the last read error logged
        self._thread: threading.Thread | None = None

    def start(self) -> "HealthMonitor":
        self._thread = threading.Thread(target=self._run, name="hyperpod-health", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a bad report or node list must not end the monitoring
                log.exception("health monitor poll failed")

    def poll(self) -> None:
        """One round over every node (the thread's loop; tests may call it directly)."""
        names = set(self._nodes())
        for gone in set(self._logs) - names:
            del self._logs[gone]
        for name in sorted(names):
            for line in self._new_lines(name):
                xid = parse_xid(line)
                if xid is not None:
                    self._report(name, xid)

    def _new_lines(self, name: str) -> list[str]:
        try:
            path = self.hosts.kernel_log(name)
            if path is None:
                return []  # host down: the next boot's file is a new one anyway
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise OSError(f"{path} is not a regular file: not read")
                boot = (path, st.st_dev, st.st_ino)
                seen, offset = self._logs.get(name, (None, 0))
                if boot != seen or st.st_size < offset:
                    offset = 0
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return []  # the host went down between kernel_log() and open()
        except Exception as err:  # noqa: BLE001 - an unreadable log is skipped, never fatal
            if self._errors.get(name) != str(err):
                self._errors[name] = str(err)
                log.warning("kernel log of node %s unreadable: %s", name, err)
            return []
        self._errors.pop(name, None)
        end = data.rfind(b"\n") + 1
        self._logs[name] = (boot, offset + end)
        return data[:end].decode(errors="replace").splitlines()
