"""Health monitoring of the HyperPod-like agent (chaos/embedded/kube/health.py + hyperpod.py): Xid
lines in a node's kernel log -> node condition and labels -> the label watch's recovery.

Against the emulated API server with a fake ``Hosts`` whose kernel logs are files under tmp_path
(a reboot puts a new file behind the path, as a new boot does); the last test does it all on a
real test host (root only), whose /dev/kmsg is its boot's own file.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from chaos.embedded.kube import ApiServer
from chaos.embedded.kube.health import DEFAULT_XID_ACTIONS, HealthMonitor, parse_xid
from chaos.embedded.kube.hyperpod import (DETECT_STEPS, FAULT_REASONS_LABEL, FAULT_TYPES_LABEL, NO_XID_SINCE_REBOOT,
                                          REBOOT_STEPS, REPLACE_STEPS, XID_HARDWARE_FAILURE, HostInfo, Hosts,
                                          HyperPodAgent, api_client_for)
from chaos.embedded.kube.resources import NODES
from chaos.hyperpod import (HEALTH_LABEL, INSTANCE_ID_LABEL, NVIDIA_ERROR_REBOOT, NVIDIA_ERROR_REPLACE, PENDING_REBOOT,
                            PENDING_REPLACEMENT, SCHEDULABLE)
from kube_helpers import add_node, host_network

ID1, ID2 = "i-0123456789abcdef0", "i-0fedcba9876543210"
NODE = "hyperpod-" + ID1


def nvrm(xid: int, text: str = "GPU has fallen off the bus.") -> str:
    return f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=123, name=python, {text}"


class LogHosts(Hosts):
    """Every node's kernel log is ``<dir>/<node>.kmsg``; a reboot puts a new, empty file behind the
    path (a new boot); a replacement's host has its own.  What the node looked like at each call is kept."""

    def __init__(self, server: ApiServer, log_dir: Path):
        self.server, self.dir = server, log_dir
        self.calls: list[tuple[str, str]] = []
        self.node_at: dict[tuple[str, str], dict | None] = {}

    def path(self, node: str) -> Path:
        return self.dir / f"{node}.kmsg"

    def write(self, node: str, *lines: str) -> None:
        with open(self.path(node), "a") as f:
            f.write("".join(line + "\n" for line in lines))

    def new_boot(self, node: str) -> None:
        fresh = self.path(node).with_suffix(".next")
        fresh.write_text("")
        os.replace(fresh, self.path(node))

    def _call(self, what: str, node: str) -> None:
        self.calls.append((what, node))
        self.node_at[(what, node)] = self.server.store.get(NODES.plural, None, node)

    def kernel_log(self, node_name: str) -> str | None:
        path = self.path(node_name)
        return str(path) if path.exists() else None

    def power_off(self, node_name: str) -> None:
        self._call("power_off", node_name)

    def reboot(self, node_name: str) -> dict:
        self._call("reboot", node_name)
        self.new_boot(node_name)
        return {}

    def replace(self, node_name: str) -> HostInfo:
        self._call("replace", node_name)
        self.path(node_name).unlink()
        self.path("hyperpod-" + ID2).write_text("")
        return HostInfo(instance_id=ID2)


@pytest.fixture
def hosts(server, tmp_path):
    return LogHosts(server, tmp_path)


def start_agent(server: ApiServer, hosts: Hosts, **kwargs) -> HyperPodAgent:
    agent = HyperPodAgent(api_client_for(server.url), hosts, poll_s=0.05, **kwargs).start()
    assert agent.ready.wait(10), "agent never finished its first node list"
    return agent


@pytest.fixture
def agent(server, hosts):
    running = start_agent(server, hosts)
    yield running
    running.stop()


def hp_node(server: ApiServer, hosts: LogHosts, name: str = NODE, instance: str = ID1) -> str:
    hosts.path(name).write_text("")  # its host is up, its kernel log empty
    add_node(server, name, {HEALTH_LABEL: SCHEDULABLE, INSTANCE_ID_LABEL: instance})
    return name


def node(server: ApiServer, name: str) -> dict | None:
    return server.store.get(NODES.plural, None, name)


def conditions(obj: dict) -> dict[str, dict]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


# ---- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "<3>", "3,1234,5678,-;", "[ 1234.567890] ", "kernel: "])
def test_an_xid_line_parses_with_any_prefix(prefix):
    line = nvrm(79)
    xid = parse_xid(prefix + line + "\n")
    assert (xid.xid, xid.device, xid.message) == (79, "PCI:0000:3b:00", line)


@pytest.mark.parametrize("line", ["", "<6>eth0: link up", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
                                  "NVRM: Xid (PCI:0000:3b:00): , pid=1", "Xid 79 GPU has fallen off the bus"])
def test_other_lines_are_no_xid(line):
    assert parse_xid(line) is None


def test_the_nvlink_example_of_the_aws_docs_parses():
    line = ("NVRM: Xid (PCI:0000:b9:00): 71, pid=<unknown>, name=<unknown>, NVLink: fatal error detected on "
            "link 6(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")
    assert parse_xid("<4>" + line).xid == 71 and parse_xid(line).message == line


def test_default_table():
    assert {x for x, a in DEFAULT_XID_ACTIONS.items() if a == "replace"} == {79, 95}
    assert {x for x, a in DEFAULT_XID_ACTIONS.items() if a == "reboot"} == {48, 63, 64, 74, 94, 119, 120}


def test_wrong_actions_are_refused(server, hosts):
    with pytest.raises(ValueError, match="each action must be 'reboot' or 'replace'"):
        HyperPodAgent(api_client_for(server.url), hosts, xid_actions={79: "rma"})


# ---- following a log (the monitor alone, one poll at a time) -----------------------------------


class Paths(Hosts):
    def __init__(self, paths: dict[str, str | None]):
        self.paths = paths

    def kernel_log(self, node_name: str) -> str | None:
        return self.paths.get(node_name)

    def power_off(self, node_name: str) -> None:
        raise AssertionError("not used")

    reboot = replace = power_off


def monitor_of(paths: dict[str, str | None]) -> tuple[HealthMonitor, list]:
    seen: list = []
    monitor = HealthMonitor(Paths(paths), lambda: list(paths), lambda n, x: seen.append((n, x.xid)),
                            threading.Event())
    return monitor, seen


def test_the_monitor_reads_only_new_complete_lines(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(f"<3>{nvrm(48)}\n<3>{nvrm(79)}")  # the second line still being written
    monitor, seen = monitor_of({"n1": str(log)})
    monitor.poll()
    assert seen == [("n1", 48)]
    monitor.poll()
    assert seen == [("n1", 48)], "a line is reported once"
    with open(log, "a") as f:
        f.write(f"\n<3>{nvrm(13)}\n")
    monitor.poll()
    assert seen == [("n1", 48), ("n1", 79), ("n1", 13)]


def test_a_new_file_or_a_shorter_one_is_read_from_its_start(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(nvrm(48) + "\n")
    monitor, seen = monitor_of({"n1": str(log)})
    monitor.poll()
    fresh = tmp_path / "next"
    fresh.write_text(nvrm(48) + "\n")  # the same length: only the new file says it is a new boot
    os.replace(fresh, log)
    monitor.poll()
    log.write_text(nvrm(95, "x") + "\n")  # truncated and shorter
    monitor.poll()
    assert seen == [("n1", 48), ("n1", 48), ("n1", 95)]


def test_unreadable_logs_and_devices_are_skipped(tmp_path, caplog):
    good = tmp_path / "kmsg"
    good.write_text(nvrm(79) + "\n")
    monitor, seen = monitor_of({"dir": str(tmp_path), "device": "/dev/null", "gone": str(tmp_path / "none"),
                                "down": None, "ok": str(good)})
    monitor.poll()
    monitor.poll()
    assert seen == [("ok", 79)]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and any("/dev/null is not a regular file" in w for w in warnings), warnings


def test_an_exception_from_kernel_log_is_no_crash(tmp_path):
    class Broken(Paths):
        def kernel_log(self, node_name: str) -> str | None:
            raise RuntimeError("no such host")

    seen: list = []
    HealthMonitor(Broken({}), lambda: ["n1"], lambda n, x: seen.append(n), threading.Event()).poll()
    assert seen == []


# ---- the agent --------------------------------------------------------------------------------


def test_xid_48_sets_the_condition_and_labels_then_reboots_and_clears_them(server, hosts, agent):
    name = hp_node(server, hosts)
    line = nvrm(48, "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.")
    hosts.write(name, "<6>something else", "3,1234,5678,-;" + line)
    agent.wait_for(name, "schedulable")
    assert agent.steps(name) == [*DETECT_STEPS, *REBOOT_STEPS]
    seen = agent.history(name)[0]
    assert seen.detail == {"xid": 48, "device": "PCI:0000:3b:00", "message": line, "ignored": None}
    at_power_off = hosts.node_at[("power_off", name)]
    condition = conditions(at_power_off)[NVIDIA_ERROR_REBOOT]
    assert {k: condition[k] for k in ("status", "reason", "message")} == {
        "status": "True", "reason": XID_HARDWARE_FAILURE, "message": line}
    assert condition["lastTransitionTime"] and condition["lastHeartbeatTime"]
    labels = at_power_off["metadata"]["labels"]
    assert (labels[HEALTH_LABEL], labels[FAULT_TYPES_LABEL], labels[FAULT_REASONS_LABEL]) == (
        PENDING_REBOOT, XID_HARDWARE_FAILURE, "Xid48")
    assert hosts.calls == [("power_off", name), ("reboot", name)]
    final = node(server, name)
    assert conditions(final)[NVIDIA_ERROR_REBOOT]["status"] == "False"
    assert conditions(final)[NVIDIA_ERROR_REBOOT]["reason"] == NO_XID_SINCE_REBOOT
    assert final["metadata"]["labels"][HEALTH_LABEL] == SCHEDULABLE
    assert not {FAULT_TYPES_LABEL, FAULT_REASONS_LABEL} & set(final["metadata"]["labels"])
    assert agent.history(name)[-1].detail == {"conditions_cleared": [NVIDIA_ERROR_REBOOT]}


def test_xid_79_replaces_the_node(server, hosts, agent):
    name = hp_node(server, hosts)
    hosts.write(name, "<3>" + nvrm(79), "<3>" + nvrm(79))  # the second: already being recovered
    new_name = agent.wait_for(name, "node_created").detail["new_node"]
    steps = agent.steps(name)  # the second xid_seen may come before or after condition_set
    assert sorted(steps[:4]) == sorted(["xid_seen", *DETECT_STEPS]) and steps[4:] == list(REPLACE_STEPS), steps
    ignored = [t.detail["ignored"] for t in agent.history(name) if t.step == "xid_seen"]
    assert ignored == [None, "node already being recovered"]
    at_power_off = hosts.node_at[("power_off", name)]
    assert conditions(at_power_off)[NVIDIA_ERROR_REPLACE]["status"] == "True"
    assert NVIDIA_ERROR_REBOOT not in conditions(at_power_off)
    labels = at_power_off["metadata"]["labels"]
    assert (labels[HEALTH_LABEL], labels[FAULT_REASONS_LABEL]) == (PENDING_REPLACEMENT, "Xid79")
    assert hosts.calls == [("power_off", name), ("replace", name)]
    new = node(server, new_name)
    assert NVIDIA_ERROR_REPLACE not in conditions(new)
    assert new["metadata"]["labels"][HEALTH_LABEL] == SCHEDULABLE
    assert not {FAULT_TYPES_LABEL, FAULT_REASONS_LABEL} & set(new["metadata"]["labels"])


def test_unmapped_xids_and_other_lines_set_nothing(server, hosts, agent):
    name = hp_node(server, hosts)
    before = node(server, name)["metadata"]["resourceVersion"]
    hosts.write(name, "<4>NVRM: GPU at PCI:0000:3b:00: GPU-1234", "<3>" + nvrm(13, "Graphics Exception"))
    seen = agent.wait_for(name, "xid_seen")
    assert (seen.action, seen.detail["xid"], seen.detail["ignored"]) == ("none", 13, "not in xid_actions")
    assert agent.steps(name) == ["xid_seen"]
    assert node(server, name)["metadata"]["resourceVersion"] == before, "the node was changed"
    assert hosts.calls == []


def test_monitoring_off_ignores_a_line_for_good(server, hosts, agent):
    name = hp_node(server, hosts)
    agent.set_health_monitoring(False)
    assert agent.health_monitoring is False
    hosts.write(name, "<3>" + nvrm(48))
    assert agent.wait_for(name, "xid_seen").detail["ignored"] == "health monitoring off"
    agent.set_health_monitoring(True)
    again = time.monotonic()
    hosts.write(name, "<3>" + nvrm(13))  # a marker: once it is seen, the old line was not read again
    assert agent.wait_for(name, "xid_seen", since=again).detail["xid"] == 13
    assert agent.steps(name) == ["xid_seen", "xid_seen"]
    assert node(server, name)["metadata"]["labels"][HEALTH_LABEL] == SCHEDULABLE
    assert NVIDIA_ERROR_REBOOT not in conditions(node(server, name))
    hosts.write(name, "<3>" + nvrm(48))  # and a new line is acted on
    agent.wait_for(name, "schedulable")
    assert hosts.calls == [("power_off", name), ("reboot", name)]


def test_monitoring_off_from_the_start(server, hosts):
    agent = start_agent(server, hosts, health_monitoring=False)
    try:
        name = hp_node(server, hosts)
        hosts.write(name, "<3>" + nvrm(79))
        assert agent.wait_for(name, "xid_seen").detail["ignored"] == "health monitoring off"
        assert agent.steps(name) == ["xid_seen"] and hosts.calls == []
    finally:
        agent.stop()


def test_the_same_line_in_a_new_boot_is_acted_on_again(server, hosts, agent):
    name = hp_node(server, hosts)
    hosts.write(name, "<3>" + nvrm(48))
    agent.wait_for(name, "schedulable")
    again = time.monotonic()
    hosts.write(name, "<3>" + nvrm(48))  # the new boot's file: as long as the old one was
    agent.wait_for(name, "schedulable", since=again)
    assert agent.steps(name) == [*DETECT_STEPS, *REBOOT_STEPS] * 2
    assert hosts.calls == [("power_off", name), ("reboot", name)] * 2


def test_a_custom_table_and_the_detection_delay(server, hosts):
    agent = start_agent(server, hosts, xid_actions={13: "reboot"}, detect_delay_s=0.3)
    try:
        name = hp_node(server, hosts)
        hosts.write(name, "<3>" + nvrm(79), "<3>" + nvrm(13))
        agent.wait_for(name, "schedulable")
        history = agent.history(name)
        assert [(t.step, t.detail.get("xid")) for t in history[:3]] == [("xid_seen", 79), ("xid_seen", 13),
                                                                         ("condition_set", None)]
        assert history[0].detail["ignored"] == "not in xid_actions"
        assert history[2].mono - history[1].mono >= 0.3
        assert history[3].detail["labels"][FAULT_REASONS_LABEL] == "Xid13"
    finally:
        agent.stop()


def test_a_failed_detection_is_recorded_and_a_later_line_tries_again(server, hosts, agent):
    name = hp_node(server, hosts)
    calls = []
    real = agent.core.patch_node_status

    def flaky(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 1:
            raise OSError("API server unreachable")
        return real(*args, **kwargs)

    agent.core.patch_node_status = flaky
    hosts.write(name, "<3>" + nvrm(48))
    failed = agent.wait_for(name, "failed")
    assert failed.detail["error"] == "OSError: API server unreachable"
    again = time.monotonic()
    hosts.write(name, "<3>" + nvrm(48))
    agent.wait_for(name, "schedulable", since=again)
    assert agent.steps(name)[:2] == ["xid_seen", "failed"]


# ---- on a real test host -----------------------------------------------------------------------

BRIDGE, SUBNET = "chm0", "198.18.201.0/28"


@pytest.fixture
def health_hosts(tmp_path_factory):
    with host_network(tmp_path_factory.mktemp("health-hosts"), BRIDGE, SUBNET) as net:
        yield net


def test_an_xid_written_to_kmsg_inside_a_test_host_reboots_its_node(health_hosts, tmp_path):
    from chaos.embedded.kube.kubelet import HostMachine, Kubelet
    from chaos.embedded.kube.testhost_hosts import TestHostHosts

    host = health_hosts.add_host("hm-a")
    host.boot()
    kubelet = Kubelet(tmp_path / "pods")
    kubelet.add_node("hm-a", HostMachine(host), {HEALTH_LABEL: SCHEDULABLE})
    with ApiServer(lifecycle=kubelet, bookmark_interval_s=0.3) as server:
        agent = start_agent(server, TestHostHosts(health_hosts, kubelet))
        try:
            before, start = host.boot_id, server.store.resource_version
            token = uuid.uuid4().hex[:12]
            line = nvrm(48, f"chaos-test {token}")
            inject = subprocess.run(["nsenter", "-t", str(host.pids()["init"]), "-m", "--", "sh", "-c",
                                     f"printf '<3>{line}\\n' >> /dev/kmsg"], capture_output=True, text=True,
                                    timeout=10)
            assert inject.returncode == 0, inject.stderr
            agent.wait_for("hm-a", "schedulable", timeout=30)
            assert agent.steps("hm-a") == [*DETECT_STEPS, *REBOOT_STEPS]
            assert agent.history("hm-a")[0].detail["message"] == line
            assert host.boot_id != before
            raised = [e.obj for e in server.store.events(NODES.plural, start)
                      if conditions(e.obj).get(NVIDIA_ERROR_REBOOT, {}).get("status") == "True"]
            assert raised and conditions(raised[0])[NVIDIA_ERROR_REBOOT]["message"] == line
            final = node(server, "hm-a")
            assert conditions(final)[NVIDIA_ERROR_REBOOT]["status"] == "False"
            assert final["metadata"]["labels"][HEALTH_LABEL] == SCHEDULABLE
            assert Path(agent.hosts.kernel_log("hm-a")).read_text() == "", "the new boot's log is empty"
            dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30).stdout
            assert token not in dmesg, "the line reached this machine's kernel log"
        finally:
            agent.stop()
            kubelet.close()
