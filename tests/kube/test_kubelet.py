"""The emulated kubelet (chaos/embedded/kube/kubelet.py) on real test hosts, and the HyperPod
agent's TestHostHosts: pods are process trees inside the hosts' namespaces, deleted with the
real SIGTERM/grace/SIGKILL sequence; nodes' bootID and Ready follow the hosts' power.

Needs root (namespaces, a bridge): skipped with the reason otherwise.  The hosts live on their
own bridge ``ckl0``; every host, the bridge and every process are gone after the module.
"""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from chaos.embedded.kube import ApiServer
from chaos.embedded.kube.hyperpod import HyperPodAgent, api_client_for
from chaos.embedded.kube.kubelet import HostMachine, Kubelet, ThisMachine
from chaos.embedded.kube.resources import NODES, PODS, prepare_new
from chaos.embedded.kube.testhost_hosts import TestHostHosts
from chaos.hyperpod import HEALTH_LABEL, INSTANCE_GROUP_LABEL, PENDING_REBOOT, PENDING_REPLACEMENT, SCHEDULABLE
from kube_helpers import host_network, wait_for

BRIDGE, SUBNET = "ckl0", "198.18.200.0/24"
HOSTS = ("kl-a", "kl-b")
HEAD = "kl-head"


@pytest.fixture(scope="module")
def network(tmp_path_factory):
    with host_network(tmp_path_factory.mktemp("kubelet-hosts"), BRIDGE, SUBNET) as net:
        for name in HOSTS:
            net.add_host(name).boot()
        yield net


@pytest.fixture
def kubelet(network, tmp_path):
    runtime = Kubelet(tmp_path / "pods")
    for name in HOSTS:
        runtime.add_node(name, HostMachine(network.hosts[name]), {"pool": "workers"})
    runtime.add_node(HEAD, ThisMachine(network.head_address), {"pool": "head"})
    yield runtime
    runtime.close()


@pytest.fixture
def server(kubelet):
    with ApiServer(lifecycle=kubelet, bookmark_interval_s=0.3) as api:
        yield api


def core(server: ApiServer) -> client.CoreV1Api:
    return client.CoreV1Api(api_client_for(server.url))


def pod(server: ApiServer, name: str) -> dict | None:
    return server.store.get(PODS.plural, "default", name)


def node(server: ApiServer, name: str) -> dict | None:
    return server.store.get(NODES.plural, None, name)


def conditions(obj: dict) -> dict[str, str]:
    return {c["type"]: c["status"] for c in obj["status"].get("conditions") or []}


def ns_of(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def pidfds(pids: list[int]) -> list[int]:
    return [os.pidfd_open(pid) for pid in pids]


def exited(fds: list[int], timeout: float = 0.0) -> bool:
    """Whether every process behind ``fds`` has exited (within ``timeout``); closes nothing."""
    deadline = time.monotonic() + timeout
    for fd in fds:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            return False
    return True


def running_pod(server: ApiServer, kubelet: Kubelet, name: str, node_name: str, script: str,
                grace: int = 30) -> tuple[int, list[int]]:
    """A Ready pod running ``sh -c script``; its main PID and all its PIDs."""
    server.pods.create(prepare_new(PODS, {"metadata": {"name": name}, "spec": {
        "nodeName": node_name, "terminationGracePeriodSeconds": grace,
        "containers": [{"name": "ray", "image": "rayproject/ray", "command": ["sh", "-c", script]}]}}, "default"))
    wait_for(server, lambda: conditions(pod(server, name) or {"status": {}}).get("Ready") == "True",
             f"pod {name} Ready", timeout=30, seen=lambda: pod(server, name))
    main, pids = kubelet.processes("default", name)
    assert main is not None and main in pids, (main, pids)
    return main, pids


def trapping_pod(server: ApiServer, kubelet: Kubelet, tmp_path: Path, node_name: str, then: str,
                 grace: int = 30) -> tuple[list[int], Path]:
    """Pod ``w`` whose shell records SIGTERM in a marker file, then runs ``then``; a child sleep keeps
    it busy.  Returned once the trap is set (the shell says so through a FIFO): its PIDs, the marker."""
    marker, fifo = tmp_path / "term", tmp_path / "trap-set"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        _, pids = running_pod(server, kubelet, "w", node_name, f'trap "echo TERM >> {marker}; {then}" TERM; '
                              f'echo set > {fifo}; while :; do sleep 1000 & wait $!; done', grace)
        if not select.select([reader], [], [], 10)[0]:
            pytest.fail(f"the container's shell never said its SIGTERM trap was set (through {fifo})")
        assert os.read(reader, 16) == b"set\n"
    finally:
        os.close(reader)
    return kubelet.processes("default", "w")[1], marker


def test_nodes_are_registered_true_to_their_machines(server, network):
    for name in HOSTS:
        host, obj = network.hosts[name], node(server, name)
        assert obj["metadata"]["labels"]["pool"] == "workers"
        assert obj["metadata"]["labels"]["kubernetes.io/hostname"] == name
        assert obj["status"]["nodeInfo"]["bootID"] == host.boot_id
        assert obj["status"]["addresses"] == [{"type": "InternalIP", "address": host.address},
                                              {"type": "Hostname", "address": name}]
        assert conditions(obj)["Ready"] == "True"
        assert {"cpu", "memory", "pods"} <= obj["status"]["capacity"].keys()
    head = node(server, HEAD)
    assert head["status"]["addresses"][0] == {"type": "InternalIP", "address": network.head_address}
    assert head["status"]["nodeInfo"]["bootID"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    # what the official client reads back (every nodeInfo field it needs is there)
    read = core(server).read_node("kl-a")
    assert read.status.node_info.boot_id == network.hosts["kl-a"].boot_id


def test_pod_runs_inside_its_host_with_the_host_address(server, kubelet, network):
    host = network.hosts["kl-a"]
    env = [{"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           {"name": "PLAIN", "value": "v"}]
    server.pods.create(prepare_new(PODS, {"metadata": {"name": "w"}, "spec": {"nodeName": "kl-a", "containers": [
        {"name": "ray", "command": ["sh", "-c"], "args": ["sleep 1000 & wait"], "env": env}]}}, "default"))
    wait_for(server, lambda: (pod(server, "w") or {}).get("status", {}).get("phase") == "Running", "w Running",
             seen=lambda: pod(server, "w"))
    status = pod(server, "w")["status"]
    assert status["podIP"] == status["hostIP"] == host.address
    assert conditions(pod(server, "w"))["Ready"] == "True"
    running = status["containerStatuses"][0]
    assert running["state"]["running"]["startedAt"] and running["containerID"] and running["restartCount"] == 0
    main, pids = kubelet.processes("default", "w")
    init = host.pids()["init"]
    for pid in pids:  # the shell and its sleep: inside the host's PID, UTS and network namespaces
        for kind in ("pid", "uts", "net", "mnt"):
            assert ns_of(pid, kind) == ns_of(init, kind), (pid, kind)
    environ = dict(item.split("=", 1) for item in Path(f"/proc/{main}/environ").read_text().split("\0") if item)
    assert (environ["MY_POD"], environ["MY_IP"], environ["MY_NODE"], environ["PLAIN"]) == \
        ("w", host.address, "kl-a", "v")
    assert os.getsid(main) != os.getsid(0)  # its own session


def test_head_pod_runs_on_this_machine(server, kubelet, network):
    main, _ = running_pod(server, kubelet, "head", HEAD, "sleep 1000")
    assert ns_of(main, "pid") == ns_of(os.getpid(), "pid") and ns_of(main, "net") == ns_of(os.getpid(), "net")
    assert pod(server, "head")["status"]["podIP"] == network.head_address


def test_graceful_delete_sigterm_then_the_object_goes_with_the_processes(server, kubelet, tmp_path):
    pids, marker = trapping_pod(server, kubelet, tmp_path, "kl-b", "exit 0")
    fds = pidfds(pids)
    core(server).delete_namespaced_pod("w", "default", grace_period_seconds=30)
    wait_for(server, lambda: pod(server, "w") is None, "w gone", seen=lambda: pod(server, "w"))
    assert marker.read_text() == "TERM\n"
    assert exited(fds), "the object went before the container's processes (the orphaned sleep included)"


def test_graceful_delete_sigkills_a_container_that_ignores_sigterm(server, kubelet, tmp_path):
    pids, marker = trapping_pod(server, kubelet, tmp_path, "kl-a", ":")
    fds = pidfds(pids)
    start = time.monotonic()
    core(server).delete_namespaced_pod("w", "default", grace_period_seconds=2)
    assert not server.store.wait(lambda: pod(server, "w") is None, 1.0), "gone before its grace"
    assert not exited(fds) and pod(server, "w")["metadata"]["deletionGracePeriodSeconds"] == 2
    wait_for(server, lambda: pod(server, "w") is None, "w gone after its grace", seen=lambda: pod(server, "w"))
    assert 1.9 <= time.monotonic() - start < 6
    assert exited(fds) and marker.read_text() == "TERM\n"


def test_a_shorter_grace_on_a_second_delete_shortens_the_wait(server, kubelet, tmp_path):
    pids, marker = trapping_pod(server, kubelet, tmp_path, "kl-a", ":")
    fds = pidfds(pids)
    api = core(server)
    api.delete_namespaced_pod("w", "default", grace_period_seconds=30)
    start = time.monotonic()
    api.delete_namespaced_pod("w", "default", grace_period_seconds=1)
    wait_for(server, lambda: pod(server, "w") is None, "w gone after the shortened grace",
             seen=lambda: pod(server, "w"))
    assert time.monotonic() - start < 4
    assert exited(fds)
    assert marker.read_text() == "TERM\n", "SIGTERM is sent once, at the first delete"


def test_forced_delete_removes_the_object_and_kills_after_the_2s_floor(server, kubelet, tmp_path):
    pids, marker = trapping_pod(server, kubelet, tmp_path, "kl-b", ":")
    fds = pidfds(pids)
    start = time.monotonic()
    core(server).delete_namespaced_pod("w", "default", body=client.V1DeleteOptions(grace_period_seconds=0))
    assert pod(server, "w") is None, "a grace-0 delete removes the object at once"
    assert not exited(fds, 1.0), "the kubelet still waits its 2 s floor"
    assert exited(fds, 6.0), "SIGKILL after the floor"
    assert 1.9 <= time.monotonic() - start < 6
    assert marker.read_text() == "TERM\n"


@pytest.mark.parametrize("code, phase, reason", [(3, "Failed", "Error"), (0, "Succeeded", "Completed")])
def test_a_container_exiting_by_itself_ends_its_pod(server, tmp_path, code, phase, reason):
    """The container exits once the pod has been seen Running (it waits for a file the test writes
    then: a fixed 0.2 s let it exit before its Running status was written under load)."""
    go = tmp_path / "exit-now"
    server.pods.create(prepare_new(PODS, {"metadata": {"name": "w"}, "spec": {"nodeName": "kl-a", "containers": [
        {"name": "ray", "command": ["sh", "-c", f"until [ -e {go} ]; do sleep 0.05; done; exit {code}"]}]}},
        "default"))
    wait_for(server, lambda: pod(server, "w")["status"].get("phase") == "Running", "w Running",
             seen=lambda: pod(server, "w")["status"])
    go.touch()
    wait_for(server, lambda: pod(server, "w")["status"].get("phase") == phase, f"w {phase}",
             seen=lambda: pod(server, "w")["status"])
    status = pod(server, "w")["status"]
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (code, reason)
    assert conditions(pod(server, "w"))["Ready"] == "False"
    phases = [e.obj["status"].get("phase") for e in server.store.events(PODS.plural)
              if e.obj["metadata"]["name"] == "w"]
    assert "Running" in phases


def test_exec_through_the_python_client_and_kubectl(server, kubelet, network, kubectl):
    host = network.hosts["kl-b"]
    running_pod(server, kubelet, "w", "kl-b", "sleep 1000")
    resp = stream(core(server).connect_get_namespaced_pod_exec, "w", "default",
                  command=["sh", "-c", "hostname; cat /proc/sys/kernel/random/boot_id; echo $HOSTNAME; exit 5"],
                  stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False)
    resp.run_forever(timeout=10)
    assert resp.returncode == 5
    assert resp.read_stdout().split() == ["kl-b", host.boot_id, "kl-b"]
    result = kubectl.exec_script("w", "hostname; echo err >&2; exit 6")
    assert (result.returncode, result.stdout, result.stderr.splitlines()[0]) == (6, "kl-b\n", "err"), result.stderr
    ok = kubectl.exec_script("w", "cat /proc/1/cmdline")
    assert ok.returncode == 0 and "testhost_init" in ok.stdout, ok  # PID 1 of the exec is the host's init


def test_exec_is_refused_in_a_pod_that_is_not_running(server):
    server.pods.create(prepare_new(PODS, {"metadata": {"name": "done"}, "spec": {"nodeName": "kl-a", "containers": [
        {"name": "ray", "command": ["true"]}]}}, "default"))
    wait_for(server, lambda: pod(server, "done")["status"].get("phase") == "Succeeded", "done Succeeded",
             seen=lambda: pod(server, "done")["status"])
    with pytest.raises(ApiException) as refused:
        stream(core(server).connect_get_namespaced_pod_exec, "done", "default", command=["true"], stderr=True,
               stdin=False, stdout=True, tty=False)
    assert "Handshake status 400" in str(refused.value) and "is not running (phase Succeeded)" in str(refused.value)


def test_host_power_cycle_fails_its_pods_and_renews_the_boot_id(server, kubelet, network):
    host = network.hosts["kl-a"]
    before = host.boot_id
    _, pids = running_pod(server, kubelet, "w", "kl-a", "sleep 1000")
    fds = pidfds(pids)
    start = server.store.resource_version
    host.power_cycle()
    assert exited(fds, 5.0), "the container dies with the host's PID namespace"
    wait_for(server, lambda: pod(server, "w")["status"].get("phase") == "Failed", "w Failed",
             seen=lambda: pod(server, "w")["status"])
    terminated = pod(server, "w")["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 137 and "went down" in terminated["message"]
    host.wait_up(timeout=20)
    wait_for(server, lambda: node(server, "kl-a")["status"]["nodeInfo"]["bootID"] == host.boot_id != before,
             "kl-a's new boot id", seen=lambda: node(server, "kl-a")["status"]["nodeInfo"])
    readiness = [conditions(e.obj)["Ready"] for e in server.store.events(NODES.plural, start)
                 if e.obj["metadata"]["name"] == "kl-a"]
    assert readiness[:1] == ["Unknown"] and readiness[-1] == "True"
    main, _ = running_pod(server, kubelet, "again", "kl-a", "sleep 1000")  # a new pod runs in the new boot
    assert ns_of(main, "pid") == ns_of(host.pids()["init"], "pid")


@pytest.fixture
def agent(server, network, kubelet):
    with HyperPodAgent(api_client_for(server.url), TestHostHosts(network, kubelet)) as running:
        assert running.ready.wait(10), "agent never finished its first node list"
        wait_for(server, lambda: server.store.watching(NODES.plural) >= 1, "the agent's node watch",
                 seen=lambda: server.store.watching(NODES.plural))
        yield running


def label(server: ApiServer, name: str, value: str) -> None:
    def change(obj: dict) -> dict:
        obj["metadata"]["labels"][HEALTH_LABEL] = value
        return obj
    server.store.update(NODES.plural, None, name, change)


def test_hyperpod_reboot_gives_the_node_a_new_boot_id(server, kubelet, network, agent):
    host = network.hosts["kl-b"]
    before = host.boot_id
    _, pids = running_pod(server, kubelet, "w", "kl-b", "sleep 1000")
    fds = pidfds(pids)
    label(server, "kl-b", PENDING_REBOOT)
    back = agent.wait_for("kl-b", "host_back", timeout=20)
    assert back.detail == {"bootID": host.boot_id} and host.boot_id != before
    agent.wait_for("kl-b", "schedulable", timeout=10)
    after = node(server, "kl-b")
    assert after["status"]["nodeInfo"]["bootID"] == host.boot_id
    assert conditions(after)["Ready"] == "True" and after["metadata"]["labels"][HEALTH_LABEL] == SCHEDULABLE
    assert pod(server, "w") is None and exited(fds)


def test_hyperpod_replace_gives_a_new_node_on_a_new_host(server, kubelet, network, agent):
    old_host = network.add_host("kl-c")
    old_host.boot()
    kubelet.add_node("kl-c", HostMachine(old_host), {HEALTH_LABEL: SCHEDULABLE, INSTANCE_GROUP_LABEL: "workers"})
    old_uid = node(server, "kl-c")["metadata"]["uid"]
    label(server, "kl-c", PENDING_REPLACEMENT)
    new_name = agent.wait_for("kl-c", "node_created", timeout=20).detail["new_node"]
    assert new_name.startswith("hyperpod-i-") and new_name != "kl-c"
    assert node(server, "kl-c") is None and "kl-c" not in network.hosts
    new_host = network.hosts[new_name]
    wait_for(server, lambda: (node(server, new_name)["status"].get("nodeInfo") or {}).get("bootID") == new_host.boot_id,
             f"{new_name}'s status from the kubelet", seen=lambda: node(server, new_name)["status"])
    new = node(server, new_name)
    assert new["metadata"]["uid"] != old_uid and conditions(new)["Ready"] == "True"
    assert {"type": "InternalIP", "address": new_host.address} in new["status"]["addresses"]
    assert new["metadata"]["labels"][INSTANCE_GROUP_LABEL] == "workers"
    main, _ = running_pod(server, kubelet, "w", new_name, "sleep 1000")
    assert ns_of(main, "pid") == ns_of(new_host.pids()["init"], "pid")
    assert pod(server, "w")["status"]["podIP"] == new_host.address


def nvrm_in_dmesg() -> list[str]:
    import subprocess

    out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30).stdout
    return [line for line in out.splitlines() if "NVRM" in line]


def test_a_privileged_node_pod_writes_the_hosts_kernel_log_and_never_this_machines(server, network):
    """The xid fault's way to a node's kernel log on Kubernetes: a one-shot privileged pod.
    On a test host it lands in the host's stand-in /dev/kmsg; on the head (this machine's root
    namespace) the real kernel log is refused by name; the pods are gone after either."""
    from chaos.transport.kube_access import KubeAccess
    from chaos.errors import InjectionError
    from chaos.faults.kube import write_by_node_pod
    from chaos.faults.xid import KMSG_SCRIPT, harness_env, xid_line

    kube = KubeAccess(api_client_for(server.url), "default", "rc")
    before = nvrm_in_dmesg()
    line = xid_line(79, 7, pci="0000:ee:00")
    env = harness_env(line)
    out = write_by_node_pod(kube, "kl-a", "busybox", KMSG_SCRIPT, env, what="the Xid line")
    assert "written to /dev/kmsg (stand-in file)" in out, out
    stand_in = Path(f"/proc/{network.hosts['kl-a'].pids()['init']}/root/dev/kmsg")
    assert stand_in.read_text().endswith(f"<3>{line}\n")
    with pytest.raises(InjectionError, match=r"writing the Xid line on node kl-head \(pod chaos-node-shell-\w+\): "
                                             r"refused: /dev/kmsg here is the kernel log of the machine the harness "
                                             r"runs on \(character device, boot time \d+\)$"):
        write_by_node_pod(kube, HEAD, "busybox", KMSG_SCRIPT, env, what="the Xid line")
    assert nvrm_in_dmesg() == before, "this machine's kernel log gained an NVRM line"

    def shells():
        return [p["metadata"]["name"] for p in server.store.list(PODS.plural, "default")[0]
                if p["metadata"]["name"].startswith("chaos-node-shell-")]

    wait_for(server, lambda: not shells(), "the node-shell pods to be deleted", seen=shells)
