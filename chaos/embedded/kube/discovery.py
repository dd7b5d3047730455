"""``/version`` and legacy discovery (``/api``, ``/apis``, ``/api/v1``, ``/apis/<group>/<version>``).

kubectl reads discovery before every command (drain checks that ``pods/eviction`` is
advertised as ``policy/v1`` and otherwise deletes with a protobuf body), and the gcloud
kubectl dispatcher picks the kubectl whose minor matches ``/version``: 33 selects the
bundled kubectl 1.33, which execs over WebSocket (≤ 1.29 would use SPDY).  Aggregated
discovery is not served; clients fall back to these legacy documents.
"""

from __future__ import annotations

from chaos.embedded.kube.resources import CORE, GROUPS, Resource

MINOR = "33"
GIT_VERSION = f"v1.{MINOR}.1+chaos.emulated"


def version() -> dict:
    return {"major": "1", "minor": MINOR, "gitVersion": GIT_VERSION, "gitCommit": "emulated",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0",
            "compiler": "gc", "platform": "linux/amd64"}


def api_versions(server_address: str) -> dict:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def _group(name: str, version: str) -> dict:
    entry = {"groupVersion": f"{name}/{version}", "version": version}
    return {"name": name, "versions": [entry], "preferredVersion": entry}


def api_group_list() -> dict:
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [_group(name, version) for name, (version, _) in GROUPS.items()]}


def api_group(name: str) -> dict | None:
    if name not in GROUPS:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, GROUPS[name][0])}


def _entries(resource: Resource) -> list[dict]:
    entries = [{"name": resource.plural, "singularName": resource.singular, "namespaced": resource.namespaced,
                "kind": resource.kind, "verbs": list(resource.verbs),
                **({"shortNames": list(resource.short_names)} if resource.short_names else {})}]
    for sub, info in resource.subresources.items():
        entry = {"name": f"{resource.plural}/{sub}", "singularName": "", "namespaced": resource.namespaced,
                 "kind": info["kind"], "verbs": info["verbs"]}
        if "group" in info:
            entry.update(group=info["group"], version=info["version"])
        entries.append(entry)
    return entries


def resource_list(group: str, version: str) -> dict | None:
    if group == "":
        resources = list(CORE.values()) if version == "v1" else None
    else:
        served = GROUPS.get(group)
        resources = served[1] if served and served[0] == version else None
    if resources is None:
        return None
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}" if group else version,
            "resources": [e for r in resources for e in _entries(r)]}
