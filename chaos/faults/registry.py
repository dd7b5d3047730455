"""Which Fault class injects each catalog kind: the class in a module of ``chaos.faults`` that
declares it (``kind = "..."``), found by importing them.  A new kind is its module and its
catalog entry; there is nothing else to register.

Kept apart from the catalog: profiles, verdicts and summaries read the catalog, which must
import no fault module (a fault module imports the catalog for its budget class).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

import chaos.faults
from chaos.faults import catalog
from chaos.faults.base import Fault


@functools.cache
def implementations() -> dict[str, type[Fault]]:
    """kind -> the Fault class that declares it; two classes declaring one kind is a bug."""
    for module in pkgutil.iter_modules(chaos.faults.__path__):
        importlib.import_module(f"{chaos.faults.__name__}.{module.name}")
    found: dict[str, type[Fault]] = {}
    todo = list(Fault.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        kind = cls.__dict__.get("kind")
        if kind is None or not cls.__module__.startswith(f"{chaos.faults.__name__}."):
            continue  # a base class, or one a test defines
        if found.setdefault(kind, cls) is not cls:
            raise TypeError(f"fault kind {kind!r} is declared by {found[kind].__qualname__} and {cls.__qualname__}")
    return found


def fault_class(kind: str) -> type[Fault]:
    """The Fault class of catalog kind ``kind``; an unknown kind names the known ones."""
    entry = catalog.kind(kind)
    cls = implementations().get(kind)
    if cls is None:
        planned = " (the catalog marks it planned)" if entry.not_drawn == "planned" else ""
        raise ValueError(f"fault kind {kind!r} has no implementation yet{planned}")
    return cls
