"""The ``xid`` fault: a GPU dies on a node the way the hardware says so, and the platform's
node health agent — not the harness — has to notice and start automatic node recovery.

At one instant, on the node hosting rank ``r``:

(a) the CUDA shim fails every driver call on that node — in any rank, in any process started
    later — with the error applications see for that Xid, until the node's boot id changes
    (a dead GPU stays dead until the node is rebooted or replaced): one shim plan selected
    by the node's boot id (``boot_id=``), armed in the control file every shimmed process of
    the run maps;
(b) the Xid line (``NVRM: Xid (PCI:…): 79, pid=…, name=…, GPU has fallen off the bus.``) is
    written to that node's kernel log, where agents (HyperPod's health-monitoring agent,
    NVSentinel, gpud) read it: ``/dev/kmsg`` as root through the host's transport (SSH,
    test hosts), or on Kubernetes through a one-shot privileged pod on the node (KubeRay's
    own pods are unprivileged); refused with the server's reason when neither is allowed.

Then, watching the Kubernetes API from the moment of injection, the chain the verdicts
judge link by link: the agent's condition / label / taint on the node (``node_agent_acted``
at the first, ``node_agent_signal`` for each; ``node_agent_silent`` when nothing came within
the agent SLO), the node going down (``node_down``) and back Ready with a new boot id, or a
new node in its place (``node_recovered``).

Safety: the kernel-log write refuses a ``/dev/kmsg`` that is a character device on a
machine booted when the harness's own machine was (``btime`` in ``/proc/stat``): a test
host shares this machine's kernel, and its kernel log is a stand-in file.  An Xid whose
remediation is a replacement (volumes destroyed) needs ``safety.allow_node_replacement``.
Revert disarms the plan (the node has rebooted by then, or it is the end of the run) and
collects the shim's log; ``ray-chaos sweep`` does the same for a killed session and empties
a test host's kernel-log stand-in, and lists — never clears — what the agent set on nodes.
"""

from __future__ import annotations

import calendar
import dataclasses
import json
import logging
import re
import shlex
import threading
import time
import uuid

from chaos import hyperpod
from chaos.cluster import Target
from chaos.errors import InjectionError, TransportError, WaitTimeout
from chaos.faults import catalog
from chaos.faults.base import Fault, FaultContext, FaultSettings, Injection, placement_target
from chaos.faults.cuda import ShimFault, check_shim_loaded
from chaos.shim.control import control_command
from chaos.shim.cuda_errors import ERRORS
from chaos.shim.plan import Plan

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class XidSpec:
    """What an Xid looks like to applications and in the kernel log, and the remediation
    agents commonly choose (NVIDIA's Xid catalog: "reset GPU / reboot" vs. a hardware
    replacement; notes/hyperpod-k8s.md).  The platform's own table decides on a real cluster."""

    error: str  # the CUDA error every driver call returns
    text: str  # the rest of the NVRM line
    remediation: str  # reboot | replace


XIDS: dict[int, XidSpec] = {
    48: XidSpec("CUDA_ERROR_ECC_UNCORRECTABLE", "An uncorrectable double bit error (DBE) has been detected on GPU "
                "in the framebuffer at partition 0, subpartition 0.", "reboot"),
    74: XidSpec("CUDA_ERROR_NVLINK_UNCORRECTABLE", "NVLink: fatal error detected on link 0", "reboot"),
    79: XidSpec("CUDA_ERROR_UNKNOWN", "GPU has fallen off the bus.", "replace"),
    94: XidSpec("CUDA_ERROR_ECC_UNCORRECTABLE", "Contained: SM (0x1). RST: No, D-RST: No", "reboot"),
    95: XidSpec("CUDA_ERROR_ECC_UNCORRECTABLE", "Uncontained: FBHUB. RST: Yes, D-RST: No", "replace"),
    119: XidSpec("CUDA_ERROR_UNKNOWN", "Timeout after 6s of waiting for RPC response from GPU0 GSP!", "reboot"),
    120: XidSpec("CUDA_ERROR_UNKNOWN", "GSP Error: Task 1 raised error code 0x5 for reason 0x0", "reboot"),
}

# Refuses this machine's kernel log, failing closed; the target's answer names what it found.
# $LINE, $HARNESS_BTIME and $HARNESS_BOOT_ID come from the environment (a pod's env, or set
# before the script over SSH).  A character device is refused when its kernel booted within
# 5 s of the harness machine's (a time namespace shifts btime, not the boot id) or reports the
# harness machine's boot id; a test host's stand-in is a regular file.
KMSG_SCRIPT = r"""
k=/dev/kmsg
case "$HARNESS_BTIME" in ''|*[!0-9]*) echo "refused: the harness's boot time is missing ($HARNESS_BTIME)" >&2; exit 3;; esac
bt=$(sed -n 's/^btime //p' /proc/stat)
case "$bt" in ''|*[!0-9]*) echo "refused: cannot read btime from /proc/stat, so cannot tell this kernel from the harness machine's" >&2; exit 3;; esac
if [ -c "$k" ]; then
  d=$((bt - HARNESS_BTIME)); [ "$d" -lt 0 ] && d=$((0 - d))
  if [ "$d" -le 5 ] || [ "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)" = "$HARNESS_BOOT_ID" ]; then
    echo "refused: $k here is the kernel log of the machine the harness runs on (character device, boot time $bt)" >&2; exit 3
  fi
fi
if [ ! -w "$k" ]; then echo "refused: $k is not writable here (no such device, not root, or an unprivileged container)" >&2; exit 4; fi
printf '<3>%s\n' "$LINE" >> "$k" && echo "written to $k ($( [ -c "$k" ] && echo 'character device' || echo 'stand-in file'))"
"""


@dataclasses.dataclass(frozen=True)
class AgentSignals:
    """What the cluster's node health agent puts on a node it found faulty, and which recovery
    each asks for.  Defaults: SageMaker HyperPod's health-monitoring agent (condition
    ``NvidiaErrorReboot`` per AWS's documented detection event; ``…Replace`` the emulator's
    name) and its ``node-health-status`` label; NVSentinel and others: name their condition
    types and taint keys in the profile (``kubernetes.node_agent``)."""

    conditions: tuple[str, ...] = (hyperpod.NVIDIA_ERROR_REBOOT, hyperpod.NVIDIA_ERROR_REPLACE)
    label: str | None = hyperpod.HEALTH_LABEL
    label_values: tuple[str, ...] = (hyperpod.PENDING_REBOOT, hyperpod.PENDING_REPLACEMENT)
    taints: tuple[str, ...] = ()

    def on(self, node: dict) -> dict:
        """The signals ``node`` carries now (empty: none)."""
        found: dict = {}
        conds = [c for c in (node.get("status") or {}).get("conditions") or []
                 if c.get("type") in self.conditions and c.get("status") == "True"]
        if conds:
            found["condition"] = {k: conds[0].get(k) for k in ("type", "reason", "message")}
        value = (node["metadata"].get("labels") or {}).get(self.label) if self.label else None
        if value in self.label_values:
            found["label"] = f"{self.label}={value}"
        taints = [t.get("key") for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") in self.taints]
        if taints:
            found["taints"] = taints
        return found

    @classmethod
    def from_settings(cls, settings) -> "AgentSignals":
        if settings is None:
            return cls()
        return cls(tuple(settings.conditions), settings.label, tuple(settings.label_values), tuple(settings.taints))


def xid_line(xid: int, pid: int | None, pci: str = "0000:3b:00", name: str = "python") -> str:
    return f"NVRM: Xid (PCI:{pci}): {xid}, pid={pid if pid else '<unknown>'}, name={name}, {XIDS[xid].text}"


def harness_btime() -> str:
    """This machine's boot time (``btime`` of /proc/stat): shared by every namespace of its kernel
    but a time namespace, which shifts it."""
    with open("/proc/stat") as f:
        return next(line.split()[1] for line in f if line.startswith("btime "))


def harness_env(line: str) -> dict[str, str]:
    """What ``KMSG_SCRIPT`` needs: the line, and how to recognise this machine's kernel."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot_id = f.read().strip()
    return {"LINE": line, "HARNESS_BTIME": harness_btime(), "HARNESS_BOOT_ID": boot_id}


class Xid(ShimFault, Fault):
    kind = "xid"
    kills_node = False  # Train sees the rank fail first; the node goes when the agent acts

    def __init__(self, xid: int = 79, rank: int = 1, shim_path: str | None = None, driver_dir: str | None = None,
                 agent_slo_s: float = 60.0, recover_timeout_s: float = 600.0, signals: AgentSignals | None = None,
                 allow_replacement: bool = False, node_shell_image: str = "busybox:1.36"):
        """``driver_dir``: a directory holding libcuda.so.1 to put first on LD_LIBRARY_PATH
        (the stub driver on machines without a GPU).  ``agent_slo_s``: how long the node agent
        may take to act on the line (its absence after that is the finding); ``recover_timeout_s``:
        how long the node may take to come back once the agent acted."""
        if xid not in XIDS:
            raise ValueError(f"xid {xid} is not modelled; known: {', '.join(map(str, XIDS))}")
        if XIDS[xid].remediation == "replace" and not allow_replacement:
            raise InjectionError(f"Xid {xid} is remedied by replacing the node (its volumes are destroyed): set "
                                 "safety.allow_node_replacement: true in the profile to allow it")
        self.xid, self.rank = xid, rank
        self.spec = XIDS[xid]
        self.error_code = ERRORS[self.spec.error][0]
        self.shim_path, self.driver_dir = shim_path, driver_dir
        self.agent_slo_s, self.recover_timeout_s = agent_slo_s, recover_timeout_s
        self.signals = signals or AgentSignals()
        self.node_shell_image = node_shell_image
        files = uuid.uuid4().hex[:8]
        self.control_path = f"/dev/shm/chaos-xid-{files}.ctl"
        self.log_path = f"/tmp/chaos-xid-{files}.jsonl"
        self._watches: dict[str, _ChainWatch] = {}

    @classmethod
    def build(cls, settings: FaultSettings, **params) -> "Xid":
        """The agent SLO and the node's recovery time are the kind's SLOs (the profile's, else
        the catalog's), the agent's signals, the node-shell image and whether a replacement is
        allowed the profile's; ``params`` overrides any of them."""
        profile = settings.profile
        detect, recover = profile.slo_for(cls.kind) if profile is not None else (
            catalog.kind(cls.kind).slo_detect_s, catalog.kind(cls.kind).slo_recover_s)
        kube = profile.kubernetes if profile is not None else None
        defaults = dict(agent_slo_s=detect, recover_timeout_s=recover,
                        signals=AgentSignals.from_settings(kube.node_agent if kube else None),
                        allow_replacement=bool(profile and profile.safety.allow_node_replacement),
                        node_shell_image=kube.node_shell_image if kube else "busybox:1.36")
        return cls(**{**defaults, **{k: v for k, v in params.items() if v is not None}})

    def describe(self) -> str:
        return f"Xid {self.xid} ({self.spec.error}, every driver call until reboot) on rank {self.rank}'s node"

    def resolve(self, ctx: FaultContext) -> Target:
        return placement_target(ctx, self.rank)

    def revert_plan(self, inj: Injection) -> dict:
        return {"action": "disarm-xid", "host": inj.host.key, "control": self.control_path, "log": self.log_path,
                "why": "the node's dead-GPU plan is disarmed; the kernel-log stand-in of a test host is emptied; "
                       "what the node agent set is listed, never cleared"}

    # -- inject ------------------------------------------------------------------------
    def inject(self, ctx: FaultContext, inj: Injection) -> dict:
        transport = inj.host.transport
        got = transport.run("cat /proc/sys/kernel/random/boot_id", timeout=30)
        boot_id = got.stdout.strip()
        if not got.ok or not re.fullmatch(r"[0-9a-f-]{36}", boot_id):
            raise InjectionError(f"cannot read the boot id of {transport.host}: {got.stderr.strip() or boot_id!r}")
        check_shim_loaded(transport, inj.target, self.shim_path)
        kube = ctx.backend.kube
        node = self._kube_node(ctx, inj) if kube is not None else None
        watch = None
        if node is not None:  # listed before the line exists: the watch misses nothing the agent does
            from chaos.faults.kube import list_nodes_at

            watch = _ChainWatch(kube, node, list_nodes_at(kube), self.signals, self.agent_slo_s,
                                self.recover_timeout_s, ctx.timeline, inj.ledger_id, self.xid)
            self._watches[inj.ledger_id] = watch
        line = xid_line(self.xid, inj.target.pid)
        plan = Plan(plan_id=f"xid{self.xid}-{uuid.uuid4().hex[:8]}", symbols=("*",), mode="error", times=None,
                    error=self.error_code, boot_id=boot_id)
        inj.evidence.update(xid=self.xid, error=self.spec.error, boot_id_before=boot_id, line=line, plan=plan.render(),
                            node=node["metadata"]["name"] if node else inj.target.host)
        armed = transport.run(control_command(self.control_path, plan, python=ctx.backend.python), timeout=30)
        if not armed.ok:
            raise InjectionError(f"arming the dead-GPU plan on {transport.host} failed: {armed.stderr.strip()}")
        written = (self._kmsg_by_pod(kube, node, line) if node is not None else self._kmsg_by_transport(transport, line))
        t = ctx.timeline.emit("fault", "xid_logged", xid=self.xid, line=line, node=inj.evidence["node"],
                              written=written, agent_slo_s=self.agent_slo_s, recover_slo_s=self.recover_timeout_s,
                              ledger_id=inj.ledger_id).t
        inj.evidence["kernel_log"] = written
        if watch is not None:
            watch.t0 = t
            watch.start()
        return {"xid": self.xid, "plan_id": plan.plan_id, "boot_id": boot_id, "kernel_log": written}

    def _kube_node(self, ctx: FaultContext, inj: Injection) -> dict:
        from chaos.faults.kube import _read_node

        return _read_node(ctx.backend.kube, ctx.backend.pod_of(inj.target))

    @staticmethod
    def _kmsg_by_transport(transport, line: str) -> str:
        env = harness_env(line)
        script = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + f"; export {' '.join(env)}\n{KMSG_SCRIPT}"
        res = transport.run(["/bin/sh", "-c", script], timeout=30, privileged=True)
        if not res.ok:
            raise InjectionError(f"writing the Xid line to {transport.host}'s kernel log: "
                                 f"{(res.stderr or res.stdout).strip() or f'exit {res.exit_code}'}")
        return f"{transport.host}: {res.stdout.strip()}"

    def _kmsg_by_pod(self, kube, node: dict, line: str) -> str:
        """A one-shot privileged pod on the node writes the line (``kubectl debug node/…`` does the
        same); refused by the API server (RBAC, Pod Security) or the script, the error names why."""
        from chaos.faults.kube import write_by_node_pod

        name = node["metadata"]["name"]
        out = write_by_node_pod(kube, name, self.node_shell_image, KMSG_SCRIPT, harness_env(line), what="the Xid line")
        return f"node {name}: {out}"

    def after_detect(self, ctx: FaultContext, inj: Injection) -> None:
        """Wait for the chain's end: the agent acted and the node is back (or the agent stayed
        silent past its SLO — the finding the verdicts report; the run then goes on without it)."""
        watch = self._watches.get(inj.ledger_id)
        if watch is None:
            return
        watch.join(self.agent_slo_s + self.recover_timeout_s + 30)
        inj.evidence.update(watch.evidence)

    # -- revert / sweep ----------------------------------------------------------------
    def revert(self, ctx: FaultContext, inj: Injection) -> bool:
        transport = inj.host.transport
        watch = self._watches.pop(inj.ledger_id, None)
        if watch is not None:
            watch.stop()
        files = f"{shlex.quote(self.log_path)} {shlex.quote(self.control_path)}"
        collect = f"cat {shlex.quote(self.log_path)} 2>/dev/null; rm -f {files}"
        try:
            transport.run(control_command(self.control_path, None, python=ctx.backend.python), timeout=30).check()
        except TransportError:
            if not inj.evidence.get("recovered", {}).get("ok"):
                raise
            # The node was rebooted or replaced: its pod, its processes and their plan are gone
            # (and the plan, bound to the old boot id, fires nowhere).  Where a live worker still
            # sees the files (a /tmp and /dev/shm shared with the node's, as test hosts share
            # them), the shim's log is collected and the files dropped.
            outs = [ctx.backend.host(n.node_id).transport.run(collect, timeout=30).stdout
                    for n in ctx.cluster.alive_workers()]
            self._count(inj, "".join(outs))
            inj.evidence["reverted"] = "nothing armed: the node's pod went with its reboot or replacement"
            return False
        self._count(inj, transport.run(collect, timeout=30).stdout)
        return True

    @staticmethod
    def _count(inj: Injection, log: str) -> None:
        """How often the shim failed a driver call (its ``inject`` events), for the evidence."""
        fired = 0
        for line in log.splitlines():
            try:
                fired += json.loads(line).get("event") == "inject"
            except (ValueError, AttributeError):
                continue
        inj.evidence["shim_injections"] = fired

    @classmethod
    def sweep(cls, plan: dict, backend) -> bool:
        """Disarm the plan on the host the ledger names, empty a test host's kernel-log stand-in
        (a regular file; a real /dev/kmsg is never touched), and list what a node agent set."""
        kube = backend.kube
        if kube is not None:  # first: the pod below may be gone with the node's reboot, and the sweep fail there
            from chaos.faults.kube import delete_node_shells

            delete_node_shells(kube)  # one left by a killed session could still write its line
        host = backend.reach(plan["host"])
        host.transport.run(control_command(plan["control"], None, python=backend.python), timeout=60).check()
        files = [plan["control"]] + ([plan["log"]] if plan.get("log") else [])
        host.transport.run("rm -f " + " ".join(shlex.quote(f) for f in files), timeout=60).check()
        host.transport.run("[ -f /dev/kmsg ] && [ ! -c /dev/kmsg ] && : > /dev/kmsg; true", timeout=60, privileged=True)
        if kube is not None:
            from chaos.faults.kube import _list_nodes

            signals = AgentSignals.from_settings(backend.profile.kubernetes.node_agent)
            for node in _list_nodes(kube)["items"]:
                found = signals.on(node)
                if found:
                    log.warning("sweep: node %s carries %s from the node agent; left as it is (clearing it could "
                                "cancel a real remediation)", node["metadata"]["name"], found)
        return True


class _ChainWatch(threading.Thread):
    """Watches the node through the API from a list taken before the Xid was written (so a
    short-lived label is replayed, not missed): the agent's first signal, or none within
    ``agent_slo_s``; then the node back Ready with a new boot id — or gone, and a new node of
    its instance group, created after the agent acted, Ready in its place.  Each link becomes
    a timeline event stamped when the harness saw it; a watch that fails says so
    (``chain_watch_failed``)."""

    INSTANCE_GROUP = hyperpod.INSTANCE_GROUP_LABEL

    def __init__(self, kube, node: dict, start: tuple[dict[str, dict], str], signals: AgentSignals,
                 agent_slo_s: float, recover_timeout_s: float, timeline, ledger_id: str | None, xid: int):
        super().__init__(name=f"xid-chain:{node['metadata']['name']}", daemon=True)
        self.kube, self.signals, self.timeline = kube, signals, timeline
        self.name_, self.uid = node["metadata"]["name"], node["metadata"]["uid"]
        self.group = (node["metadata"].get("labels") or {}).get(self.INSTANCE_GROUP)
        self.boot_before = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID")
        self.resume = {"nodes": dict(start[0]), "rv": start[1]}
        self.nodes_before = set(start[0])
        self.before = signals.on(start[0].get(self.uid) or node)
        self.agent_slo_s, self.recover_timeout_s = agent_slo_s, recover_timeout_s
        self.ledger_id, self.xid = ledger_id, xid
        self.t0: float | None = None  # when the line was written (set before start)
        self.t_acted: float | None = None
        self.evidence: dict = {"signals_before": self.before}
        self._stopped = threading.Event()
        self._noted: set[str] = set()  # signals and "down" already on the timeline

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        try:
            self._watch()
        except Exception as err:  # noqa: BLE001 - said on the timeline: the verdicts quote it
            error = f"watching node {self.name_} failed: {type(err).__name__}: {err}"
            self.evidence["error"] = error
            self.timeline.emit("fault", "chain_watch_failed", node=self.name_, error=error, ledger_id=self.ledger_id)

    def _watch(self) -> None:
        from chaos.faults.kube import wait_nodes

        if self.before:  # a signal already there proves nothing about this fault
            raise RuntimeError(f"node {self.name_} already carried {self.before} before the Xid")
        try:
            acted = wait_nodes(self.kube, self._acted, self.agent_slo_s,
                               f"the node agent to act on Xid {self.xid} on node {self.name_}", resume=self.resume,
                               stop=self._stopped)
        except WaitTimeout as err:
            if self._stopped.is_set():
                return
            seen = str(err).split("saw: ", 1)[-1]
            self.evidence["agent"] = {"acted": False, "seen": seen}
            self.timeline.emit("fault", "node_agent_silent", node=self.name_, xid=self.xid,
                               waited_s=self.agent_slo_s, seen=seen, ledger_id=self.ledger_id)
            return
        self.evidence["agent"] = {"acted": True, **acted, "after_s": round(self.t_acted - (self.t0 or 0), 3)}
        self.timeline.emit("fault", "node_agent_acted", t=self.t_acted, node=self.name_, xid=self.xid, **acted,
                           ledger_id=self.ledger_id)
        try:
            result = wait_nodes(self.kube, self._back, self.recover_timeout_s,
                                f"node {self.name_} to be back Ready with a new boot id, or replaced",
                                resume=self.resume, stop=self._stopped)
        except WaitTimeout as err:
            if self._stopped.is_set():
                return
            self.evidence["recovered"] = {"ok": False, "seen": str(err)}
            self.timeline.emit("fault", "node_not_recovered", node=self.name_, waited_s=self.recover_timeout_s,
                               seen=str(err), ledger_id=self.ledger_id)
            return
        t_back = time.time()
        self.evidence["recovered"] = {"ok": True, **result, "after_agent_s": round(t_back - self.t_acted, 3)}
        self.timeline.emit("fault", "node_recovered", t=t_back, node=self.name_, boot_id_before=self.boot_before,
                           **result, ledger_id=self.ledger_id)

    def _note(self, node: dict | None) -> None:
        """Each link the first time it is seen: every agent signal on its own (a condition and a
        label come in separate updates), and the node going down (NotReady, or deleted)."""
        for kind, value in (self.signals.on(node) if node is not None else {}).items():
            if kind not in self._noted:
                self._noted.add(kind)
                self.timeline.emit("fault", "node_agent_signal", node=self.name_, signal=kind, value=value,
                                   ledger_id=self.ledger_id)
        if "down" not in self._noted and (node is None or not _usable(node)):
            self._noted.add("down")
            self.timeline.emit("fault", "node_down", node=self.name_, deleted=node is None, ledger_id=self.ledger_id)

    def _acted(self, nodes: dict[str, dict]):
        node = nodes.get(self.uid)
        self._note(node)
        if node is None:
            return None, f"node {self.name_} is gone (deleted without a signal seen first)"
        found = self.signals.on(node)
        if found and self.t_acted is None:
            self.t_acted = time.time()
        value = (node["metadata"].get("labels") or {}).get(self.signals.label) if self.signals.label else None
        state = f"node {self.name_} still {value}" if value else f"node {self.name_} carries no agent signal"
        return (found or None), state

    def _back(self, nodes: dict[str, dict]):
        old = nodes.get(self.uid)
        self._note(old)
        if old is not None:
            boot = ((old.get("status") or {}).get("nodeInfo") or {}).get("bootID")
            ok = _usable(old) and boot not in (None, self.boot_before) and not self.signals.on(old)
            state = (f"{self.name_}: Ready={_usable(old)}, bootID {boot} (was {self.boot_before}), "
                     f"agent signals {self.signals.on(old) or 'none'}")
            return ({"action": "reboot", "node_after": self.name_, "boot_id_after": boot} if ok else None), state
        new = [n for uid, n in nodes.items() if uid not in self.nodes_before and self._replaces(n)]
        state = f"{self.name_} gone; new usable nodes of its group: {[n['metadata']['name'] for n in new] or 'none'}"
        return ({"action": "replace", "node_after": new[0]["metadata"]["name"],
                 "boot_id_after": ((new[0].get("status") or {}).get("nodeInfo") or {}).get("bootID")}
                if new else None), state

    def _replaces(self, node: dict) -> bool:
        """A node that can be the replacement: usable, of the old node's instance group (HyperPod
        replaces within the group), created after the agent acted (not an autoscaler's)."""
        meta = node["metadata"]
        if self.group is not None and (meta.get("labels") or {}).get(self.INSTANCE_GROUP) != self.group:
            return False
        created = meta.get("creationTimestamp")
        if created and self.t_acted is not None:
            made = calendar.timegm(time.strptime(created.replace(".000", "")[:19], "%Y-%m-%dT%H:%M:%S"))
            if made < int(self.t_acted) - 1:  # whole seconds
                return False
        return _usable(node)


def _usable(node: dict) -> bool:
    """Ready, schedulable (not cordoned)."""
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or [])
    return ready and not (node.get("spec") or {}).get("unschedulable")
