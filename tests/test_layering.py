"""The import layering of docs/architecture.md, checked by parsing every module's imports with ``ast``.

Top level: ``envs`` imports none of ``rollout``, ``rewards``, ``rl``; ``rollout`` and ``rewards``
import ``envs`` only (never each other, never ``rl``). Inside ``rl``, each sub-package imports only
sub-packages of a lower layer (``LAYERS``), with the exceptions in ``ALLOWED`` (each with its reason).
Imports inside functions count too: a lazy import is still a dependency. Ray is imported only by the edge
package ``rl.driver.actors`` (``EDGE``): every other module runs without it.

Inside one package (``envs``, ``rollout``, ``rewards`` or one of rl's sub-packages) the modules form no
import cycle, except the ones closed by an import in ``ALLOWED_CYCLES``. An edge of the graph is an import of one of our
modules: ``import a.b`` depends on ``a.b``; ``from a.b import c`` on ``a.b`` (it reads ``c`` off it, so
``a.b`` must be fully built: a package's ``__init__`` included) and on ``a.b.c`` too when that is a
module. Importing ``a.b.c`` does run ``a/b/__init__.py`` first, but that implicit edge does not count:
a package's ``__init__`` importing its own submodules would otherwise be a cycle by construction.
Imports under ``if TYPE_CHECKING:`` count (the annotation still couples the two modules), and so
do imports inside functions: a lazy import that closes a cycle does not fail at import time, but the
two modules still depend on each other (neither can be read, tested or moved without the other),
and the failure the lazy import hides moves to call time. The failure message names one cycle of each
group of modules that import each other, every import with its file and line (``in a function`` for a
lazy one).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "rollout", "rewards", "rl")
# What each top-level package may import of the others.
TOP = {"envs": set(), "rollout": {"envs"}, "rewards": {"envs"}, "rl": {"envs", "rollout", "rewards"}}
# rl's sub-packages, highest layer first; a layer imports only layers below it.
LAYERS = [("rl.cli",), ("rl.driver",), ("rl.trainer",), ("rl.data", "rl.algos"), ("rl.config",)]
# (importing module, imported module) pairs that go up, on purpose.
ALLOWED = {
    # An algo arm resolves algo.loss.agg: auto to its estimator's default_agg (the registry), when built; the
    # cross-section rules ask the estimator object what it needs, at validate time; inside functions.
    ("rl.config.algo", "rl.algos.estimators"),
    ("rl.config.rules", "rl.algos.estimators"),
    # Likewise algo.loss.policy and algo.loss.kwargs against the policy-loss registry (#40 item 2).
    ("rl.config.rules", "rl.algos.policy_losses"),
    # validate_recipe checks learner.allocator: jemalloc against the installed library (jemalloc_path: stdlib
    # only, no torch), so a missing library fails at validate time naming the key, before anything starts.
    ("rl.config.validate", "rl.trainer.memory"),
}
# Import cycles inside a package that stay, each as the (importing module, imported module) import that
# closes it: the cycle check leaves that import out of the graph, so any other cycle still fails.
ALLOWED_CYCLES: set[tuple[str, str]] = set()


# The one package that imports Ray: every actor wrapper, over plain classes that import nothing of Ray.
EDGE = "rl.driver.actors"


def ray_importers(root: Path = REPO) -> list[tuple[str, str]]:
    """(file, module) of every module of our packages that imports ``ray`` (or a ``ray.`` submodule), at any depth."""
    found = []
    for top in PACKAGES:
        for f in sorted((root / top).rglob("*.py")):
            mod = ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module]
                    if isinstance(node, ast.ImportFrom) and node.module and not node.level
                    else []
                )
                if any(n.split(".")[0] == "ray" for n in names):
                    found.append((str(f.relative_to(root)), mod))
                    break
    return found


def outside_edge(found: list[tuple[str, str]]) -> list[str]:
    return [f"{f}: {mod} imports ray" for f, mod in found if mod != EDGE and not mod.startswith(EDGE + ".")]


def _unit(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "rl" and len(parts) > 1 else parts[0]


@dataclass(frozen=True)
class Edge:
    """One import of our modules: ``module`` (written in ``file`` at ``line``) depends on ``target``."""

    file: str
    line: int
    module: str
    target: str
    lazy: bool  # inside a function: it runs when the function is called, not when ``module`` is imported


def _is_module(root: Path, name: str) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _targets(node: ast.Import | ast.ImportFrom, mod: str, is_package: bool, root: Path) -> list[str]:
    """The modules one import statement depends on (see the module docstring)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    package = mod.split(".") if is_package else mod.split(".")[:-1]
    base = package[: len(package) - node.level + 1] if node.level else []  # relative: from this package up
    source = ".".join([*base, *([node.module] if node.module else [])])
    return [source, *(f"{source}.{a.name}" for a in node.names if _is_module(root, f"{source}.{a.name}"))]


def _walk(node: ast.AST, lazy: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under ``node``, with whether it sits inside a function."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, lazy
        yield from _walk(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))


def edges(root: Path = REPO) -> list[Edge]:
    """Every import of our packages by a module of ours, at any depth, file by file in source order."""
    found = []
    for top in PACKAGES:
        for f in sorted((root / top).rglob("*.py")):
            rel = f.relative_to(root)
            mod = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            for node, lazy in _walk(ast.parse(f.read_text(), str(f))):
                for target in _targets(node, mod, f.name == "__init__.py", root):
                    if target.split(".")[0] in PACKAGES:
                        found.append(Edge(str(rel), node.lineno, mod, target, lazy))
    return found


def imports(root: Path = REPO) -> list[tuple[str, str, str]]:
    """(file, importing module, imported module) for every import of our packages, at any depth."""
    return [(e.file, e.module, e.target) for e in edges(root)]


def layer_of(unit: str) -> int:
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"{unit} is in no layer of LAYERS: add it (tests/test_layering.py, docs/architecture.md)")


def top_level_violations(found: list[tuple[str, str, str]]) -> list[str]:
    return [
        f"{f}: {mod} imports {dep}"
        for f, mod, dep in found
        if (a := mod.split(".")[0]) != (b := dep.split(".")[0]) and b not in TOP[a]
    ]


def test_top_level_packages_import_down_only() -> None:
    bad = top_level_violations(imports())
    assert not bad, "imports that point up or sideways:\n" + "\n".join(bad)


def test_rl_subpackages_import_lower_layers_only() -> None:
    bad = []
    for f, mod, dep in imports():
        if not (mod.startswith("rl.") and dep.startswith("rl.")):
            continue
        a, b = _unit(mod), _unit(dep)
        if a == b or (mod, dep) in ALLOWED:
            continue
        if layer_of(b) <= layer_of(a):
            bad.append(f"{f}: {mod} ({a}) imports {dep} ({b})")
    assert not bad, "rl imports that do not point down (LAYERS):\n" + "\n".join(bad)


def test_every_rl_subpackage_has_a_layer() -> None:
    subs = {f"rl.{p.name}" for p in (REPO / "rl").iterdir() if (p / "__init__.py").is_file()}
    assert subs == {u for layer in LAYERS for u in layer}


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The check can fail: an ``envs`` module importing ``rl`` inside a function is found and reported."""
    for top in PACKAGES:
        (tmp_path / top).mkdir()
    (tmp_path / "envs" / "bad.py").write_text("def f():\n    from rl.driver.loop import train\n")
    (tmp_path / "rollout" / "ok.py").write_text("from envs.types import Task\n")
    found = imports(tmp_path)
    assert found == [("envs/bad.py", "envs.bad", "rl.driver.loop"), ("rollout/ok.py", "rollout.ok", "envs.types")]
    assert top_level_violations(found) == ["envs/bad.py: envs.bad imports rl.driver.loop"]


def test_architecture_doc_states_these_layers() -> None:
    """docs/architecture.md states the layers this test checks, in this order."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    order = " > ".join(" = ".join(u.removeprefix("rl.") for u in layer) for layer in LAYERS)
    assert f"`{order}`" in doc, f"docs/architecture.md should state the rl layers as `{order}`"


def package_graph(found: list[Edge], leave_out: set[tuple[str, str]] | None = None) -> dict[str, dict[str, Edge]]:
    """module -> {each module of its own package it imports: the first such import, a module-level one
    before a lazy one}. A module importing itself (a package ``__init__`` from its own name) is no edge,
    nor is an import ``(module, target)`` in ``leave_out``."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in sorted(found, key=lambda e: e.lazy):
        if (e.module, e.target) in (leave_out or set()):
            continue
        if e.module != e.target and _unit(e.module) == _unit(e.target):
            graph.setdefault(e.module, {}).setdefault(e.target, e)
    return graph


def _reach(graph: dict[str, dict[str, Edge]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), {}):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def cycle_groups(graph: dict[str, dict[str, Edge]]) -> list[frozenset[str]]:
    """The strongly connected groups of the graph with more than one module (each reaches every other)."""
    reach = {m: _reach(graph, m) for m in graph}
    groups = {frozenset({m, *(n for n in reach[m] if m in reach.get(n, ()))}) for m in graph if m in reach[m]}
    return sorted(groups, key=sorted)


def one_cycle(graph: dict[str, dict[str, Edge]], group: frozenset[str]) -> list[Edge]:
    """A shortest cycle through the first module (by name) of ``group``, as its imports in order."""
    start = min(group)
    into: dict[str, Edge] = {}  # module -> the import it was first reached by (breadth first)
    todo = [start]
    for m in todo:
        for nxt, e in graph[m].items():
            if nxt in group and nxt not in into:
                into[nxt] = e
                todo.append(nxt)
    cycle = [into[start]]
    while cycle[-1].module != start:
        cycle.append(into[cycle[-1].module])
    return cycle[::-1]


def describe(graph: dict[str, dict[str, Edge]], group: frozenset[str]) -> str:
    """``a -> b (file:line) -> a (file:line, in a function)``, and the whole group when it is larger."""
    cycle = one_cycle(graph, group)
    steps = [f"-> {e.target} ({e.file}:{e.line}{', in a function' if e.lazy else ''})" for e in cycle]
    more = f" [the whole group: {', '.join(sorted(group))}]" if len(group) > len(cycle) else ""
    return " ".join([cycle[0].module, *steps]) + more


def test_no_import_cycle_inside_a_package() -> None:
    graph = package_graph(edges(), ALLOWED_CYCLES)
    bad = [describe(graph, g) for g in cycle_groups(graph)]
    assert not bad, "import cycles inside a package (break each, e.g. by moving what both need down):\n" + "\n".join(
        bad
    )


def test_every_allowed_cycle_still_exists() -> None:
    """An entry of ``ALLOWED_CYCLES`` whose import is gone or closes no cycle any more is removed, so that
    the cycle cannot come back unseen."""
    graph = package_graph(edges())
    stale = [(a, b) for a, b in sorted(ALLOWED_CYCLES) if b not in graph.get(a, {}) or a not in _reach(graph, b)]
    assert not stale, f"these imports close no cycle any more: remove them from ALLOWED_CYCLES: {stale}"


def test_the_cycle_check_sees_cycles(tmp_path: Path) -> None:
    """Lazy, TYPE_CHECKING and package-reentering cycles are found and named; down-only imports,
    a package ``__init__`` importing its own submodules, and imports across packages are not cycles."""
    files = {
        "envs/calls.py": "from envs.tools import run\n",
        "envs/tools.py": "def run():\n    from envs.calls import check\n",
        "envs/box/__init__.py": "from envs.box.core import Box\n",
        "envs/box/core.py": "from envs.box.warm import Warm\nfrom envs.box.pump import pump\n",
        "envs/box/warm.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from envs.box.core import Box\n",
        "envs/box/pump.py": "from envs.box import reap\n",
        "envs/box/reap.py": "",
        "envs/ok/__init__.py": "from envs.ok.top import T\n",
        "envs/ok/top.py": "from envs.ok.bottom import B\nfrom .bottom import C\n",
        "envs/ok/bottom.py": "import envs.types\n",
        "envs/types.py": "",
        "rollout/episode.py": "from envs.calls import check\n",
        "rewards/calls.py": "def f():\n    from envs.calls import check\n",
    }
    for top in PACKAGES:
        (tmp_path / top).mkdir()
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = edges(tmp_path)
    assert ("envs/box/pump.py", "envs.box.pump", "envs.box.reap") in imports(tmp_path)  # from a package import a module
    assert ("envs/ok/top.py", "envs.ok.top", "envs.ok.bottom") in imports(tmp_path)  # relative, resolved
    graph = package_graph(found)
    groups = cycle_groups(graph)
    assert groups == [
        frozenset({"envs.box", "envs.box.core", "envs.box.pump", "envs.box.warm"}),
        frozenset({"envs.calls", "envs.tools"}),
    ]
    assert describe(graph, groups[1]) == (
        "envs.calls -> envs.tools (envs/calls.py:1) -> envs.calls (envs/tools.py:2, in a function)"
    )
    assert describe(graph, groups[0]) == (
        "envs.box -> envs.box.core (envs/box/__init__.py:1) -> envs.box.pump (envs/box/core.py:2) "
        "-> envs.box (envs/box/pump.py:1) [the whole group: envs.box, envs.box.core, envs.box.pump, envs.box.warm]"
    )
    # An allowed import is left out, and only the cycles it closes with it.
    allowed = package_graph(found, {("envs.tools", "envs.calls"), ("envs.box.pump", "envs.box")})
    assert cycle_groups(allowed) == [frozenset({"envs.box.core", "envs.box.warm"})]


def test_only_the_edge_package_imports_ray() -> None:
    bad = outside_edge(ray_importers())
    assert not bad, f"Ray is imported outside {EDGE} (move the Ray part into it):\n" + "\n".join(bad)
    assert ray_importers(), f"{EDGE} is expected to import Ray: is the check still parsing the right files?"


def test_the_ray_check_sees_a_lazy_import_outside_the_edge(tmp_path: Path) -> None:
    for top in PACKAGES:
        (tmp_path / top).mkdir()
    (tmp_path / "rl" / "driver" / "actors").mkdir(parents=True)
    (tmp_path / "rollout" / "bad.py").write_text("def f():\n    from ray.util import placement_group\n")
    (tmp_path / "rl" / "driver" / "actors" / "ok.py").write_text("import ray\n")
    (tmp_path / "envs" / "fine.py").write_text("import rayon\n")  # another package whose name starts with ray
    found = ray_importers(tmp_path)
    assert found == [("rollout/bad.py", "rollout.bad"), ("rl/driver/actors/ok.py", "rl.driver.actors.ok")]
    assert outside_edge(found) == ["rollout/bad.py: rollout.bad imports ray"]
