"""Label and field selectors, parsed with the grammar of ``k8s.io/apimachinery``.

Label selectors: comma-separated requirements, all of which must hold (AND): ``k=v``,
``k==v``, ``k!=v`` (also true when the label is absent), ``k in (a,b)``, ``k notin (a,b)``
(true when absent), ``k`` (exists), ``!k`` (does not exist), ``k>n`` / ``k<n`` (integers).
Field selectors: ``f=v``, ``f==v``, ``f!=v`` joined by commas, over the fields each
resource supports; any other field is a 400, as on a real server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

from chaos.embedded.kube.status import bad_request

LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_SET_RE = re.compile(r"^\s*(!?)\s*([^\s!=<>(),]+)\s+(in|notin)\s*\((.*)\)\s*$")
_CMP_RE = re.compile(r"^\s*([^\s!=<>(),]+)\s*(==|!=|=|>|<)\s*([^\s,]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([^\s!=<>(),]+)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", ">", "<"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        try:  # ">" and "<": both sides must be integers, else no match (as in apimachinery)
            number = int(value) if present else None
        except ValueError:
            return False
        if number is None:
            return False
        return number > int(self.values[0]) if self.op == ">" else number < int(self.values[0])


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``( )`` (the value lists of in/notin)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _check_key(key: str, selector: str) -> None:
    if not LABEL_KEY.match(key):
        raise bad_request(f'unable to parse requirement: invalid label key "{key}" in selector "{selector}"')


def _check_value(value: str, selector: str) -> None:
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise bad_request(f'unable to parse requirement: invalid label value: "{value}" in selector "{selector}"')


def parse_label_selector(selector: str | None) -> list[Requirement]:
    """The requirements of ``selector`` (empty or None selects everything); 400 when malformed."""
    if not selector or not selector.strip():
        return []
    requirements = []
    for part in _split_top_level(selector):
        if m := _SET_RE.match(part):
            if m.group(1):
                raise bad_request(f'unable to parse requirement: "!" before a set requirement in "{selector}"')
            key, op = m.group(2), m.group(3)
            values = tuple(v.strip() for v in m.group(4).split(","))
            _check_key(key, selector)
            for value in values:
                _check_value(value, selector)
            requirements.append(Requirement(key, op, values))
        elif m := _CMP_RE.match(part):
            key, op, value = m.group(1), m.group(2), m.group(3)
            _check_key(key, selector)
            if op in (">", "<"):
                if not re.fullmatch(r"-?\d+", value):
                    raise bad_request(f'unable to parse requirement: for "gt", "lt" operators, exactly one '
                                      f'integer value is required (selector "{selector}")')
            else:
                _check_value(value, selector)
            requirements.append(Requirement(key, "=" if op == "==" else op, (value,)))
        elif m := _EXISTS_RE.match(part):
            _check_key(m.group(2), selector)
            requirements.append(Requirement(m.group(2), "!" if m.group(1) else "exists"))
        else:
            raise bad_request(f'unable to parse requirement: found "{part.strip()}" in selector "{selector}"')
    return requirements


def labels_match(requirements: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    return all(r.matches(labels or {}) for r in requirements)


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    equal: bool
    value: str


def parse_field_selector(selector: str | None, supported: Mapping[str, Callable[[dict], str]],
                         resource: str) -> list[FieldRequirement]:
    """Requirements over ``supported`` fields; an unknown field is a 400 as on a real server."""
    if not selector or not selector.strip():
        return []
    requirements = []
    for part in selector.split(","):
        m = re.fullmatch(r"\s*([^\s!=]+)\s*(==|!=|=)\s*(.*?)\s*", part)
        if not m:
            raise bad_request(f'invalid selector: \'{selector}\'; can\'t understand \'{part}\'')
        field, op, value = m.groups()
        if field not in supported:
            raise bad_request(f'field label not supported: {field}')
        requirements.append(FieldRequirement(field, op != "!=", value))
    return requirements


def fields_match(requirements: list[FieldRequirement], obj: dict,
                 supported: Mapping[str, Callable[[dict], str]]) -> bool:
    return all((supported[r.field](obj) == r.value) == r.equal for r in requirements)
