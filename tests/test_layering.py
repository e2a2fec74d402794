"""The import layering of docs/architecture.md, checked by parsing every module's imports with ``ast``.

Top level: ``envs`` imports none of ``rollout``, ``rewards``, ``rl``; ``rollout`` and ``rewards``
import ``envs`` only (never each other, never ``rl``). Inside ``rl``, each sub-package imports only
sub-packages of a lower layer (``LAYERS``), with the exceptions in ``ALLOWED`` (each with its reason).
Imports inside functions count too: a lazy import is still a dependency.
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
