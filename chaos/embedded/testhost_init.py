"""PID 1 of a test host: ``python -m chaos.embedded.testhost_init BOOT_JSON``.

Runs inside the host's fresh namespaces (chaos.embedded.testhost starts it and supervises
it from outside): makes the mount and UTS namespaces look like the host's own machine (its
own /run, boot id, power commands and kernel log), starts sshd and the workload, reaps, and
turns the host's power commands into reboot(2), which in a child PID namespace kills every
process in it at once, as a power loss does.
It reports to the supervisor over the unix datagram socket named in its config (INIT,
WORKLOAD; sshd itself sends READY) and imports nothing but the standard library.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SSHD = "/usr/sbin/sshd"
INIT_MARKER = "chaos.embedded.testhost_init"  # the init's module, found in /proc/1/cmdline


# Inside the host, `systemctl reboot` & co. signal the init; the init then calls reboot(2),
# which in a non-initial PID namespace SIGKILLs the namespace's init (so every process in
# it) and reports SIGHUP (restart) or SIGINT (power off) as the init's fate.
REBOOT_SIGNAL = signal.SIGUSR1
POWEROFF_SIGNAL = signal.SIGUSR2
_RB_AUTOBOOT = 0x01234567
_RB_POWER_OFF = 0x4321FEDC

POWER_COMMANDS = ("systemctl", "reboot", "poweroff", "halt", "shutdown")
POWER_SCRIPT = """#!/bin/sh
# Power control of a chaos test host, installed as systemctl/reboot/poweroff/halt/shutdown.
# It never touches the real machine: it only signals the test host's own init (PID 1).
tr '\\0' ' ' </proc/1/cmdline | grep -q '{marker}' || {{
    echo "$0: not inside a chaos test host; refusing" >&2; exit 1; }}
name=$(basename "$0"); action=""
for arg in "$name" "$@"; do
    case "$arg" in
        reboot|-r) action=reboot ;;
        poweroff|halt|-h|-P|-H) [ -n "$action" ] || action=poweroff ;;
    esac
done
[ "$name" = shutdown ] && [ -z "$action" ] && action=poweroff
case "$action" in
    reboot) exec kill -s {reboot} 1 ;;
    poweroff) exec kill -s {poweroff} 1 ;;
esac
echo "$name: a chaos test host only supports reboot and poweroff" >&2
exit 1
""".format(marker=INIT_MARKER, reboot=REBOOT_SIGNAL.name[3:], poweroff=POWEROFF_SIGNAL.name[3:])

_libc = ctypes.CDLL(None, use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MNT_DETACH = 1, 2, 4, 4096, 16384, 2
STATE_VIEW = "/run/testhost"  # an isolated host's view of its state dir (chaos.embedded.testhost)


def _mount(source: str, target: str, fstype: str | None = None, flags: int = 0, data: str | None = None) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _prepare_namespace(cfg: dict) -> None:
    """Make the fresh mount/UTS namespaces look like this host's machine."""
    socket.sethostname(cfg["name"])
    # A private /run. Detach our copies of the machine's /run mounts first: copies of
    # /run/netns/* would keep other hosts' network namespaces alive after their teardown.
    with open("/proc/self/mountinfo") as f:
        targets = sorted({line.split()[4] for line in f}, key=len)
    for target in targets:
        if target == "/run" or target.startswith("/run/"):
            _libc.umount2(target.encode(), _MNT_DETACH)  # EINVAL once a parent went: fine
    _mount("tmpfs", "/run", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    os.mkdir("/run/sshd", 0o755)
    if cfg.get("isolation"):  # its own state where it still sees it once /tmp is its own
        os.mkdir(STATE_VIEW, 0o755)
        _mount(cfg["state_dir"], STATE_VIEW, flags=_MS_BIND)
    _mount(cfg["boot_id_file"], "/proc/sys/kernel/random/boot_id", flags=_MS_BIND)
    # This boot's own kernel log: a write to /dev/kmsg inside the host (how Xid injectors reach a
    # health agent) lands in an empty file of this boot, never in the machine's kernel log (the
    # character device 1:11 is only covered, in this private mount namespace).
    os.close(os.open("/run/kmsg", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    _mount("/run/kmsg", "/dev/kmsg", flags=_MS_BIND)
    # Root's home shows the real one (the venv's interpreter may live there) but writes
    # land in this boot's /run: a session cut off by a power loss must not leave the real
    # home half-written (e.g. a stale lock file of a shell's rc script hanging every shell).
    os.makedirs("/run/rc-home/upper")
    os.makedirs("/run/rc-home/work")
    _mount("overlay", "/root", "overlay", 0, "lowerdir=/root,upperdir=/run/rc-home/upper,workdir=/run/rc-home/work")
    # ...without this machine's shell start-up files: bash runs ~/.bashrc for every SSH
    # command, and this machine's (pyenv init) cost ~190 ms of CPU per command and host
    # (measured: bench/bench_fanout.py).  A host is a fresh machine with a plain shell.
    for rc in (".bashrc", ".bash_profile", ".bash_login", ".profile"):
        Path("/root", rc).write_text("")
    # Shadow the real machine's power commands: they must reach this host's init only.
    seen = set()
    for directory in DEFAULT_PATH.split(":"):
        for name in POWER_COMMANDS:
            real = os.path.realpath(os.path.join(directory, name))
            if os.path.isfile(real) and real not in seen:
                seen.add(real)
                _mount(cfg["power_script"], real, flags=_MS_BIND)
    if cfg.get("isolation"):
        _isolate(cfg["isolation"])
        if cfg["isolation"].get("users"):
            _add_users(cfg["isolation"]["users"], cfg["env"]["PATH"])


def _isolate(iso: dict) -> None:
    """Share nothing of this machine's filesystem but what ``iso`` binds (chaos.embedded.testhost
    .Isolation): binds first (their sources may lie under what is hidden next), each under a
    top-level directory made the host's own; then its own private directories; then an empty
    read-only tmpfs over each hidden path that it can still see."""
    own = set()
    for source, target in iso["binds"]:
        top = "/" + Path(target).parts[1]
        if top not in own:
            os.makedirs(top, exist_ok=True)
            _mount("tmpfs", top, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
            own.add(top)
        os.makedirs(target, exist_ok=True)
        _mount(source, target, flags=_MS_BIND | _MS_REC)
    for path in iso["private"]:
        _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    for path in iso["hide"]:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV, "mode=0555")


def _add_users(users: list, path: str) -> None:
    """Login users of this host's own (name, sudo without a password or not): this machine's
    /etc/passwd, group and shadow copied into this boot's /run with them added (a name already
    there replaced) and bound over the originals in this mount namespace, as is a sudoers.d
    holding this machine's rules and theirs; homes in /run/home.  sudo's secure_path is the
    host's session PATH, as on a machine whose systemctl is its own (the power commands')."""
    etc = Path("/run/rc-etc")
    os.makedirs(etc / "sudoers.d", mode=0o755)
    names = {name for name, _ in users}

    def kept(name: str) -> list[str]:
        return [line for line in Path("/etc", name).read_text().splitlines() if line.split(":", 1)[0] not in names]

    passwd, group, shadow = kept("passwd"), kept("group"), kept("shadow")
    taken = {int(f[2]) for f in (line.split(":") for line in passwd + group) if len(f) > 2 and f[2].isdigit()}
    rules = [f'Defaults secure_path="{path}"']
    uid = 2000
    for name, sudo in users:
        while uid in taken:
            uid += 1
        taken.add(uid)
        home = f"/run/home/{name}"
        os.makedirs(home, mode=0o755)
        os.chown(home, uid, uid)
        passwd.append(f"{name}:x:{uid}:{uid}:{name}:{home}:/bin/bash")
        group.append(f"{name}:x:{uid}:")
        shadow.append(f"{name}:*:19000:0:99999:7:::")  # no password, not locked: key logins only
        if sudo:
            rules.append(f"{name} ALL=(ALL) NOPASSWD: ALL")
    for name, lines, mode in (("passwd", passwd, 0o644), ("group", group, 0o644), ("shadow", shadow, 0o600)):
        (etc / name).write_text("\n".join(lines) + "\n")
        os.chmod(etc / name, mode)
        _mount(str(etc / name), f"/etc/{name}", flags=_MS_BIND)
    mine = Path("/etc/sudoers.d")
    for rule_file in sorted(mine.iterdir()) if mine.is_dir() else []:
        (etc / "sudoers.d" / rule_file.name).write_bytes(rule_file.read_bytes())
        os.chmod(etc / "sudoers.d" / rule_file.name, 0o440)
    (etc / "sudoers.d" / "rc-testhost-users").write_text("\n".join(rules) + "\n")
    os.chmod(etc / "sudoers.d" / "rc-testhost-users", 0o440)
    if mine.is_dir():
        _mount(str(etc / "sudoers.d"), str(mine), flags=_MS_BIND)


def _power(request: int) -> None:
    if os.getpid() == 1:  # reboot(2) outside a child PID namespace would hit the real machine
        _libc.reboot(request)
    os._exit(1)


def _init_main(config_path: str) -> None:
    """PID 1 of a test host: set up, start sshd and the workload, reap, obey power requests."""
    if os.getpid() != 1:
        sys.exit(f"{INIT_MARKER} init must run as PID 1 of a fresh PID namespace")
    cfg = json.loads(Path(config_path).read_text())
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.connect(cfg["notify_socket"])
    notify.send(b"INIT=1")
    signal.signal(REBOOT_SIGNAL, lambda *_: _power(_RB_AUTOBOOT))
    signal.signal(POWEROFF_SIGNAL, lambda *_: _power(_RB_POWER_OFF))
    try:
        _prepare_namespace(cfg)
    except Exception as e:
        notify.send(f"ERROR={e}".encode())
        raise
    workload = None
    if cfg["workload"]:
        with open(cfg["workload_log"], "ab") as out:
            try:
                workload = subprocess.Popen(cfg["workload"], stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, env=cfg["env"], cwd="/root",
                                            preexec_fn=lambda: notify.send(b"WORKLOAD=1"))
            except OSError as e:  # like a failing service: the machine itself stays up
                out.write(f"cannot start workload {cfg['workload']}: {e}\n".encode())
                print(f"{cfg['name']}: cannot start workload: {e}", file=sys.stderr, flush=True)
                if cfg["reboot_when_workload_exits"]:
                    _power(_RB_AUTOBOOT)
    # sshd after the workload: its READY (the host is up) then always follows WORKLOAD, so
    # whoever waits for the host finds the workload's PID (the head's `ray start` once
    # looked "exited" because a busy init had not forked it yet).
    try:
        with open(cfg["sshd_log"], "ab") as sshd_log:
            sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", cfg["sshd_config"]], stdin=subprocess.DEVNULL,
                                    stdout=sshd_log, stderr=sshd_log,
                                    env={"PATH": DEFAULT_PATH,
                                         "NOTIFY_SOCKET": cfg.get("sshd_notify_socket") or cfg["notify_socket"]})
    except Exception as e:
        notify.send(f"ERROR={e}".encode())
        raise
    print(f"{cfg['name']}: sshd PID {sshd.pid}, workload PID {workload.pid if workload else None}",
          file=sys.stderr, flush=True)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            signal.pause()
            continue
        if workload is not None and pid == workload.pid:
            print(f"{cfg['name']}: workload exited ({os.waitstatus_to_exitcode(status)})", file=sys.stderr, flush=True)
            if cfg["reboot_when_workload_exits"]:
                _power(_RB_AUTOBOOT)
        elif pid == sshd.pid:
            print(f"{cfg['name']}: sshd exited ({os.waitstatus_to_exitcode(status)})", file=sys.stderr, flush=True)


if __name__ == "__main__":
    _init_main(sys.argv[1])
