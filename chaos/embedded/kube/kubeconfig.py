"""A kubeconfig pointing at an emulated API server, for kubectl and ``kubernetes.config``."""

from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML


def write_kubeconfig(path: Path, url: str, token: str = "emulated-token", namespace: str = "default",
                     name: str = "emulated") -> Path:
    """Write a one-context kubeconfig (plain HTTP, bearer token: the server accepts any)."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": url}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        YAML(typ="safe", pure=True).dump(config, f)
    return path
