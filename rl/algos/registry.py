"""Choosing a class by name: a registered short name, or a dotted path ``pkg.module.Class`` of a subclass.

The estimators (``algo.name``) and the policy losses (``algo.loss.policy``) are chosen this way; each passes its
registry, its base class and its error type (which names the recipe key to blame).
"""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def resolve_class(
    name: str, registry: dict[str, type[T]], base: type[T], error: Callable[[str], Exception], unknown: str
) -> type[T]:
    """``registry[name]``, else the class at dotted path ``name`` if it subclasses ``base``; else ``error(msg)`` is
    raised: ``unknown`` for a bare name not registered, or why the path does not import or is not a subclass."""
    if name in registry:
        return registry[name]
    if "." not in name:
        raise error(unknown)
    from envs.base import resolve

    try:
        cls = resolve(name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to see
        raise error(f"cannot import {name!r}: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise error(f"{name} is not a subclass of {base.__module__}.{base.__qualname__}")
    return cls
