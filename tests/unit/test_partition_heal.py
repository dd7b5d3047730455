"""A partition over a host's transport is called healed only when the host's iptables shows
nothing of it (chaos.faults.partition): an iptables that cannot list its rules (its lock held
past -w) or a heal that left the OUTPUT jump must not pass as healed, and the host's own
self-heal timer stays until the cut is gone.  The transport is the local one, and iptables a
stand-in script first on PATH that keeps its rules in a file (this machine's are never touched)."""

from __future__ import annotations

import os
import signal
import types

import pytest

from chaos.errors import ChaosError
from chaos.faults.base import Injection
from chaos.faults.partition import Partition
from chaos.transport.local import LocalTransport

# -w N is ignored; -I INPUT 1 ... is kept as -A INPUT ...; files fail / fail-D-OUTPUT make every
# call, or the deletion of an OUTPUT jump, exit 4 as iptables does when its lock stays held.
FAKE_IPTABLES = r"""#!/bin/bash
d=$(dirname "$0"); rules="$d/rules"; touch "$rules"
[ -e "$d/fail" ] && exit 4
[ "$1" = -w ] && shift 2
op=$1; shift
case "$op" in
  -N) echo "-N $1" >> "$rules" ;;
  -A) echo "-A $*" >> "$rules" ;;
  -I) chain=$1; shift 2; echo "-A $chain $*" >> "$rules" ;;
  -D) [ "$1" = OUTPUT ] && [ -e "$d/fail-D-OUTPUT" ] && exit 4
      line="-A $*"; grep -qxF -- "$line" "$rules" || exit 1
      grep -vxF -- "$line" "$rules" > "$rules.new"; mv "$rules.new" "$rules" ;;
  -F) grep -v -- "^-A $1 " "$rules" > "$rules.new"; mv "$rules.new" "$rules" ;;
  -X) grep -vxF -- "-N $1" "$rules" > "$rules.new"; mv "$rules.new" "$rules" ;;
  -S) cat "$rules" ;;
  *) exit 2 ;;
esac
"""


@pytest.fixture
def fake_iptables(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "iptables"
    script.write_text(FAKE_IPTABLES)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


@pytest.fixture
def cut(fake_iptables):
    """A partition cut through the local transport; its self-heal timer is stopped by PID after."""
    fault = Partition(rank=1, self_heal_s=600)
    inj = Injection(fault, target=types.SimpleNamespace(node_ip="198.18.0.2"), host=types.SimpleNamespace(
        console=None, transport=LocalTransport(), key="h1", name="h1"))
    fault.revert_plan(inj)
    ctx = types.SimpleNamespace(timeline=types.SimpleNamespace(emit=lambda *a, **k: None))
    fault.inject(ctx, inj)
    timer = inj.evidence["timer_pid"]
    yield fault, inj, ctx, timer
    try:
        os.killpg(timer, signal.SIGKILL)
    except ProcessLookupError:
        pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_an_iptables_that_cannot_list_its_rules_is_no_heal(cut, fake_iptables):
    fault, inj, ctx, timer = cut
    (fake_iptables / "fail").touch()
    with pytest.raises(ChaosError):
        fault.revert(ctx, inj)
    assert alive(timer), "the host's self-heal timer was stopped though the heal was never seen"
    (fake_iptables / "fail").unlink()
    assert fault.is_partitioned(inj)
    # twin: once iptables answers, the heal is seen and the timer goes
    assert fault.revert(ctx, inj) is True and not fault.is_partitioned(inj)
    assert "chaos-" not in (fake_iptables / "rules").read_text()


def test_a_heal_that_left_the_output_jump_is_no_heal(cut, fake_iptables):
    fault, inj, ctx, timer = cut
    (fake_iptables / "fail-D-OUTPUT").touch()
    with pytest.raises(ChaosError, match="still there after heal"):
        fault.revert(ctx, inj)
    rules = (fake_iptables / "rules").read_text()
    assert f"-A OUTPUT -j {inj.evidence['chain']}-out" in rules and f"{inj.evidence['chain']}-in" not in rules
    assert alive(timer)
    (fake_iptables / "fail-D-OUTPUT").unlink()
    assert fault.revert(ctx, inj) is True and (fake_iptables / "rules").read_text().strip() == ""
