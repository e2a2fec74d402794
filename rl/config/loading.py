"""Loading a recipe: YAML plus ``key=value`` overrides, built into a frozen ``Recipe``.

``load_recipe`` reads the YAML, applies the overrides and builds the sections
(``rl.config.fields.build``): unknown keys, wrong types and out-of-range values fail there,
naming the key and its YAML line (or the override that set it); a key of an older layout names
its new place (``rl/config/migrations.py``). ``recipe_from_dict`` does the same for a mapping.
Defaults that depend on other settings are resolved by the sections themselves when built
(``algo.loss.agg: auto`` by the ``algo`` arm, ``algo.loss.norm_tokens: 0`` by ``Recipe``).
``RecipeError`` is the error of every recipe problem, its message meant for the user as is;
``failer(recipe)`` makes the ``fail(key, msg)`` that the checks raise it with, naming the line.

This module does not check files, models or rules across sections (``rl/config/validate.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import yaml

from rl.config.fields import FieldError, build, to_plain
from rl.config.migrations import RENAMED, refuse_old_normalization
from rl.config.schema import Recipe

__all__ = [
    "RecipeError",
    "FREE_FORM_DICTS",
    "load_recipe",
    "recipe_from_dict",
    "recipe_to_dict",
    "resolve_path",
    "failer",
    "Fail",
]


class RecipeError(ValueError):
    """A recipe problem, with a message that names the file, key and line where known."""


# A check's way to report a problem: ``fail(key, msg)`` raises ``RecipeError`` naming the key and its line.
Fail = Callable[[str, str], None]

FREE_FORM_DICTS = (
    "kwargs",
    "domain_weights",
    "engine_resources",
    "learner_resources",
    "reward_resources",
    "engine_kwargs",
)


def _yaml_line(text: str, dotted: str) -> int | None:
    """1-based line of ``dotted`` (``a.b`` or ``a.0.b``) in YAML ``text``, or of its deepest existing parent."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in dotted.split("."):
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == part:
                    line, nxt = k.start_mark.line + 1, v
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line + 1
        else:
            break
        if node is None:
            break
    return line


def _where(path: str, text: str, key: str) -> str:
    line = _yaml_line(text, key) if text else None
    return f"{path}:{line}" if line else path


def load_recipe(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read a recipe YAML, apply ``key=value`` overrides, and return a frozen ``Recipe``.

    Raises ``RecipeError`` for a missing file, invalid YAML, unknown or moved keys, wrong
    types, out-of-range values or a malformed override, naming the key and its YAML line (or
    the override). Does not check files, models or rules across sections (``validate_recipe``).
    """
    p = Path(path)
    if not p.is_file():
        raise RecipeError(f"recipe not found: {p}")
    text = p.read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        raise RecipeError(f"{where}: YAML syntax error: {getattr(e, 'problem', e)}") from None
    if raw is None:
        raw = {}
    return _recipe_from_raw(raw, p, text, overrides)


def recipe_from_dict(
    raw: dict, base_dir: str | os.PathLike = ".", overrides: list[str] | tuple[str, ...] = ()
) -> Recipe:
    """A ``Recipe`` from a mapping shaped like a recipe YAML (a notebook's dict), overrides applied.

    Relative paths in it (task files, the model folder) are relative to ``base_dir``; errors
    name the key as :func:`load_recipe`'s do, with ``<recipe dict>`` for the file. ``raw`` is not changed.
    """
    import copy

    return _recipe_from_raw(copy.deepcopy(raw), Path(base_dir) / "<recipe dict>", "", overrides)


def _recipe_from_raw(raw: Any, p: Path, text: str, overrides: list[str] | tuple[str, ...]) -> Recipe:
    if not isinstance(raw, dict):
        raise RecipeError(f"{p}: a recipe is a mapping of sections (run, model, data, ...), got {type(raw).__name__}")
    if "source" in raw:
        raise RecipeError(f"{_where(str(p), text, 'source')}: 'source' is set by jointrl, not by the recipe")
    overridden: dict[str, str] = {}
    for ov in overrides:
        key, value = _parse_override(ov)
        _set_path(raw, key, value, ov)
        overridden[key] = ov
    raw["source"] = str(p.resolve())
    try:
        refuse_old_normalization(raw)
        return build(Recipe, raw, renamed=RENAMED)
    except FieldError as e:
        raise RecipeError(_locate(e, str(p), text, overridden)) from None


def _locate(e: FieldError, src: str, text: str, overridden: dict[str, str]) -> str:
    """``e`` as the user reads it: the override that set the key, else the key's YAML line."""
    body = e.msg if f"'{e.key}'" in e.msg else f"{e.key}: {e.msg}"
    for k, ov in overridden.items():
        if e.key == k or e.key.startswith(k + ".") or k.startswith(e.key + "."):
            if e.value:  # a value out of range: where it sits in the recipe, and what set it
                return f"{_where(src, text, e.key)}: {body} (set by override {ov!r})"
            return f"override {ov!r}: {body}"
    return f"{_where(src, text, e.key)}: {body}"


def _parse_override(ov: str) -> tuple[str, Any]:
    if "=" not in ov:
        raise RecipeError(f"override {ov!r}: expected key=value (e.g. train.steps=5)")
    key, _, value = ov.partition("=")
    try:
        # Parsed like the YAML file: 5 -> int, 1e-5 -> float, [a, b] -> list, {k: v} -> mapping.
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


def _set_path(tree: dict, key: str, value: Any, ov: str) -> None:
    """Set dotted ``key`` in the plain YAML ``tree``; sections and default lists left out of the YAML are
    created on the way (``rewards.0.weight=0.5`` edits the default reward). A list's last part may be an
    index (``rewards.1.kwargs.x=3`` sets one key of one item) or ``+`` (``rewards.+={cls: ...}`` appends
    an item). Unknown keys are set as given and refused by ``build``, which names them."""
    parts = key.split(".")
    if not key or not all(parts) or parts[0] == "source":
        raise RecipeError(f"override {ov!r}: unknown recipe key '{key}'")
    node: Any = tree
    default: Any = to_plain(Recipe())
    for part in parts[:-1]:
        if isinstance(node, dict):
            sub = default.get(part) if isinstance(default, dict) else None
            if not isinstance(node.get(part), (dict, list)):
                node[part] = [dict(x) if isinstance(x, dict) else x for x in sub] if isinstance(sub, list) else {}
            node, default = node[part], sub
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            default = default[0] if isinstance(default, list) and default else None
        elif isinstance(node, list):
            raise RecipeError(
                f"override {ov!r}: unknown recipe key '{key}' (no item {part}: the list has {len(node)} items; "
                "append one with LIST.+=VALUE)"
            )
        else:
            raise RecipeError(f"override {ov!r}: unknown recipe key '{key}' (no item {part} here)")
    last = parts[-1]
    if isinstance(node, dict):
        node[last] = value
    elif isinstance(node, list) and last.isdigit() and int(last) < len(node):
        node[int(last)] = value
    elif isinstance(node, list) and last == "+":  # rewards.+={cls: ...}: append one item
        node.append(value)
    elif isinstance(node, list):
        raise RecipeError(
            f"override {ov!r}: '{'.'.join(parts[:-1])}' is a list of {len(node)} items (0-{len(node) - 1}); "
            f"set one with '{'.'.join(parts[:-1])}.N.KEY=...' or append one with '{'.'.join(parts[:-1])}.+=VALUE'"
        )
    else:
        raise RecipeError(f"override {ov!r}: unknown recipe key '{key}'")


def resolve_path(recipe: Recipe, p: str) -> Path:
    """A path from the recipe: absolute as is, relative to the recipe file's folder."""
    q = Path(os.path.expanduser(p))
    if q.is_absolute() or not recipe.source:
        return q
    return Path(recipe.source).parent / q


def failer(recipe: Recipe) -> Fail:
    """``fail(key, msg)`` for the checks of ``recipe``: raises ``RecipeError`` naming the file, the key's line
    and the key."""
    src = recipe.source or "recipe"
    text = Path(recipe.source).read_text() if recipe.source and Path(recipe.source).is_file() else ""

    def fail(key: str, msg: str) -> None:
        raise RecipeError(f"{_where(src, text, key)}: {key}: {msg}")

    return fail


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    """The recipe as plain data (every key, resolved): what `jointrl validate --print` and recipe.resolved.yaml show."""
    return to_plain(recipe)
