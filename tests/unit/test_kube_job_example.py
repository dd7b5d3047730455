"""examples/kubernetes/chaos-job.yaml as far as it can be checked without a real cluster (the
emulated API server serves no Jobs): every document is a valid object for the official
client's models, its profile loads, its names agree, its command runs a suite that exists
with options the plugin has, and its image carries the Ray that constraints.txt pins.  Its
RBAC is run against the emulator in tests/kube/test_kube_faults.py."""

import json
import re
import shlex
from pathlib import Path

import pytest
from kubernetes import client
from ruamel.yaml import YAML

from chaos.profile import profile_from_dict

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kubernetes"
DOCS = [d for d in YAML(typ="safe").load_all((EXAMPLE / "chaos-job.yaml").read_text()) if d]
MODELS = {"ServiceAccount": "V1ServiceAccount", "Role": "V1Role", "RoleBinding": "V1RoleBinding",
          "ClusterRole": "V1ClusterRole", "ClusterRoleBinding": "V1ClusterRoleBinding",
          "ConfigMap": "V1ConfigMap", "PersistentVolumeClaim": "V1PersistentVolumeClaim", "Job": "V1Job"}


def of_kind(kind: str) -> dict:
    [doc] = [d for d in DOCS if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d["kind"])
def test_each_document_is_a_valid_object_for_the_official_client(doc):
    model = client.ApiClient().deserialize(json.dumps(doc), MODELS[doc["kind"]], "application/json")
    assert model.kind == doc["kind"] and model.metadata.name == doc["metadata"]["name"]


def test_the_profile_names_the_jobs_namespace_and_cluster_and_the_pod_joins_nothing():
    namespace = of_kind("Job")["metadata"]["namespace"]
    assert {d["metadata"].get("namespace", namespace) for d in DOCS} == {namespace}
    profile = profile_from_dict(YAML(typ="safe").load(of_kind("ConfigMap")["data"]["profile.yaml"]))
    kube = profile.kubernetes
    assert kube.in_cluster and kube.namespace == namespace and kube.ray_cluster in profile.ray.gcs_address
    [script] = of_kind("Job")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "ray start" not in script  # the harness is no Ray driver: nothing of it runs as a node
    bound = {s["name"] for d in DOCS if d["kind"].endswith("Binding") for s in d["subjects"]}
    assert bound == {of_kind("Job")["spec"]["template"]["spec"]["serviceAccountName"]}


def test_the_job_runs_a_suite_that_exists_with_options_the_plugin_has(capsys, monkeypatch):
    container = of_kind("Job")["spec"]["template"]["spec"]["containers"][0]
    [script] = container["args"]
    run_line = re.search(r"^\s*(ray-chaos run .*?)$", script.replace("\\\n", " "), re.M).group(1)
    words = shlex.split(run_line)[2:]
    suites = [w for w in words if w.startswith("test_")]
    assert suites and all((ROOT / "suites" / s.split("::")[0]).is_file() for s in suites), suites
    monkeypatch.chdir(ROOT)
    assert pytest.main(["--help", "-p", "no:cacheprovider"]) == 0
    known = capsys.readouterr().out
    options = [w for w in words if w.startswith("--") and w != "--profile"]
    assert all(re.search(rf"^\s+{re.escape(w)}\b", known, re.M) for w in options), options
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/etc/ray-chaos", "/results"} <= mounts
    assert "--chaos-reports /results" in run_line and "--alluredir /results/allure-results" in run_line
    assert "--profile /etc/ray-chaos/profile.yaml" in run_line


def test_the_image_installs_the_wheel_on_the_ray_that_constraints_pins():
    pinned = re.search(r"^ray==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    dockerfile = (EXAMPLE / "Dockerfile").read_text()
    assert re.search(rf"^FROM rayproject/ray:{re.escape(pinned)}-py3\d+$", dockerfile, re.M)
    assert re.search(rf"pip install .*ray_chaos_harness-\*\.whl \"ray\[train,default\]=={re.escape(pinned)}\"",
                     dockerfile)
    assert "COPY . " not in dockerfile  # the wheel, not a clone
