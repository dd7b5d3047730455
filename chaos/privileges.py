"""Running a fault's privileged commands as root on a host reached over SSH, and finding out
beforehand whether that is possible.

Teams log in as ``ubuntu``/``ec2-user`` and escalate with sudo: a command that needs root (a
fault kind's ``privileges`` in the catalog) runs as the login user when that is root, else
through ``sudo -n`` when the host's ssh settings say ``become: sudo`` (never a password
prompt: a nightly run has nobody to type it).  ``escalate`` is the one wrapping, which the SSH
transport applies to commands run with ``privileged=True``; ``probe`` asks a host, read-only,
whether it will work (``ray-chaos doctor``, and a session before its first injection there).
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Iterable

from chaos.errors import InjectionError
from chaos.faults.catalog import PRIVILEGES
from chaos.transport.base import Transport

BECOME = ("sudo",)  # the profile's ssh.become values


def escalate(command: str, become: str | None) -> str:
    """``command`` as root through ``become`` (None: unchanged, for a login user that is root).
    ``sudo -n``: fail at once rather than wait for a password nobody types."""
    if become is None:
        return command
    if become == "sudo":
        return f"sudo -n sh -c {shlex.quote(command)}"
    raise ValueError(f"become {become!r} is none of {', '.join(BECOME)}")


@dataclasses.dataclass(frozen=True)
class Escalation:
    """Whether privileged commands can run on a host, and how; or why not and the fix."""

    host: str
    user: str  # the login user, as the host names it
    how: str | None  # "root" (the login user is root) or "sudo -n"; None: they cannot run
    reason: str = ""  # why not (how is None)
    fix: str = ""  # what makes them run (how is None)

    @property
    def ok(self) -> bool:
        return self.how is not None

    def line(self) -> str:
        """One line for a preflight table."""
        if self.ok:
            return f"privileged commands run as root: {'logged in as root' if self.how == 'root' else 'sudo -n'}"
        return f"{self.reason}; fix: {self.fix}"

    def refusal(self, kind: str, privileges: Iterable[str]) -> str:
        """Why a fault of ``kind`` needing ``privileges`` is refused on this host, before anything is injected."""
        needs = "; ".join(f"{p} ({PRIVILEGES[p]})" for p in privileges)
        return (f"{kind} refused on {self.host} before injecting anything: it needs root there for {needs}, "
                f"and {self.reason}. Fix: {self.fix}")


class PrivilegeRefused(InjectionError):
    """A fault kind needs root on its target host, which the host's login does not give: refused
    before anything is recorded or injected."""

    def __init__(self, escalation: Escalation, kind: str, privileges: Iterable[str]):
        self.escalation, self.kind, self.privileges = escalation, kind, tuple(privileges)
        super().__init__(escalation.refusal(kind, self.privileges))


def _fix(user: str) -> str:
    return (f"set `ssh.become: sudo` (hosts.defaults, or per host in hosts.overrides) and give {user} passwordless "
            f"sudo (a sudoers rule `{user} ALL=(ALL) NOPASSWD: ALL`, e.g. in /etc/sudoers.d/), or log in as root "
            "(`ssh.user: root`)")


def probe(transport: Transport, become: str | None, timeout: float = 30.0) -> Escalation:
    """Ask the host behind ``transport`` (read-only: ``id``, and ``sudo -n id -u`` when
    ``become`` is sudo) whether a privileged command would run as root.  Raises the
    transport's TransportError when the host cannot be reached at all."""
    who = transport.run("id -u; id -un", timeout=timeout).check().stdout.split()
    if len(who) < 2:
        raise ValueError(f"{transport.host}: `id -u; id -un` printed {' '.join(who)!r}, not a uid and a name")
    uid, user = who[0], who[1]
    if uid == "0":
        return Escalation(transport.host, user, "root")
    if become is None:
        return Escalation(transport.host, user, None, f"the login user {user} is not root and ssh.become is unset",
                          _fix(user))
    res = transport.run(escalate("id -u", become), timeout=timeout)
    said = (res.stderr.strip() or res.stdout.strip()).splitlines()
    said_line = said[-1] if said else "(no output)"
    if res.ok and res.stdout.strip() == "0":
        return Escalation(transport.host, user, "sudo -n")
    if res.ok:
        why = f"`sudo -n` runs {user}'s commands as uid {res.stdout.strip()}, not root (a runas_default?)"
    elif res.exit_code == 127:
        why = f"sudo is not installed ({said_line})"
    elif "a password is required" in said_line:
        why = (f"`sudo -n` says a password is required ({user} has no NOPASSWD rule, or is not in the sudoers "
               "file: sudo tells these apart only after a password)")
    elif "not in the sudoers file" in said_line or "not allowed to" in said_line:
        why = f"{user} may not use sudo ({said_line})"
    elif "must have a tty" in said_line:
        why = f"sudo requires a terminal for {user} (Defaults requiretty: {said_line})"
        return Escalation(transport.host, user, None, why,
                          f"`Defaults:{user} !requiretty` in the sudoers, or log in as root (`ssh.user: root`)")
    else:
        why = f"`sudo -n` failed (exit {res.exit_code}): {said_line}"
    return Escalation(transport.host, user, None, why, _fix(user))
