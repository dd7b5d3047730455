"""Imports inside ``chaos/``: no circles, and no arrow pointing up the layers below.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import`` at any
depth (module level, inside functions and methods, under ``if TYPE_CHECKING:`` — a type-only
circle is still a circle in the design), relative imports resolved, plus the modules named by
strings: the argument of ``importlib.import_module`` / ``__import__``, and any string literal of
the form ``"chaos.pkg.module.Attr"`` or ``"chaos.pkg.module:attr"`` (a registry that imports
lazily).  Importing ``a.b.c`` also runs the ``__init__`` of ``a.b``, so every package above the
imported module (other than the importer's own packages) whose ``__init__`` imports anything is an
edge too (one that imports nothing can close no circle and lift nothing).

Why this order (lowest first):

* Backends sit *below* faults.  A fault acts through what a backend hands it (``Host`` handles
  looked up by Ray node id, the backend itself for sweeps: ``FaultContext.backend``); a backend
  never needs a fault, only the ``Target`` the safety rules check — a placement on the Ray
  cluster, so it lives in ``chaos.cluster`` beside ``Node``.
* Transports sit below backends and faults: both reach hosts through them, and the Kubernetes
  API access (``chaos.transport.kube_access``) is how the k8s exec transport, the Kubernetes
  backend and the Kubernetes faults all reach the API server.
* The embedded cluster (``chaos.embedded``) is driven by the embedded backend, so it sits below
  backends; its emulated control plane (``chaos.embedded.kube``) is test equipment that the
  harness reaches only over HTTP, so nothing outside ``chaos.embedded`` may import it
  (``SEALED``).  Platform facts both sides need (HyperPod label names) live in ``chaos.hyperpod``.
* Profiles are settings data (with the catalog of kinds they validate against); the safety rules
  enforce a profile's safety settings, so ``chaos.safety`` sits above ``chaos.profile``.
* The catalog (``chaos.faults.catalog``: kinds, budget classes, SLOs) is data that profiles,
  verdicts and summaries read, so it sits with them, low; which Fault class injects a kind is
  ``chaos.faults.registry``, at the faults' layer (it imports every fault module).
"""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "chaos"

# module or package -> layer; the longest matching prefix decides, "chaos" alone is the root
# package's own __init__.  A module may import only from its own layer or lower ones.
LAYERS: dict[str, int] = {
    # 0 foundation: exceptions, process/wait helpers, secret patterns, Ray version gates and
    #   platform facts; knows nothing of the harness.
    "chaos": 0, "chaos.errors": 0, "chaos.secrets": 0, "chaos.procs": 0, "chaos.waits": 0,
    "chaos.ray_support": 0, "chaos.hyperpod": 0,
    # 1 records and declarations: events, report sink, the catalog of kinds, profiles (settings),
    #   the shim's plan language and driver client, the recorder's record format; no host I/O.
    "chaos.timeline": 1, "chaos.report": 1, "chaos.faults.catalog": 1, "chaos.profile": 1,
    "chaos.shim.plan": 1, "chaos.shim.cuda_errors": 1, "chaos.shim.control": 1,
    "chaos.shim.driver_client": 1, "chaos.train.recording": 1,
    # 2 reaching things: transports (local, ssh, k8s exec + API access, Ray gRPC), the Ray
    #   cluster view, shipping the shim over a transport, the safety rules over profile settings,
    #   a way out's deadline, running a command as root on a host (and asking whether it can).
    "chaos.transport": 2, "chaos.privileges": 2, "chaos.cluster": 2, "chaos.shim": 2, "chaos.safety": 2, "chaos.cleanup": 2,
    # 3 the embedded cluster, its test hosts and emulated control planes (run by a backend); object
    #   storage: the S3 server and fault proxy the harness runs, a job's S3 settings, the storage events.
    "chaos.embedded": 3, "chaos.storage": 3,
    # 4 backends: cluster view, Host handles by Ray node id, health, heal, safety, sweep.
    "chaos.backends": 4,
    # 5 faults: target, inject, detect, revert, sweep through backends' hosts and transports.
    "chaos.faults": 5,
    # 6 runs, triggers and what is concluded from them: submission, recorder, verdicts,
    #   summaries, the ledger (sweeps by fault class), campaigns, head loss, canary, projections,
    #   a dry run's plan, the sweep.
    "chaos.train": 6, "chaos.triggers": 6, "chaos.attribution": 6, "chaos.verdicts": 6,
    "chaos.summary": 6, "chaos.progress": 6, "chaos.plot": 6, "chaos.ledger": 6,
    "chaos.campaign": 6, "chaos.canary": 6, "chaos.projection": 6, "chaos.plan": 6, "chaos.sweep": 6,
    # 7 entry points: the experiment driver, baselines, the Allure site, the CLI, the pytest plugin,
    #   doctor's preflight.
    "chaos.experiment": 7, "chaos.baseline": 7, "chaos.allure_site": 7, "chaos.cli": 7,
    "chaos.pytest_plugin": 7, "chaos.doctor": 7,
    # 8 the reference pages, generated from every layer below (the plugin's options among them).
    "chaos.docgen": 8,
}

# package -> the only packages whose modules may import it.
SEALED: dict[str, tuple[str, ...]] = {
    "chaos.embedded.kube": ("chaos.embedded",),
}

MIN_EDGES = 250  # the real graph has well over this many edges: an empty walk must not pass

_DOTTED = re.compile(r"chaos(?:\.\w+)+[.:]\w+")


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def discover(root: Path = ROOT) -> dict[str, tuple[str, bool, str]]:
    """Module name -> (source, is_package, path) for every ``chaos/**/*.py``."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        found[".".join(parts)] = (path.read_text(), is_pkg, str(path.relative_to(root)))
    return found


def _named(node: ast.AST) -> list[tuple[str, bool]]:
    """The (dotted name, is_exact_module) pairs ``node`` makes the importer depend on."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in ("import_module", "__import__"):
            return [(node.args[0].value, True)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.fullmatch(node.value):
        return [(node.value.replace(":", "."), False)]
    return []


def collect(modules: dict[str, tuple[str, bool, str]]) -> dict[str, dict[str, str]]:
    """importer -> {imported module: "path:line" of the first import} within ``modules``."""
    names = set(modules)
    graph: dict[str, dict[str, str]] = {m: {} for m in modules}
    above: list[tuple[str, str, str]] = []  # (importer, package above an imported module, where)

    def add(importer: str, target: str, where: str) -> None:
        if target != importer:
            graph[importer].setdefault(target, where)
        own = set(_ancestors(importer))
        above.extend((importer, p, where) for p in _ancestors(target) if p in names and p not in own)

    def module_of(dotted: str) -> str | None:
        while dotted and dotted not in names:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for importer, (source, is_pkg, path) in modules.items():
        package = importer.split(".") if is_pkg else importer.split(".")[:-1]
        for node in ast.walk(ast.parse(source, path)):
            where = f"{path}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if (target := module_of(alias.name)) is not None:
                        add(importer, target, where)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - (node.level - 1)]
                    source_module = ".".join(base + ([node.module] if node.module else []))
                else:
                    source_module = node.module or ""
                for alias in node.names:
                    # "from pkg import sub" imports the submodule; "from mod import name", the module
                    if (target := module_of(f"{source_module}.{alias.name}")) is not None:
                        add(importer, target, where)
            else:
                for dotted, exact in _named(node):
                    if exact:
                        target = module_of(dotted)
                    else:
                        # "chaos.x.y.Attr": y must be a module and Attr not one of its submodules
                        # (a plain module name, such as a logger's, is no import)
                        head, _, attr = dotted.rpartition(".")
                        target = head if head in names and dotted not in names else None
                    if target is not None:
                        add(importer, target, where)
    for importer, package, where in above:
        if graph[package] and package != importer:
            graph[importer].setdefault(package, where)
    return graph


def cycles(graph: dict[str, dict[str, str] | set[str]]) -> list[list[str]]:
    """One shortest cycle through every module that lies on a cycle, each as [a, b, ..., a],
    rotated to start at its smallest name, without repeats."""
    found: dict[tuple[str, ...], list[str]] = {}
    for start in sorted(graph):
        parent: dict[str, str | None] = {start: None}
        queue = collections.deque([start])
        end = None
        while queue and end is None:
            here = queue.popleft()
            for nxt in sorted(graph.get(here, ())):
                if nxt == start:
                    end = here
                    break
                if nxt not in parent:
                    parent[nxt] = here
                    queue.append(nxt)
        if end is None:
            continue
        path = [end]
        while parent[path[-1]] is not None:
            path.append(parent[path[-1]])
        path.reverse()  # start ... end
        i = path.index(min(path))
        ring = path[i:] + path[:i]
        found.setdefault(tuple(ring), ring + [ring[0]])
    return list(found.values())


def layer_of(module: str, layers: dict[str, int] = LAYERS) -> int | None:
    best = None
    for prefix in layers:
        if (_within(module, prefix) and prefix != PACKAGE) or module == prefix:
            if best is None or len(prefix) > len(best):
                best = prefix
    return None if best is None else layers[best]


def upward(graph: dict[str, dict[str, str]], layers: dict[str, int] = LAYERS) -> list[str]:
    arrows = []
    for importer, deps in sorted(graph.items()):
        for dep, where in sorted(deps.items()):
            lo, hi = layer_of(importer, layers), layer_of(dep, layers)
            if lo is not None and hi is not None and hi > lo:
                arrows.append(f"{importer} (layer {lo}) -> {dep} (layer {hi}) at {where}")
    return arrows


def _graph() -> dict[str, dict[str, str]]:
    return collect(discover())


def test_no_import_cycles():
    found = cycles(_graph())
    assert not found, f"{len(found)} import cycle(s):\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_upward_imports():
    graph = _graph()
    unlayered = sorted(m for m in graph if layer_of(m) is None)
    assert not unlayered, f"modules without a layer in LAYERS: {unlayered}"
    arrows = upward(graph)
    assert not arrows, f"{len(arrows)} upward import(s):\n" + "\n".join(arrows)
    breaches = [f"{importer} -> {dep} at {where}"
                for importer, deps in sorted(graph.items()) for dep, where in sorted(deps.items())
                for sealed, allowed in SEALED.items()
                if _within(dep, sealed) and not any(_within(importer, a) for a in allowed)]
    assert not breaches, "imports of sealed packages:\n" + "\n".join(breaches)


def test_the_checks_can_fail():
    graph = _graph()
    edges = sum(len(deps) for deps in graph.values())
    assert edges > MIN_EDGES, f"only {edges} import edges found in chaos/: the walk is broken"
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []

    # what the collector must see: a function-level import, a relative one, an import_module
    # string, a registry string, the package __init__ above an imported module (when it imports
    # anything), and no logger name
    fake = {
        "chaos": ("", True, "chaos/__init__.py"),
        "chaos.low": ("def f():\n    from chaos.high.mod import X\n", False, "chaos/low.py"),
        "chaos.high": ("from chaos.high import other\n", True, "chaos/high/__init__.py"),
        "chaos.high.mod": ("from . import other\nimport importlib\n"
                           "importlib.import_module('chaos.low')\n", False, "chaos/high/mod.py"),
        "chaos.high.other": ("IMPL = 'chaos.reg.Thing'\nLOG = 'chaos.bare.leaf'\n", False, "chaos/high/other.py"),
        "chaos.reg": ("import chaos.bare.leaf\n", False, "chaos/reg.py"),
        "chaos.bare": ("", True, "chaos/bare/__init__.py"),
        "chaos.bare.leaf": ("", False, "chaos/bare/leaf.py"),
    }
    got = {m: set(deps) for m, deps in collect(fake).items()}
    assert got == {"chaos": set(), "chaos.low": {"chaos.high", "chaos.high.mod"},
                   "chaos.high": {"chaos.high.other"}, "chaos.high.mod": {"chaos.high.other", "chaos.low"},
                   "chaos.high.other": {"chaos.reg"}, "chaos.reg": {"chaos.bare.leaf"},
                   "chaos.bare": set(), "chaos.bare.leaf": set()}
    assert cycles(got) == [["chaos.high.mod", "chaos.low", "chaos.high.mod"]]
    layers = {"chaos": 0, "chaos.low": 0, "chaos.high": 1, "chaos.reg": 0, "chaos.bare": 0}
    assert [a.split(" at ")[0] for a in upward(collect(fake), layers)] == [
        "chaos.low (layer 0) -> chaos.high (layer 1)", "chaos.low (layer 0) -> chaos.high.mod (layer 1)"]


def test_the_harness_side_imports_no_ray_train():
    """Ray Train is the run's, not the harness's: the plugin (and what it imports) loads none
    of it — the recorder's names it shares live in chaos.train.channel — so a runner outside
    the cluster starts without its seconds of imports."""
    import subprocess
    import sys

    probe = ("import sys, chaos.pytest_plugin; "
             "print(sorted(m for m in sys.modules if m == 'ray.train' or m.startswith('ray.train.')))")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout
