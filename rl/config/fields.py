"""Typed recipe fields, checked where they are declared, and the builder from plain YAML data.

``knob(default, doc, ge=..., le=..., check=...)`` is a ``dataclasses.field`` whose metadata
holds the field's one-line doc (read by ``rl/config/docgen.py``) and its bounds. ``Section``
is the base of every recipe section: its ``__post_init__`` checks every field against its
annotation (``Literal`` choices) and bounds, then runs the section's own ``check()`` (rules
between fields of that one section). A failure raises ``FieldError(key, msg)`` with the key
relative to the section. ``build(cls, data)`` turns the plain data of a YAML file into
sections, checking types on the way (``1`` is a float where a float is due, ``true`` is no
int; ``X | Y``: the first that fits), and prefixes each error's key with the section's dotted path.

(OmegaConf's structured configs, used before, take no ``Literal`` field types and check no
bounds; this builder is the part of them the recipe needs.)

A tagged union (the ``algo`` section: one arm per algorithm) is a base section whose
``arm_for(data)`` names the subclass that builds a mapping; a key only another arm has is an
unknown key, with the words of ``key_hint``.

What this module does not do: read files, know any particular section, or check rules that
span sections (``rl/config/rules.py`` keeps those in one place).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Callable, Literal

__all__ = ["FieldError", "Section", "knob", "build", "doc_of", "bounds_text"]

_MISSING = dataclasses.MISSING


class FieldError(ValueError):
    """A bad value: ``key`` (dotted, relative to where it was raised) and a message for the user."""

    def __init__(self, key: str, msg: str, *, value: bool = False) -> None:
        super().__init__(f"{key}: {msg}")
        self.key, self.msg = key, msg
        self.value = value  # a well-typed value out of range or against a rule (not a shape or type error)


def knob(
    default: Any = _MISSING,
    doc: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A recipe field: ``default`` (or ``factory`` for mutable defaults), its doc line and bounds.

    ``check(value)`` returns an error message (``None`` when fine) for rules bounds cannot say; it may
    raise ``FieldError(subkey, msg)`` to name a part of the value (a mapping's key).
    """
    md = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "check": check}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=md)
    return dataclasses.field(default=default, metadata=md)


def doc_of(f: dataclasses.Field) -> str:
    """The doc line declared with ``knob``, else ``""``."""
    return str(f.metadata.get("doc", ""))


def bounds_text(f: dataclasses.Field) -> str:
    """``>= 0``, ``in [0, 1]``, ``> 0`` ... for the docs ("" when unbounded)."""
    md = f.metadata
    lo = f"[{md['ge']:g}" if md.get("ge") is not None else f"({md['gt']:g}" if md.get("gt") is not None else None
    hi = f"{md['le']:g}]" if md.get("le") is not None else f"{md['lt']:g})" if md.get("lt") is not None else None
    if lo and hi:
        return f"in {lo}, {hi}"
    if lo:
        return (">= " if lo[0] == "[" else "> ") + lo[1:]
    if hi:
        return ("<= " if hi[-1] == "]" else "< ") + hi[:-1]
    return ""


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check_field(f: dataclasses.Field, value: Any, tp: Any) -> None:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and not isinstance(value, tp):
        raise FieldError(f.name, f"expected a {tp.__name__} section, got {type(value).__name__}")
    if typing.get_origin(tp) is Literal and value not in typing.get_args(tp):
        raise FieldError(f.name, f"choose one of {', '.join(map(str, typing.get_args(tp)))}; got {value!r}")
    md = f.metadata
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        bad = (
            (md.get("ge") is not None and not value >= md["ge"])
            or (md.get("gt") is not None and not value > md["gt"])
            or (md.get("le") is not None and not value <= md["le"])
            or (md.get("lt") is not None and not value < md["lt"])
        )
        if bad:
            raise FieldError(f.name, f"must be {bounds_text(f)}, got {value:g}")
    if md.get("check") is not None:
        try:
            msg = md["check"](value)
        except FieldError as e:
            raise FieldError(f"{f.name}.{e.key}", e.msg) from None
        if msg:
            raise FieldError(f.name, msg)


class Section:
    """Base of the recipe sections (frozen dataclasses): fields are checked on construction."""

    def __post_init__(self) -> None:
        types = hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            _check_field(f, getattr(self, f.name), types[f.name])
        self.check()

    def check(self) -> None:
        """Rules between this section's own fields; raise ``FieldError(field, msg)``."""

    @classmethod
    def arm_for(cls, data: dict) -> type:
        """The class that builds ``data`` (a mapping of this section's keys): ``cls`` itself, or for a tagged
        union (a base section whose subclasses are its arms) the arm that the tag in ``data`` chooses."""
        return cls

    @classmethod
    def key_hint(cls, key: str, data: dict) -> str:
        """Words added to the "unknown recipe key" error for ``key`` in ``data`` (a key another arm of a union
        has)."""
        return ""


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _scalar(tp: Any, data: Any, path: str) -> Any:
    if tp is Any:
        return data
    if tp is bool:
        if not isinstance(data, bool):
            raise FieldError(path, f"expected true or false, got {data!r}")
        return data
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise FieldError(path, f"expected an integer, got {data!r}")
        return data
    if tp is float:
        if isinstance(data, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                return float(data)
            except ValueError:
                pass
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise FieldError(path, f"expected a number, got {data!r}")
        return float(data)
    if tp is str:
        if isinstance(data, bool) or not isinstance(data, (str, int, float)):
            raise FieldError(path, f"expected a string, got {data!r}")
        return str(data)
    if typing.get_origin(tp) is Literal:
        return data  # membership is checked by the section, which names the choices
    raise TypeError(f"{path}: unsupported recipe field type {tp!r}")


def build(tp: Any, data: Any, path: str = "", *, renamed: dict[str, str] | None = None) -> Any:
    """``data`` (plain YAML values) as type ``tp``: sections, ``list[...]``, ``dict[str, ...]``, scalars.

    A key a section does not have raises ``FieldError(path, "unknown recipe key ...")``, naming its
    new place when ``renamed`` maps the old dotted key (list indices as ``<i>``) to one.
    """
    renamed = renamed or {}
    if dataclasses.is_dataclass(tp):
        if isinstance(data, tp):
            return data
        if isinstance(data, dict) and issubclass(tp, Section):
            tp = tp.arm_for(data)
        names = [f.name for f in dataclasses.fields(tp) if f.init]
        generic = ".".join("<i>" if p.isdigit() else p for p in path.split("."))
        if not isinstance(data, dict):
            hint = f"; '{path}: {data}' moved to {renamed[generic]}" if generic in renamed else ""
            raise FieldError(path, f"is a section (keys {', '.join(names)}), got {data!r}{hint}")
        for k in data:
            if k not in names:
                key = _join(path, k)
                gkey = _join(generic, k)
                # An old scalar key that became a section (algo.critic -> algo.critic.model) given a mapping is
                # today's section, where this arm has none: an unknown key, not a moved one.
                became_section = isinstance(data[k], dict) and renamed.get(gkey, "").startswith(gkey + ".")
                if gkey in renamed and not became_section:
                    raise FieldError(key, f"recipe key '{key}' moved to '{renamed[gkey]}'")
                hint = tp.key_hint(k, data) if issubclass(tp, Section) else ""
                raise FieldError(key, f"unknown recipe key '{key}'{hint}; valid keys here: {', '.join(names)}")
        kwargs = {k: build(hints(tp)[k], v, _join(path, k), renamed=renamed) for k, v in data.items()}
        try:
            return tp(**kwargs)
        except FieldError as e:
            raise FieldError(_join(path, e.key), e.msg, value=True) from None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _union(args, data, path, renamed)
    if origin is list:
        if not isinstance(data, (list, tuple)):
            raise FieldError(path, f"expected a list, got {data!r}")
        return [build(args[0], x, _join(path, i), renamed=renamed) for i, x in enumerate(data)]
    if origin is dict:
        if not isinstance(data, dict):
            raise FieldError(path, f"expected a mapping, got {data!r}")
        return {str(k): build(args[1], v, _join(path, k), renamed=renamed) for k, v in data.items()}
    return _scalar(tp, data, path)


def _union(arms: tuple[Any, ...], data: Any, path: str, renamed: dict[str, str]) -> Any:
    """``data`` as the first of ``arms`` (``X | Y``) it builds as. When an arm failed inside ``data``
    (a mapping with a bad value), that deeper error is the one raised: it names the part at fault."""
    inner: FieldError | None = None
    for arm in arms:
        try:
            return build(arm, data, path, renamed=renamed)
        except FieldError as e:
            if e.key != path and inner is None:
                inner = e
    if inner is not None:
        raise inner
    raise FieldError(path, f"expected {' or '.join(_kind(a) for a in arms)}, got {data!r}")


def _kind(tp: Any) -> str:
    """How an error message names a value of type ``tp``."""
    origin = typing.get_origin(tp)
    if origin is dict:
        return "a mapping"
    if origin is list:
        return "a list"
    names = {float: "a number", int: "an integer", str: "a string", bool: "true or false", type(None): "null"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def to_plain(v: Any) -> Any:
    """Sections as dicts, recursively (what ``jointrl validate --print`` and the resolved recipe show)."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: to_plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (list, tuple)):
        return [to_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: to_plain(x) for k, x in v.items()}
    return v
