"""REST verbs on the stored resources: list, watch, get, create, update, patch, delete, subresources.

Paths are parsed as the apiserver does (``/api/v1[/namespaces/<ns>]/<resource>[/<name>[/<sub>]]``
and the same under ``/apis/<group>/<version>``).  Answers are always JSON, whatever the
client's Accept asks (protobuf, Table): kubectl and client-go accept JSON.  Updates through
the main resource keep the stored status and updates through ``/status`` keep everything
else; a no-op patch keeps the resource version; a stale ``resourceVersion`` is a 409.
A create with ``dryRun=All`` runs validation and admission and stores nothing (other verbs
refuse ``dryRun`` rather than act for real); a ``SelfSubjectAccessReview`` is answered from
the allow-list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from chaos.embedded.kube import podexec, protobuf, watch
from chaos.embedded.kube.admission import admit_pod
from chaos.embedded.kube.eviction import Evictions
from chaos.embedded.kube.lifecycle import PodLifecycle
from chaos.embedded.kube.patch import apply_patch
from chaos.embedded.kube.pods import Pods
from chaos.embedded.kube.rbac import Rbac, access_review
from chaos.embedded.kube.resources import CORE, GROUPS, NAMESPACES, PODS, SELF_SUBJECT_ACCESS_REVIEWS, Resource, \
    prepare_new
from chaos.embedded.kube.selectors import (
    fields_match, labels_match, parse_field_selector, parse_label_selector, LABEL_KEY, LABEL_VALUE)
from chaos.embedded.kube.status import ApiError, already_exists, bad_request, conflict, invalid, \
    method_not_allowed, not_found, unsupported_media_type
from chaos.embedded.kube.store import Store

_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")
DEFAULT_WATCH_TIMEOUT_S = 1800.0


def parse_bool(query: Any, name: str) -> bool:
    """A query boolean as Go's strconv.ParseBool reads it (old Python clients send ``True``)."""
    value = query.get(name)
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise bad_request(f'invalid boolean value "{value}" for query parameter {name}')


def parse_int(query: Any, name: str) -> int | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise bad_request(f'invalid value "{value}" for query parameter {name}: not an integer') from None


def parse_dry_run(query: Any, verb: str) -> bool:
    """``dryRun=All`` (the only value the apiserver accepts), on a create only: a dry run of
    another verb is refused rather than carried out for real."""
    values = query.getall("dryRun", []) if hasattr(query, "getall") else [query.get("dryRun")]
    values = [v for v in values if v]
    if not values:
        return False
    if any(v != "All" for v in values):
        raise invalid("CreateOptions.meta.k8s.io", "", "dryRun",
                      "Unsupported value: []string{" + ", ".join(f'"{v}"' for v in values) + '}: supported values: "All"')
    if verb != "create":
        raise bad_request(f"dryRun is emulated on create only, not on {verb}: nothing was done")
    return True


def json_response(body: Any, code: int = 200) -> web.Response:
    return web.Response(status=code, text=json.dumps(body), content_type="application/json")


def unknown_path() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


async def read_body(request: web.Request) -> Any:
    """The JSON request body; a missing Content-Type means JSON, as on a real apiserver."""
    media = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise unsupported_media_type(media)
    raw = await request.read()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError as err:
        raise bad_request(f"the request body is not valid JSON: {err}") from None


async def read_review(request: web.Request) -> Any:
    """A SelfSubjectAccessReview body: JSON, or protobuf as kubectl >= 1.32 sends it."""
    media = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if media == protobuf.MEDIA_TYPE:
        return protobuf.decode_access_review(await request.read())
    return await read_body(request)


def validate_labels(kind: str, obj: dict) -> None:
    meta = obj.get("metadata") or {}
    for key, value in (meta.get("labels") or {}).items():
        if not LABEL_KEY.match(key):
            raise invalid(kind, meta.get("name", ""), "metadata.labels", f'Invalid value: "{key}": a valid label '
                          "key must consist of alphanumeric characters, '-', '_' or '.', with an optional DNS prefix")
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            raise invalid(kind, meta.get("name", ""), "metadata.labels", f'Invalid value: "{value}": a valid label '
                          "value must be 63 characters or less, alphanumeric, '-', '_' or '.' inside")


@dataclass(frozen=True)
class Target:
    resource: Resource
    group: str
    namespace: str | None
    name: str | None
    sub: str


def parse_target(group: str, version: str, tail: str) -> Target:
    table = CORE if group == "" and version == "v1" else \
        {r.plural: r for r in GROUPS[group][1]} if group in GROUPS and GROUPS[group][0] == version else {}
    segments = [s for s in tail.split("/") if s]
    namespace = None
    if len(segments) >= 3 and segments[0] == "namespaces":
        namespace, segments = segments[1], segments[2:]
    if not segments or len(segments) > 3 or segments[0] not in table:
        raise unknown_path()
    resource = table[segments[0]]
    name = segments[1] if len(segments) > 1 else None
    sub = segments[2] if len(segments) > 2 else ""
    if (namespace is not None and not resource.namespaced) or (resource.namespaced and name and namespace is None) \
            or (sub and sub not in resource.subresources):
        raise unknown_path()
    return Target(resource, group, namespace, name, sub)


_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


class Rest:
    def __init__(self, store: Store, pods: Pods, evictions: Evictions, lifecycle: PodLifecycle,
                 rbac: Rbac | None, bookmark_interval_s: float):
        self.store, self.pods, self.evictions, self.lifecycle = store, pods, evictions, lifecycle
        self.rbac, self.bookmark_interval_s = rbac, bookmark_interval_s

    async def handle(self, request: web.Request, group: str, version: str, tail: str) -> web.StreamResponse:
        target = parse_target(group, version, tail)
        method, query = request.method, request.query
        if target.sub == "exec":
            self._authorize("create", target)
            pod = self.store.require(PODS.plural, target.namespace, target.name)
            command = podexec.parse(request, pod)
            return await podexec.serve(request, pod, command, self.lifecycle, podexec.check_upgrade(request))
        verb = _VERBS.get(method)
        if target.name is None and method == "GET":
            verb = "watch" if parse_bool(query, "watch") else "list"
        sub = target.resource.subresources.get(target.sub, {})
        allowed = sub["verbs"] if target.sub else target.resource.verbs
        full = f"{target.resource.plural}/{target.sub}" if target.sub else target.resource.plural
        if verb is None or verb not in allowed or (target.name is None and verb not in ("list", "watch", "create")):
            raise method_not_allowed(verb or method, full)
        dry_run = parse_dry_run(query, verb if target.name is None else f"{verb} {full}")
        if target.resource is SELF_SUBJECT_ACCESS_REVIEWS:  # any caller may ask what it may do
            return json_response(access_review(self.rbac, await read_review(request)), 201)
        self._authorize(verb, target)
        if target.sub == "log":
            pod = self.store.require(PODS.plural, target.namespace, target.name)
            text = self.lifecycle.logs(pod, query.get("container"))
            if text is None:
                raise bad_request("container logs are not emulated by this API server's runtime")
            return web.Response(body=text, content_type="text/plain")
        if verb in ("list", "watch"):
            return await self._collection(request, target, verb)
        if target.name is None:
            return json_response(self._create(target, await read_body(request), dry_run), 201)
        if verb == "get":
            return json_response(self.store.require(target.resource.plural, target.namespace, target.name))
        if target.sub == "eviction":
            body = await read_body(request) or {}
            return json_response(self.evictions.evict(target.namespace, target.name, body), 201)
        if target.sub == "binding":
            body = await read_body(request) or {}
            return json_response(self.pods.bind(target.namespace, target.name, body), 201)
        if verb == "delete":
            return json_response(self._delete(target, await read_body(request) or {}, query))
        return json_response(self._write(target, verb, request.headers.get("Content-Type", ""),
                                         await read_body(request)))

    def _authorize(self, verb: str, target: Target) -> None:
        if self.rbac is not None:
            self.rbac.check(verb, target.resource.plural, target.sub, target.group, target.namespace, target.name)

    def _matcher(self, target: Target, query: Any):
        labels = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(query.get("fieldSelector"), target.resource.fields, target.resource.plural)
        supported = target.resource.fields

        def matches(obj: dict) -> bool:
            meta = obj["metadata"]
            return ((target.namespace is None or meta.get("namespace") == target.namespace)
                    and labels_match(labels, meta.get("labels")) and fields_match(fields, obj, supported))
        return matches

    async def _collection(self, request: web.Request, target: Target, verb: str) -> web.StreamResponse:
        query = request.query
        matches = self._matcher(target, query)
        if verb == "watch":
            since = parse_int(query, "resourceVersion")
            timeout = parse_int(query, "timeoutSeconds")
            spec = watch.WatchRequest(target.resource, matches, since or None,
                                      float(timeout) if timeout else DEFAULT_WATCH_TIMEOUT_S,
                                      parse_bool(query, "allowWatchBookmarks"))
            return await watch.stream(request, self.store, spec, self.bookmark_interval_s)
        items, rv = self.store.list(target.resource.plural, target.namespace)
        selected = []
        for obj in items:
            if matches(obj):
                obj.pop("kind", None)
                obj.pop("apiVersion", None)
                selected.append(obj)
        return json_response({"kind": f"{target.resource.kind}List", "apiVersion": target.resource.api_version,
                              "metadata": {"resourceVersion": str(rv)}, "items": selected})

    def _create(self, target: Target, body: Any, dry_run: bool) -> dict:
        """Validate, admit, store; a dry run stops before storing and answers the object as it
        would be created (name generated, uid and timestamp set, no resourceVersion)."""
        if not isinstance(body, dict):
            raise bad_request(f"the body of a create must be a {target.resource.kind} object")
        namespace = self.store.get(NAMESPACES.plural, None, target.namespace) if target.resource.namespaced else None
        if target.resource.namespaced and namespace is None:
            raise not_found(NAMESPACES.plural, target.namespace)
        obj = prepare_new(target.resource, body, target.namespace)
        validate_labels(target.resource.kind, obj)
        if target.resource is PODS:
            admit_pod(namespace, obj)
        if dry_run:
            if self.store.get(target.resource.plural, target.namespace, obj["metadata"]["name"]) is not None:
                raise already_exists(target.resource.plural, obj["metadata"]["name"])
            return obj
        if target.resource is PODS:
            return self.pods.create(obj)
        return self.store.create(target.resource.plural, obj)

    def _delete(self, target: Target, options: dict, query: Any) -> dict:
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = parse_int(query, "gracePeriodSeconds")
        uid = (options.get("preconditions") or {}).get("uid")
        if target.resource is PODS:
            return self.pods.delete(target.namespace, target.name, grace, uid)
        removed = self.store.remove(target.resource.plural, target.namespace, target.name)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": target.name, "kind": target.resource.plural, "uid": removed["metadata"]["uid"]}}

    def _write(self, target: Target, verb: str, content_type: str, body: Any) -> dict:
        resource = target.resource
        def change(old: dict) -> dict | None:
            if verb == "patch":
                new = apply_patch(content_type, old, body)
            else:
                if not isinstance(body, dict):
                    raise bad_request(f"the body of an update must be a {resource.kind} object")
                new = dict(body)
            meta = dict(new.get("metadata") or {})
            sent_rv = meta.get("resourceVersion")
            if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise conflict(resource.plural, target.name,
                               "the object has been modified; please apply your changes to the latest version "
                               "and try again")
            for kept in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion", "deletionTimestamp",
                         "deletionGracePeriodSeconds", "generateName"):
                meta.pop(kept, None)
                if kept in old["metadata"]:
                    meta[kept] = old["metadata"][kept]
            new["metadata"] = meta
            new["kind"], new["apiVersion"] = resource.kind, resource.api_version
            if resource.subresources.get("status"):
                if target.sub == "status":
                    new = {**old, "status": new.get("status", {})}
                else:
                    new["status"] = old.get("status", {})
            validate_labels(resource.kind, new)
            return None if new == old else new

        obj = self.store.update(resource.plural, target.namespace, target.name, change)
        if resource is PODS:
            self.pods.finish_if_done(target.namespace, target.name)
        return obj
