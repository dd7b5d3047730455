"""The emulated API server's building blocks, without HTTP: selectors, patches, the store."""

from __future__ import annotations

import asyncio

import pytest

from chaos.embedded.kube.patch import apply_patch, merge_patch, strategic_merge_patch
from chaos.embedded.kube.resources import NODES, generated_name, prepare_new
from chaos.embedded.kube.selectors import labels_match, parse_label_selector
from chaos.embedded.kube.status import ApiError
from chaos.embedded.kube.store import Store


@pytest.mark.parametrize("selector, labels, expected", [
    ("a=b", {"a": "b"}, True),
    ("a==b", {"a": "c"}, False),
    ("a!=b", {}, True),
    ("a in (b, c)", {"a": "c"}, True),
    ("a notin (b)", {}, True),
    ("a notin (b)", {"a": "b"}, False),
    ("a,!b", {"a": ""}, True),
    ("a,!b", {"a": "", "b": "x"}, False),
    ("example.com/k=v,x in (y)", {"example.com/k": "v", "x": "y"}, True),
    ("n>2", {"n": "x"}, False),
    ("", {"anything": "at all"}, True),
])
def test_label_selector_semantics(selector, labels, expected):
    assert labels_match(parse_label_selector(selector), labels) is expected


@pytest.mark.parametrize("selector", ["a in (b", "!a in (b)", "a=b c", "-bad=x", "a=" + "v" * 64])
def test_malformed_label_selectors_are_400(selector):
    with pytest.raises(ApiError) as err:
        parse_label_selector(selector)
    assert err.value.code == 400


def test_merge_patch_nulls_delete_and_lists_replace():
    node = {"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"taints": [{"key": "x"}]}}
    assert merge_patch(node, {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"taints": []}}) == \
        {"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"taints": []}}


def test_strategic_merge_patch_merge_keys_and_directives():
    pod = {"metadata": {"finalizers": ["a"]},
           "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}}
    patched = strategic_merge_patch(pod, {
        "metadata": {"finalizers": ["b", "a"]},
        "status": {"conditions": [{"type": "Ready", "status": "False"},
                                  {"type": "PodScheduled", "$patch": "delete"},
                                  {"type": "DisruptionTarget", "status": "True"}]}})
    assert patched["metadata"]["finalizers"] == ["a", "b"]
    assert patched["status"]["conditions"] == [{"type": "Ready", "status": "False"},
                                               {"type": "DisruptionTarget", "status": "True"}]
    node = {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}], "unschedulable": True}}
    assert strategic_merge_patch(node, {"spec": {"taints": [{"key": "y", "effect": "NoExecute"}]}})["spec"] == \
        {"taints": [{"key": "y", "effect": "NoExecute"}], "unschedulable": True}  # no patch strategy: replaced
    assert strategic_merge_patch(node, {"spec": {"$patch": "replace", "podCIDR": "10.0.0.0/24"}}) == \
        {"spec": {"podCIDR": "10.0.0.0/24"}}
    assert strategic_merge_patch(node, {"spec": {"unschedulable": None}}) == \
        {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}


def test_json_patch_is_unsupported():
    with pytest.raises(ApiError) as err:
        apply_patch("application/apply-patch+yaml", {}, {})
    assert err.value.code == 415


def test_generated_names_follow_the_apiserver():
    name = generated_name("x" * 70)
    assert len(name) == 63 and name.startswith("x" * 58)
    assert set(name[58:]) <= set("bcdfghjklmnpqrstvwxz2456789")


def node(name: str) -> dict:
    return prepare_new(NODES, {"metadata": {"name": name}}, None)


def test_store_versions_history_and_expiry():
    store = Store(history=3)
    for i in range(5):
        store.create(NODES.plural, node(f"n{i}"))
    assert [int(o["metadata"]["resourceVersion"]) for o in store.list(NODES.plural)[0]] == [1, 2, 3, 4, 5]
    assert [e.rv for e in store.events(NODES.plural)] == [3, 4, 5]
    loop = asyncio.new_event_loop()
    try:
        _, backlog, reached = store.watch(NODES.plural, 2, loop)  # events 3.. still held
        assert [e.rv for e in backlog] == [3, 4, 5] and reached == 5
        with pytest.raises(ApiError) as err:
            store.watch(NODES.plural, 1, loop)  # event 2 is gone
        assert err.value.code == 410 and err.value.reason == "Expired"
        _, current, _ = store.watch(NODES.plural, None, loop)
        assert [(e.type, e.obj["metadata"]["name"]) for e in current] == [("ADDED", f"n{i}") for i in range(5)]
    finally:
        store.close_watches()
        loop.close()
    with pytest.raises(ApiError) as err:
        store.create(NODES.plural, node("n0"))
    assert err.value.code == 409
    unchanged = store.update(NODES.plural, None, "n0", lambda n: None)
    assert unchanged["metadata"]["resourceVersion"] == "1" and store.resource_version == 5
