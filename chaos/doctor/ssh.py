"""The host side of doctor: on each host, through the backend's own transport (SSH with the
profile's connect timeout, or local), the login, the privileges each enabled kind needs, the
tools its commands run, the boot id, and where the CUDA shim goes.

One command per host reads everything (commands that only read: ``id``, ``command -v``,
``test -w``, ``sudo -n true``); hosts are probed in parallel, so a host that does not
answer costs its connect timeout once, as its own ✗ line.
"""

from __future__ import annotations

import concurrent.futures
import shlex
from typing import TYPE_CHECKING

from chaos import privileges
from chaos.doctor.check import Check
from chaos.doctor.cluster import HostPlan
from chaos.errors import ChaosError
from chaos.faults import catalog
from chaos.shim.build import REMOTE_ROOT

if TYPE_CHECKING:
    from chaos.backends.base import Backend

#: what each kind runs on its target's host (chaos/faults/*), as alternatives: any one will do
TOOLS: dict[str, tuple[tuple[str, ...], ...]] = {
    "raylet-kill": (("kill",),),  # --chaos-raylet-kill sigkill (grpc goes through Ray itself)
    "worker-kill": (("kill",),),
    "preempt": (("kill",),),
    "node-reboot": (("systemctl", "reboot"),),
    "partition": (("iptables",),),
    "cuda": (("python3",),),  # unpacks the shim it is sent (chaos.shim.build.deliver_shim)
    "xid": (("python3",),),
}
#: kinds that read a host's boot id (to see a reboot happen, to aim a GPU failure at one boot)
BOOT_KINDS = ("node-reboot", "xid")
#: kinds whose run gets the CUDA shim on every live worker's host: its directory, the control
#: file in /dev/shm and the shim's log in /tmp
SHIM_KINDS = ("cuda", "xid")
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def probe_script(become: str | None) -> str:
    """The one read-only command that answers every check but the privileges' (chaos.privileges
    asks those), as ``key=value`` lines; the tools are looked up as root where escalation is
    needed (sudo's PATH is root's)."""
    tools = sorted({t for groups in TOOLS.values() for group in groups for t in group})

    def lookup(tool: str) -> str:
        plain = f"command -v {tool}"
        if become is None:
            return plain
        return f'if [ "$(id -u)" = 0 ]; then {plain}; else {privileges.escalate(plain, become)}; fi'

    return "\n".join([
        'echo "user=$(id -un)"', 'echo "uid=$(id -u)"',
        *(f'echo "tool.{t}=$({lookup(t)} 2>/dev/null)"' for t in tools),
        f"b=$(cat {BOOT_ID} 2>&1) && echo \"boot_id=$b\" || echo \"boot_id_error=$b\"",
        # the shim's directory, or the nearest directory above it that exists: where mkdir -p starts
        f"d={shlex.quote(REMOTE_ROOT)}; while [ ! -e \"$d\" ]; do d=$(dirname \"$d\"); done",
        'for p in "$d" /dev/shm /tmp; do if [ -d "$p" ] && [ -w "$p" ]; then echo "writable.$p=yes"; '
        'else echo "writable.$p=no"; fi; done',
    ])


def _parse(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value.strip()
    return out


def checks(backend: "Backend", hosts: dict[str, HostPlan], kinds: list[str]) -> list[Check]:
    """Every host's checks for the enabled ``kinds``, in the order of ``hosts``."""
    with concurrent.futures.ThreadPoolExecutor(min(16, len(hosts)) or 1, thread_name_prefix="doctor") as pool:
        found = list(pool.map(lambda item: host_checks(backend, item[0], item[1], kinds), hosts.items()))
    return [c for per_host in found for c in per_host]


def host_checks(backend: "Backend", key: str, plan: HostPlan, kinds: list[str]) -> list[Check]:
    """One host's checks: the kinds that act on it are every enabled host kind where a fault may
    target it, else the shim's."""
    acting = [k for k in kinds if k in TOOLS and (plan.target or k in SHIM_KINDS)]
    subject = f"host {key}"
    if not acting:
        return []
    try:
        access = backend.profile.access_for(key, backend.cluster.hostname(plan.node.node_id), plan.node.labels)
        become = access.ssh.become if access.transport == "ssh" else None
        transport = backend.reach(key, plan.node).transport
        result = transport.run(probe_script(become), timeout=30)
    except ChaosError as e:
        return [Check(subject, "login", False, str(e), _login_fix(str(e), key), tuple(acting))]
    seen = _parse(result.stdout)
    if "uid" not in seen:
        return [Check(subject, "login", False, f"the probe gave no answer (exit {result.exit_code}): "
                                                f"{(result.stderr or result.stdout).strip()[-300:]}",
                      "the login shell must be a POSIX sh that runs commands (no forced command)", tuple(acting))]
    user = seen.get("user", "?")
    out = [Check(subject, "login", True, f"as {user} over {type(transport).__name__}"
                 + ("" if plan.target else " (not a target: the CUDA shim only)"))]
    on_target = acting if plan.target else []  # elsewhere the shim is only put in place
    try:
        out += _privileges(subject, transport, become, on_target)
    except (ChaosError, ValueError) as e:
        out.append(Check(subject, "privileges", False, f"could not be asked: {e}", _login_fix(str(e), key),
                         tuple(k for k in on_target if catalog.KINDS[k].privileges)))
    out += _tools(subject, seen, acting, become)
    out += _boot_id(subject, seen, on_target)
    out += _shim(subject, seen, acting)
    return out


def _login_fix(error: str, host: str) -> str:
    if "unknown host key" in error:
        return (f"add {host}'s host key to the profile's known_hosts after checking its fingerprint (ssh-keyscan "
                f"{host}), or set ssh.trust_on_first_use: true for a freshly built test cluster")
    if "CHANGED" in error:
        return f"verify {host}'s new host key out of band, then replace its line in known_hosts"
    if "authentication failed" in error:
        return "check hosts.*.ssh.user and key_file (its public key in the user's ~/.ssh/authorized_keys on the host)"
    if "passphrase" in error or "private key" in error:
        return "load the key into an ssh-agent (use_agent: true) or give key_file an unencrypted private key"
    return (f"make {host}'s SSH port reachable from this machine (sshd running, firewall), or correct "
            "hosts.*.ssh.port / jump_host")


def _privileges(subject: str, transport, become: str | None, acting: list[str]) -> list[Check]:
    needing = [k for k in acting if catalog.KINDS[k].privileges]
    if not needing:
        return []
    needed = sorted({p for k in needing for p in catalog.KINDS[k].privileges})
    what = f"privileges ({', '.join(needed)})"
    escalation = privileges.probe(transport, become)
    if escalation.how == "root":
        return [Check(subject, what, True, f"logged in as root ({escalation.user})")]
    if escalation.ok:
        return [Check(subject, what, True, f"{escalation.user} through {escalation.how} (passwordless)")]
    return [Check(subject, what, False, escalation.reason, escalation.fix, tuple(needing))]


def _tools(subject: str, seen: dict[str, str], acting: list[str], become: str | None) -> list[Check]:
    missing: dict[str, list[str]] = {}
    found: list[str] = []
    for k in acting:
        for group in TOOLS[k]:
            have = [t for t in group if seen.get(f"tool.{t}")]
            if have:
                found.append(have[0])
            else:
                missing.setdefault(" or ".join(group), []).append(k)
    where = " (root's PATH through sudo)" if become == "sudo" and seen.get("uid") != "0" else ""
    if not missing:
        return [Check(subject, "tools", True, ", ".join(sorted(set(found))) + where)]
    return [Check(subject, "tools", False, f"not found{where}: " + "; ".join(f"{t} (for {', '.join(ks)})"
                                                                              for t, ks in missing.items()),
                  f"install {', '.join(missing)} on the host (on the PATH of the user that runs them)",
                  tuple(sorted({k for ks in missing.values() for k in ks})))]


def _boot_id(subject: str, seen: dict[str, str], acting: list[str]) -> list[Check]:
    needing = tuple(k for k in acting if k in BOOT_KINDS)
    if not needing:
        return []
    if seen.get("boot_id"):
        return [Check(subject, "boot id", True, f"{BOOT_ID} readable")]
    return [Check(subject, "boot id", False, f"{BOOT_ID}: {seen.get('boot_id_error') or 'empty'}",
                  f"{BOOT_ID} must be readable by the login user (a Linux host with /proc mounted)", needing)]


def _shim(subject: str, seen: dict[str, str], acting: list[str]) -> list[Check]:
    needing = tuple(k for k in acting if k in SHIM_KINDS)
    if not needing:
        return []
    paths = [k.removeprefix("writable.") for k in seen if k.startswith("writable.")]
    blocked = [p for p in paths if seen[f"writable.{p}"] != "yes"]
    what = f"CUDA shim's directories ({REMOTE_ROOT}, /dev/shm, /tmp)"
    if not paths:
        return [Check(subject, what, False, "not checked: the probe did not answer for them",
                      "the login shell must be a POSIX sh", needing)]
    if not blocked:
        return [Check(subject, what, True, "writable: " + ", ".join(paths))]
    return [Check(subject, what, False, f"not writable by the login user: {', '.join(blocked)}",
                  f"let the login user create {REMOTE_ROOT} and write /dev/shm and /tmp", needing)]
