"""Checking a tool call's arguments against its function's JSON Schema.

One module below both :mod:`envs.toolcall` (the env, which reports schema errors of the policy's calls)
and :mod:`envs.toolcall_tools` (the simulated tools, which refuse invalid arguments as a tool error), so
that the two check calls alike without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema

from envs.types import ToolCall

__all__ = ["validate_arguments"]


def _tool_index(tools: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {t["name"]: t for t in tools if isinstance(t, Mapping) and "name" in t}


def validate_arguments(call: ToolCall, tools: Iterable[Mapping[str, Any]]) -> list[str]:
    """Errors of ``call`` against its function's JSON Schema (``[]`` when it is valid).

    ``tools`` are function schemas ``{"name", "description", "parameters"}``. The schema's
    ``$schema`` picks the draft; without one, Draft 2020-12 is used (which agrees with
    Draft 7 on everything function schemas use). An unknown function name is an error.
    """
    index = _tool_index(tools)
    tool = index.get(call.name)
    if tool is None:
        available = ", ".join(sorted(index)) or "none"
        return [f"unknown function {call.name!r} (available: {available})"]
    schema = tool.get("parameters")
    if schema is None:
        schema = {"type": "object"}
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return [f"{call.name}: the function's parameter schema is invalid: {exc.message}"]
    errors = sorted(cls(schema).iter_errors(call.arguments), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    out = []
    for e in errors:
        path = ".".join(str(p) for p in e.absolute_path)
        out.append(f"{call.name}: {path + ': ' if path else ''}{e.message}")
    return out
