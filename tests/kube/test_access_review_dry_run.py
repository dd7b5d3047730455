"""SelfSubjectAccessReview, server-side dry run and Pod Security admission on the emulated API
server, driven by the real kubectl (1.31 sends the review as JSON, 1.33 as protobuf) and the
official Python client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from chaos.embedded.kube import ApiServer, Rbac, Rule
from chaos.embedded.kube.admission import ENFORCE
from chaos.embedded.kube.resources import NAMESPACES, PODS, prepare_new
from kube_helpers import SLEEPER, add_node, bundled_kubectl, make_kubectl

USER = "system:serviceaccount:ml:chaos"
RBAC = Rbac((Rule(("get", "list", "watch"), ("pods",), ("ml",)), Rule(("create",), ("pods/eviction",)),
             Rule(("patch",), ("nodes",))), user=USER)
PRIVILEGED_SHELL = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "shell"},
    "spec": {"nodeName": "n1", "hostPID": True, "restartPolicy": "Never",
             "containers": [{"name": "shell", "image": "busybox:1.36", "command": SLEEPER,
                             "securityContext": {"privileged": True},
                             "volumeMounts": [{"name": "kmsg", "mountPath": "/dev/kmsg"}]}],
             "volumes": [{"name": "kmsg", "hostPath": {"path": "/dev/kmsg"}}]}}
BASELINE_REFUSAL = ('pods "shell" is forbidden: violates PodSecurity "baseline:latest": host namespaces (hostPID=true), '
                    'hostPath volumes (volume "kmsg"), privileged (container "shell" must not set '
                    "securityContext.privileged=true)")


def add_namespace(server: ApiServer, name: str, labels: dict | None = None) -> None:
    server.store.create(NAMESPACES.plural, prepare_new(NAMESPACES, {"metadata": {"name": name,
                                                                                 "labels": labels or {}}}, None))


def api_client(server: ApiServer) -> client.ApiClient:
    config = client.Configuration(host=server.url, api_key={"authorization": "any-token"},
                                  api_key_prefix={"authorization": "Bearer"})
    return client.ApiClient(config)


@pytest.fixture
def rbac_server(kubelet):
    with ApiServer(lifecycle=kubelet, rbac=RBAC) as api:
        add_namespace(api, "ml")
        yield api


# -- SelfSubjectAccessReview -----------------------------------------------------------------
@pytest.mark.parametrize("minor", [31, 33])
def test_kubectl_auth_can_i_answers_from_the_allow_list(rbac_server, tmp_path, minor):
    kubectl = make_kubectl(bundled_kubectl(minor), rbac_server, tmp_path, str(minor))

    def can_i(*args: str) -> tuple[int, str]:
        result = kubectl.run("auth", "can-i", *args)
        return result.returncode, result.stdout.strip()

    assert can_i("list", "pods", "-n", "ml") == (0, "yes")
    assert can_i("delete", "pods", "-n", "ml") == (1, "no")
    assert can_i("list", "pods", "-n", "other") == (1, "no")  # the rule is the namespace's only
    assert can_i("create", "pods", "--subresource=eviction", "-n", "other") == (0, "yes")
    assert can_i("create", "pods", "--subresource=exec", "-n", "ml") == (1, "no")
    assert can_i("patch", "nodes") == (0, "yes")
    assert can_i("get", "/version") == (0, "yes")  # non-resource URLs are always served
    reviews = [(method, ctype) for method, path, ctype, _ in rbac_server.requests
               if path.startswith("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")]
    assert len(reviews) == 7
    # kubectl >= 1.32 sends the review as protobuf, older ones as JSON
    assert {ctype for _, ctype in reviews} == {"application/vnd.kubernetes.protobuf" if minor >= 32
                                               else "application/json"}


def test_python_client_access_review_allowed_denied_and_invalid(rbac_server):
    authz = client.AuthorizationV1Api(api_client(rbac_server))

    def review(**attrs) -> client.V1SubjectAccessReviewStatus:
        body = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(**attrs)))
        return authz.create_self_subject_access_review(body).status

    allowed = review(verb="watch", resource="pods", namespace="ml")
    assert allowed.allowed is True and "verbs [get,list,watch] on [pods] in ml" in allowed.reason
    denied = review(verb="delete", resource="pods", namespace="ml")
    assert denied.allowed is False and not denied.reason  # RBAC never denies: it only does not allow
    assert review(verb="create", resource="pods", subresource="eviction", namespace="ml").allowed is True
    assert review(verb="create", resource="pods", subresource="exec", namespace="ml").allowed is False
    with pytest.raises(ApiException) as bad:
        authz.create_self_subject_access_review(client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec()))
    assert bad.value.status == 422
    assert "exactly one of nonResourceAttributes or resourceAttributes" in json.loads(bad.value.body)["message"]
    # the review is a question, never a stored object: no list
    with pytest.raises(urllib.error.HTTPError) as listed:
        urllib.request.urlopen(f"{rbac_server.url}/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", timeout=10)
    assert listed.value.code == 405


def test_without_an_allow_list_every_review_is_allowed(server):
    authz = client.AuthorizationV1Api(api_client(server))
    body = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(verb="delete", resource="nodes")))
    assert authz.create_self_subject_access_review(body).status.allowed is True


# -- server-side dry run ---------------------------------------------------------------------
def test_kubectl_create_dry_run_server_stores_nothing(server, kubectl, kubelet, tmp_path):
    add_node(server, "n1")
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(PRIVILEGED_SHELL))
    before = server.store.resource_version
    result = kubectl.run("create", "-f", str(manifest), "--dry-run=server", "--validate=false", "-o", "json")
    assert result.returncode == 0, result.stderr
    answered = json.loads(result.stdout)
    assert answered["metadata"]["name"] == "shell" and answered["metadata"]["uid"]
    assert "resourceVersion" not in answered["metadata"] and answered["status"]["phase"] == "Pending"
    assert answered["spec"]["terminationGracePeriodSeconds"] == 30  # defaulted as on a real create
    assert server.store.get(PODS.plural, "default", "shell") is None
    assert server.store.resource_version == before and not kubelet.procs
    assert any("dryRun=All" in path for method, path, _, _ in server.requests if method == "POST")
    plain = kubectl.run("create", "-f", str(manifest), "--dry-run=server", "--validate=false")
    assert plain.returncode == 0 and plain.stdout.strip() == "pod/shell created (server dry run)"


def test_python_client_dry_run_generates_a_name_and_checks_conflicts(server):
    api = client.CoreV1Api(api_client(server))
    body = {**PRIVILEGED_SHELL, "metadata": {"generateName": "chaos-node-shell-"}}
    pod = api.create_namespaced_pod("default", body, dry_run="All")
    assert pod.metadata.name.startswith("chaos-node-shell-") and len(pod.metadata.name) == len("chaos-node-shell-") + 5
    assert server.store.list(PODS.plural, "default")[0] == []
    server.pods.create(prepare_new(PODS, {**PRIVILEGED_SHELL, "spec": {**PRIVILEGED_SHELL["spec"], "nodeName": None}},
                                   "default"))
    with pytest.raises(ApiException) as exists:
        api.create_namespaced_pod("default", PRIVILEGED_SHELL, dry_run="All")
    assert exists.value.status == 409
    with pytest.raises(ApiException) as missing_ns:
        api.create_namespaced_pod("nowhere", PRIVILEGED_SHELL, dry_run="All")
    assert missing_ns.value.status == 404
    with pytest.raises(ApiException) as bogus:
        api.create_namespaced_pod("default", body, dry_run="Some")
    assert bogus.value.status == 422 and 'supported values: "All"' in json.loads(bogus.value.body)["message"]
    # a dry run of another verb is refused, not carried out
    with pytest.raises(ApiException) as delete:
        api.delete_namespaced_pod("shell", "default", dry_run="All")
    assert delete.value.status == 400 and server.store.get(PODS.plural, "default", "shell") is not None


# -- Pod Security admission ------------------------------------------------------------------
def test_kubectl_sees_pod_security_refuse_a_privileged_pod_dry_run_or_not(server, kubectl, tmp_path):
    add_node(server, "n1")
    add_namespace(server, "base", {ENFORCE: "baseline"})
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(PRIVILEGED_SHELL))
    for dry in ("--dry-run=server", "--dry-run=none"):
        result = kubectl.run("create", "-n", "base", "-f", str(manifest), dry, "--validate=false")
        assert result.returncode == 1
        assert result.stderr.strip() == (f'Error from server (Forbidden): error when creating "{manifest}": '
                                          f"{BASELINE_REFUSAL}")
    assert server.store.list(PODS.plural, "base")[0] == []


def test_pod_security_levels(server):
    api = client.CoreV1Api(api_client(server))
    add_namespace(server, "open", {ENFORCE: "privileged"})
    add_namespace(server, "strict", {ENFORCE: "restricted", "pod-security.kubernetes.io/enforce-version": "v1.33"})
    add_namespace(server, "typo", {ENFORCE: "restriced"})
    assert api.create_namespaced_pod("open", PRIVILEGED_SHELL, dry_run="All").metadata.name == "shell"
    assert api.create_namespaced_pod("default", PRIVILEGED_SHELL, dry_run="All").metadata.name == "shell"
    with pytest.raises(ApiException) as refused:
        api.create_namespaced_pod("strict", PRIVILEGED_SHELL, dry_run="All")
    assert refused.value.status == 403 and json.loads(refused.value.body)["reason"] == "Forbidden"
    assert json.loads(refused.value.body)["message"] == (
        'pods "shell" is forbidden: violates PodSecurity "restricted:v1.33": allowPrivilegeEscalation != false '
        '(container "shell" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
        '(container "shell" must set securityContext.capabilities.drop=["ALL"]), host namespaces (hostPID=true), '
        'privileged (container "shell" must not set securityContext.privileged=true), restricted volume types '
        '(volume "kmsg" uses restricted volume type "hostPath"), runAsNonRoot != true (pod or container "shell" '
        'must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "shell" must set '
        'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
    with pytest.raises(ApiException) as unknown_level:  # an unknown level counts as restricted
        api.create_namespaced_pod("typo", PRIVILEGED_SHELL, dry_run="All")
    assert 'violates PodSecurity "restricted:latest"' in json.loads(unknown_level.value.body)["message"]
    compliant = {"metadata": {"name": "ok"}, "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "image": "busybox:1.36", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "scratch", "emptyDir": {}}]}}
    assert api.create_namespaced_pod("strict", compliant).metadata.resource_version
