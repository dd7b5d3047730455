"""Kubernetes ``Status`` objects: every error the emulated API server returns has this shape.

Clients (kubectl, the official Python client, client-go) decode the body of a non-2xx
answer as a ``Status`` and print its ``message``; kubectl also keys behaviour on ``reason``
and ``code`` (drain retries on 429, ``delete`` treats 404 as "already gone"), so the
reasons and codes are the ones a real kube-apiserver uses.
"""

from __future__ import annotations

from typing import Any


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None,
           *, ok: bool = False) -> dict[str, Any]:
    """A ``Status`` body; ``ok`` makes it a ``Success`` (eviction's 201 answer)."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Success" if ok else "Failure", "code": code}
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    """A request the server refuses; the handlers turn it into a ``Status`` reply."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def body(self) -> dict[str, Any]:
        return status(self.code, self.reason, self.message, self.details)


def _details(resource: str, name: str | None, group: str = "") -> dict[str, Any]:
    details: dict[str, Any] = {"kind": resource}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    return details


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    prefix = f"{resource}.{group}" if group else resource
    return ApiError(404, "NotFound", f'{prefix} "{name}" not found', _details(resource, name, group))


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists', _details(resource, name))


def conflict(resource: str, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": {why}',
                    _details(resource, name))


def invalid(kind: str, name: str, field: str, why: str) -> ApiError:
    """422 Invalid, as the apiserver's validation answers (one cause per bad field)."""
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {field}: {why}',
                    {"name": name, "kind": kind, "causes": [
                        {"reason": "FieldValueInvalid", "message": why, "field": field}]})


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(verb: str, resource: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested resource "
                    f"({verb} {resource})", {"kind": resource})


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType",
                    f'the body of the request was in an unknown format - accepted media types include: '
                    f'application/json, application/merge-patch+json, application/strategic-merge-patch+json '
                    f'(got "{content_type}")')


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)
