"""PATCH bodies: JSON merge patch (RFC 7386) and strategic merge patch for the fields used.

kubectl labels with a merge patch and cordons with a strategic merge patch; the Python
client sends every dict body as a strategic merge patch.  Strategic merge differs from a
merge patch only where the Go types carry a patch strategy: lists with a merge key are
merged element by element, ``metadata.finalizers`` is a set union, and the ``$patch``
/``$deleteFromPrimitiveList`` / ``$setElementOrder`` directives apply.  The merge keys of
the Pod and Node fields this server stores are listed below; every other list is replaced
whole (``spec.taints`` included: NodeSpec.Taints has no patch strategy).
"""

from __future__ import annotations

import copy
from typing import Any

from chaos.embedded.kube.status import bad_request, unsupported_media_type

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

_MERGE_KEYS = {
    "metadata.ownerReferences": "uid",
    "spec.containers": "name",
    "spec.initContainers": "name",
    "status.conditions": "type",
    "status.containerStatuses": "name",
    "status.addresses": "type",
}
_PRIMITIVE_SETS = {"metadata.finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _strategic_list(path: str, target: Any, patch: list) -> list:
    if path in _PRIMITIVE_SETS:
        merged = list(target) if isinstance(target, list) else []
        merged.extend(v for v in patch if v not in merged)
        return merged
    key = _MERGE_KEYS.get(path)
    if key is None or not isinstance(target, list):
        return [_strip(v) for v in patch]
    merged = [copy.deepcopy(v) for v in target]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise bad_request(f"strategic merge patch: list {path} element lacks its merge key {key!r}")
        index = next((i for i, v in enumerate(merged) if isinstance(v, dict) and v.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                merged.pop(index)
        elif index is None:
            merged.append(_strip(item))
        else:
            merged[index] = strategic_merge_patch(merged[index], item, path)
    return merged


def _strip(value: Any) -> Any:
    """A value from the patch with its directives removed (what is stored when nothing merges)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return copy.deepcopy(value)


def strategic_merge_patch(target: Any, patch: Any, path: str = "") -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip(patch)
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$patch", "$retainKeys"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        child = f"{path}.{key}" if path else key
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _strategic_list(child, result.get(key), value)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value, child)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    return result


def apply_patch(content_type: str, target: dict, patch: Any) -> dict:
    """``target`` patched as ``content_type`` says; 415 for JSON patch and apply patches."""
    media = content_type.split(";")[0].strip().lower()
    if media not in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
        raise unsupported_media_type(media)
    if not isinstance(patch, dict):
        raise bad_request("the patch body must be a JSON object")
    return merge_patch(target, patch) if media == MERGE_PATCH else strategic_merge_patch(target, patch)
