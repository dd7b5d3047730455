"""Reading and writing profile YAML; every problem named as ``FILE:LINE: FIELD: PROBLEM``, e.g.::

    staging.yaml:14: hosts.defaults.ssh.port: Input should be a valid integer, got 'twenty-two'

ruamel.yaml does the YAML.  Its round-trip loader keeps the line of every key and list item,
which is where a pydantic error's ``loc`` is looked up, and its mapping-key check (hooked
below) catches duplicate keys and keys YAML reads as something other than a name.  Its safe
loader then gives the plain values the models validate, refusing tags that would build
objects.  Profiles are YAML 1.1, as with PyYAML and Kubernetes manifests: ``on``, ``yes``
and ``off`` are booleans.

Profiles never hold secrets: any key named like a password, token or secret and any value
holding a private key is refused before validation.
"""

from __future__ import annotations

import difflib
import io
import logging
import os
import types
import typing
import warnings
from pathlib import Path
from typing import Annotated, Any, Callable, Mapping, Sequence

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.error import MantissaNoDotYAML1_1Warning, MarkedYAMLError
from ruamel.yaml.nodes import ScalarNode

from chaos.errors import ProfileError
from chaos.faults import catalog
from chaos.profile.models import SECRET_HINT, FaultsSettings, Problem, Profile, ProfileInvalid, problem_text
from chaos.secrets import is_secret_name, secret_value_in

log = logging.getLogger(__name__)

MAX_VALUES = 100_000  # a profile is small; more means aliases expanding without end


def _yaml(typ: str) -> YAML:
    yaml = YAML(typ=typ, pure=True)
    yaml.version = (1, 1)
    return yaml


class _KeyCheck(RoundTripConstructor):
    """Keeps duplicate keys, and keys YAML reads as something other than a name, out of the
    data and remembers them per mapping, so that all of them are reported with their field
    paths rather than the first one alone."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bad_keys: dict[int, list[tuple[str, str, int]]] = {}  # id(mapping) -> [(key, problem, line)]

    def check_mapping_key(self, node, key_node, mapping, key, value) -> bool:
        if isinstance(key, str) and key not in mapping:
            return True
        if isinstance(key, str):
            name, problem = key, (f"duplicate key (first given on line {mapping.lc.key(key)[0] + 1}); "
                                  f"YAML would silently keep only the last")
        else:
            scalar = isinstance(key_node, ScalarNode)
            name = key_node.value if scalar else "?"
            kind = str(key_node.tag).rsplit(":", 1)[-1] if scalar else "collection"
            problem = (f"YAML reads this key as {'an' if kind[:1] in 'aeiou' else 'a'} {kind}, not a name; "
                       f"quote it: '{name}':")
        self.bad_keys.setdefault(id(mapping), []).append((str(name), problem, key_node.start_mark.line + 1))
        return False


def _key_line(mapping: CommentedMap, key: str) -> int | None:
    """1-based line of ``key`` in ``mapping``, looking through merge keys (``<<: *anchor``)."""
    if key in (mapping.lc.data or {}):
        return mapping.lc.key(key)[0] + 1
    return next((_key_line(merged, key) for merged in mapping.merge if key in merged), None)


def _line(doc: CommentedMap, loc: Sequence) -> int:
    """The line of the deepest part of ``loc`` that the document has: the key of a bad value,
    the parent of a missing field."""
    node, line = doc, doc.lc.line + 1
    for part in loc:
        if isinstance(node, CommentedMap) and isinstance(part, str) and part in node:
            line = _key_line(node, part) or line
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
            line = node.lc.item(part)[0] + 1
        else:
            break
        node = node[part]
    return line


class _TooBig(Exception):
    def __init__(self, line: int):
        self.line = line


class _Scan:
    """One pass over the loaded document: the bad keys where they sit, secret names and
    values, and a bound on aliases that expand without end."""

    def __init__(self, bad_keys: Mapping[int, list[tuple[str, str, int]]]):
        self.bad_keys = bad_keys
        self.problems: list[Problem] = []
        self.values = 0
        self._reported: set[int] = set()

    def walk(self, value: Any, path: tuple, line: int, stack: frozenset = frozenset()) -> None:
        if id(value) in stack:  # a recursive alias
            return
        self.values += 1
        if self.values > MAX_VALUES:
            raise _TooBig(line)
        if isinstance(value, CommentedMap):
            if id(value) not in self._reported:  # an anchored mapping: once, where it is first met
                self._reported.add(id(value))
                self.problems += [Problem(path + (key,), problem, at)
                                  for key, problem, at in self.bad_keys.get(id(value), ())]
            for key, item in value.items():
                at = _key_line(value, key) or line
                if is_secret_name(key):
                    self.problems.append(Problem(path + (key,), f"looks like a secret; {SECRET_HINT}", at))
                self.walk(item, path + (key,), at, stack | {id(value)})
        elif isinstance(value, CommentedSeq):
            for i, item in enumerate(value):
                self.walk(item, path + (i,), value.lc.item(i)[0] + 1, stack | {id(value)})
        elif isinstance(value, str) and (what := secret_value_in(value)):
            self.problems.append(Problem(path, f"the value contains {what}; {SECRET_HINT}", line))


def _not_yaml(e: MarkedYAMLError, source: str) -> ProfileError:
    mark = e.problem_mark or e.context_mark
    what = " ".join(x for x in (e.context, e.problem) if x)
    return ProfileError(f"{source}{f':{mark.line + 1}' if mark else ''}: not valid YAML: {what}")


def parse_profile(text: str, source: str | os.PathLike = "<profile>") -> Profile:
    """Validate profile YAML text; ``source`` names it in messages."""
    source = str(source)
    lines = _yaml("rt")
    lines.Constructor = _KeyCheck
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MantissaNoDotYAML1_1Warning)  # 1e3 is a float, as in YAML 1.2
        try:
            doc = lines.load(text)
        except MarkedYAMLError as e:
            raise _not_yaml(e, source) from None
        if doc is None:
            raise ProfileError(f"{source}: the profile is empty; it needs at least name, ray and storage "
                               f"(see examples/profiles/)")
        if not isinstance(doc, CommentedMap):
            kind = "a list" if isinstance(doc, CommentedSeq) else f"a single value ({doc!r})"
            raise ProfileError(f"{source}:{lines.compose(text).start_mark.line + 1}: the profile must be a mapping "
                               f"of field: value at the top level, got {kind}")
        scan = _Scan(lines.constructor.bad_keys)
        try:
            scan.walk(doc, (), doc.lc.line + 1)
        except _TooBig as e:
            raise ProfileError(f"{source}:{e.line}: the profile expands to more than {MAX_VALUES} values "
                               f"(anchors/aliases nested too deep?)") from None
        if scan.problems:
            raise ProfileInvalid(scan.problems, source)
        try:
            data = _yaml("safe").load(text)
        except MarkedYAMLError as e:
            raise _not_yaml(e, source) from None
    return _validate(data, source, lambda loc: _line(doc, loc))


def _unwrap(annotation) -> list:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _unwrap(arg)]
    return [annotation]


def _model_at(loc: Sequence) -> type[BaseModel] | None:
    """The model class whose fields live at ``loc`` in a Profile (list indices skipped)."""
    cls: Any = Profile
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            return None
        field = next((f for n, f in cls.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return None
        nxt = None
        for cand in _unwrap(field.annotation):
            if typing.get_origin(cand) in (list, tuple):
                cand = typing.get_args(cand)[0]
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                nxt = cand
        cls = nxt
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _extra_text(loc: Sequence) -> str:
    key = str(loc[-1])
    cls = _model_at(loc[:-1])
    known = [f.alias or n for n, f in cls.model_fields.items()] if cls else []
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if cls is FaultsSettings:
        return f"unknown fault kind {key!r}{hint}; known kinds: {', '.join(catalog.KINDS)} (and defaults)"
    return f"unknown field {key!r}{hint}" + (f"; allowed here: {', '.join(known)}" if known else "")


def _validate(data: Any, source: str | None, line_for: Callable[[Sequence], int] | None = None) -> Profile:
    line_for = line_for or (lambda loc: None)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = tuple(err["loc"])
            if err["type"] == "extra_forbidden":
                text = _extra_text(loc)
            elif err["type"] == "missing":
                text = f"required field {loc[-1]!r} is missing" if loc else "required field is missing"
            else:
                text = problem_text(err)
            problems.append(Problem(loc, text, line_for(loc[:-1] if err["type"] == "missing" else loc)))
        raise ProfileInvalid(problems, source) from None
    except ProfileInvalid as e:  # cross-field checks: add source and lines
        raise ProfileInvalid([p._replace(line=line_for(p.loc)) for p in e.problems], source) from None
    profile._source = source
    return profile


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and validate a profile; raises ProfileError naming file, line, field and problem."""
    p = Path(path)
    try:
        text = p.expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{path}: profile file not found (looked at {p.expanduser().resolve()})") from None
    except IsADirectoryError:
        raise ProfileError(f"{path}: is a directory; give the profile's YAML file") from None
    except PermissionError:
        raise ProfileError(f"{path}: profile file is not readable (permission denied)") from None
    except UnicodeDecodeError as e:
        raise ProfileError(f"{path}: not a text file (not UTF-8 at byte {e.start}); a profile is YAML") from None
    profile = parse_profile(text, path)
    for note in profile.notes():
        log.warning("%s: %s", path, note)
    return profile


def profile_from_dict(data: Mapping, source: str | None = None) -> Profile:
    """Validate a profile given as a dict (messages name fields, without lines)."""
    return _validate(dict(data), source)


# -- embedded profiles, writing ------------------------------------------------------------------
def embedded_profile(gcs_address: str, dashboard_url: str, storage_path: str, hosts: list[dict], *,
                     name: str = "embedded") -> dict:
    """The profile (as a dict) of an already-running embedded cluster.

    ``hosts``: one dict per worker host: ``address`` (required), ``hostname``, ``transport``
    (``local`` — the default — or ``ssh``) and, for ssh, ``ssh`` with SSHSettings fields
    (user, port, key_file, known_hosts, ...).  Every host is allowlisted by address; the
    head never is.  Raises ProfileError when the result would not validate.
    """
    overrides, allow = [], []
    for i, h in enumerate(hosts):
        unknown = set(h) - {"address", "hostname", "transport", "ssh", "netns"}
        if unknown or "address" not in h:
            raise ProfileError(f"embedded_profile: hosts[{i}] needs address and may have hostname, transport, ssh; "
                               f"got {sorted(h)}")
        transport = h.get("transport", "local")
        if transport not in ("local", "ssh"):
            raise ProfileError(f"embedded_profile: hosts[{i}].transport must be local or ssh, got {transport!r}")
        override: dict[str, Any] = {"match": {"address": h["address"]}, "transport": transport}
        if h.get("ssh"):
            override["ssh"] = dict(h["ssh"])
        if h.get("netns"):
            override["netns"] = h["netns"]
        overrides.append(override)
        allow.append({"address": h["address"]})
    data: dict[str, Any] = {
        "name": name,
        "protected": False,
        "ray": {"dashboard_url": dashboard_url, "gcs_address": gcs_address},
        "storage": {"path": str(storage_path)},
        "nodes": {"discovery": "ray"},
        "hosts": {"defaults": {"transport": "local"}, "overrides": overrides},
        "safety": {"allow_head": False, "allowlist": allow, "max_live_faults": 1,
                   "min_alive_nodes": 1, "unhealthy_for_s": 60.0},
    }
    profile_from_dict(data, "embedded_profile()")
    return data


def dump_profile(profile: Mapping | Profile, path: str | os.PathLike) -> Path:
    """Write a profile (dict or Profile) as YAML after validating it; returns the path."""
    if isinstance(profile, Profile):
        data = profile.model_dump(mode="json", by_alias=True, exclude_unset=True)
    else:
        data = dict(profile)
        profile_from_dict(data, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = _yaml("safe")
    writer.default_flow_style = False
    writer.representer.sort_base_mapping_type_on_output = False  # fields in the models' order
    text = io.StringIO()
    text.write("# ray-chaos-harness profile, written by the harness; see docs/profiles.md\n")
    writer.dump(data, text)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text.getvalue(), encoding="utf-8")
    os.replace(tmp, path)
    return path
