"""Kubernetes' protobuf request encoding, decoded for the one body that needs it here.

kubectl ≥ 1.32 sends ``kubectl auth can-i``'s ``SelfSubjectAccessReview`` as
``application/vnd.kubernetes.protobuf`` (kubectl ≤ 1.31 sends JSON); a real apiserver
accepts both.  Every other request body a client sends this emulator is JSON, and protobuf
elsewhere stays a 415.  The envelope is ``k8s\\x00`` + ``runtime.Unknown`` {1 typeMeta
{1 apiVersion, 2 kind}, 2 raw}; the field numbers below are those of
``k8s.io/api/authorization/v1/generated.proto``.
"""

from __future__ import annotations

from typing import Any

from chaos.embedded.kube.status import bad_request

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
_RESOURCE_ATTRIBUTES = {1: "namespace", 2: "verb", 3: "group", 4: "version", 5: "resource", 6: "subresource",
                        7: "name"}
_NON_RESOURCE_ATTRIBUTES = {1: "path", 2: "verb"}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise bad_request("the protobuf body is truncated")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fields(data: bytes) -> dict[int, list[Any]]:
    """A message's fields by number: ints for varints, bytes for length-delimited ones."""
    out: dict[int, list[Any]] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos:pos + size], pos + size
        else:
            raise bad_request(f"the protobuf body has an unsupported wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _strings(data: bytes, names: dict[int, str]) -> dict[str, str]:
    found = fields(data)
    return {name: found[number][-1].decode() for number, name in names.items() if found.get(number)}


def decode_access_review(body: bytes) -> dict:
    """A protobuf ``SelfSubjectAccessReview`` as its JSON form (metadata and status dropped:
    the server sets them)."""
    if not body.startswith(MAGIC):
        raise bad_request("the protobuf body lacks the k8s\\x00 envelope prefix")
    unknown = fields(body[len(MAGIC):])
    type_meta = _strings(unknown.get(1, [b""])[-1], {1: "apiVersion", 2: "kind"})
    if type_meta.get("kind") != "SelfSubjectAccessReview":
        raise bad_request(f"a protobuf body of kind {type_meta.get('kind')!r} where a SelfSubjectAccessReview "
                          "was expected")
    review = fields(unknown.get(2, [b""])[-1])
    spec_fields = fields(review.get(2, [b""])[-1])
    spec: dict[str, Any] = {}
    if spec_fields.get(1):
        spec["resourceAttributes"] = _strings(spec_fields[1][-1], _RESOURCE_ATTRIBUTES)
    if spec_fields.get(2):
        spec["nonResourceAttributes"] = _strings(spec_fields[2][-1], _NON_RESOURCE_ATTRIBUTES)
    return {**type_meta, "metadata": {}, "spec": spec}
