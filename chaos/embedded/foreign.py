"""The foreign-cluster stand-in: a Ray cluster the harness did not start, on machines that
share nothing with the harness's, and pytest outside it — what a nightly run against a
team's staging VMs is, on one machine.

* **Machines**: isolated test hosts (chaos.embedded.testhost.Isolation) on a bridge of their
  own: their own /tmp, /var/tmp and /dev/shm; the harness's checkout, venv and reports
  hidden; Python and Ray at the node's own path (``/opt/ray``: this machine's venv bound
  there, as a node image installs it; the harness's package is not importable there, a job
  gets it through its runtime_env as on any cluster); a disk of their own that outlives a
  reboot (``/opt/node``); a shared filesystem for checkpoints (``/mnt/shared``, which the
  harness does not see) — or, with ``shared_fs=False``, no shared filesystem at all: checkpoints
  go to S3 only (moto's server behind the storage fault proxy on the bridge's address, which
  the nodes reach; chaos.storage.local), as on a real cluster; optionally a CUDA driver
  (``/opt/cuda/lib64``: the stub on machines without a GPU); login users besides root, with
  root's key, as teams log in: ``ubuntu`` with passwordless sudo and ``nosudo`` without sudo
  (``USERS``; the hosts' own, this machine's user database untouched).
* **Ray**: started the way a team starts it, by a script over SSH
  (``scripts/foreign-ray-start.sh``: a service unit per node, ``ray start --block``
  restarted when it exits and at boot) — not by EmbeddedCluster's supervisor.
* **The harness outside**: ``run_outside`` runs a command (pytest) in a test host of its own
  on the bridge — its own PID, mount and network namespace, so no raylet is visible to it
  and it reaches the cluster only as a profile says: the dashboard over HTTP, the GCS and
  raylet ports for drains and kills, the hosts over SSH (``profile()``: vm-ssh.yaml's shape).

``python -m chaos.embedded up --foreign [--no-shared-fs] --profile-out P`` starts one by hand.
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import subprocess
import sys
from pathlib import Path

import chaos
from chaos.cluster import ClusterView
from chaos.embedded.cluster import claim_slot, free_bridge, free_port, one_start_at_a_time, port_slice
from chaos.embedded.testhost import Isolation, TestHostNetwork
from chaos.errors import ClusterError, WaitTimeout
from chaos.waits import poll_until

log = logging.getLogger(__name__)

ROOT = Path(chaos.__file__).resolve().parent.parent
START_SCRIPT = ROOT / "scripts" / "foreign-ray-start.sh"
NODE_PYTHON = "/opt/ray"  # where a node has its Python and Ray
SHARED = "/mnt/shared"  # the nodes' shared filesystem (checkpoints)
GCS_PORT, DASHBOARD_PORT = 6379, 8265
#: what a node runs at every boot: its Ray service, once the start script installed it
BOOT = ["sh", "-c", "[ -x /opt/node/ray.service ] && exec /opt/node/ray.service >> /opt/node/ray.log 2>&1"]
#: every host's login users besides root: (name, passwordless sudo) — for ssh.become
USERS = (("ubuntu", True), ("nosudo", False))


@dataclasses.dataclass
class ForeignConfig:
    workers: int = 3
    base_dir: Path = Path("reports/foreign")
    slot: int | None = None
    boot_delay_s: float = 2.0  # a reboot's power-off time
    cuda_driver_dir: Path | None = None  # a directory with libcuda.so.1 the nodes get as their own
    start_timeout_s: float = 180.0
    shared_fs: bool = True  # False: no /mnt/shared; checkpoints on S3 only

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"a foreign cluster needs at least 1 worker, got workers={self.workers}")


class ForeignCluster:
    def __init__(self, config: ForeignConfig | None = None):
        self.config = config or ForeignConfig()
        self.base_dir = Path(self.config.base_dir).resolve()
        self.network: TestHostNetwork | None = None
        self.head = None
        self.workers: list = []
        self.storage = None  # chaos.storage.local.LocalStorage, without a shared filesystem
        self._slot = None

    # -- what the harness is told -----------------------------------------------------
    @property
    def dashboard_url(self) -> str:
        return f"http://{self.head.address}:{DASHBOARD_PORT}"

    @property
    def gcs_address(self) -> str:
        return f"{self.head.address}:{GCS_PORT}"

    def profile(self, user: str = "root", become: str | None = None) -> dict:
        """vm-ssh.yaml's shape: the dashboard and GCS by address, every host over SSH with its
        key verified (as ``user``, root's rights through ``become``: USERS), every worker
        allowlisted, never the head, checkpoints on the nodes' shared filesystem — or on S3, its
        credentials named (``storage_env`` has their values)."""
        net = self.network
        return {
            "name": "foreign-standin", "protected": False,
            "ray": {"dashboard_url": self.dashboard_url, "gcs_address": self.gcs_address},
            "storage": self.storage.settings() if self.storage is not None else {"path": f"{SHARED}/ray-chaos"},
            "nodes": {"discovery": "ray"},
            "hosts": {"defaults": {"transport": "ssh", "ssh": {
                "user": user, "key_file": str(net.ssh_key_path), "known_hosts": str(net.known_hosts_path),
                "use_agent": False, "connect_timeout_s": 10, "command_timeout_s": 60,
                **({"become": become} if become else {})}}},
            "safety": {"allow_head": False, "allowlist": [{"address": w.address} for w in self.workers],
                       "max_live_faults": 1, "min_alive_nodes": 1, "unhealthy_for_s": 120.0},
        }

    def storage_env(self) -> dict[str, str]:
        """What a harness's environment needs to hand the nodes their S3 credentials (the
        profile names the variables): the made-up ones moto takes; nothing with a shared filesystem."""
        from chaos.storage.local import CREDENTIALS

        return dict(CREDENTIALS) if self.storage is not None else {}

    def status(self) -> dict:
        storage = self.storage
        return {"dashboard_url": self.dashboard_url, "gcs_address": self.gcs_address,
                "bridge": self.network.bridge.name, "test_host_dir": str(self.network.state_dir),
                "hosts": [{"name": h.name, "address": h.address, "pids": h.pids()} for h in [self.head, *self.workers]],
                **({"storage": {"endpoint_url": storage.endpoint_url, "pids": storage.pids()}} if storage else {})}

    # -- lifecycle ------------------------------------------------------------------------
    def up(self) -> "ForeignCluster":
        cfg = self.config
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._slot = claim_slot(cfg.slot, bridge=True)
        try:
            with one_start_at_a_time(f"foreign-cluster stand-in (slot {self._slot.slot})"):
                return self._start()
        except BaseException:
            self.down()
            raise

    def _start(self) -> "ForeignCluster":
        cfg = self.config
        bridge, subnet = free_bridge(self._slot.slot)
        # A short state dir (unix socket paths), under /tmp: the hosts' own /tmp hides it.
        self.network = TestHostNetwork(state_dir=Path("/tmp") / f"rc-foreign-{self._slot.slot}", bridge=bridge,
                                       subnet=subnet, boot_delay=cfg.boot_delay_s).up()
        shared = None
        if cfg.shared_fs:
            shared = self.base_dir / "shared"
            shared.mkdir(exist_ok=True)
        else:  # the nodes reach this machine only at the bridge's address
            from chaos.storage.local import LocalStorage

            ports = port_slice(self._slot.slot)
            self.storage = LocalStorage(self.network.head_address, self.base_dir / "s3",
                                        lambda: free_port(ports)).start()
        names = ["fc-head", *(f"fc-worker-{i}" for i in range(1, cfg.workers + 1))]
        hosts = [self.network.add_host(name, workload=BOOT, isolation=self._isolation(name, shared))
                 for name in names]
        self.head, self.workers = hosts[0], hosts[1:]
        for host in hosts:
            host.boot(wait=False)
        for host in hosts:
            host.wait_up(timeout=60)
        self._start_ray()
        return self

    def _isolation(self, name: str, shared: Path | None) -> Isolation:
        disk = self.base_dir / "disks" / name
        disk.mkdir(parents=True, exist_ok=True)
        binds = [(sys.prefix, NODE_PYTHON), (str(disk), "/opt/node"), *([(str(shared), SHARED)] if shared else [])]
        if self.config.cuda_driver_dir is not None:
            binds.append((str(Path(self.config.cuda_driver_dir).resolve()), "/opt/cuda/lib64"))
        hidden = {str(ROOT), sys.prefix, str(Path("reports").resolve()), str(self.base_dir)}
        return Isolation(binds=tuple(binds), hide=tuple(sorted(hidden)), users=USERS)

    def _start_ray(self) -> None:
        net = self.network
        argv = ["bash", str(START_SCRIPT), "-i", str(net.ssh_key_path), "-k", str(net.known_hosts_path),
                self.head.address, *(w.address for w in self.workers)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                              env={"PATH": "/usr/local/bin:/usr/bin:/bin", "NODE_PYTHON": f"{NODE_PYTHON}/bin/python"})
        if done.returncode != 0:
            raise ClusterError(f"{START_SCRIPT.name} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        view = ClusterView(self.dashboard_url, self.gcs_address)
        try:
            view.wait_alive_workers(len(self.workers), self.config.start_timeout_s)
        except WaitTimeout as e:
            logs = "; ".join(f"{h.name}: {_tail(self.base_dir / 'disks' / h.name / 'ray.log')}"
                             for h in [self.head, *self.workers])
            raise ClusterError(f"the foreign cluster did not come up: {e}; ray.log tails: {logs}") from e

    def run_outside(self, command: str, cwd: Path, timeout: float, env: dict[str, str] | None = None,
                    echo=None, hide: tuple[str, ...] = ()) -> tuple[int, str]:
        """Run ``command`` (sh) from ``cwd`` in a runner of its own on the cluster's bridge (its
        own PID, mount and network namespace; this machine's files but ``hide``), as a CI runner
        outside the cluster; return (exit code, output).  ``echo(line)``: each output line as it comes."""
        code = self.network.state_dir / "fc-runner" / "exit-code"
        code.unlink(missing_ok=True)
        runner = self.network.add_host("fc-runner", workload=[
            "sh", "-c", f"cd {shlex.quote(str(cwd))} && {command}; echo $? > {code}.tmp && mv {code}.tmp {code}"],
            env={"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", **(env or {})},
            isolation=Isolation(hide=hide, private=()) if hide else None)
        runner.workload_log.unlink(missing_ok=True)
        seen = 0

        def finished():
            nonlocal seen
            out = runner.workload_log.read_text(errors="replace") if runner.workload_log.exists() else ""
            for line in out[seen:].splitlines(keepends=True):
                if not line.endswith("\n"):
                    break  # the rest of it on the next look
                seen += len(line)
                if echo is not None:
                    echo(line.rstrip("\n"))
            return (code.read_text().strip() if code.exists() else None), f"{len(out)} bytes of output so far"

        try:
            runner.boot(wait=True, timeout=30)
            exit_code = int(poll_until(finished, timeout, f"`{command}` to finish outside the cluster", interval=0.5))
            return exit_code, runner.workload_log.read_text(errors="replace")
        finally:
            self.network.remove_host("fc-runner")

    def down(self) -> None:
        """Power every machine off (every process of theirs dies with it) and remove the network."""
        try:
            if self.network is not None:
                self.network.close()
                TestHostNetwork.sweep(self.network.bridge.name)
        finally:
            self.network = None
            if self.storage is not None:
                self.storage.stop()
                self.storage = None
            if self._slot is not None:
                self._slot.release()
                self._slot = None


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_healthy(cluster: ForeignCluster, timeout: float) -> None:
    """Every worker back (a test before may have rebooted or killed one; its unit restarts it)."""
    ClusterView(cluster.dashboard_url, cluster.gcs_address).wait_alive_workers(len(cluster.workers), timeout)


