"""Safety rules: target checks, the live-fault limit, the health guard, the secret scan."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from chaos.errors import ChaosError, InjectionError
from chaos.profile import SafetySettings
from chaos.safety import GuardAbort, HealthGuard, LiveFaults, NodeInfo, Safety, TargetRefused, scan_for_secrets

HEAD = NodeInfo("a1b2c3d4e5f6", "127.0.1.1", "head-0", {}, is_head=True)
W2 = NodeInfo("b2" * 14, "10.0.0.2", "cpu-worker-2", {"pool": "ondemand"})
W3 = NodeInfo("c3" * 14, "10.0.1.3", "GPU-A100-3", {"pool": "spot", "chaos": "ok"})
W4 = NodeInfo("d4" * 14, "192.168.5.4", None, {})


def refused(safety: Safety, node: NodeInfo) -> TargetRefused:
    with pytest.raises(TargetRefused) as e:
        safety.check_target(node)
    return e.value


def test_module_does_not_import_ray():
    code = "import sys, chaos.safety, chaos.profile; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_error_types():
    assert issubclass(TargetRefused, InjectionError) and issubclass(GuardAbort, ChaosError)


# -- targets --------------------------------------------------------------------------------
def test_head_refused_by_default_even_if_allowlisted():
    s = Safety({"allowlist": [{"address": "127.0.1.1"}], "allow_all_workers": True})
    e = refused(s, HEAD)
    assert e.rule == "safety.allow_head" and e.node is HEAD
    assert str(e).startswith("head node 127.0.1.1 (hostname head-0, node a1b2c3d4) is never targeted unless "
                             "safety.allow_head: true")


def test_head_allowed_with_allow_head():
    Safety({"allow_head": True}).check_target(HEAD)


def test_empty_allowlist_refuses_every_worker():
    s = Safety(None)
    for node in (W2, W3, W4):
        e = refused(s, node)
        assert e.rule == "safety.allowlist"
        assert "safety.allowlist is empty" in str(e) and "safety.allow_all_workers: true" in str(e)
    assert f"worker node {W4.ip} (node d4d4d4d4)" in str(refused(s, W4))


def test_allow_all_workers():
    s = Safety({"allow_all_workers": True})
    for node in (W2, W3, W4):
        s.check_target(node)
    refused(s, HEAD)


def test_allowlist_by_exact_address():
    s = Safety({"allowlist": [{"address": "10.0.0.2"}]})
    s.check_target(W2)
    e = refused(s, W3)
    assert "matches none of safety.allowlist [address=10.0.0.2]" in str(e)
    assert str(e).startswith("worker node 10.0.1.3 (hostname GPU-A100-3, node c3c3c3c3, labels chaos=ok, pool=spot) "
                             "matches none of safety.allowlist [address=10.0.0.2]; add a selector for it")


def test_allowlist_by_cidr():
    s = Safety({"allowlist": [{"address": "10.0.0.0/16"}]})
    s.check_target(W2)
    s.check_target(W3)
    refused(s, W4)
    s6 = Safety({"allowlist": [{"address": "fd00::/64"}]})
    s6.check_target(NodeInfo("x", "fd00::5"))
    refused(s6, W2)  # v4 node, v6 range
    refused(s, NodeInfo("x", "not-an-ip"))


def test_allowlist_by_hostname_glob():
    s = Safety({"allowlist": [{"hostname": "gpu-a100-*"}]})
    s.check_target(W3)  # case-insensitive, as hostnames are
    refused(s, W2)
    refused(s, W4)  # no hostname known: a glob cannot match


def test_allowlist_by_label():
    s = Safety({"allowlist": [{"label": "chaos=ok"}]})
    s.check_target(W3)
    refused(s, W2)
    refused(Safety({"allowlist": [{"label": "pool=spo"}]}), W3)


def test_allowlist_any_selector_matches():
    s = Safety(SafetySettings(allowlist=[{"hostname": "nothing-*"}, {"label": "pool=ondemand"}]))
    s.check_target(W2)
    ok, no = s.split([HEAD, W2, W3, W4])
    assert ok == [W2] and [n for n, _ in no] == [HEAD, W3, W4]
    assert s.is_allowed(W2) and not s.is_allowed(W3)


def test_bad_safety_settings_are_validated():
    with pytest.raises(Exception, match="CIDR"):
        Safety({"allowlist": [{"address": "10.0.0.1/8"}]})


# -- live faults ----------------------------------------------------------------------------
def test_live_fault_limit():
    live = LiveFaults(1)
    with live.slot("raylet-kill on 10.0.0.2"):
        assert live.live() == ["raylet-kill on 10.0.0.2"]
        with pytest.raises(TargetRefused) as e:
            with live.slot("node-reboot on 10.0.0.3"):
                pass
        assert str(e.value) == ("refusing node-reboot on 10.0.0.3: at most 1 fault may be live at once "
                                "(safety.max_live_faults); live now: raylet-kill on 10.0.0.2")
        assert e.value.rule == "safety.max_live_faults"
    assert len(live) == 0
    with live.slot("again"):  # freed, even though the block above raised
        pass


def test_live_faults_released_on_error_and_by_token():
    live = LiveFaults(2)
    with pytest.raises(RuntimeError):
        with live.slot("a"):
            raise RuntimeError("inject failed")
    t1 = live.acquire("b")
    t2 = live.acquire("c")
    with pytest.raises(TargetRefused, match="at most 2 faults may be live at once.*live now: b; c"):
        live.acquire("d")
    live.release(t1)
    live.release(t1)  # twice is harmless
    assert live.live() == ["c"]
    live.release(t2)
    with pytest.raises(ValueError):
        LiveFaults(0)


def test_live_faults_thread_safe():
    live = LiveFaults(3)
    barrier = threading.Barrier(16)
    got, refused_n = [], []

    def grab(i):
        barrier.wait()
        try:
            got.append(live.acquire(f"f{i}"))
        except TargetRefused:
            refused_n.append(i)

    threads = [threading.Thread(target=grab, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 3 and len(refused_n) == 13 and len(live) == 3


# -- health guard ---------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_guard_fires_only_after_unhealthy_for_s_and_resets():
    clock, alive = Clock(), [3]
    g = HealthGuard(min_alive=2, unhealthy_for_s=60, count_alive=lambda: alive[0], clock=clock)
    assert g.observe() is None
    alive[0] = 1
    assert g.observe() is None  # below since t=1000
    clock.t += 60
    assert g.observe() is None  # exactly 60 s: not longer than
    clock.t += 0.5
    reason = g.observe()
    assert reason and "1 node(s) alive, fewer than safety.min_alive_nodes=2, for 60.5 s" in reason
    assert "safety.unhealthy_for_s=60 s" in reason and g.abort_reason == reason
    alive[0] = 2  # healthy again: the clock starts over
    assert g.observe() is None and g.below_since is None
    alive[0] = 0
    clock.t += 1000
    assert g.observe() is None
    clock.t += 59
    assert g.observe() is None
    clock.t += 2
    with pytest.raises(GuardAbort, match="0 node\\(s\\) alive"):
        g.check()
    assert "60.5 s" in g.abort_reason  # the first reason is kept


def test_guard_zero_grace_and_count_failures():
    clock = Clock()
    g = HealthGuard(1, 0, lambda: 0, clock)
    assert g.observe() is not None
    boom = HealthGuard(1, 5, lambda: (_ for _ in ()).throw(ConnectionError("GCS unreachable")), clock)
    assert boom.observe() is None
    clock.t += 6
    assert "could not count alive nodes (ConnectionError: GCS unreachable)" in boom.observe()


def test_guard_from_settings():
    clock = Clock()
    g = HealthGuard.from_settings(SafetySettings(min_alive_nodes=4, unhealthy_for_s=10), lambda: 3, clock)
    g.check()
    clock.t += 11
    with pytest.raises(GuardAbort):
        g.check()


# -- secret scan -----------------------------------------------------------------------------
def test_secret_scan_finds_planted_secrets(tmp_path):
    secret = 'hunter2"\\pa$$'
    (tmp_path / "report.txt").write_text(f"line one\nssh connect ok\nthe secret is {secret} oops\n")
    (tmp_path / "ledger.jsonl").write_text(json.dumps({"a": 1}) + "\n" + json.dumps({"cmd": f"x {secret}"}) + "\n")
    (tmp_path / "key.log").write_text("a\nb\n-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n")
    (tmp_path / "env.txt").write_text("AWS=AKIAIOSFODNN7EXAMPLE\nurl=http://x/?user=a&password=swordfish\n")
    (tmp_path / "http.json").write_text('{\n "headers": {"Authorization": "Bearer abcdefghijklmnop.qrstuv"},\n'
                                        ' "password": "pw1"\n}\n')
    sub = tmp_path / "allure"
    sub.mkdir()
    (sub / "shot.png").write_bytes(b"\x89PNG\0\0AKIAIOSFODNN7EXAMPLE\n" + secret.encode())
    hits = {(h.path.relative_to(tmp_path).as_posix(), h.line, h.kind) for h in scan_for_secrets([tmp_path], [secret])}
    assert hits == {
        ("report.txt", 3, "secret[0]"),
        ("ledger.jsonl", 2, "secret[0]"),  # found JSON-escaped
        ("key.log", 3, "pem-private-key"),
        ("env.txt", 1, "aws-access-key-id"),
        ("env.txt", 2, "password"),
        ("http.json", 2, "bearer-token"),
        ("http.json", 3, "password"),
        ("allure/shot.png", 2, "secret[0]"),  # binary: only the given secrets
    }
    # the result never contains the secret itself
    assert secret not in repr(scan_for_secrets([tmp_path], [secret]))


def test_secret_scan_clean_files(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({
        "profile": "hosts.defaults.ssh.password: looks like a secret; put secrets in your SSH agent",
        "note": "bearer tokens and password= values are never written", "redacted": "password=***",
        "json": {"password": "<redacted>"}, "env": "PWD=/work OLDPWD=/tmp TOKENIZERS_PARALLELISM=false",
        "key_file": "~/.ssh/id_ed25519", "akia": "AKIA-short",
    }, indent=1))
    (tmp_path / "report.txt").write_text("raylet-kill on 10.0.0.2: node DEAD after 2.1 s\n")
    assert scan_for_secrets([tmp_path / "summary.json", tmp_path / "report.txt"], ["hunter2", "", "  "]) == []
    assert scan_for_secrets([tmp_path / "missing.txt"], ["x"]) == []


def test_secret_scan_multiline_secret(tmp_path):
    key = "-----BEGIN RSA PRIVATE KEY-----\nMIIabc\n-----END RSA PRIVATE KEY-----"
    (tmp_path / "a.log").write_text("x\n" + key + "\n")
    kinds = {(h.line, h.kind) for h in scan_for_secrets([tmp_path / "a.log"], [key])}
    assert kinds == {(2, "secret[0]"), (2, "pem-private-key")}
