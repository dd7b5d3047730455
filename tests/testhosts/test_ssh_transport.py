"""SSHTransport against real test hosts: host-key checks, auth, timeouts, errors, fan-out."""

from __future__ import annotations

import base64
import time

import paramiko
import pytest

from chaos.embedded.testhost import ensure_ed25519_key
from chaos.errors import TransportError
from chaos.transport.ssh import SSHTransport, fan_out, fingerprint


def transport(network, host, **kw) -> SSHTransport:
    args = dict(key_filename=network.ssh_key_path, known_hosts=network.known_hosts_path, use_agent=False,
                connect_timeout=3, command_timeout=10)
    return SSHTransport(host.address, **{**args, **kw})


def host_fingerprint(host) -> str:
    key_type, blob = host.host_key.split()[:2]
    return fingerprint(paramiko.PKey.from_type_string(key_type, base64.b64decode(blob)))


def test_known_key_runs_commands_inside_the_host(ssh, host):
    result = ssh.run("hostname; cat /proc/sys/kernel/random/boot_id; grep -c 'chaos test host' $(command -v systemctl)").check()
    name, boot_id, power_script = result.stdout.split()
    assert (name, boot_id) == (host.name, host.boot_id)
    assert int(power_script) > 0  # `systemctl` is the host's power script, never the real one
    entry = ssh.transcript[-1]
    assert entry.exit_code == 0 and host.name in entry.stdout and entry.host == host.address


def test_unknown_host_key_is_refused(network, host, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    with pytest.raises(TransportError) as e:
        transport(network, host, known_hosts=known).run("true")
    msg = str(e.value)
    assert "unknown host key" in msg and host.address in msg and str(known) in msg
    assert "ssh-ed25519" in msg and host_fingerprint(host) in msg


def test_changed_host_key_is_refused_even_with_tofu(network, host, tmp_path):
    other = ensure_ed25519_key(tmp_path / "other_key", "impostor")
    known = tmp_path / "known_hosts"
    known.write_text(f"{host.address} {' '.join(other.split()[:2])}\n")
    before = known.read_text()
    with pytest.raises(TransportError) as e:
        transport(network, host, known_hosts=known, trust_on_first_use=True).run("true")
    msg = str(e.value)
    assert "CHANGED" in msg and host.address in msg and host_fingerprint(host) in msg and str(known) in msg
    assert known.read_text() == before


def test_trust_on_first_use_records_the_key(network, host, tmp_path):
    known = tmp_path / "known_hosts"
    transport(network, host, known_hosts=known, trust_on_first_use=True).run("true").check()
    assert known.read_text().split() == [host.address, *host.host_key.split()[:2]]
    transport(network, host, known_hosts=known).run("true").check()  # now a known key


def test_unusable_private_key_is_named(network, host, tmp_path):
    bad = tmp_path / "bad_key"
    bad.write_text("not a key\n")
    with pytest.raises(TransportError, match=f"SSH key file {bad} cannot be used"):
        transport(network, host, key_filename=bad).run("true")


def test_unauthorized_key_fails_authentication(network, host, tmp_path):
    ensure_ed25519_key(tmp_path / "stranger", "stranger")
    with pytest.raises(TransportError, match="authentication failed .*stranger"):
        transport(network, host, key_filename=tmp_path / "stranger").run("true")


def test_host_down_fails_within_connect_timeout(network, host):
    host.power_off()
    t0 = time.monotonic()
    with pytest.raises(TransportError, match=f"root@{host.address}:22: cannot connect within 1.0s"):
        transport(network, host, connect_timeout=1.0).run("true")
    assert time.monotonic() - t0 < 3.0


def test_failing_command_surfaces_exit_code_and_stderr(ssh):
    result = ssh.run("echo out; echo oops >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "oops\n")
    with pytest.raises(TransportError, match="exited 3: oops"):
        result.check()


def test_command_timeout_names_the_command_and_is_not_retried(ssh):
    with pytest.raises(TransportError, match=r"`echo started; sleep 30` did not finish within 0.5s.*started"):
        ssh.run("echo started; sleep 30", timeout=0.5)
    assert [e.command for e in ssh.transcript] == ["echo started; sleep 30"]
    assert ssh.run("echo again").check().stdout == "again\n"  # the connection is still usable


def test_large_output_is_read_while_the_command_runs(ssh):
    # Bigger than paramiko's channel window: a reader that waits for the exit would hang.
    result = ssh.run("head -c 5000000 /dev/zero | tr '\\0' x").check()
    assert len(result.stdout) == 5_000_000


def test_fan_out_reports_each_host(network, host):
    down = network.add_host("rc-t-2")
    down.boot()
    down.power_off()
    transports = [transport(network, host), transport(network, down, connect_timeout=1.0)]
    results = fan_out(transports, "hostname", timeout=5)
    assert results[host.address].stdout.strip() == host.name
    assert isinstance(results[down.address], TransportError)


def test_jump_host_tunnels_to_a_peer(network, host):
    """Through host A, reach host B (real clusters often sit behind a bastion)."""
    b = network.add_host("rc-t-2")
    b.boot()
    jump = transport(network, host)
    assert transport(network, b, jump_host=jump).run("hostname").check().stdout.strip() == b.name
