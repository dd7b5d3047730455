"""Object storage (chaos.storage): the profile's storage.s3 settings and what a job gets from
them, moto's real S3 server behind the real fault proxy (its rules, scoped by client and key,
lifted by their own time), and the storage events read from the proxy's log.  Starts no Ray:
moto_server and the proxy are processes on 127.0.0.1, stopped by PID."""

from __future__ import annotations

import http.client
import time

import pytest

from chaos.errors import ProfileError
from chaos.profile import load_profile, profile_from_dict
from chaos.storage import events
from chaos.storage.access import ObjectStorage
from chaos.storage.proxy import ProxyAdmin, Rule
from chaos.timeline import Event, Timeline
from chaos.waits import poll_until

BASE = {"name": "s", "ray": {"dashboard_url": "http://10.0.0.1:8265", "gcs_address": "10.0.0.1:6379"}}
S3 = {"endpoint_url": "http://10.0.0.9:9000", "region": "us-west-2",
      "credentials": {"from": "env", "env": ["CI_S3_KEY_ID", "CI_S3_KEY"]},
      "fault_proxy": {"admin_url": "http://10.0.0.9:9001", "upstream": "http://10.0.0.8:9000"}}


def storage(**s3) -> ObjectStorage:
    p = profile_from_dict({**BASE, "storage": {"path": "s3://bkt/chaos", "s3": {**S3, **s3}}}, "test")
    return ObjectStorage(p.storage, environ={"CI_S3_KEY_ID": "id-value", "CI_S3_KEY": "key-value"})


# -- the profile's storage.s3 and the job's environment ---------------------------------------
def test_s3_settings_give_the_job_the_endpoint_region_and_the_named_credentials():
    env = storage().job_env()
    assert env == {"AWS_ENDPOINT_URL_S3": "http://10.0.0.9:9000", "AWS_DEFAULT_REGION": "us-west-2",
                   "AWS_REGION": "us-west-2", "CI_S3_KEY_ID": "id-value", "CI_S3_KEY": "key-value",
                   "AWS_EC2_METADATA_DISABLED": "true"}


def test_a_credential_variable_not_set_is_named():
    store = storage(credentials={"from": "env", "env": ["CI_S3_KEY_ID", "NOT_SET_HERE"]})
    with pytest.raises(ProfileError, match="NOT_SET_HERE, which is not set in the harness's environment"):
        store.job_env()


def test_aws_profile_and_node_credentials_pass_no_secret():
    env = storage(credentials={"from": "aws_profile", "aws_profile": "chaos",
                               "credentials_file": "/etc/ray/aws"}).job_env()
    assert env["AWS_PROFILE"] == "chaos" and env["AWS_SHARED_CREDENTIALS_FILE"] == "/etc/ray/aws"
    nodes = storage(credentials={"from": "nodes"}).job_env()
    # an instance role is found through the metadata service: not switched off then
    assert "AWS_EC2_METADATA_DISABLED" not in nodes and not {"CI_S3_KEY_ID", "AWS_PROFILE"} & set(nodes)


@pytest.mark.parametrize("bad, problem", [
    ({"path": "/mnt/x", "s3": {}}, "s3: settings only apply to an s3:// path"),
    ({"path": "s3://b/p", "s3": {"credentials": {"from": "env"}}}, "from: env needs env:"),
    ({"path": "s3://b/p", "s3": {"credentials": {"from": "env", "env": ["not a name"]}}}, "NAMES of environment"),
    ({"path": "s3://b/p", "s3": {"credentials": {"from": "nodes", "env": ["X"]}}}, "env only apply with from: env"),
    ({"path": "s3://b/p", "s3": {"endpoint_url": "http://u:pw@h:1"}}, "must not carry credentials"),
    ({"path": "s3://b/p", "s3": {"fault_proxy": {"admin_url": "http://h:1", "upstream": "http://h:2"}}},
     "fault_proxy needs endpoint_url"),
])
def test_bad_s3_settings_are_named(bad, problem):
    with pytest.raises(ProfileError, match=problem):
        profile_from_dict({**BASE, "storage": bad}, "test")


def test_a_secret_in_the_s3_settings_is_refused(tmp_path):
    """By reference only: a key value where a variable's name belongs, or a secret-named field."""
    yaml = tmp_path / "p.yaml"
    yaml.write_text("name: s\nray: {dashboard_url: 'http://10.0.0.1:8265', gcs_address: '10.0.0.1:6379'}\n"
                    "storage:\n  path: s3://b/p\n  s3:\n    credentials:\n      from: env\n"
                    "      env: [AKIAABCDEFGHIJKLMNOP]\n      aws_secret_access_key: x\n")
    with pytest.raises(ProfileError) as e:
        load_profile(yaml)
    assert "env[0]: the value contains an AWS access key id" in str(e.value)
    assert "aws_secret_access_key: looks like a secret" in str(e.value)


def test_the_named_endpoints_are_the_nodes_and_the_upstream():
    assert storage().endpoints() == ["http://10.0.0.9:9000", "http://10.0.0.8:9000"]
    aws = ObjectStorage(profile_from_dict({**BASE, "storage": {"path": "s3://b/p", "s3": {"region": "eu-west-1"}}},
                                          "t").storage)
    assert aws.endpoints() == ["https://s3.eu-west-1.amazonaws.com"]


# -- moto behind the fault proxy --------------------------------------------------------------
@pytest.fixture(scope="module")
def local(tmp_path_factory, local_ports):
    from chaos.storage.local import LocalStorage

    ls = LocalStorage("127.0.0.1", tmp_path_factory.mktemp("s3"), local_ports).start()
    yield ls
    ls.stop()
    assert ls.server is None and ls.proxy is None


def request(ls, method: str, key: str, source: str = "127.0.0.1", body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", ls.proxy_port, timeout=10, source_address=(source, 0))
    try:
        # moto reads who asks from the Authorization header and does not check the signature
        conn.request(method, f"/ray-chaos/{key}", body=body, headers={"Authorization": (
            "AWS4-HMAC-SHA256 Credential=chaos-local-key/20260101/us-east-1/s3/aws4_request, "
            "SignedHeaders=host, Signature=0")})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_requests_pass_through_to_moto_and_are_logged(local):
    assert request(local, "PUT", "t1/checkpoint_1/a.bin", body=b"abc")[0] == 200
    assert request(local, "GET", "t1/checkpoint_1/a.bin") == (200, b"abc")
    log = [r for r in ProxyAdmin(local.admin_url).log() if r["key"].startswith("ray-chaos/t1/")]
    assert [(r["method"], r["key"], r["status"], r["fault"]) for r in log] == [
        ("PUT", "ray-chaos/t1/checkpoint_1/a.bin", 200, None), ("GET", "ray-chaos/t1/checkpoint_1/a.bin", 200, None)]


def test_an_errors_rule_answers_its_clients_keys_only_and_lifts_itself(local):
    admin = ProxyAdmin(local.admin_url)
    admin.arm("e1", "errors", 3.0, status=503, keys="*/checkpoint_*/*", clients=["127.0.0.2"])
    status, body = request(local, "PUT", "t2/checkpoint_1/a.bin", source="127.0.0.2", body=b"x")
    assert status == 503 and b"<Code>SlowDown</Code>" in body
    # twins: another client, another key
    assert request(local, "PUT", "t2/checkpoint_1/a.bin", source="127.0.0.1", body=b"x")[0] == 200
    assert request(local, "PUT", "t2/snapshot.json", source="127.0.0.2", body=b"x")[0] == 200
    poll_until(lambda: (not admin.rules(), "armed"), 10, "rule e1 to lift itself after 3 s")
    assert request(local, "PUT", "t2/checkpoint_1/a.bin", source="127.0.0.2", body=b"x")[0] == 200


def test_a_slow_rule_holds_requests_and_a_lift_ends_it(local):
    admin = ProxyAdmin(local.admin_url)
    assert request(local, "PUT", "t4/checkpoint_1/a.bin", body=b"abc")[0] == 200
    admin.arm("s1", "slow", 60.0, latency_s=0.5, keys="*/t4/*")
    try:
        t = time.monotonic()
        assert request(local, "GET", "t4/checkpoint_1/a.bin")[0] == 200
        held = time.monotonic() - t
    finally:
        assert admin.lift("s1") is True
    assert admin.lift("s1") is False and all(r["id"] != "s1" for r in admin.rules())
    assert held >= 0.5, held
    assert [r["fault"] for r in admin.log() if r["key"].startswith("ray-chaos/t4/")] == [None, "slow"]


def test_the_admin_api_refuses_bad_rules(local):
    from chaos.errors import InjectionError

    admin = ProxyAdmin(local.admin_url)
    for bad, said in ((dict(status=404), "status 404"), (dict(for_s=0), "for_s 0"), (dict(bogus=1), "bogus")):
        fields = {"status": 503, "for_s": 5, **bad}
        with pytest.raises(InjectionError, match=said):
            admin._call("PUT", "/rules/x", {"kind": "errors", **fields})
    with pytest.raises(ValueError, match="latency_s"):
        Rule("x", "slow", until=time.time() + 5)


def test_pyarrow_uploads_through_the_proxy_and_fails_on_a_long_503(local, monkeypatch):
    """The client the job uses (pyarrow's S3FileSystem, the AWS C++ SDK), configured as a job's
    environment configures it: it reaches moto through the proxy, retries a 503 and gives up
    with the AWS error Ray's own upload retry matches (AWS_RETRYABLE_TOKENS)."""
    import pyarrow.fs

    for k, v in local.object_storage().job_env().items():
        monkeypatch.setenv(k, v)
    fs, root = pyarrow.fs.FileSystem.from_uri(local.object_storage().path)
    with fs.open_output_stream(f"{root}/t3/checkpoint_1/state.pt") as out:
        out.write(b"state")
    ProxyAdmin(local.admin_url).arm("e2", "errors", 60.0, status=503, keys="*/checkpoint_2/*")
    try:
        with pytest.raises(OSError, match="AWS Error SLOW_DOWN"):
            with fs.open_output_stream(f"{root}/t3/checkpoint_2/state.pt") as out:
                out.write(b"state")
    finally:
        ProxyAdmin(local.admin_url).lift("e2")


# -- storage events ---------------------------------------------------------------------------
def run_timeline(*reqs) -> Timeline:
    tl = Timeline([Event(1.0, "harness", "job_submitted", {}),
                   Event(2.0, "recorder", "controller_started", {"run_id": "r1", "run_name": "run",
                                                                 "storage_path": "s3://bkt/chaos"})])
    for i, (t, method, key, query, status, *rest) in enumerate(reqs):
        folder = key.split("/")[0]
        tl.add(Event(t, "storage", "storage_request", {
            "seq": i, "run_id": "r1", "method": method, "key": key, "query": query, "status": status,
            "checkpoint": folder if folder.startswith("checkpoint_") else None, "t_end": t + 0.01,
            "client": rest[0] if rest else "10.0.0.2", "fault": "errors" if status == 503 else None}))
    return tl


def multipart(t, key, status=200):
    return [(t, "POST", key, ["uploads"], status), (t + 0.1, "PUT", key, ["partNumber", "uploadId"], 200),
            (t + 0.2, "POST", key, ["uploadId"], 200)]


def test_uploads_are_read_per_checkpoint_folder():
    tl = run_timeline((10.0, "PUT", "checkpoint_a/", [], 200), *multipart(10.1, "checkpoint_a/state.pt"),
                      (20.0, "PUT", "checkpoint_b/", [], 200), (20.1, "POST", "checkpoint_b/state.pt", ["uploads"], 503),
                      (21.0, "POST", "checkpoint_b/state.pt", ["uploads"], 503),
                      (30.0, "PUT", "checkpoint_c/", [], 200),
                      (30.1, "POST", "checkpoint_c/state.pt", ["uploads"], 200))  # begun, never completed
    a, b, c = events.uploads(tl)
    assert (a.checkpoint, a.ok, a.failed, round(a.took, 2)) == ("checkpoint_a", True, 0, 0.31)
    assert (b.ok, b.failed, b.faulted) == (False, 2, 2)
    assert c.ok is False and c.failed == 0  # no error seen, but the object was never whole: not committed
    assert events.usual_upload_s([a, b, c], but=b) == pytest.approx(0.31)


def test_a_late_upload_that_completed_is_ok_and_restores_are_per_client():
    tl = run_timeline((10.0, "PUT", "checkpoint_a/", [], 200), (10.1, "POST", "checkpoint_a/state.pt", ["uploads"], 503),
                      *multipart(13.0, "checkpoint_a/state.pt"),
                      (40.0, "HEAD", "checkpoint_a/state.pt", [], 200, "10.0.0.3"),
                      (40.1, "GET", "checkpoint_a/state.pt", [], 503, "10.0.0.3"),
                      (41.0, "GET", "checkpoint_a/state.pt", [], 206, "10.0.0.4"),
                      # the controller looks at the folder before it deletes it: no restore
                      (50.0, "HEAD", "checkpoint_a", [], 404, "10.0.0.1"))
    [up] = events.uploads(tl)
    assert up.ok and up.faulted == 1 and round(up.took, 2) == 3.21
    r3, r4 = events.restores(tl)
    assert (r3.client, r3.ok, r4.client, r4.ok) == ("10.0.0.3", False, "10.0.0.4", True)


def test_collect_adds_the_runs_requests_once(local):
    """Only requests under the run's folder, from its submission on; a second collect adds none."""
    tl = Timeline([Event(time.time(), "harness", "job_submitted", {}),
                   Event(time.time(), "recorder", "controller_started",
                         {"run_id": "r9", "run_name": "t9", "storage_path": "s3://ray-chaos"})])
    request(local, "PUT", "t9/checkpoint_1/a.bin", body=b"a")
    request(local, "PUT", "other/checkpoint_1/a.bin", body=b"a")
    backend = type("B", (), {"storage_proxy": ProxyAdmin(local.admin_url)})()
    assert events.collect(backend, tl) == 1 and events.collect(backend, tl) == 0
    [e] = tl.of("storage_request")
    assert (e.data["key"], e.data["checkpoint"], e.data["run_id"]) == ("checkpoint_1/a.bin", "checkpoint_1", "r9")
