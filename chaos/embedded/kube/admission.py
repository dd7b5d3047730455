"""Pod Security admission: a namespace's ``pod-security.kubernetes.io/enforce`` label refusing pods.

Real clusters label the namespaces teams run in ``baseline`` or ``restricted``, which refuses
the privileged, hostPID node-shell pod of the ``xid`` fault; the harness (and ``ray-chaos
doctor``'s server-side dry run) must report that refusal as the server words it:
``pods "p" is forbidden: violates PodSecurity "baseline:latest": host namespaces (hostPID=true),
hostPath volumes (volume "kmsg"), privileged (container "shell" must not set
securityContext.privileged=true)`` — the checks in the order of their IDs, as the
pod-security-admission library reports them.

Only the checks below are emulated (hostPorts, capabilities beyond ``drop``, sysctls, AppArmor,
SELinux, procMount, runAsUser and Windows fields are not); ``warn``/``audit`` labels and
exemptions are ignored; an unknown level counts as ``restricted`` (ours: fail closed).
"""

from __future__ import annotations

from typing import Callable

from chaos.embedded.kube.status import ApiError

ENFORCE = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION = "pod-security.kubernetes.io/enforce-version"
LEVELS = ("privileged", "baseline", "restricted")
# Volume types the restricted level allows (Pod Security Standards).
RESTRICTED_VOLUME_TYPES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret")


def _containers(spec: dict) -> list[dict]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []),
            *(spec.get("ephemeralContainers") or [])]


def _quoted(noun: str, names: list[str]) -> str:
    """``container "a"`` / ``containers "a", "b"`` as the library words a list."""
    return f"{noun}{'s' if len(names) > 1 else ''} " + ", ".join(f'"{n}"' for n in names)


def _security(container: dict) -> dict:
    return container.get("securityContext") or {}


def _host_namespaces(spec: dict) -> str | None:
    used = [f"{f}=true" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    return f"host namespaces ({', '.join(used)})" if used else None


def _host_path_volumes(spec: dict) -> str | None:
    names = [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]
    return f"hostPath volumes ({_quoted('volume', names)})" if names else None


def _privileged(spec: dict) -> str | None:
    names = [c["name"] for c in _containers(spec) if _security(c).get("privileged")]
    return f"privileged ({_quoted('container', names)} must not set securityContext.privileged=true)" \
        if names else None


def _allow_privilege_escalation(spec: dict) -> str | None:
    names = [c["name"] for c in _containers(spec) if _security(c).get("allowPrivilegeEscalation") is not False]
    return (f"allowPrivilegeEscalation != false ({_quoted('container', names)} must set "
            "securityContext.allowPrivilegeEscalation=false)") if names else None


def _capabilities(spec: dict) -> str | None:
    names = [c["name"] for c in _containers(spec)
             if "ALL" not in ((_security(c).get("capabilities") or {}).get("drop") or [])]
    return (f'unrestricted capabilities ({_quoted("container", names)} must set '
            'securityContext.capabilities.drop=["ALL"])') if names else None


def _restricted_volumes(spec: dict) -> str | None:
    bad = [(v.get("name", ""), next((k for k in v if k != "name"), "?")) for v in spec.get("volumes") or []]
    bad = [(name, kind) for name, kind in bad if kind not in RESTRICTED_VOLUME_TYPES]
    if not bad:
        return None
    kinds = sorted({kind for _, kind in bad})
    verb = "use" if len(bad) > 1 else "uses"
    return (f"restricted volume types ({_quoted('volume', [n for n, _ in bad])} {verb} restricted volume "
            f"{_quoted('type', kinds)})")


def _pod_or_containers(spec: dict, ok: Callable[[dict], bool | None], what: str) -> str | None:
    """A setting the pod may make for all its containers, each container overriding it."""
    pod_level = ok(spec.get("securityContext") or {})
    names = [c["name"] for c in _containers(spec)
             if not (ok(_security(c)) if ok(_security(c)) is not None else pod_level)]
    return f"pod or {_quoted('container', names)} must set {what}" if names else None


def _run_as_non_root(spec: dict) -> str | None:
    detail = _pod_or_containers(spec, lambda sc: sc.get("runAsNonRoot"), "securityContext.runAsNonRoot=true")
    return f"runAsNonRoot != true ({detail})" if detail else None


def _seccomp(spec: dict) -> str | None:
    def ok(sc: dict) -> bool | None:
        kind = (sc.get("seccompProfile") or {}).get("type")
        return None if kind is None else kind in ("RuntimeDefault", "Localhost")

    detail = _pod_or_containers(spec, ok, 'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"')
    return f"seccompProfile ({detail})" if detail else None


# (check ID, level, check): reported in ID order; restrictedVolumes replaces hostPathVolumes.
_CHECKS: tuple[tuple[str, str, Callable[[dict], str | None]], ...] = (
    ("allowPrivilegeEscalation", "restricted", _allow_privilege_escalation),
    ("capabilities_restricted", "restricted", _capabilities),
    ("hostNamespaces", "baseline", _host_namespaces),
    ("hostPathVolumes", "baseline", _host_path_volumes),
    ("privileged", "baseline", _privileged),
    ("restrictedVolumes", "restricted", _restricted_volumes),
    ("runAsNonRoot", "restricted", _run_as_non_root),
    ("seccompProfile_restricted", "restricted", _seccomp),
)


def violations(level: str, spec: dict) -> list[str]:
    """What ``level`` forbids in a pod spec, each as ``reason (detail)``."""
    if level == "privileged":
        return []
    found = []
    for check_id, check_level, check in _CHECKS:
        if check_level == "restricted" and level != "restricted":
            continue
        if check_id == "hostPathVolumes" and level == "restricted":
            continue
        detail = check(spec)
        if detail:
            found.append(detail)
    return found


def admit_pod(namespace: dict | None, pod: dict) -> None:
    """Refuse a pod its namespace's enforced level forbids: 403 as the PodSecurity plugin answers."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE)
    if level is None:
        return
    if level not in LEVELS:
        level = "restricted"
    found = violations(level, pod.get("spec") or {})
    if found:
        name = pod["metadata"]["name"]
        policy = f"{level}:{labels.get(ENFORCE_VERSION) or 'latest'}"
        raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: violates PodSecurity "{policy}": '
                       + ", ".join(found), {"name": name, "kind": "pods"})
