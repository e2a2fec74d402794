"""The import layering of docs/architecture.md, checked by parsing every module's imports with ``ast``.

Top level: ``envs`` imports none of ``rollout``, ``rewards``, ``rl``; ``rollout`` and ``rewards``
import ``envs`` only (never each other, never ``rl``). Inside ``rl``, each sub-package imports only
sub-packages of a lower layer (``LAYERS``), with the exceptions in ``ALLOWED`` (each with its reason).
Imports inside functions count too: a lazy import is still a dependency. Ray is imported only by the edge
package ``rl.driver.actors`` (``EDGE``): every other module runs without it.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "rollout", "rewards", "rl")
# What each top-level package may import of the others.
TOP = {"envs": set(), "rollout": {"envs"}, "rewards": {"envs"}, "rl": {"envs", "rollout", "rewards"}}
# rl's sub-packages, highest layer first; a layer imports only layers below it.
LAYERS = [("rl.cli",), ("rl.driver",), ("rl.trainer",), ("rl.data", "rl.algos"), ("rl.config",)]
# (importing module, imported module) pairs that go up, on purpose.
ALLOWED = {
    # The recipe checks algo.name and each estimator's own config section against the estimator
    # registry (an estimator owns its section: #16 item 2), at validate time, inside functions.
    ("rl.config.recipe", "rl.algos.estimators"),
    # Likewise algo.loss.policy and algo.loss.kwargs against the policy-loss registry (#40 item 2).
    ("rl.config.recipe", "rl.algos.policy_losses"),
    # validate_recipe checks learner.allocator: jemalloc against the installed library (jemalloc_path: stdlib
    # only, no torch), so a missing library fails at validate time naming the key, before anything starts.
    ("rl.config.recipe", "rl.trainer.memory"),
}


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


def imports(root: Path = REPO) -> list[tuple[str, str, str]]:
    """(file, importing module, imported module) for every import of our packages, at any depth."""
    found = []
    for top in PACKAGES:
        for f in sorted((root / top).rglob("*.py")):
            mod = ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    if node.level:  # relative: resolve against this module's package
                        base = mod.split(".")[: -node.level] if not f.name == "__init__.py" else mod.split(".")
                        names = [".".join([*base, node.module])]
                    else:
                        names = [node.module]
                else:
                    continue
                found += [(str(f.relative_to(root)), mod, n) for n in names if n.split(".")[0] in PACKAGES]
    return found


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
