"""The xid fault's parts that need no cluster: the automatic node recovery verdicts, what a
lasting fault is charged, the agent signals, the kernel-log write's refusal of this
machine's real kernel log, and bad input."""

import os
import shutil
import subprocess

import pytest

from chaos.errors import InjectionError
from chaos.faults.xid import KMSG_SCRIPT, XIDS, AgentSignals, Xid, harness_btime, harness_env, xid_line
from chaos.verdicts import Expect
from chaos.verdicts.node_recovery import node_recovery_chain
from chaos.verdicts.budget import within_budget
from timelines import Script

CUDA_ERROR = "RuntimeError: CUDA error: unspecified launch failure (CUDA_ERROR_UNKNOWN)"


def chain(tl):
    agent, node = node_recovery_chain(tl)
    assert agent.name == "node-agent (fault 1)" and node.name == "node-recovered (fault 1)"
    return agent, node


def xid_run(agent_after=2.0, back_after=30.0, decisions=1, after_back=0, agent_slo_s=60.0):
    """Train sees rank 1's CUDA error ``decisions`` times before the node is back (a restart on
    the dead GPU fails again), recovers on an attempt begun after it, then fails ``after_back``
    more times for other reasons."""
    s = Script().start_attempt().steps(1, 11).xid(agent_after=agent_after, back_after=back_after,
                                                  agent_slo_s=agent_slo_s)
    for i in range(decisions):  # the run goes on while the agent acts: these come before the chain's end
        s.decision(error=CUDA_ERROR)
        if i < decisions - 1:
            s.start_attempt()
    s.at(max(e.t for e in s.events) + 1).start_attempt().steps(11, 15)
    for _ in range(after_back):
        s.decision(error="rank 0 died").start_attempt().steps(16, 20)
    return s


def test_a_failure_ray_notices_after_the_node_is_back_is_still_the_xids():
    """The emulated host reboots in well under a second: Ray's health check can call the node
    dead after the node is already back.  The fault's window ends when the run recovered."""
    s = Script().start_attempt().steps(1, 11).xid(agent_after=0.2, back_after=0.2)
    s.at(max(e.t for e in s.events) + 1).decision(error="the actor's node was terminated unexpectedly")
    s.start_attempt().steps(11, 15).finish()
    v = within_budget(s.timeline(), Expect(charge_outcomes=[{"worker_group": 1}]))
    assert v.status == "pass", v.line()


# -- the chain's verdicts -----------------------------------------------------------------
def test_an_agent_that_acts_and_a_node_that_comes_back_pass_with_their_times():
    agent, node = chain(xid_run().finish().timeline())
    assert agent.status == "pass" and "acted on Xid 79 after 2.0 s" in agent.message, agent.line()
    assert "NvidiaErrorReplace" in agent.message, agent.message
    assert node.status == "pass" and "replaced by node hyperpod-b 30.0 s after the agent acted" in node.message


def test_an_agent_that_never_acts_fails_both_links_with_what_the_node_showed():
    agent, node = chain(xid_run(agent_after=None, back_after=None, agent_slo_s=20.0).timeline())
    assert agent.status == "fail" and agent.diagnosis == "node agent never acted"
    assert agent.message == ("node agent never acted: automatic node recovery did not act on Xid 79 within 20 s: "
                             "node hyperpod-a still Schedulable")
    assert node.status == "fail" and node.diagnosis == "node not recovered"


def test_a_slow_agent_or_a_slow_node_is_a_finding():
    agent, _ = chain(xid_run(agent_after=45.0, agent_slo_s=30.0).timeline())
    assert agent.status == "fail" and agent.diagnosis == "node agent too slow" and "SLO 30.0 s" in agent.message
    s = Script().start_attempt().steps(1, 5).xid(agent_after=1.0, back_after=700.0, recover_slo_s=600.0)
    _, node = chain(s.timeline())
    assert node.status == "fail" and node.diagnosis == "node recovery too slow"


def test_no_watch_of_the_node_is_unverifiable_never_a_pass():
    s = Script().start_attempt().steps(1, 5).xid(agent_after=1.0, back_after=3.0)
    s.events = [e for e in s.events if e.kind not in ("node_agent_acted", "node_recovered")]
    agent, node = chain(s.timeline())
    assert (agent.status, node.status) == ("unverifiable", "unverifiable")
    assert agent.diagnosis == "unverifiable: no node agent evidence"


def test_a_node_that_never_came_back_fails():
    s = Script().start_attempt().steps(1, 5).xid(agent_after=1.0)
    s.events.append(s._e("fault", "node_not_recovered", 600, ledger_id="f1", waited_s=600.0,
                         seen="node hyperpod-a: Ready=False"))
    _, node = chain(s.timeline())
    assert node.status == "fail" and "waited 600 s: node hyperpod-a: Ready=False" in node.message


# -- what a lasting fault is charged --------------------------------------------------------
def test_every_failure_until_the_node_is_back_is_the_xid_faults_own_charge():
    """A restart placed on the dead node before the agent acted fails again: two charges, both
    the fault's; one of the outcomes measured."""
    tl = xid_run(decisions=2).finish().timeline()
    expect = Expect(charge_outcomes=[{"worker_group": 1}, {"worker_group": 2}])
    v = within_budget(tl, expect)
    assert v.status == "pass", v.line()
    assert "the xid fault(s) charged {'worker_group': 2}" in v.message, v.message
    assert v.evidence["charged_by_node_recovery_faults"] == {"worker_group": 2}


def test_a_charge_outside_the_measured_outcomes_fails():
    v = within_budget(xid_run(decisions=2).finish().timeline(), Expect(charge_outcomes=[{"worker_group": 1}]))
    assert v.status == "fail" and v.diagnosis == "charge not among the measured outcomes", v.line()


def test_a_failure_after_the_node_is_back_is_unrelated():
    v = within_budget(xid_run(decisions=1, after_back=1).finish().timeline(),
                      Expect(charge_outcomes=[{"worker_group": 1}]))
    assert v.status == "fail" and v.diagnosis == "unrelated failure", v.line()


def test_a_dead_gpu_nobody_recovers_exhausts_the_budget_and_never_passes():
    s = Script(max_failures=2).start_attempt().steps(1, 11).xid(agent_after=None, agent_slo_s=20.0)
    for i in range(3):
        s.decision("RAISE" if i == 2 else "RETRY", limit=2, error=CUDA_ERROR)
        if i < 2:
            s.start_attempt()
    tl = s.finish("ERRORED").timeline()
    v = within_budget(tl, Expect(charge_outcomes=[{"worker_group": 1}]))
    assert v.status == "fail" and v.diagnosis == "retry budget exhausted" and "3 failures" in v.message, v.line()
    assert v.evidence["charged_by_node_recovery_faults"] == {"worker_group": 3}, "the dead GPU's failures are the xid's"
    assert all(x.status == "fail" for x in node_recovery_chain(tl))


# -- agent signals ---------------------------------------------------------------------------
def node(labels=None, conditions=(), taints=()):
    return {"metadata": {"name": "n", "labels": labels or {}}, "spec": {"taints": list(taints)},
            "status": {"conditions": list(conditions)}}


def test_the_signals_a_node_carries_are_named():
    hma = AgentSignals()
    assert hma.on(node({"sagemaker.amazonaws.com/node-health-status": "Schedulable"})) == {}
    assert hma.on(node(conditions=[{"type": "NvidiaErrorReboot", "status": "False"}])) == {}
    got = hma.on(node({"sagemaker.amazonaws.com/node-health-status": "UnschedulablePendingReboot"},
                      [{"type": "NvidiaErrorReboot", "status": "True", "reason": "XidHardwareFailure", "message": "m"}]))
    assert got == {"condition": {"type": "NvidiaErrorReboot", "reason": "XidHardwareFailure", "message": "m"},
                   "label": "sagemaker.amazonaws.com/node-health-status=UnschedulablePendingReboot"}
    nvsentinel = AgentSignals(conditions=("GpuXidError",), label=None, label_values=(), taints=("nvsentinel/bad",))
    assert nvsentinel.on(node(taints=[{"key": "nvsentinel/bad", "effect": "NoSchedule"}])) == {
        "taints": ["nvsentinel/bad"]}


def test_a_profile_names_its_agents_signals():
    from chaos.profile.models import NodeAgentSettings

    settings = NodeAgentSettings(conditions=["GpuXidError"], label=None, taints=["nvsentinel/bad"])
    assert AgentSignals.from_settings(settings) == AgentSignals(
        ("GpuXidError",), None, ("UnschedulablePendingReboot", "UnschedulablePendingReplacement"), ("nvsentinel/bad",))
    with pytest.raises(ValueError, match="node_agent names nothing to watch"):
        NodeAgentSettings(conditions=[], label=None, taints=[])


# -- bad input -------------------------------------------------------------------------------
def test_unknown_xid_and_a_replacement_without_opt_in_are_refused():
    with pytest.raises(ValueError, match=r"xid 13 is not modelled; known: 48, 74, 79"):
        Xid(xid=13)
    with pytest.raises(InjectionError, match=r"Xid 79 is remedied by replacing the node .* "
                                             r"safety.allow_node_replacement: true"):
        Xid(xid=79)
    assert Xid(xid=48).describe().startswith("Xid 48 (CUDA_ERROR_ECC_UNCORRECTABLE")
    assert Xid(xid=79, allow_replacement=True).error_code == 999


def test_the_xid_line_reads_as_nvrm_writes_it():
    assert xid_line(79, 4242) == "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."
    assert "pid=<unknown>" in xid_line(48, None) and set(XIDS) >= {48, 79, 94, 95}


# -- the kernel-log write ----------------------------------------------------------------------
def dmesg_nvrm() -> list[str]:
    out = subprocess.run(["dmesg"], capture_output=True, text=True)
    assert out.returncode == 0, f"dmesg cannot be read here: {out.stderr}"
    return [ln for ln in out.stdout.splitlines() if "NVRM" in ln]


def run_script(line: str, stand_in: str | None = None, wrap: tuple[str, ...] = (), **env_over) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], **harness_env(line), **env_over}
    if stand_in is None:
        return subprocess.run([*wrap, "/bin/sh", "-c", KMSG_SCRIPT], env=env, capture_output=True, text=True,
                              timeout=30)
    # As a test host has it: a stand-in file over /dev/kmsg in a private mount namespace.
    inner = f"mount --bind {stand_in} /dev/kmsg && exec /bin/sh -c \"$SCRIPT\""
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", inner],
                          env={**env, "SCRIPT": KMSG_SCRIPT}, capture_output=True, text=True, timeout=30)


needs_kmsg = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/kmsg") or shutil.which("dmesg") is None,
                                reason="needs root, /dev/kmsg and dmesg")


@needs_kmsg
def test_this_machines_kernel_log_is_refused_and_a_stand_in_is_written(tmp_path):
    before = dmesg_nvrm()
    line = xid_line(79, 1, pci="0000:ff:00")
    refused = run_script(line)
    assert refused.returncode == 3, refused
    assert "refused: /dev/kmsg here is the kernel log of the machine the harness runs on" in refused.stderr
    stand_in = tmp_path / "kmsg"
    stand_in.write_text("")
    written = run_script(line, str(stand_in))
    assert written.returncode == 0, written
    assert "stand-in file" in written.stdout
    assert stand_in.read_text() == f"<3>{line}\n"
    assert dmesg_nvrm() == before, "this machine's kernel log gained an NVRM line"


@needs_kmsg
@pytest.mark.parametrize("how", ["no harness boot time", "another boot time, this machine's boot id",
                                 "a time namespace"])
def test_the_refusal_fails_closed(how):
    """What could make this machine's kernel log look like another's is refused all the same."""
    before = dmesg_nvrm()
    line = xid_line(79, 1, pci="0000:fe:00")
    if how == "no harness boot time":
        got = run_script(line, HARNESS_BTIME="")
    elif how == "another boot time, this machine's boot id":
        got = run_script(line, HARNESS_BTIME=str(int(harness_btime()) - 86400))
    else:  # btime shifted by a day inside the namespace; the boot id is still this machine's
        if subprocess.run(["unshare", "--time", "--boottime", "86400", "true"], capture_output=True).returncode:
            pytest.skip("no time namespaces here")
        got = run_script(line, wrap=("unshare", "--time", "--boottime", "86400"))
    assert got.returncode == 3 and got.stderr.startswith("refused:"), got
    assert dmesg_nvrm() == before, "this machine's kernel log gained an NVRM line"


def test_an_xid_charge_without_measured_outcomes_is_unverifiable():
    v = within_budget(xid_run().finish().timeline(), Expect())
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no measured outcomes", v.line()


def test_a_failed_watch_is_named_in_the_unverifiable_chain():
    s = Script().start_attempt().steps(1, 5).xid(agent_after=1.0, back_after=3.0)
    s.events = [e for e in s.events if e.kind not in ("node_agent_acted", "node_recovered")]
    s.events.append(s._e("fault", "chain_watch_failed", ledger_id="f1", error="watching node x failed: 403"))
    agent, node = chain(s.timeline())
    assert agent.status == node.status == "unverifiable"
    assert "the watch of the node failed: watching node x failed: 403" in agent.message, agent.message


def test_without_a_watched_recovery_the_xids_window_ends_when_the_run_recovered():
    """No node_recovered (the SSH path): a failure after the run recovered is not the xid's."""
    s = Script().start_attempt().steps(1, 11).xid(agent_after=1.0)
    s.decision(error=CUDA_ERROR).start_attempt().steps(11, 15)
    s.decision(error="rank 0 died").start_attempt().steps(16, 20).finish()
    v = within_budget(s.timeline(), Expect(charge_outcomes=[{"worker_group": 1}]))
    assert v.status == "fail" and v.diagnosis == "unrelated failure", v.line()
