"""`python -m chaos.embedded up|down|status`: an embedded cluster that outlives the command.

`up` starts a supervisor process (`serve`, its own session, tracked by PID in a state file)
that owns the cluster and returns once the cluster is ready.  `down` asks that supervisor to
stop (SIGTERM) and waits for it; if it is gone without cleaning up, `down` stops what the
state file records by PID itself — only PIDs recorded in this boot (the state keeps the boot
id and the supervisor's start time: after a reboot its PIDs name other processes).  `status` prints the state file.  `--profile-out` writes a
profile that points the harness at the cluster.

Three kinds of cluster:

* plain (default): Ray nodes on loopback or on test hosts, with automatic node recovery
  (``chaos.embedded.cluster``); its profile is served by the ``ssh``/``embedded`` backends;
* ``--kubernetes``: a KubeRay RayCluster (``ray/raytrain``) on HyperPod-labelled test-host
  nodes behind the emulated API server, with a kubeconfig for kubectl and a SageMaker endpoint
  for boto3 (``chaos.embedded.kubernetes``; needs root).  Its profile is served by the
  ``kubernetes`` backend.  Pods and hosts are replaced under chaos, so its supervisor rewrites
  the state file (pods, their container PIDs, the test hosts' PIDs) whenever the API server's
  objects change: that is what `down` stops if the supervisor died.
* ``--foreign``: a cluster the harness did not start (``chaos.embedded.foreign``; needs root):
  isolated test hosts that share nothing with this machine but a bridge, Ray started on them
  over SSH by ``scripts/foreign-ray-start.sh``; its profile (vm-ssh.yaml's shape) is served by
  the ``ssh`` backend, from a runner outside the cluster or from here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from chaos.embedded.cluster import EmbeddedCluster, EmbeddedConfig
from chaos.errors import ChaosError
from chaos.procs import session_members
from chaos.waits import poll_until

DEFAULT_DIR = Path("reports/embedded")
log = logging.getLogger("chaos.embedded")


def _state_file(base: Path) -> Path:
    return base / "state.json"


def _read_state(base: Path) -> dict | None:
    try:
        return json.loads(_state_file(base).read_text())
    except (OSError, ValueError):
        return None


def _write_state(base: Path, state: dict) -> None:
    """Atomically: `up` and `status` never read half a file."""
    path = _state_file(base)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _supervisor() -> dict:
    """Who wrote the state: its PID, when it started and in which boot — a PID alone names
    another process after a reboot (or, rarely, a wrap), and `down` must never signal that."""
    return {"serve_pid": os.getpid(), "serve_started": psutil.Process().create_time(), "boot_id": _boot_id()}


def _this_boot(st: dict) -> bool:
    """The state's PIDs were written in this boot (a state without a boot id proves nothing)."""
    return st.get("boot_id") == _boot_id()


def _supervisor_alive(st: dict) -> bool:
    """The state's supervisor still runs: its PID alive, in this boot, with its start time."""
    pid = st.get("serve_pid")
    if not pid or not _this_boot(st):
        return False
    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    return abs(started - st.get("serve_started", started)) < 1.0


def serve(args) -> int:
    base = Path(args.dir).resolve()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    starting = True

    def on_signal(signum, _frame):
        nonlocal starting
        stop.set()
        if starting:  # once: the start-up's own teardown runs undisturbed
            starting = False
            raise _Stopped(f"stopped by {signal.Signals(signum).name} during start-up")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    keeper = None
    if args.kubernetes:
        from chaos.embedded.kubernetes import EmbeddedKubernetes, KubeClusterConfig

        cluster = EmbeddedKubernetes(KubeClusterConfig(workers=args.workers, base_dir=base))
    elif args.foreign:
        from chaos.embedded.foreign import ForeignCluster, ForeignConfig

        cluster = ForeignCluster(ForeignConfig(workers=args.workers, base_dir=base, cuda_driver_dir=_driver(args),
                                               shared_fs=not args.no_shared_fs))
    else:
        cluster = EmbeddedCluster(EmbeddedConfig(
            workers=args.workers, node_recovery=args.node_recovery == "automatic",
            recovery_delay_s=args.recovery_delay, base_dir=base, hosts=_hosts_mode(args.hosts),
            cuda_driver_dir=_driver(args)))
    try:
        cluster.up()
        # The profile first: `up` returns once the ready state is written, and its caller's
        # next command reads the profile.
        if args.profile_out:
            _write_profile(cluster, Path(args.profile_out))
        if args.kubernetes:
            keeper = _KubeStateKeeper(base, cluster).start()  # writes the ready state
        elif args.foreign:
            _write_state(base, {"kind": "foreign", "ready": True, **_supervisor(), **cluster.status()})
        else:
            _write_state(base, {"kind": "embedded", "ready": True, **_supervisor(), **cluster.status()})
        starting = False
        stop.wait()
    except (Exception, _Stopped) as e:  # the supervisor's one report of a failed start: `up` prints it
        log.exception("the embedded cluster failed")
        _write_state(base, {"ready": False, **_supervisor(), "error": str(e) or type(e).__name__})
        return 1
    finally:
        if keeper is not None:
            keeper.stop()
        cluster.down()
        if (_read_state(base) or {}).get("ready"):
            _state_file(base).unlink(missing_ok=True)
    return 0


class _Stopped(BaseException):
    """SIGTERM or SIGINT while the cluster starts: stop starting (a BaseException, as
    KeyboardInterrupt, so that no ``except Exception`` on the way swallows it)."""


class _KubeStateKeeper:
    """Keeps the state file of an embedded Kubernetes cluster current: rewritten whenever the
    API server's objects change (a pod recreated, a host rebooted or replaced), so that the
    PIDs `down` needs when the supervisor died are those running now."""

    REFRESH_BOUND_S = 5.0  # how long one wait for a change lasts before stop() is checked again

    def __init__(self, base: Path, cluster):
        self.base = base
        self.cluster = cluster
        self._lock = threading.Lock()
        self._stopped = False
        self._written: dict | None = None

    def start(self) -> "_KubeStateKeeper":
        self._refresh()
        threading.Thread(target=self._run, name="state-keeper", daemon=True).start()
        return self

    def stop(self) -> None:
        """No write after this returns (the cluster is about to be torn down)."""
        with self._lock:
            self._stopped = True

    def _run(self) -> None:
        store = self.cluster.server.store
        seen = store.resource_version
        while True:
            store.wait(lambda: store.resource_version != seen, self.REFRESH_BOUND_S)
            seen = store.resource_version
            try:
                if not self._refresh():
                    return
            except Exception:  # a race with a replacement; the next change writes it again
                log.exception("could not refresh %s", _state_file(self.base))

    def _refresh(self) -> bool:
        with self._lock:
            if self._stopped:
                return False
            state = {"kind": "kubernetes", "ready": True, **_supervisor(), **_kube_status(self.cluster)}
            if state != self._written:
                _write_state(self.base, state)
                self._written = state
            return True


def _kube_status(k) -> dict:
    """What a user and `down` need of an EmbeddedKubernetes: endpoints, nodes, pods and PIDs."""
    from chaos.embedded.kube.kubelet import HostMachine
    from chaos.embedded.kube.resources import PODS

    ns = k.config.namespace
    nodes = []
    for name in k.kubelet.node_names():
        try:
            machine = k.kubelet.machine(name)
        except KeyError:  # removed since node_names(): a replaced host
            continue
        host = machine.host if isinstance(machine, HostMachine) else None
        nodes.append({"name": name, "address": machine.address, "test_host": host is not None,
                      "host_pids": host.pids() if host else {}})
    pods = []
    for pod in sorted(k.server.store.list(PODS.plural, ns)[0], key=lambda p: p["metadata"]["name"]):
        name = pod["metadata"]["name"]
        main_pid, _ = k.kubelet.processes(ns, name)
        pods.append({"name": name, "node": pod["spec"].get("nodeName"), "phase": pod["status"].get("phase"),
                     "ip": pod["status"].get("podIP"), "main_pid": main_pid, "session": _session_of(main_pid)})
    return {"dashboard_url": k.dashboard_url, "gcs_address": k.gcs_address, "kubeconfig": str(k.kubeconfig),
            "api_server": k.server.url, "sagemaker_endpoint": k.sagemaker.url, "namespace": ns,
            "ray_cluster": k.config.ray_cluster, "hyperpod_cluster": k.config.hyperpod_cluster,
            "region": k.config.region, "bridge": k.network.bridge.name, "test_host_dir": str(k.network.state_dir),
            "ray_tmp_root": str(k.ray_tmp_root), "nodes": nodes, "pods": pods}


def _session_of(pid: int | None) -> int | None:
    """The session of a container's main process: the container's session (the kubelet starts
    each as one), whose members are everything it runs."""
    if pid is None:
        return None
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


def _hosts_mode(requested: str) -> str:
    from chaos.embedded.testhost import testhosts_supported

    supported, why = testhosts_supported()
    if requested == "namespaces" and not supported:
        raise ChaosError(f"--hosts namespaces: test hosts are not possible here: {why}")
    return requested if requested != "auto" else ("namespaces" if supported else "plain")


def _write_profile(cluster, path: Path) -> None:
    from chaos.profile import dump_profile, embedded_profile

    if not isinstance(cluster, EmbeddedCluster):  # EmbeddedKubernetes: for the kubernetes backend
        dump_profile(cluster.profile(), path)
        return
    net = cluster.network
    if net is None:
        hosts = [{"address": h.ip, "transport": "local"} for h in cluster.hosts]
    else:  # test hosts: reached over SSH with the harness's key, host keys verified
        ssh = {"user": "root", "key_file": str(net.ssh_key_path), "known_hosts": str(net.known_hosts_path),
               "use_agent": False}
        hosts = [{"address": h.ip, "hostname": h.testhost.name, "transport": "ssh", "ssh": ssh,
                  "netns": h.testhost.netns} for h in cluster.hosts]
    dump_profile(embedded_profile(cluster.gcs_address, cluster.dashboard_url,
                                  str(cluster.base_dir / "storage"), hosts), path)


def up(args) -> int:
    base = Path(args.dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    kind = "kubernetes" if args.kubernetes else "foreign" if args.foreign else "embedded"
    existing = _read_state(base)
    if existing and existing.get("ready") and _supervisor_alive(existing):
        if existing.get("kind", "embedded") != kind:
            raise ChaosError(f"a {existing.get('kind', 'embedded')} cluster is already up under {base} (supervisor pid "
                             f"{existing['serve_pid']}): `python -m chaos.embedded down --dir {base}` first, or use "
                             "another --dir")
        print(f"already up: {existing['dashboard_url']} (supervisor pid {existing['serve_pid']})")
        return 0
    _state_file(base).unlink(missing_ok=True)
    argv = [sys.executable, "-m", "chaos.embedded", "serve", "--dir", str(base), "--workers", str(args.workers)]
    if args.kubernetes:
        argv += ["--kubernetes"]
    elif args.foreign:
        argv += ["--foreign", *(["--no-shared-fs"] if args.no_shared_fs else [])]
    else:
        argv += ["--hosts", _hosts_mode(args.hosts), "--node-recovery", args.node_recovery,
                 "--recovery-delay", str(args.recovery_delay)]
    if args.profile_out:
        argv += ["--profile-out", str(Path(args.profile_out).resolve())]
    if args.cuda_driver_dir:
        argv += ["--cuda-driver-dir", str(_driver(args))]
    log_path = base / "supervisor.log"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def check():
        st = _read_state(base)
        if st is not None:
            return st, "state written"
        if proc.poll() is not None:
            return {"ready": False, "error": f"supervisor exited with {proc.returncode}"}, ""
        return None, "cluster still starting"

    try:
        st = poll_until(check, args.timeout, f"the embedded {kind} cluster to come up", interval=0.5)
    except ChaosError as e:  # not up in time: SIGTERM makes the supervisor stop starting and tear down
        proc.terminate()
        _wait_exit(proc, args.timeout)
        _state_file(base).unlink(missing_ok=True)
        raise ChaosError(f"{e}; supervisor stopped, see {log_path}") from None
    if not st.get("ready"):
        _wait_exit(proc, args.timeout)  # it tears down before it exits: nothing is left once it has
        _state_file(base).unlink(missing_ok=True)
        print(f"embedded {kind} cluster failed to start: {st.get('error')}; see {log_path}", file=sys.stderr)
        return 1
    if args.kubernetes:
        _print_kube_up(st, base, args.profile_out)
    elif args.foreign:
        print(f"foreign cluster up: dashboard {st['dashboard_url']}, GCS {st['gcs_address']}, "
              f"{len(st['hosts']) - 1} workers on isolated test hosts (bridge {st['bridge']}), supervisor pid "
              f"{st['serve_pid']}" + (f"; profile {args.profile_out}" if args.profile_out else ""))
    else:
        print(f"embedded cluster up: dashboard {st['dashboard_url']}, GCS {st['gcs_address']}, "
              f"{len(st['hosts'])} workers, supervisor pid {st['serve_pid']}")
    return 0


def _wait_exit(proc: subprocess.Popen, timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise ChaosError(f"supervisor pid {proc.pid} did not finish its teardown within {timeout:.0f}s; killed it, "
                         "which may leave test hosts (`ip netns list`) and Ray processes behind") from None


def _print_kube_up(st: dict, base: Path, profile_out: str | None) -> None:
    workers = [n["name"] for n in st["nodes"] if n["test_host"]]
    kubectl = f"kubectl --kubeconfig {st['kubeconfig']}"
    lines = [
        f"embedded Kubernetes cluster up: RayCluster {st['namespace']}/{st['ray_cluster']}, 1 head + {len(workers)} "
        f"worker pods on HyperPod nodes {', '.join(workers)} (supervisor pid {st['serve_pid']})",
        f"  dashboard    {st['dashboard_url']}   (GCS {st['gcs_address']})",
        f"  kubeconfig   {st['kubeconfig']}   (API server {st['api_server']})",
        f"  SageMaker    {st['sagemaker_endpoint']}   (boto3 endpoint_url; HyperPod cluster "
        f"{st['hyperpod_cluster']}, region {st['region']})",
    ]
    if profile_out:
        lines.append(f"  profile      {Path(profile_out).resolve()}   (kubernetes backend: --chaos-profile)")
    lines += [f"  try          {kubectl} get pods -n {st['namespace']} -o wide",
              f"               {kubectl} get nodes --show-labels",
              f"  stop         python -m chaos.embedded down --dir {base}"]
    print("\n".join(lines))


def _alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def down(args) -> int:
    base = Path(args.dir).resolve()
    st = _read_state(base)
    if not st:
        print("no embedded cluster recorded under", base)
        return 0
    if not _this_boot(st):
        print(f"the state under {base} was written in another boot (boot id {st.get('boot_id', 'not recorded')}, "
              f"now {_boot_id()}): its PIDs name other processes now, so none is signalled")
        _sweep_network(st)
        _state_file(base).unlink(missing_ok=True)
        return 0
    pid = st.get("serve_pid")
    if _supervisor_alive(st):
        os.kill(pid, signal.SIGTERM)
        try:
            poll_until(lambda: (not _alive(pid), f"supervisor {pid} still running"), args.timeout,
                       f"supervisor pid {pid} to stop the cluster")
        except ChaosError:
            os.kill(pid, signal.SIGKILL)
    # Whatever the supervisor could not stop, by PID.
    if st.get("kind") == "kubernetes":
        _sweep_kubernetes(st)
    elif st.get("kind") == "foreign":
        _sweep_hosts(st)
    else:
        leaders = [st.get("head_pid")] + [h.get("pid") for h in st.get("hosts", [])]
        _kill_sessions(leaders)
    _state_file(base).unlink(missing_ok=True)
    print(f"embedded {st.get('kind', 'embedded')} cluster stopped")
    return 0


def _kill_sessions(leaders) -> None:
    for leader in filter(None, leaders):
        for member in session_members(leader):
            os.kill(member, signal.SIGKILL)


def _sweep_kubernetes(st: dict) -> None:
    """What a dead supervisor left of an embedded Kubernetes cluster: the containers' sessions
    (the head pod's runs on this machine), the test hosts' boots, their network, their state
    (SSH keys included) and the Ray temp dirs."""
    _kill_sessions([p.get("session") for p in st.get("pods", [])] +
                   [n.get("host_pids", {}).get("unshare") for n in st.get("nodes", [])])
    _sweep_network(st)


def _sweep_hosts(st: dict) -> None:
    """What a dead supervisor left of a foreign cluster: its test hosts' boots (every Ray
    process of theirs lives in them), their network and state."""
    _kill_sessions([h.get("pids", {}).get("unshare") for h in st.get("hosts", [])]
                   + st.get("storage", {}).get("pids", []))
    _sweep_network(st)


def _sweep_network(st: dict) -> None:
    bridge = st.get("bridge")
    if bridge:
        from chaos.embedded import netns
        from chaos.embedded.testhost import TestHostNetwork

        if netns.link_exists(bridge) or netns.netns_names(f"{bridge}-"):
            removed = TestHostNetwork.sweep(bridge)
            print(f"removed what the supervisor left: {', '.join(removed)}")
    for tmp in (st.get("test_host_dir"), st.get("ray_tmp_root")):
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def status(args) -> int:
    st = _read_state(Path(args.dir).resolve())
    if not st:
        print("no embedded cluster is up")
        return 1
    st["supervisor_alive"] = _supervisor_alive(st)
    print(json.dumps(st, indent=1))
    return 0 if st["supervisor_alive"] else 1


def _driver(args) -> Path | None:
    return Path(args.cuda_driver_dir).resolve() if args.cuda_driver_dir else None


def _validate_up(args) -> None:
    """Refuse what cannot work before a supervisor is started."""
    if args.kubernetes and args.foreign:
        raise ChaosError("--kubernetes and --foreign: one kind of cluster at a time")
    if args.no_shared_fs and not args.foreign:
        raise ChaosError("--no-shared-fs applies to --foreign only (the other clusters' nodes share this machine's "
                         "files)")
    if args.cuda_driver_dir:
        if args.kubernetes:
            raise ChaosError("--cuda-driver-dir does not apply to --kubernetes (its pods see this machine's files: "
                             "a session's own driver directory reaches them)")
        if not (_driver(args) / "libcuda.so.1").is_file():
            raise ChaosError(f"--cuda-driver-dir {args.cuda_driver_dir}: no libcuda.so.1 there")
    if not (args.kubernetes or args.foreign):
        args.hosts = args.hosts or "auto"
        args.node_recovery = args.node_recovery or "automatic"
        args.recovery_delay = 2.0 if args.recovery_delay is None else args.recovery_delay
        EmbeddedConfig(workers=args.workers, recovery_delay_s=args.recovery_delay, cuda_driver_dir=_driver(args))
        return
    from chaos.embedded.testhost import testhosts_supported

    if args.kubernetes:
        from chaos.embedded.kubernetes import KubeClusterConfig

        flag, machines, recovery = ("--kubernetes", "nodes",
                                     "the KubeRay-like reconciler and the HyperPod-like agent recover them")
        KubeClusterConfig(workers=args.workers)
    else:
        from chaos.embedded.foreign import ForeignConfig

        flag, machines, recovery = "--foreign", "machines", "each node's service restarts its Ray"
        ForeignConfig(workers=args.workers)
    given = [f for f, value in (("--hosts", args.hosts), ("--node-recovery", args.node_recovery),
                                ("--recovery-delay", args.recovery_delay)) if value is not None]
    if given:
        raise ChaosError(f"{flag}: {', '.join(given)} do not apply (its {machines} are always test hosts; "
                         f"{recovery})")
    supported, why = testhosts_supported()
    if not supported:
        raise ChaosError(f"{flag}: its {machines} are test hosts, which are not possible here: {why}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.embedded", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("up", "serve", "down", "status"):
        s = sub.add_parser(name)
        s.add_argument("--dir", default=str(DEFAULT_DIR), help="state and logs (default reports/embedded)")
        s.add_argument("--timeout", type=float, default=240.0)
        if name in ("up", "serve"):
            s.add_argument("--kubernetes", action="store_true",
                           help="a KubeRay RayCluster on HyperPod-labelled test-host nodes behind an emulated "
                                "API server (root), instead of plain Ray nodes")
            s.add_argument("--foreign", action="store_true",
                           help="a cluster the harness did not start: isolated test hosts (their own /tmp, none of "
                                "this checkout), Ray started on them over SSH by scripts/foreign-ray-start.sh (root)")
            s.add_argument("--no-shared-fs", action="store_true",
                           help="foreign cluster only: no shared filesystem at all; checkpoints go to S3 (moto "
                                "behind the storage fault proxy on the bridge's address), as on a real cluster")
            s.add_argument("--workers", type=int, default=3)
            s.add_argument("--node-recovery", choices=["automatic", "off"], default=None,
                           help="plain cluster only (default automatic)")
            s.add_argument("--recovery-delay", type=float, default=None, help="plain cluster only (default 2.0)")
            s.add_argument("--profile-out", default=None, help="write a profile describing this cluster")
            s.add_argument("--cuda-driver-dir", default=None,
                           help="a directory with libcuda.so.1 (e.g. chaos/shim/cuda_stub's) first on every node's "
                                "library path, as a GPU node has its driver: CUDA faults through the profile")
            s.add_argument("--hosts", choices=["auto", "plain", "namespaces"], default=None,
                           help="plain cluster only: workers as loopback processes or as test hosts (namespaces, "
                                "root); auto (default): hosts if possible")
    args = p.parse_args(argv)
    try:
        if args.cmd in ("up", "serve"):
            _validate_up(args)
        return {"up": up, "serve": serve, "down": down, "status": status}[args.cmd](args)
    except (ChaosError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
