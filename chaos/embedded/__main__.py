"""`python -m chaos.embedded up|down|status`: an embedded cluster that outlives the command.

`up` starts a supervisor process (`serve`, its own session, tracked by PID in a state
file) that owns the cluster — including automatic node recovery — and returns once the
cluster is ready.  `down` asks that supervisor to stop (SIGTERM) and waits for it; if it
is gone without cleaning up, `down` stops the recorded node sessions by PID itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from chaos.embedded.cluster import EmbeddedCluster, EmbeddedConfig
from chaos.errors import ChaosError
from chaos.procs import session_members
from chaos.waits import poll_until

DEFAULT_DIR = Path("reports/embedded")


def _state_file(base: Path) -> Path:
    return base / "state.json"


def _read_state(base: Path) -> dict | None:
    try:
        return json.loads(_state_file(base).read_text())
    except (OSError, ValueError):
        return None


def serve(args) -> int:
    base = Path(args.dir).resolve()
    cfg = EmbeddedConfig(workers=args.workers, node_recovery=args.node_recovery == "automatic",
                         recovery_delay_s=args.recovery_delay, base_dir=base, hosts=_hosts_mode(args.hosts))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = EmbeddedCluster(cfg)
    state = _state_file(base)
    try:
        cluster.up()
        state.write_text(json.dumps({"ready": True, "serve_pid": os.getpid(), **cluster.status()}, indent=1))
        if args.profile_out:
            _write_profile(cluster, Path(args.profile_out))
        stop.wait()
    except ChaosError as e:
        state.write_text(json.dumps({"ready": False, "serve_pid": os.getpid(), "error": str(e)}))
        return 1
    finally:
        cluster.down()
        if _read_state(base) and _read_state(base).get("ready"):
            state.unlink(missing_ok=True)
    return 0


def _hosts_mode(requested: str) -> str:
    from chaos.embedded.testhost import testhosts_supported

    supported, why = testhosts_supported()
    if requested == "namespaces" and not supported:
        raise ChaosError(f"--hosts namespaces: test hosts are not possible here: {why}")
    return requested if requested != "auto" else ("namespaces" if supported else "plain")


def _write_profile(cluster: EmbeddedCluster, path: Path) -> None:
    from chaos.profile import dump_profile, embedded_profile

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
    existing = _read_state(base)
    if existing and existing.get("ready") and _alive(existing.get("serve_pid")):
        print(f"already up: {existing['dashboard_url']} (supervisor pid {existing['serve_pid']})")
        return 0
    _state_file(base).unlink(missing_ok=True)
    argv = [sys.executable, "-m", "chaos.embedded", "serve", "--dir", str(base), "--workers", str(args.workers),
            "--hosts", _hosts_mode(args.hosts),
            "--node-recovery", args.node_recovery, "--recovery-delay", str(args.recovery_delay)]
    if args.profile_out:
        argv += ["--profile-out", str(Path(args.profile_out).resolve())]
    log = open(base / "supervisor.log", "ab")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)

    def check():
        st = _read_state(base)
        if st is not None:
            return st, "state written"
        if proc.poll() is not None:
            return {"ready": False, "error": f"supervisor exited with {proc.returncode}; see {base / 'supervisor.log'}"}, ""
        return None, "cluster still starting"

    st = poll_until(check, args.timeout, "the embedded cluster to come up", interval=0.5)
    if not st.get("ready"):
        print(f"embedded cluster failed to start: {st.get('error')}", file=sys.stderr)
        return 1
    print(f"embedded cluster up: dashboard {st['dashboard_url']}, GCS {st['gcs_address']}, "
          f"{len(st['hosts'])} workers, supervisor pid {st['serve_pid']}")
    return 0


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
    pid = st.get("serve_pid")
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        try:
            poll_until(lambda: (not _alive(pid), f"supervisor {pid} still running"), args.timeout,
                       f"supervisor pid {pid} to stop the cluster")
        except ChaosError:
            os.kill(pid, signal.SIGKILL)
    # Whatever the supervisor could not stop: the recorded node sessions, by PID.
    leaders = [st.get("head_pid")] + [h.get("pid") for h in st.get("hosts", [])]
    for leader in filter(None, leaders):
        for member in session_members(leader):
            os.kill(member, signal.SIGKILL)
    _state_file(base).unlink(missing_ok=True)
    print("embedded cluster stopped")
    return 0


def status(args) -> int:
    st = _read_state(Path(args.dir).resolve())
    if not st:
        print("no embedded cluster is up")
        return 1
    st["supervisor_alive"] = _alive(st.get("serve_pid"))
    print(json.dumps(st, indent=1))
    return 0 if st["supervisor_alive"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.embedded", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("up", "serve", "down", "status"):
        s = sub.add_parser(name)
        s.add_argument("--dir", default=str(DEFAULT_DIR), help="state and logs (default reports/embedded)")
        s.add_argument("--timeout", type=float, default=240.0)
        if name in ("up", "serve"):
            s.add_argument("--workers", type=int, default=3)
            s.add_argument("--node-recovery", choices=["automatic", "off"], default="automatic")
            s.add_argument("--recovery-delay", type=float, default=2.0)
            s.add_argument("--profile-out", default=None, help="write a profile describing this cluster")
            s.add_argument("--hosts", choices=["auto", "plain", "namespaces"], default="auto",
                           help="workers as loopback processes or as test hosts (namespaces, root); auto: hosts if possible")
    args = p.parse_args(argv)
    try:
        if args.cmd == "up":  # validate here, before a supervisor is started
            EmbeddedConfig(workers=args.workers, recovery_delay_s=args.recovery_delay)
        return {"up": up, "serve": serve, "down": down, "status": status}[args.cmd](args)
    except (ChaosError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
