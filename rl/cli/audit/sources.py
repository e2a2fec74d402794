"""Task sources for ``jointrl audit``: how a task file becomes tasks and their reference answers.

A source is a small plug-in (:class:`TaskSource`): it says whether it reads a path
(``accepts``) and turns it into :class:`AuditTask` records (``load``): the task, as the envs
and rewards take it, and, where the task carries one, its reference answer as the assistant
turns that play it (a code solution in a Python block; a terminal solution as one command then
the done marker; a tool-call task's expected calls). Sources are kept in :data:`SOURCES` by name;
:func:`register_source` adds one (a task-directory format brings its own, reading its
``solve.sh`` as the reference), and :func:`load_audit_tasks` picks the named source or the first
one that accepts the path.

Shipped sources: ``native`` (jointrl's JSON-lines / parquet task files, ``envs/io.py``),
``humaneval`` and ``bfcl`` (the formats ``jointrl score --format`` reads). BFCL files carry no
reference in the audit's sense beyond their ground-truth calls, which are used as such.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from envs.toolcall import format_call
from envs.types import ExpectedCall, Task, ToolCall

__all__ = [
    "AuditTask",
    "TaskSource",
    "SOURCES",
    "register_source",
    "load_audit_tasks",
    "native_reference",
    "SourceError",
]


class SourceError(ValueError):
    """A task file no source can read, or an unknown source name (the message names it)."""


@dataclass(frozen=True)
class AuditTask:
    """One task to audit: ``task``, and its reference answer if it has one.

    ``reference``: the assistant turns that play the reference answer (None: the task has
    none); ``reference_from``: where it came from (``"solution"``, ``"expected calls"``,
    ``"solve.sh"``...), shown in the report; ``where``: the file the task came from. ``columns``:
    what the source adds to the task's row of the table (the Harbor source: ``image``, its build
    time); ``error``: a problem the source met preparing the task (an image that did not build):
    the task is then reported with it as an error finding, and not played.
    """

    task: Task
    reference: tuple[str, ...] | None
    reference_from: str
    where: str
    columns: dict[str, str] = field(default_factory=dict)
    error: str | None = None


@runtime_checkable
class TaskSource(Protocol):
    """Reads one task format. ``name`` is what ``--format`` selects."""

    name: str

    def accepts(self, path: Path) -> bool:
        """Whether this source reads ``path`` (used when no format is named)."""
        ...

    def load(self, path: Path, done_marker: str) -> list[AuditTask]:
        """The tasks of ``path`` with their references (terminal references end with ``done_marker``)."""
        ...


SOURCES: dict[str, TaskSource] = {}


def register_source(source: TaskSource) -> TaskSource:
    """Add ``source`` to :data:`SOURCES` under its ``name`` (a later one of the same name replaces it)."""
    if not isinstance(source, TaskSource):
        raise TypeError(f"{source!r} is not a TaskSource (needs name, accepts(path), load(path, done_marker))")
    SOURCES[source.name] = source
    return source


def load_audit_tasks(path: str | Path, fmt: str | None = None, done_marker: str = "DONE") -> list[AuditTask]:
    """The tasks of ``path`` read by the source named ``fmt``, or by the first source that accepts it."""
    p = Path(path)
    if not p.exists() and not glob.has_magic(str(p)):  # a glob is for a source to read (Harbor task dirs)
        raise FileNotFoundError(f"task file not found: {p}")
    if fmt is not None:
        if fmt not in SOURCES:
            raise SourceError(f"unknown task format {fmt!r}; registered: {', '.join(sorted(SOURCES))}")
        return SOURCES[fmt].load(p, done_marker)
    for source in SOURCES.values():
        if source.accepts(p):
            return source.load(p, done_marker)
    raise SourceError(f"{p}: no task source reads this file (registered: {', '.join(sorted(SOURCES))}); pass --format")


# ---------------------------------------------------------------------------- references


def _call_text(expected: tuple[ExpectedCall, ...], prefill: str) -> str:
    """The expected calls as a turn: each parameter at its first allowed value (omitted where ``""`` is allowed
    first), the first call's arguments ordered so that the text continues the task's prefill when it can."""
    calls = []
    for e in expected:
        args = {k: v[0] for k, v in e.allowed.items() if v and v[0] != ""}
        calls.append(ToolCall(e.name, args))
    if calls:
        m = re.search(r'"arguments": \{"([^"]+)"', prefill)
        if m and m.group(1) in calls[0].arguments:
            first = m.group(1)
            a = calls[0].arguments
            calls[0] = ToolCall(calls[0].name, {first: a[first], **{k: v for k, v in a.items() if k != first}})
    return "".join(format_call(c) for c in calls)


def native_reference(task: Task, done_marker: str = "DONE") -> tuple[tuple[str, ...] | None, str]:
    """The reference answer a task in jointrl's format carries, as assistant turns, and where it came from.

    Code: ``code.solution`` in one Python block. Terminal: ``terminal.solution`` as one command (a
    fenced block may span lines), then ``done_marker``. Tool calls in ``"calls"`` mode: the expected
    calls at their first allowed values, one turn a request (follow-ups included). Answer-mode tool
    tasks and tasks without these fields: none.
    """
    if task.code is not None and task.code.solution.strip():
        return (f"```python\n{task.code.solution.rstrip()}\n```",), "solution"
    if task.terminal is not None and task.terminal.solution.strip():
        return (f"```bash\n{task.terminal.solution.rstrip()}\n```", done_marker), "solution"
    spec = task.tool_call
    if spec is not None and spec.mode == "calls":
        requests = [(spec.expected, task.prefill), *((f.expected, f.prefill) for f in spec.followups)]
        return tuple(_call_text(exp, pre) if exp else "I need no tool for this." for exp, pre in requests), (
            "expected calls"
        )
    return None, ""


@dataclass(frozen=True)
class _FileSource:
    """A source backed by a loader function over one file, with native references."""

    name: str
    suffixes: tuple[str, ...]
    loader: Callable[[str], list[Task]]

    def accepts(self, path: Path) -> bool:
        return path.is_file() and path.name.endswith(self.suffixes)

    def load(self, path: Path, done_marker: str) -> list[AuditTask]:
        out = []
        for t in self.loader(str(path)):
            ref, origin = native_reference(t, done_marker)
            out.append(AuditTask(t, ref, origin, str(path)))
        return out


def _native(path: str) -> list[Task]:
    from envs.io import load_tasks

    return load_tasks(path)


def _humaneval(path: str) -> list[Task]:
    from envs.code import load_humaneval

    return load_humaneval(path)


def _bfcl(path: str) -> list[Task]:
    from envs.toolcall import load_bfcl

    return load_bfcl(path, None)


register_source(_FileSource("native", (".jsonl", ".jsonl.gz", ".parquet"), _native))
# Never picked without --format: their files end in .json/.jsonl like native ones.
register_source(_FileSource("humaneval", (), _humaneval))
register_source(_FileSource("bfcl", (), _bfcl))
