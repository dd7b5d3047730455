"""The storage faults (chaos.faults.storage): only an endpoint the profile names is targeted,
only a run on its S3 storage; a proxy rule is armed, ends its window by itself (at once, or
from the first request it matches), is reverted and swept from its ledger plan; a storage
partition is a chain of its own on the host, healed by revert and by sweep.  The proxy is the
real one in front of moto (127.0.0.1); iptables a stand-in script first on PATH (this
machine's rules are never touched)."""

from __future__ import annotations

import http.client
import os
import signal
import types

import pytest

from chaos.embedded.cluster import free_port
from chaos.errors import InjectionError
from chaos.faults.base import Injection
from chaos.faults.storage import StorageErrors, StoragePartition, StorageSlow
from chaos.safety import TargetRefused
from chaos.storage.proxy import ProxyAdmin
from chaos.timeline import Event, Timeline
from chaos.transport.local import LocalTransport
from chaos.transport.ssh import SSHTransport
from test_partition_heal import FAKE_IPTABLES


@pytest.fixture(scope="module")
def local(tmp_path_factory, local_ports):
    from chaos.storage.local import LocalStorage

    ls = LocalStorage("127.0.0.1", tmp_path_factory.mktemp("s3"), local_ports).start()
    yield ls
    ls.stop()


def put(ls, key: str, source: str = "127.0.0.1") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", ls.proxy_port, timeout=10, source_address=(source, 0))
    try:
        conn.request("PUT", f"/ray-chaos/{key}", body=b"x", headers={"Authorization": (
            "AWS4-HMAC-SHA256 Credential=k/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0")})
        return conn.getresponse().status
    finally:
        conn.close()


def ctx_for(store, storage_path: str, transport=None, proxy=None):
    """A FaultContext whose run checkpoints to ``storage_path`` with rank 0 on node n0 (127.0.0.2)."""
    tl = Timeline([
        Event(1.0, "recorder", "controller_started", {"run_id": "r", "run_name": "run", "storage_path": storage_path}),
        Event(2.0, "recorder", "attempt_started", {"run_id": "r", "attempt": 0, "placement": [
            {"rank": 0, "node_id": "n0" * 8, "node_ip": "127.0.0.2", "pid": 7}]})])
    host = types.SimpleNamespace(transport=transport or SSHTransport.__new__(SSHTransport), key="127.0.0.2",
                                 name="w0", console=None)
    backend = types.SimpleNamespace(object_storage=store, storage_proxy=proxy, label="test", storage_path="/x",
                                    host=lambda node_id: host)
    return types.SimpleNamespace(timeline=tl, backend=backend, cluster=None), host


def test_a_fault_against_an_endpoint_the_profile_does_not_name_is_refused(local):
    store = local.object_storage()
    ctx, _ = ctx_for(store, store.path + "/run", proxy=ProxyAdmin(local.admin_url))
    with pytest.raises(TargetRefused, match="endpoint http://10.9.9.9:9000 is not one the profile names"):
        StorageErrors(endpoint="http://10.9.9.9:9000").resolve(ctx)
    # twins: the endpoint the nodes use, and the one behind the proxy, are named
    assert StorageErrors(endpoint=local.endpoint_url).resolve(ctx).node_id == "n0" * 8
    assert StorageErrors(endpoint=local.server.url + "/").resolve(ctx).rank == 0


def test_a_run_that_does_not_checkpoint_to_the_s3_storage_is_refused(local):
    store = local.object_storage()
    ctx, _ = ctx_for(store, "/mnt/shared/ray-chaos", proxy=ProxyAdmin(local.admin_url))
    with pytest.raises(InjectionError, match="the run checkpoints to /mnt/shared/ray-chaos, not to the S3 storage"):
        StorageErrors().resolve(ctx)
    ctx.backend.object_storage = None
    with pytest.raises(InjectionError, match="storage-partition needs S3 storage"):
        StoragePartition().resolve(ctx)


def test_proxy_faults_need_the_proxy_and_node_scope_needs_hosts_of_their_own(local):
    store = local.object_storage()
    ctx, _ = ctx_for(store, store.path + "/run", proxy=None)
    with pytest.raises(InjectionError, match=r"needs the storage fault proxy \(storage.s3.fault_proxy\)"):
        StorageSlow().resolve(ctx)
    ctx, _ = ctx_for(store, store.path + "/run", transport=LocalTransport(), proxy=ProxyAdmin(local.admin_url))
    with pytest.raises(InjectionError, match="plain embedded cluster's nodes all reach the endpoint from 127.0.0.1"):
        StorageErrors(scope="node").resolve(ctx)
    assert StorageErrors(scope="endpoint").resolve(ctx).rank == 0
    with pytest.raises(InjectionError, match="whose network every node shares"):
        StoragePartition().resolve(ctx)


def inject(fault, ctx, host):
    target = fault.resolve(ctx)
    inj = Injection(fault, target, host, ledger_id="L1", t=ctx.timeline.events[-1].t)
    plan = fault.revert_plan(inj)
    return inj, plan, fault.inject(ctx, inj)


def window_end(ctx, timeout=20.0) -> Event:
    return ctx.timeline.wait_for(lambda ev: next((e for e in ev if e.kind == "storage_window_ended"), None), timeout,
                                 "the storage fault's window to end")


def test_an_errors_window_from_the_next_upload_ends_by_itself(local):
    """Armed now, it waits for the first matching request (a checkpoint object of rank 0's node),
    answers it and the rest for its window, then the proxy drops it: storage_window_ended says
    when it began; the revert after has nothing left to lift."""
    store = local.object_storage()
    ctx, host = ctx_for(store, store.path + "/run", proxy=ProxyAdmin(local.admin_url))
    fault = StorageErrors(duration_s=1.0, at="next-upload", wait_s=30)
    inj, plan, details = inject(fault, ctx, host)
    assert plan["action"] == "lift-storage-rule" and details["clients"] == ["127.0.0.2"]
    assert put(local, "run/snapshot.json", source="127.0.0.2") == 200  # not a checkpoint object
    assert put(local, "run/checkpoint_1/a", source="127.0.0.1") == 200  # not rank 0's node
    assert put(local, "run/checkpoint_1/a", source="127.0.0.2") == 503  # the window begins here
    ended = window_end(ctx)
    assert ended.data["met_a_request"] is True and ended.data["cut_short"] is False and ended.data["started"]
    assert put(local, "run/checkpoint_1/a", source="127.0.0.2") == 200
    assert fault.revert(ctx, inj) is False


def test_a_revert_lifts_an_armed_rule_and_the_sweep_lifts_a_left_one(local):
    store = local.object_storage()
    admin = ProxyAdmin(local.admin_url)
    ctx, host = ctx_for(store, store.path + "/run", proxy=admin)
    fault = StorageSlow(duration_s=300, latency_s=1.0)
    inj, plan, _ = inject(fault, ctx, host)
    assert [r["id"] for r in admin.rules()] == [plan["rule"]]
    assert fault.revert(ctx, inj) is True and admin.rules() == []
    assert window_end(ctx, 5).data["cut_short"] is True
    # what a killed session leaves: the rule, and its plan in the ledger
    other = StorageErrors(duration_s=300)
    inj2, plan2, _ = inject(other, ctx, host)
    backend = types.SimpleNamespace()
    assert StorageErrors.sweep(plan2, backend) is True and admin.rules() == []
    assert StorageErrors.sweep(plan2, backend) is False  # twin: nothing left
    inj2.handles["stop"].set()
    assert StorageErrors.sweep({**plan2, "admin_url": f"http://127.0.0.1:{free_port(range(64990, 65000))}"}, backend) is False


@pytest.fixture
def fake_iptables(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "iptables").write_text(FAKE_IPTABLES)
    (bin_dir / "iptables").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_a_storage_partition_drops_only_the_endpoint_and_is_healed(local, fake_iptables):
    """The cut is a chain of its own with one rule: TCP to the endpoint's address and port;
    revert removes it and stops the host's self-heal timer; the sweep heals what is left."""
    store = local.object_storage()
    transport = LocalTransport()
    ctx, host = ctx_for(store, store.path + "/run", transport=transport)
    # what resolve checks is a host of its own (reached over SSH); the cut goes through ``host``'s transport
    ctx.backend.host = lambda node_id: types.SimpleNamespace(transport=SSHTransport.__new__(SSHTransport), name="w0")
    fault = StoragePartition(duration_s=300)
    inj, plan, details = inject(fault, ctx, host)
    timer = inj.evidence["timer_pid"]
    try:
        rules = (fake_iptables / "rules").read_text().splitlines()
        chain = plan["chain"]
        assert rules == [f"-N {chain}", f"-A {chain} -p tcp -d 127.0.0.1 --dport {local.proxy_port} -j DROP",
                         f"-A OUTPUT -j {chain}"], rules
        assert fault.revert(ctx, inj) is True and (fake_iptables / "rules").read_text().strip() == ""
        assert window_end(ctx, 5).data["cut_short"] is True
        inj2, plan2, _ = inject(StoragePartition(duration_s=300), ctx, host)
        inj2.handles["stop"].set()
        backend = types.SimpleNamespace(connect=lambda key: LocalTransport(key))
        assert StoragePartition.sweep(plan2, backend) is True and StoragePartition.sweep(plan2, backend) is False
        os.killpg(inj2.evidence["timer_pid"], signal.SIGKILL)
    finally:
        try:
            os.killpg(timer, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_ray_chaos_sweep_lifts_a_rule_a_killed_session_left(local, tmp_path, monkeypatch):
    """The ledger's entry, written before the injection, is all the sweep needs: the rule is
    lifted and the entry closed; a second sweep finds nothing open."""
    import subprocess

    import chaos.ledger
    from chaos.backends.lock import this_runner
    from chaos.ledger import Ledger
    from chaos.sweep import sweep

    killed = subprocess.Popen(["true"])  # the session that wrote the entry, gone
    killed.wait()
    monkeypatch.setattr(chaos.ledger, "this_runner", lambda: {**this_runner(), "pid": str(killed.pid)})

    store = local.object_storage()
    admin = ProxyAdmin(local.admin_url)
    ctx, host = ctx_for(store, store.path + "/run", proxy=admin)
    fault = StorageErrors(duration_s=300)
    target = fault.resolve(ctx)
    inj = Injection(fault, target, host, t=ctx.timeline.events[-1].t)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    inj.ledger_id = ledger.record(fault.kind, target.to_json(), fault.revert_plan(inj), test="t")
    fault.inject(ctx, inj)
    inj.handles["stop"].set()  # the session is gone: nothing of it ends the window
    ledger.mark(inj.ledger_id, "injected")
    said = []
    done = sweep(types.SimpleNamespace(), ledger, None, say=said.append)
    assert done.ok and done.reverted == [inj.ledger_id]
    assert admin.rules() == [] and ledger.open_entries() == []
    assert said and "sweep: reverted storage-errors" in said[0] and "lift-storage-rule" in said[0], said
