"""Profiles: valid ones load, every problem is named as FILE:LINE: FIELD: PROBLEM."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from chaos.errors import ProfileError
from chaos.faults import catalog
from chaos.profile import (Profile, ProfileInvalid, dump_profile, embedded_profile, is_secret_name, load_profile,
                           parse_profile, profile_from_dict)

load_yaml = YAML(typ="safe", pure=True).load

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "profiles"

MINIMAL = """\
name: staging
ray:
  dashboard_url: http://10.0.0.1:8265
  gcs_address: 10.0.0.1:6379
storage:
  path: /mnt/shared/chaos
"""


def write(tmp_path: Path, text: str, name: str = "staging.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path: Path, text: str, name: str = "staging.yaml") -> str:
    with pytest.raises(ProfileError) as e:
        load_profile(write(tmp_path, text, name))
    return str(e.value)


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line containing needle."""
    return next(i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line)


def assert_problem(message: str, path: Path | str, line: int, field: str, problem: str) -> None:
    want = re.compile(rf"^{re.escape(str(path))}:{line}: {re.escape(field)}: .*{re.escape(problem)}", re.M)
    assert want.search(message), f"want {path}:{line}: {field}: ...{problem}... in:\n{message}"


# -- valid profiles --------------------------------------------------------------------------
@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_profiles_load(example):
    profile = load_profile(example)
    assert profile.source == str(example)
    for kind in catalog.KINDS:
        detect, recover = profile.slo_for(kind)
        assert 0 < detect <= recover


def test_examples_exist():
    assert {p.name for p in EXAMPLES.glob("*.yaml")} >= {"vm-ssh.yaml", "kuberay.yaml"}


def test_minimal_profile_defaults(tmp_path):
    p = load_profile(write(tmp_path, MINIMAL))
    assert p.name == "staging" and not p.protected
    assert p.nodes.discovery == "ray"
    assert p.hosts.defaults.transport == "ssh"
    ssh = p.hosts.defaults.ssh
    assert (ssh.port, ssh.trust_on_first_use, ssh.use_agent, ssh.connect_timeout_s, ssh.command_timeout_s) == \
        (22, False, True, 10.0, 60.0)
    assert p.workload.kind == "reference" and p.workload.reference.steps == 30
    assert p.slo_for("raylet-kill") == (30.0, 120.0)
    assert p.faults.get("drain") is None and p.faults.get("raylet-kill") is None  # the catalog's budgets apply
    assert (catalog.kind("drain").budget_class, catalog.kind("raylet-kill").budget_class) == \
        ("preemption", "worker_group")
    s = p.safety
    assert (s.allow_head, s.allowlist, s.allow_all_workers, s.max_live_faults, s.min_alive_nodes,
            s.unhealthy_for_s) == (False, [], False, 1, 1, 60.0)
    notes = " ".join(p.notes())
    assert "must be the same shared filesystem" in notes and "no node is targetable" in notes


def test_vm_example_details():
    p = load_profile(EXAMPLES / "vm-ssh.yaml")
    assert p.hosts.defaults.ssh.jump() == ("ops", "bastion.staging.example.com", 22)
    assert [sel.describe() for sel in p.safety.allowlist] == \
        ["address=10.20.0.0/24", "hostname=cpu-worker-*", "label chaos=ok"]


def test_storage_uris_and_paths(tmp_path):
    for good in ("s3://bucket/prefix", "gs://bucket", "/mnt/fsx/x/"):
        p = load_profile(write(tmp_path, MINIMAL.replace("/mnt/shared/chaos", good)))
        assert p.storage.path == good.rstrip("/")
    assert not load_profile(write(tmp_path, MINIMAL.replace("/mnt/shared/chaos", "s3://b/p"))).storage.is_local_path
    for bad, problem in (("relative/dir", "must be an absolute path"), ("s3://", "needs a bucket"),
                         ("hdfs://nn/x", "not supported")):
        msg = error_of(tmp_path, MINIMAL.replace("/mnt/shared/chaos", bad))
        assert_problem(msg, tmp_path / "staging.yaml", 6, "storage.path", problem)


# -- error kinds, each with file:line: field: problem ------------------------------------------------
def test_wrong_type_names_file_line_field_and_value(tmp_path):
    text = MINIMAL + """\
hosts:
  defaults:
    ssh:
      user: ubuntu
      port: twenty-two
"""
    msg = error_of(tmp_path, text)
    assert msg == (f"{tmp_path / 'staging.yaml'}:{line_of(text, 'twenty-two')}: hosts.defaults.ssh.port: "
                   f"Input should be a valid integer, got 'twenty-two'")


def test_relative_path_is_named_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, MINIMAL + "protected: maybe\n")
    with pytest.raises(ProfileError, match=r"^staging.yaml:7: protected: Input should be a valid boolean"):
        load_profile("staging.yaml")


def test_missing_required_field_points_at_its_parent(tmp_path):
    text = """\
    name: staging
    ray:
      dashboard_url: http://10.0.0.1:8265
    storage:
      path: /x
    """
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 2, "ray.gcs_address",
                   "required field 'gcs_address' is missing")


def test_missing_top_level_fields(tmp_path):
    msg = error_of(tmp_path, "name: x\n")
    assert "2 problems" in msg
    assert_problem(msg, tmp_path / "staging.yaml", 1, "ray", "required field 'ray' is missing")
    assert_problem(msg, tmp_path / "staging.yaml", 1, "storage", "required field 'storage' is missing")


def test_typo_key_rejected_with_suggestion(tmp_path):
    text = MINIMAL + """\
safety:
  max_live_fault: 2
"""
    msg = error_of(tmp_path, text)
    assert_problem(msg, tmp_path / "staging.yaml", 8, "safety.max_live_fault",
                   "unknown field 'max_live_fault' (did you mean 'max_live_faults'?)")
    assert "allowed here: allow_head, allowlist" in msg


def test_typo_at_top_level_and_in_list(tmp_path):
    text = MINIMAL + """\
protcted: true
safety:
  allowlist:
    - address: 10.0.0.2
    - adress: 10.0.0.3
"""
    msg = error_of(tmp_path, text)
    assert_problem(msg, tmp_path / "staging.yaml", 7, "protcted", "did you mean 'protected'?")
    assert_problem(msg, tmp_path / "staging.yaml", 11, "safety.allowlist[1].adress", "unknown field 'adress'")


def test_several_problems_sorted_by_line(tmp_path):
    text = MINIMAL + """\
hosts:
  defaults:
    transport: telnet
    ssh:
      connect_timeout_s: -1
"""
    msg = error_of(tmp_path, text)
    lines = msg.splitlines()
    assert lines[0].endswith("2 problems:")
    assert_problem(msg, tmp_path / "staging.yaml", 9, "hosts.defaults.transport", "'ssh', 'local' or 'k8s'")
    assert_problem(msg, tmp_path / "staging.yaml", 11, "hosts.defaults.ssh.connect_timeout_s",
                   "greater than 0, got -1")
    assert lines[1].startswith(f"{tmp_path / 'staging.yaml'}:9:")


def test_file_missing(tmp_path):
    with pytest.raises(ProfileError, match=r"nope.yaml: profile file not found"):
        load_profile(tmp_path / "nope.yaml")


def test_directory_given(tmp_path):
    with pytest.raises(ProfileError, match="is a directory"):
        load_profile(tmp_path)


def test_not_yaml_names_the_line(tmp_path):
    text = MINIMAL + "hosts:\n  defaults: [unclosed\n  other: 1\n"
    msg = error_of(tmp_path, text)
    assert re.match(rf"{re.escape(str(tmp_path / 'staging.yaml'))}:\d+: not valid YAML: ", msg), msg
    line = int(msg.split(":")[1])
    assert 8 <= line <= 10


def test_tab_indent_is_not_yaml(tmp_path):
    msg = error_of(tmp_path, MINIMAL + "safety:\n\tallow_head: true\n")
    assert re.match(rf"{re.escape(str(tmp_path / 'staging.yaml'))}:8: not valid YAML", msg), msg


def test_binary_file(tmp_path):
    path = tmp_path / "staging.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProfileError, match="not a text file"):
        load_profile(path)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n", "~\n"])
def test_empty_file(tmp_path, text):
    msg = error_of(tmp_path, text)
    assert msg.startswith(f"{tmp_path / 'staging.yaml'}: the profile is empty")


@pytest.mark.parametrize("text, got", [("- a\n- b\n", "a list"), ("just a string\n", "a single value")])
def test_top_level_not_a_mapping(tmp_path, text, got):
    msg = error_of(tmp_path, text)
    assert msg.startswith(f"{tmp_path / 'staging.yaml'}:1: the profile must be a mapping")
    assert got in msg


def test_two_documents_rejected(tmp_path):
    msg = error_of(tmp_path, MINIMAL + "---\nname: other\n")
    assert "not valid YAML" in msg and "single document" in msg


def test_duplicate_key(tmp_path):
    text = MINIMAL + "name: again\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 7, "name", "duplicate key (first given on line 1)")


def test_key_yaml_reads_as_bool_or_number(tmp_path):
    msg = error_of(tmp_path, MINIMAL + "safety:\n  on: true\n  1: x\n")
    assert_problem(msg, tmp_path / "staging.yaml", 8, "safety.on", "YAML reads this key as a bool, not a name; quote it")
    assert_problem(msg, tmp_path / "staging.yaml", 9, "safety.1", "as an int")


def test_section_of_the_wrong_shape(tmp_path):
    msg = error_of(tmp_path, MINIMAL + "faults: [raylet-kill]\nsafety:\n")
    assert_problem(msg, tmp_path / "staging.yaml", 7, "faults", "Input should be a mapping of field: value, got a list")
    assert_problem(msg, tmp_path / "staging.yaml", 8, "safety", "mapping of field: value, got None")


def test_anchors_and_merge_keys(tmp_path):
    text = MINIMAL + """\
x-ssh: &ssh {user: ubuntu, port: 2200}
"""
    # an unknown top-level key, even as an anchor holder, is refused
    assert "unknown field 'x-ssh'" in error_of(tmp_path, text)
    text = MINIMAL + """\
hosts:
  defaults:
    ssh: &ssh {user: ubuntu, port: 2200}
  overrides:
    - match: {hostname: "gpu-*"}
      ssh:
        <<: *ssh
        port: 2201
"""
    p = load_profile(write(tmp_path, text))
    ssh = p.access_for("10.0.0.9", "gpu-1").ssh
    assert (ssh.user, ssh.port) == ("ubuntu", 2201)


def test_alias_bomb_refused(tmp_path):
    text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 7):
        text += f"{'abcdefg'[i]}: &{'abcdefg'[i]} [{', '.join(['*' + 'abcdefg'[i - 1]] * 10)}]\n"
    assert "expands to more than" in error_of(tmp_path, text)


def test_recursive_alias(tmp_path):
    msg = error_of(tmp_path, MINIMAL + "nodes: &n {discovery: ray, self: *n}\n")
    assert "nodes.self" in msg


def test_addresses_validated(tmp_path):
    text = """\
    name: staging
    ray:
      dashboard_url: 10.0.0.1:8265
      gcs_address: ray://10.0.0.1:10001
      driver_ip: my-laptop
    storage:
      path: /x
    """
    msg = error_of(tmp_path, text)
    f = tmp_path / "staging.yaml"
    assert_problem(msg, f, 3, "ray.dashboard_url", "must be http://host:port")
    assert_problem(msg, f, 4, "ray.gcs_address", "without a scheme")
    assert_problem(msg, f, 5, "ray.driver_ip", "is no longer used: the harness is no Ray driver")
    msg = error_of(tmp_path, MINIMAL.replace("10.0.0.1:6379", "10.0.0.1:99999"))
    assert_problem(msg, f, 4, "ray.gcs_address", "out of range")
    p = load_profile(write(tmp_path, MINIMAL.replace("10.0.0.1:6379", "'[fd00::1]:6379'")))
    assert p.ray.gcs_host == "fd00::1"


def test_bad_name(tmp_path):
    msg = error_of(tmp_path, MINIMAL.replace("name: staging", "name: my cluster/1"))
    assert_problem(msg, tmp_path / "staging.yaml", 1, "name", "letters, digits")


def test_jump_host_format(tmp_path):
    text = MINIMAL + "hosts:\n  defaults:\n    ssh:\n      jump_host: 'a@b@c'\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 10, "hosts.defaults.ssh.jump_host",
                   "[user@]host[:port]")
    p = load_profile(write(tmp_path, text.replace("a@b@c", "bastion")))
    assert p.hosts.defaults.ssh.jump() == (None, "bastion", 22)


def test_ssh_without_any_authentication(tmp_path):
    text = MINIMAL + "hosts:\n  defaults:\n    ssh:\n      use_agent: false\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 9, "hosts.defaults.ssh",
                   "no way to authenticate")
    # the same through an override, caught at load time after merging
    text = MINIMAL + """\
hosts:
  overrides:
    - match: {address: 10.0.0.0/24}
      ssh: {use_agent: false}
"""
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 10, "hosts.overrides[0].ssh",
                   "no way to authenticate")


def test_k8s_transport_needs_kubernetes_section(tmp_path):
    text = MINIMAL + "hosts:\n  defaults:\n    transport: k8s\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 9, "hosts.defaults.transport",
                   "needs a kubernetes: section")


def test_kubernetes_section(tmp_path):
    text = MINIMAL + "kubernetes:\n  namespace: ML_Staging\n  ray_cluster: train\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 8, "kubernetes.namespace", "DNS label")
    text = MINIMAL + "kubernetes:\n  namespace: ml\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 7, "kubernetes.ray_cluster",
                   "required field 'ray_cluster' is missing")
    p = load_profile(write(tmp_path, MINIMAL + "kubernetes:\n  ray_cluster: train\n"))
    assert p.kubernetes.namespace == "default" and p.kubernetes.kubeconfig is None


# -- secrets --------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["password", "ssh_password", "passphrase", "token", "apiKey", "api_key",
                                 "client_secret", "HF_TOKEN", "private_key"])
def test_secret_fields_rejected(tmp_path, key):
    text = MINIMAL + f"hosts:\n  defaults:\n    ssh:\n      {key}: hunter2\n"
    msg = error_of(tmp_path, text)
    assert_problem(msg, tmp_path / "staging.yaml", 10, f"hosts.defaults.ssh.{key}",
                   "put secrets in your SSH agent or key file, not in the profile")
    assert "hunter2" not in msg


def test_secret_in_runtime_env_rejected(tmp_path):
    text = MINIMAL + """\
workload:
  entrypoint: python train.py
  runtime_env:
    env_vars:
      TOKENIZERS_PARALLELISM: "false"
      WANDB_API_KEY: abc123
"""
    msg = error_of(tmp_path, text)
    assert_problem(msg, tmp_path / "staging.yaml", 12, "workload.runtime_env.env_vars.WANDB_API_KEY",
                   "not in the profile")
    assert "TOKENIZERS" not in msg and "abc123" not in msg


def test_secret_values_rejected(tmp_path):
    text = MINIMAL + "hosts:\n  defaults:\n    ssh:\n      key_file: \"-----BEGIN OPENSSH PRIVATE KEY-----\\nAAAA\"\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 10, "hosts.defaults.ssh.key_file",
                   "contains a PEM private key")
    text = MINIMAL.replace("/mnt/shared/chaos", "s3://AKIAABCDEFGHIJKLMNOP@bucket/x")
    assert "AWS access key id" in error_of(tmp_path, text)


def test_credentials_in_urls_rejected(tmp_path):
    msg = error_of(tmp_path, MINIMAL.replace("http://10.0.0.1:8265", "http://admin:pw@10.0.0.1:8265"))
    assert_problem(msg, tmp_path / "staging.yaml", 3, "ray.dashboard_url", "must not carry credentials")


def test_secret_name_words():
    assert not any(map(is_secret_name, ["key_file", "known_hosts", "TOKENIZERS_PARALLELISM", "use_agent",
                                        "monkey", "tokenizer"]))
    assert all(map(is_secret_name, ["db-password", "GithubToken", "AWS_SECRET_ACCESS_KEY", "bearer"]))


# -- workload -------------------------------------------------------------------------------
def test_workload_exactly_one_kind(tmp_path):
    both = MINIMAL + "workload:\n  reference: {steps: 10}\n  entrypoint: python train.py\n"
    assert_problem(error_of(tmp_path, both), tmp_path / "staging.yaml", 7, "workload", "exactly one of")
    assert "both are set" in error_of(tmp_path, both)
    neither = MINIMAL + "workload:\n  step_metric: step\n"
    assert "neither is set" in error_of(tmp_path, neither)
    mixed = MINIMAL + "workload:\n  reference: {}\n  working_dir: ./x\n"
    assert "working_dir only apply to an entrypoint workload" in error_of(tmp_path, mixed)


def test_entrypoint_workload(tmp_path):
    text = MINIMAL + """\
workload:
  entrypoint: python train.py --epochs 3
  working_dir: ./trainer
  runtime_env: {pip: [torch], env_vars: {NCCL_DEBUG: WARN}}
  step_metric: global_step
"""
    w = load_profile(write(tmp_path, text)).workload
    assert (w.kind, w.entrypoint, w.step_metric, w.runtime_env["env_vars"]) == \
        ("entrypoint", "python train.py --epochs 3", "global_step", {"NCCL_DEBUG": "WARN"})
    bad = text.replace("NCCL_DEBUG: WARN", "NCCL_DEBUG: 1")
    assert_problem(error_of(tmp_path, bad), tmp_path / "staging.yaml", 10, "workload.runtime_env",
                   "must map names to strings")
    empty = text.replace("python train.py --epochs 3", "' '")
    assert_problem(error_of(tmp_path, empty), tmp_path / "staging.yaml", 8, "workload.entrypoint",
                   "entrypoint is empty")


def test_reference_workload_checks(tmp_path):
    text = MINIMAL + "workload:\n  reference:\n    steps: 4\n    checkpoint_every: 5\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 8, "workload.reference",
                   "never commit a checkpoint")
    text = MINIMAL + "workload:\n  reference:\n    num_workers: 0\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 9, "workload.reference.num_workers",
                   "greater than or equal to 1")


def test_an_elastic_reference_workload_takes_min_and_max_and_a_resize_interval(tmp_path):
    ok = MINIMAL + "workload:\n  reference:\n    num_workers: [2, 4]\n    resize_interval_s: 10\n"
    path = tmp_path / "ok.yaml"
    path.write_text(ok)
    reference = load_profile(path).workload.reference
    assert (reference.num_workers, reference.resize_interval_s) == ((2, 4), 10.0)
    staging = tmp_path / "staging.yaml"
    for value, problem in (("[4, 2]", "needs min <= max"), ("[0, 2]", "greater than or equal to 1"),
                           ("[1, 2, 3]", "give a number of workers N, or [min, max]")):
        text = MINIMAL + f"workload:\n  reference:\n    num_workers: {value}\n"
        assert_problem(error_of(tmp_path, text), staging, 9, "workload.reference.num_workers", problem)
    text = MINIMAL + "workload:\n  reference:\n    num_workers: 3\n    resize_interval_s: 10\n"
    assert_problem(error_of(tmp_path, text), staging, 8, "workload.reference", "applies to an elastic run only")


# -- faults ---------------------------------------------------------------------------------
def test_unknown_fault_kind_names_known_ones(tmp_path):
    text = MINIMAL + "faults:\n  raylet_kill: {slo_detect_s: 5}\n  gpu-melt: {}\n"
    msg = error_of(tmp_path, text)
    f = tmp_path / "staging.yaml"
    assert_problem(msg, f, 8, "faults.raylet_kill", "unknown fault kind 'raylet_kill' (did you mean 'raylet-kill'?)")
    assert_problem(msg, f, 9, "faults.gpu-melt", "known kinds: " + ", ".join(catalog.KINDS))


def test_fault_slos_and_budgets(tmp_path):
    text = MINIMAL + """\
faults:
  defaults: {slo_detect_s: 20, slo_recover_s: 200}
  raylet-kill: {slo_detect_s: 5}
  partition: {slo_detect_s: 10, slo_recover_s: 60, expected_budget: controller}
"""
    p = load_profile(write(tmp_path, text))
    assert p.slo_for("raylet-kill") == (5.0, 200.0)
    assert p.slo_for("partition") == (10.0, 60.0)
    assert p.slo_for("cuda") == (20.0, 200.0)
    assert p.faults.get("partition").expected_budget == "controller" and p.faults.get("xid") is None
    assert catalog.kind("xid").budget_class is None
    with pytest.raises(ProfileError, match="unknown fault kind 'melt'; known kinds: raylet-kill"):
        p.slo_for("melt")


def test_catalog_slos_apply_where_the_profile_sets_none(tmp_path, monkeypatch):
    monkeypatch.setitem(catalog.KINDS, "partition", dataclasses.replace(catalog.KINDS["partition"], slo_detect_s=8.0, slo_recover_s=90.0))
    assert load_profile(write(tmp_path, MINIMAL)).slo_for("partition") == (8.0, 90.0)
    text = MINIMAL + "faults:\n  defaults: {slo_recover_s: 200}\n"
    assert load_profile(write(tmp_path, text)).slo_for("partition") == (8.0, 200.0)


def test_fault_slo_problems(tmp_path):
    text = MINIMAL + """\
faults:
  defaults: {expected_budget: worker_group}
  cuda: {slo_detect_s: 50, slo_recover_s: 10}
  drain: {expected_budget: spot}
"""
    msg = error_of(tmp_path, text)
    f = tmp_path / "staging.yaml"
    assert_problem(msg, f, 8, "faults.defaults.expected_budget", "unknown field")
    assert_problem(msg, f, 9, "faults.cuda", "slo_recover_s (10.0) < slo_detect_s (50.0)")
    assert_problem(msg, f, 10, "faults.drain.expected_budget", "'worker_group', 'preemption' or 'controller'")


# -- hosts: access_for ----------------------------------------------------------------------
HOSTS = MINIMAL + """\
hosts:
  defaults:
    ssh: {user: ubuntu, key_file: ~/.ssh/id, jump_host: bastion:2222}
  overrides:
    - match: {address: 10.0.1.7}
      ssh: {port: 2207}
    - match: {address: 10.0.1.0/24}
      ssh: {user: dmz, jump_host: null}
    - match: {hostname: "GPU-*"}
      ssh: {user: gpu}
    - match: {label: "pool=spot"}
      transport: local
      ssh: {connect_timeout_s: 3}
"""


def test_access_for_merges_defaults_and_first_matching_override(tmp_path):
    p = load_profile(write(tmp_path, HOSTS))
    plain = p.access_for("10.0.0.5", "cpu-1", {}).ssh
    assert (plain.user, plain.port, plain.key_file, plain.jump()) == ("ubuntu", 22, "~/.ssh/id", (None, "bastion", 2222))
    exact = p.access_for("10.0.1.7", "gpu-7").ssh  # first match wins: the exact address, not the CIDR or the glob
    assert (exact.user, exact.port, exact.jump_host) == ("ubuntu", 2207, "bastion:2222")
    cidr = p.access_for("10.0.1.8", "gpu-8").ssh
    assert (cidr.user, cidr.port, cidr.jump_host, cidr.key_file) == ("dmz", 22, None, "~/.ssh/id")
    glob = p.access_for("10.0.2.1", "gpu-a100-1").ssh  # hostname globs are case-insensitive
    assert glob.user == "gpu"
    access = p.access_for("10.0.3.1", "cpu-3", {"pool": "spot"})
    assert (access.transport, access.ssh.connect_timeout_s, access.ssh.user) == ("local", 3.0, "ubuntu")
    assert p.access_for("10.0.3.1", "cpu-3", {"pool": "ondemand"}).transport == "ssh"
    assert p.access_for("10.0.3.1", None, None).ssh.user == "ubuntu"
    assert p.hosts.defaults.ssh.key_path == Path("~/.ssh/id").expanduser()


def test_override_match_validated(tmp_path):
    text = MINIMAL + """\
hosts:
  overrides:
    - match: {address: gpu-1}
    - match: {label: novalue}
    - match: {}
"""
    msg = error_of(tmp_path, text)
    f = tmp_path / "staging.yaml"
    assert_problem(msg, f, 9, "hosts.overrides[0].match.address", "IP address or a CIDR range")
    assert_problem(msg, f, 10, "hosts.overrides[1].match.label", "key=value")
    assert_problem(msg, f, 11, "hosts.overrides[2].match", "exactly one of address, hostname, label")


# -- safety settings, protected ---------------------------------------------------------------
def test_safety_settings_validated(tmp_path):
    text = MINIMAL + "safety:\n  max_live_faults: 0\n  unhealthy_for_s: -5\n  allow_head: perhaps\n"
    msg = error_of(tmp_path, text)
    f = tmp_path / "staging.yaml"
    assert_problem(msg, f, 8, "safety.max_live_faults", "greater than or equal to 1")
    assert_problem(msg, f, 9, "safety.unhealthy_for_s", "greater than or equal to 0")
    assert_problem(msg, f, 10, "safety.allow_head", "valid boolean")


def test_protected_profile_refused(tmp_path):
    p = load_profile(write(tmp_path, MINIMAL + "protected: true\n"))
    with pytest.raises(ProfileError, match=r"profile 'staging' \(.*staging.yaml\) is protected: the harness refuses"):
        p.ensure_not_protected()
    load_profile(write(tmp_path, MINIMAL)).ensure_not_protected()  # not protected: no error


# -- embedded profiles, dump ----------------------------------------------------------------------
def test_embedded_profile_round_trip(tmp_path):
    data = embedded_profile("127.0.1.1:61000", "http://127.0.1.1:61001", tmp_path / "storage", [
        {"address": "127.0.1.2", "hostname": "worker-1"},
        {"address": "198.18.0.3", "hostname": "th-2", "transport": "ssh",
         "ssh": {"user": "root", "port": 22, "key_file": str(tmp_path / "id"),
                 "known_hosts": str(tmp_path / "known_hosts")}},
    ])
    path = dump_profile(data, tmp_path / "out" / "embedded.yaml")
    assert path.read_text().startswith("# ray-chaos-harness profile")
    assert load_yaml(path.read_text()) == data
    p = load_profile(path)
    assert p.name == "embedded" and "driver_ip" not in data["ray"]
    assert p.access_for("127.0.1.2").transport == "local"
    th = p.access_for("198.18.0.3")
    assert (th.transport, th.ssh.key_file, th.ssh.trust_on_first_use) == ("ssh", str(tmp_path / "id"), False)
    assert [s.address for s in p.safety.allowlist] == ["127.0.1.2", "198.18.0.3"]
    assert not p.safety.allow_head
    # a Profile dumps too, and reloads equal
    again = load_profile(dump_profile(p, tmp_path / "again.yaml"))
    assert again.model_dump() == p.model_dump()


def test_embedded_profile_rejects_bad_hosts(tmp_path):
    with pytest.raises(ProfileError, match="needs address"):
        embedded_profile("127.0.1.1:6379", "http://127.0.1.1:8265", "/tmp/x", [{"hostname": "w"}])
    with pytest.raises(ProfileError, match="local or ssh"):
        embedded_profile("127.0.1.1:6379", "http://127.0.1.1:8265", "/tmp/x", [{"address": "127.0.1.2",
                                                                                "transport": "k8s"}])
    with pytest.raises(ProfileError, match="storage.path: must be an absolute path"):
        embedded_profile("127.0.1.1:6379", "http://127.0.1.1:8265", "rel", [{"address": "127.0.1.2"}])


def test_dump_refuses_invalid_profile(tmp_path):
    with pytest.raises(ProfileInvalid, match="ray: required field"):
        dump_profile({"name": "x", "storage": {"path": "/x"}}, tmp_path / "x.yaml")
    assert not (tmp_path / "x.yaml").exists()


def test_profile_from_dict_errors_have_no_line():
    with pytest.raises(ProfileInvalid) as e:
        profile_from_dict({"name": "x", "ray": {"dashboard_url": "http://h:1", "gcs_address": "h:2"},
                           "storage": {"path": "/x"}, "safety": {"bogus": 1}}, "cli")
    assert str(e.value).startswith("cli: safety.bogus: unknown field 'bogus'")
    assert e.value.problems[0].line is None


def test_parse_profile_text():
    p = parse_profile(MINIMAL, "<inline>")
    assert isinstance(p, Profile) and p.source == "<inline>"


def test_secret_in_command_finds_tokens_and_keys_but_not_ordinary_flags():
    from chaos.profile import secret_in_command

    assert secret_in_command("HF_TOKEN=hf_x python train.py") .startswith("HF_TOKEN=")
    assert secret_in_command("python train.py --api-key abc").startswith("--api-key")
    assert secret_in_command("python t.py --aws AKIAABCDEFGHIJKLMNOP") == "an AWS access key id"
    assert secret_in_command("TOKENIZERS_PARALLELISM=false python train.py --lr 0.1 --steps 3") is None


# -- kubernetes: connection, HyperPod ----------------------------------------------------------
def test_kuberay_hyperpod_example_loads_for_the_kubernetes_backend():
    from chaos.backends import KubernetesBackend, for_profile

    p = load_profile(EXAMPLES / "kuberay-hyperpod-eks.yaml")
    k = p.kubernetes
    assert (k.namespace, k.ray_cluster, k.in_cluster, k.request_timeout_s) == ("ml-staging", "train", False, 30.0)
    assert (k.hyperpod.cluster_name, k.hyperpod.region, k.hyperpod.endpoint_url) == \
        ("ml-staging-hyperpod", "us-west-2", None)
    assert not p.safety.allow_head and [s.label for s in p.safety.allowlist] == \
        ["sagemaker.amazonaws.com/instance-group-name=gpu-workers"]
    assert isinstance(for_profile(p), KubernetesBackend)


def test_kubernetes_connection_defaults(tmp_path):
    k = load_profile(write(tmp_path, MINIMAL + "kubernetes:\n  ray_cluster: train\n")).kubernetes
    assert (k.context, k.in_cluster, k.request_timeout_s, k.hyperpod) == (None, False, 30.0, None)


def test_in_cluster_excludes_kubeconfig_and_context(tmp_path):
    text = MINIMAL + "kubernetes:\n  ray_cluster: train\n  in_cluster: true\n  context: staging\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 7, "kubernetes",
                   "in_cluster: true uses the pod's service account; context would be ignored")


@pytest.mark.parametrize("field, value, problem", [
    ("request_timeout_s", "0", "greater than 0"),
    ("context", "' '", "context is empty"),
    ("kubeconfig", "''", "must be a file path"),
])
def test_kubernetes_connection_fields(tmp_path, field, value, problem):
    text = MINIMAL + f"kubernetes:\n  ray_cluster: train\n  {field}: {value}\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", line_of(text, f"{field}:"),
                   f"kubernetes.{field}", problem)


@pytest.mark.parametrize("field, value, problem", [
    ("cluster_name", "my_cluster", "the HyperPod cluster's name"),
    ("region", "uswest2", "an AWS region name like us-west-2"),
    ("endpoint_url", "sagemaker.local:9000", "must be http(s)://host[:port]"),
    ("endpoint_url", "https://AKID:secret@sagemaker.local", "must not carry credentials"),
])
def test_hyperpod_fields_name_the_problem(tmp_path, field, value, problem):
    fields = {"cluster_name": "ml-hp", "region": "us-west-2", field: value}
    text = MINIMAL + "kubernetes:\n  ray_cluster: train\n  hyperpod:\n" + \
        "".join(f"    {k}: {v}\n" for k, v in fields.items())
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", line_of(text, f"{field}: {value}"),
                   f"kubernetes.hyperpod.{field}", problem)


def test_hyperpod_needs_cluster_and_region_and_accepts_an_arn(tmp_path):
    text = MINIMAL + "kubernetes:\n  ray_cluster: train\n  hyperpod:\n    region: us-east-1\n"
    assert_problem(error_of(tmp_path, text), tmp_path / "staging.yaml", 9, "kubernetes.hyperpod.cluster_name",
                   "required field")
    arn = "arn:aws:sagemaker:us-east-1:111122223333:cluster/abcdef123456"
    p = load_profile(write(tmp_path, text + f"    cluster_name: {arn}\n    endpoint_url: http://127.0.0.1:9000/\n"))
    assert (p.kubernetes.hyperpod.cluster_name, p.kubernetes.hyperpod.endpoint_url) == (arn, "http://127.0.0.1:9000")
