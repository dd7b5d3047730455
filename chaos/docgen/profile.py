"""docs/reference/profile.md: every profile field, from the pydantic models (each field's
description is its docstring in chaos/profile/models.py)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from chaos.docgen.markdown import code, doc_of, header, paragraphs, slug, table
from chaos.faults import catalog
from chaos.profile.models import Profile

INTRO = """
Every field of a profile (YAML), section by section; what a profile is and how to use one:
[../profiles.md](../profiles.md). *Default* is what an absent field means; fields without one
are required. Unknown fields are errors, named with their file and line.
"""

SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any", dict: "mapping"}
BOUNDS = {annotated_types.Ge: "≥", annotated_types.Gt: ">", annotated_types.Le: "≤", annotated_types.Lt: "<"}


@dataclasses.dataclass
class Section:
    """One model, and every path where a profile has it (a selector: in two places)."""

    model: type[BaseModel]
    paths: list[str]

    @property
    def title(self) -> str:
        return f"`{self.paths[0]}`" if self.paths[0] else "Top level"


def _kind_key(name: str, f: FieldInfo) -> str:
    """A field keyed by a fault kind (``faults.raylet-kill``) is one of many: ``<kind>``."""
    return "<kind>" if f.alias in catalog.KINDS else (f.alias or name)


def sections(model: type[BaseModel] = Profile) -> list[Section]:
    """Every model under ``model``, each once, in the order the walk first meets it."""
    found: dict[type[BaseModel], Section] = {}

    def walk(m: type[BaseModel], path: str) -> None:
        if m in found:
            if path not in found[m].paths:
                found[m].paths.append(path)
            return
        found[m] = Section(m, [path])
        for name, f in m.model_fields.items():
            many = "[]" if typing.get_origin(_strip_none(f.annotation)) is list else ""
            for sub in _models_in(f.annotation):
                walk(sub, f"{path}.{_kind_key(name, f)}{many}".lstrip("."))

    walk(model, "")
    return list(found.values())


def _strip_none(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return tp


def _models_in(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in typing.get_args(tp) for m in _models_in(a)]


def _bounds(metadata: list) -> str:
    return ", ".join(f"{BOUNDS[type(m)]} {getattr(m, next(iter(m.__dataclass_fields__)))}"
                     for m in metadata if type(m) in BOUNDS)


def type_name(tp: Any, where: dict[type, str]) -> str:
    """A field's type in words: ``integer ≥ 1``, ``ssh | local | k8s``, a link to a section."""
    tp = _strip_none(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        inner = type_name(args[0], where)
        extra = _bounds([m for a in args[1:] for m in (getattr(a, "metadata", None) or [a])])
        return f"{inner} {extra}".strip()
    if origin is typing.Literal:
        return " | ".join(code(a) for a in args)
    if origin is list:
        return f"list of {type_name(args[0], where)}"
    if origin is dict:
        return "mapping"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a, where) for a in args if a is not type(None))
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"[{where[tp]}](#{slug(where[tp])})"
    return SCALARS.get(tp, getattr(tp, "__name__", str(tp)))


def default_of(f: FieldInfo) -> str:
    if f.default is PydanticUndefined and f.default_factory is None:
        return "**required**"
    value = f.default_factory() if f.default_factory is not None else f.default
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, bool):
        return code(str(value).lower())
    if value is None:
        return "unset"
    if value in ([], {}):
        return code(value)
    return code(", ".join(map(str, value)) if isinstance(value, list) else value)


def _section(s: Section, where: dict[type, str]) -> str:
    own = doc_of(s.model)
    rows = []
    for name, f in s.model.model_fields.items():
        if not f.description:
            raise ValueError(f"profile field {s.paths[0]}.{f.alias or name} ({s.model.__name__}.{name}) has no "
                             "description: write its docstring on the line under it in chaos/profile/models.py")
        rows.append((code(f.alias or name), f"{type_name(f.annotation, where)} {_bounds(f.metadata)}".strip(),
                     default_of(f), f.description))
    also = "".join(f"Also at `{p}`. " for p in s.paths[1:])
    text = (paragraphs(own) + " " if own else "") + also
    return f"## {s.title}\n\n" + (text.strip() + "\n\n" if text else "") + table(
        ["field", "type", "default", "meaning"], rows)


def render() -> str:
    found = sections()
    where = {s.model: s.title for s in found}
    return header("Profile fields", "the pydantic models in `chaos/profile/models.py`", INTRO) + "".join(
        _section(s, where) for s in found)
