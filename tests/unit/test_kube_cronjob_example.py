"""examples/kubernetes/chaos-cronjob.yaml as far as it can be checked without a real cluster (the
emulated API server serves no CronJobs, so neither kubectl's server nor its client dry run can
take the manifest): every document is a valid object for the official client's models, its
profile loads, its names agree, its options exist, its image carries the Ray that
constraints.txt pins, and its script's exit status is the night's (bash with a stand-in
`ray-chaos` that records its calls).  Its RBAC is run against the emulator in
tests/kube/test_kube_faults.py; its script against the foreign-cluster stand-in in
tests/integration/test_recipes.py."""

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from kubernetes import client
from pod_script import command_line, cronjob_container, documents, environment
from ruamel.yaml import YAML

from chaos.profile import profile_from_dict

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kubernetes"
MANIFEST = EXAMPLE / "chaos-cronjob.yaml"
DOCS = documents(MANIFEST)
MODELS = {"ServiceAccount": "V1ServiceAccount", "Role": "V1Role", "RoleBinding": "V1RoleBinding",
          "ClusterRole": "V1ClusterRole", "ClusterRoleBinding": "V1ClusterRoleBinding",
          "ConfigMap": "V1ConfigMap", "PersistentVolumeClaim": "V1PersistentVolumeClaim", "CronJob": "V1CronJob"}


def of_kind(kind: str) -> dict:
    [doc] = [d for d in DOCS if d["kind"] == kind]
    return doc


def pod_spec() -> dict:
    return of_kind("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d["kind"])
def test_each_document_is_a_valid_object_for_the_official_client(doc):
    model = client.ApiClient().deserialize(json.dumps(doc), MODELS[doc["kind"]], "application/json")
    assert model.kind == doc["kind"] and model.metadata.name == doc["metadata"]["name"]


def test_the_profile_names_the_namespace_and_cluster_and_the_pod_joins_nothing():
    namespace = of_kind("CronJob")["metadata"]["namespace"]
    assert {d["metadata"].get("namespace", namespace) for d in DOCS} == {namespace}
    profile = profile_from_dict(YAML(typ="safe").load(of_kind("ConfigMap")["data"]["profile.yaml"]))
    kube = profile.kubernetes
    assert kube.in_cluster and kube.namespace == namespace and kube.ray_cluster in profile.ray.gcs_address
    [script] = cronjob_container(MANIFEST)["args"]
    assert "ray start" not in script  # the harness is no Ray driver: nothing of it runs as a node
    bound = {s["name"] for d in DOCS if d["kind"].endswith("Binding") for s in d["subjects"]}
    assert bound == {pod_spec()["serviceAccountName"]}
    assert of_kind("CronJob")["spec"]["concurrencyPolicy"] == "Forbid"  # one chaos run at a time


def test_the_run_writes_under_the_results_volume_with_options_the_plugin_has(capsys, monkeypatch):
    container = cronjob_container(MANIFEST)
    [script] = container["args"]
    run_line = re.search(r"^\s*(ray-chaos run .*?)(?:\|\||$)", script.replace("\\\n", " "), re.M).group(1)
    words = shlex.split(run_line)[2:]
    monkeypatch.chdir(ROOT)
    assert pytest.main(["--help", "-p", "no:cacheprovider"]) == 0
    known = capsys.readouterr().out
    options = [w for w in words if w.startswith("--") and w != "--profile"]
    assert options and all(re.search(rf"^\s+{re.escape(w)}\b", known, re.M) for w in options), options
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    assert volumes["results"]["persistentVolumeClaim"]["claimName"] == of_kind("PersistentVolumeClaim")["metadata"]["name"]
    assert re.search(rf"^\s*out={re.escape(mounts['results'])}/", script, re.M)
    assert '--chaos-reports "$out"' in run_line and '--alluredir "$out/allure-results"' in run_line
    assert re.search(rf'^\s*profile={re.escape(mounts["profile"])}/profile\.yaml$', script, re.M)


STUB = """#!/bin/bash
echo "$1" >> "$CALLS"
case "$1" in
  doctor) exit "$DOCTOR" ;;
  run) while [ $# -gt 0 ]; do [ "$1" = --alluredir ] && mkdir -p "$2"; shift; done; exit "$RUN" ;;
  sweep) exit "$SWEEP" ;;
esac
exit 64
"""


@pytest.mark.parametrize("doctor, run, sweep, calls, status", [
    (0, 0, 0, ["doctor", "run", "sweep"], 0),
    (1, 0, 0, ["doctor", "sweep"], 1),     # no run without a preflight, still a sweep
    (0, 1, 0, ["doctor", "run", "sweep"], 1),  # a failed verdict fails the pod, after the sweep
    (0, 2, 0, ["doctor", "run", "sweep"], 2),  # pytest's own status (2: interrupted) kept
    (0, 0, 1, ["doctor", "run", "sweep"], 1),  # a sweep that could not check fails it too
])
def test_the_pods_exit_status_is_the_nights(tmp_path, doctor, run, sweep, calls, status):
    container = cronjob_container(MANIFEST)
    dirs = {m["mountPath"]: tmp_path / m["name"] for m in container["volumeMounts"]}
    dirs[container["workingDir"]] = tmp_path / "workdir"
    for d in dirs.values():
        d.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray-chaos").write_text(STUB)
    (bin_dir / "ray-chaos").chmod(0o755)
    env = {**environment(container), "PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(tmp_path / "calls"),
           "DOCTOR": str(doctor), "RUN": str(run), "SWEEP": str(sweep)}
    done = subprocess.run(["sh", "-c", command_line(container, dirs)], cwd=dirs[container["workingDir"]], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == status, done.stdout + done.stderr
    assert (tmp_path / "calls").read_text().split() == calls
    night = re.search(r"^results: (\S+)$", done.stdout, re.M)[1]
    assert Path(night).parent == tmp_path / "results"
    assert (Path(night) / "allure-results").is_dir() == ("run" in calls)


def test_the_image_installs_the_wheel_on_the_ray_that_constraints_pins():
    pinned = re.search(r"^ray==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    dockerfile = (EXAMPLE / "Dockerfile").read_text()
    assert re.search(rf"^FROM rayproject/ray:{re.escape(pinned)}-py3\d+$", dockerfile, re.M)
    assert re.search(rf"pip install .*ray_chaos_harness-\*\.whl \"ray\[train,default\]=={re.escape(pinned)}\"",
                     dockerfile)
    assert "COPY . " not in dockerfile  # the wheel, not a clone
