"""A manifest's container run as its pod would run it, minus Kubernetes, for the tests of the
recipes (examples/kubernetes/): its command and args as one command line, its env, and each
volume mount's path standing for a directory of the test's (its working directory too) — the
only substitutions, made in the command line's text so that what runs is the manifest's."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ruamel.yaml import YAML


def documents(path: Path) -> list[dict]:
    return [d for d in YAML(typ="safe").load_all(path.read_text()) if d]


def cronjob_container(path: Path) -> dict:
    """The one container of the one CronJob in ``path``."""
    [cron] = [d for d in documents(path) if d["kind"] == "CronJob"]
    [container] = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return container


def command_line(container: dict, dirs: dict[str, Path]) -> str:
    """``container``'s command and args as one shell word list, each path of ``dirs`` (a volume's
    mountPath or the workingDir, every one of them given) replaced by its directory."""
    paths = {m["mountPath"] for m in container.get("volumeMounts", [])} | {container["workingDir"]}
    missing = paths - set(dirs)
    assert not missing, f"no directory stands for {sorted(missing)}"
    text = shlex.join([*container["command"], *container.get("args", [])])
    for path in sorted(dirs, key=len, reverse=True):  # /results/x before /results
        text = re.sub(rf"(?<![\w/.-]){re.escape(path)}(?![\w.-])", str(dirs[path]), text)
    return text


def environment(container: dict) -> dict[str, str]:
    """The container's env (literal values only: a valueFrom would need a cluster)."""
    env = {}
    for var in container.get("env", []):
        assert "value" in var, f"env {var['name']}: only literal values run outside a cluster"
        env[var["name"]] = str(var["value"])
    return env
