"""The local transport runs commands on the harness's own machine — and never reboots it."""

import pytest

from chaos.errors import TransportError
from chaos.transport.local import LocalTransport


def test_run_returns_exit_code_and_output():
    r = LocalTransport("here").run("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout.strip(), r.stderr.strip()) == (3, "out", "err")
    with pytest.raises(TransportError, match=r"here: `echo out; echo err >&2; exit 3` exited 3: err"):
        r.check()


def test_timeout_names_the_command():
    with pytest.raises(TransportError, match="did not finish within 0s"):
        LocalTransport("here").run("sleep 5", timeout=0.2)


def test_launch_is_refused_so_a_reboot_cannot_hit_the_harness_machine():
    with pytest.raises(TransportError, match="refusing to launch `systemctl reboot` on the harness's own machine"):
        LocalTransport("here").launch("systemctl reboot")
