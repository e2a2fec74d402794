"""Task (de)serialization: jointrl's native JSON-lines format.

One task per line::

    {"id": "weather-001",                      # str, unique within a file
     "domain": "tool_call",                    # str
     "messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": "...", "name": "..."}],   # name optional
     "prefill": "<tool_call>",                 # optional, default ""
     "tool_call": {"tools": [{"name": ..., "description": ..., "parameters": {...}}],
                   "expected": [{"name": "get_weather",
                                 "allowed": {"city": ["Paris"], "unit": ["", "celsius"]}}],
                   "mode": "answer",           # optional: "calls" (default) | "answer" (multi-turn)
                   "answer": ["18"],           # optional: acceptable final answers (answer mode)
                   "state": {"users": {...}},  # optional: data the simulated tools read
                   "parallel": true,           # optional, informational; default false
                   "followups": [{"request": "And in Rome?", "prefill": "<tool_call>",
                                  "expected": [...]}]},  # optional (calls mode): later requests,
                                               # one a turn, each with its own right calls
                                               # optional; the five keys above are written only
                                               # when non-default ("expected" may be omitted in
                                               # answer mode)
     "code": {"tests": "assert f(2) == 4\n",  # code tasks: the HIDDEN tests, scored
              "public_tests": "assert f(1) == 2\n",  # optional: the prompt's example, never
                                               # scored (written only when set; see CodeSpec)
              "entry_point": "f", ...},
     "meta": {...}}                            # optional, free-form JSON object

Files: ``.jsonl`` and ``.jsonl.gz`` are read line by line (blank lines skipped) so that
errors name ``file:line``; ``.parquet`` is read with ``datasets`` and its nested columns
(``messages``, ``tool_call``, ``meta``...) may be either structs/lists or JSON strings.

Extending: other formats (HumanEval, BFCL...) register a reader for a file suffix with
:func:`register_reader`; a reader yields ``(where, dict)`` pairs in native format, or
whole :class:`Task` objects, and :func:`load_tasks` does validation and duplicate checks.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import dataclasses

from envs.types import CodeSpec, ExpectedCall, FollowUp, Message, Task, TerminalSpec, ToolCallSpec

__all__ = [
    "TaskFormatError",
    "task_to_dict",
    "task_from_dict",
    "load_tasks",
    "save_tasks",
    "register_reader",
    "read_json_objects",
    "ROLES",
]

ROLES = ("system", "user", "assistant", "tool")
_TOP_KEYS = ("id", "domain", "messages", "prefill", "tool_call", "code", "terminal", "meta")


class TaskFormatError(ValueError):
    """A task record is malformed. The message starts with where it is (``file:line``)."""


# ---------------------------------------------------------------------------- dict <-> Task


def _expected_to_dict(e: ExpectedCall) -> dict[str, Any]:
    return {"name": e.name, "allowed": {k: list(v) for k, v in e.allowed.items()}}


def task_to_dict(task: Task) -> dict[str, Any]:
    """The native JSON form of ``task`` (optional fields left out when empty)."""
    d: dict[str, Any] = {
        "id": task.id,
        "domain": task.domain,
        "messages": [_message_to_dict(m) for m in task.messages],
    }
    if task.prefill:
        d["prefill"] = task.prefill
    if task.tool_call is not None:
        d["tool_call"] = {
            "tools": [dict(t) for t in task.tool_call.tools],
            "expected": [_expected_to_dict(e) for e in task.tool_call.expected],
        }
        # Newer optional fields: only when non-default, so older files round-trip byte-identically.
        if task.tool_call.mode != "calls":
            d["tool_call"]["mode"] = task.tool_call.mode
        if task.tool_call.answer:
            d["tool_call"]["answer"] = list(task.tool_call.answer)
        if task.tool_call.state:
            d["tool_call"]["state"] = dict(task.tool_call.state)
        if task.tool_call.parallel:
            d["tool_call"]["parallel"] = True
        if task.tool_call.followups:
            d["tool_call"]["followups"] = [
                {
                    "request": f.request,
                    "expected": [_expected_to_dict(e) for e in f.expected],
                    **({"prefill": f.prefill} if f.prefill else {}),
                }
                for f in task.tool_call.followups
            ]
    for key in ("code", "terminal"):
        spec = getattr(task, key)
        if spec is not None:
            d[key] = dataclasses.asdict(spec)
    if task.code is not None and not task.code.public_tests:
        del d["code"]["public_tests"]  # only when set: files written before the split round-trip unchanged
    if task.meta:
        d["meta"] = dict(task.meta)
    return d


def _message_to_dict(m: Message) -> dict[str, Any]:
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.name is not None:
        d["name"] = m.name
    return d


def _fail(where: str, field: str, problem: str) -> TaskFormatError:
    prefix = f"{where}: " if where else ""
    return TaskFormatError(f"{prefix}field {field!r}: {problem}")


def _maybe_json(value: Any, where: str, field: str) -> Any:
    """Decode ``value`` if it is a JSON string (parquet stores nested fields that way)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise _fail(where, field, f"is a string but not valid JSON ({exc.msg} at column {exc.colno})") from None
    return value


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def task_from_dict(d: dict[str, Any], where: str = "") -> Task:
    """Build a :class:`Task` from its native dict, validating every field.

    Raises :class:`TaskFormatError` whose message names ``where`` (e.g. ``"tasks.jsonl:17"``)
    and the offending field. Optional fields may be missing or ``null``; nested fields may
    be JSON strings.
    """
    if not isinstance(d, dict):
        raise TaskFormatError(f"{where + ': ' if where else ''}a task must be a JSON object, got {_type_name(d)}")
    unknown = [k for k in d if k not in _TOP_KEYS]
    if unknown:
        raise _fail(where, unknown[0], f"unknown field (allowed: {', '.join(_TOP_KEYS)})")

    task_id, domain = _required_str(d, "id", where), _required_str(d, "domain", where)
    messages = _messages_from(d, where)

    prefill = d.get("prefill")
    if prefill is None:
        prefill = ""
    if not isinstance(prefill, str):
        raise _fail(where, "prefill", f"must be a string, got {_type_name(prefill)}")

    tool_call = None
    if d.get("tool_call") is not None:
        tool_call = _tool_call_from_dict(_maybe_json(d["tool_call"], where, "tool_call"), where)

    meta = d.get("meta")
    meta = {} if meta is None else _maybe_json(meta, where, "meta")
    if not isinstance(meta, dict):
        raise _fail(where, "meta", f"must be an object, got {_type_name(meta)}")

    code = (
        None
        if d.get("code") is None
        else _spec_from_dict(CodeSpec, _maybe_json(d["code"], where, "code"), where, "code")
    )
    terminal = (
        None
        if d.get("terminal") is None
        else _spec_from_dict(TerminalSpec, _maybe_json(d["terminal"], where, "terminal"), where, "terminal")
    )
    return Task(
        id=task_id,
        domain=domain,
        messages=messages,
        prefill=prefill,
        tool_call=tool_call,
        code=code,
        terminal=terminal,
        meta=meta,
    )


def _required_str(d: dict[str, Any], key: str, where: str) -> str:
    if key not in d or d[key] is None:
        raise _fail(where, key, "missing")
    if not isinstance(d[key], str) or not d[key].strip():
        raise _fail(where, key, f"must be a non-empty string, got {_type_name(d[key])} {d[key]!r:.80}")
    return d[key]


def _messages_from(d: dict[str, Any], where: str) -> tuple[Message, ...]:
    if "messages" not in d or d["messages"] is None:
        raise _fail(where, "messages", "missing")
    raw_messages = _maybe_json(d["messages"], where, "messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise _fail(where, "messages", f"must be a non-empty list of messages, got {_type_name(raw_messages)}")
    return tuple(_message_from_dict(m, where, f"messages[{i}]") for i, m in enumerate(raw_messages))


def _spec_from_dict(cls: Any, raw: Any, where: str, field: str) -> Any:
    """A flat spec dataclass (``CodeSpec``, ``TerminalSpec``) from an object of str/float fields."""
    if not isinstance(raw, dict):
        raise _fail(where, field, f"must be an object, got {_type_name(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in raw if k not in fields]
    if unknown:
        raise _fail(where, f"{field}.{unknown[0]}", f"unknown field (allowed: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        if raw.get(name) is None:
            if f.default is dataclasses.MISSING:
                raise _fail(where, f"{field}.{name}", "missing")
            continue
        value, want = raw[name], type(f.default) if f.default is not dataclasses.MISSING else str
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or isinstance(value, bool):
            raise _fail(where, f"{field}.{name}", f"must be a {want.__name__}, got {_type_name(value)}")
        kwargs[name] = value
    return cls(**kwargs)


def _message_from_dict(m: Any, where: str, field: str) -> Message:
    m = _maybe_json(m, where, field) if isinstance(m, str) and m.lstrip().startswith("{") else m
    if not isinstance(m, dict):
        raise _fail(where, field, f"must be an object with 'role' and 'content', got {_type_name(m)}")
    unknown = [k for k in m if k not in ("role", "content", "name")]
    if unknown:
        raise _fail(where, f"{field}.{unknown[0]}", "unknown field (allowed: role, content, name)")
    role = m.get("role")
    if role is None:
        raise _fail(where, f"{field}.role", "missing")
    if role not in ROLES:
        raise _fail(where, f"{field}.role", f"must be one of {', '.join(ROLES)}, got {role!r:.80}")
    content = m.get("content")
    if content is None:
        raise _fail(where, f"{field}.content", "missing")
    if not isinstance(content, str):
        raise _fail(where, f"{field}.content", f"must be a string, got {_type_name(content)}")
    name = m.get("name")
    if name is not None and not isinstance(name, str):
        raise _fail(where, f"{field}.name", f"must be a string, got {_type_name(name)}")
    return Message(role=role, content=content, name=name)


_TOOL_CALL_MODES = ("calls", "answer")


def _tool_call_from_dict(tc: Any, where: str) -> ToolCallSpec:
    """A :class:`ToolCallSpec` from its record; every bad field is named (``tool_call.<field>``)."""
    if not isinstance(tc, dict):
        raise _fail(where, "tool_call", f"must be an object with 'tools' and 'expected', got {_type_name(tc)}")
    keys = ("tools", "expected", "mode", "answer", "state", "parallel", "followups")
    unknown = [k for k in tc if k not in keys]
    if unknown:
        raise _fail(where, f"tool_call.{unknown[0]}", f"unknown field (allowed: {', '.join(keys)})")
    mode = "calls" if tc.get("mode") is None else tc["mode"]
    if mode not in _TOOL_CALL_MODES:
        raise _fail(where, "tool_call.mode", f"must be one of {', '.join(_TOOL_CALL_MODES)}, got {mode!r:.80}")
    answer = _answers_from(tc, mode, where)  # fields are checked in this order: the first bad one is named
    state = {} if tc.get("state") is None else _maybe_json(tc["state"], where, "tool_call.state")
    if not isinstance(state, dict):
        raise _fail(where, "tool_call.state", f"must be an object, got {_type_name(state)}")
    parallel = False if tc.get("parallel") is None else tc["parallel"]
    if not isinstance(parallel, bool):
        raise _fail(where, "tool_call.parallel", f"must be a bool, got {_type_name(parallel)}")
    tools = _tools_from(tc, where)
    if tc.get("expected") is None and mode != "answer":
        raise _fail(where, "tool_call.expected", "missing")
    return ToolCallSpec(
        tools=tools,
        expected=_expected_from(tc, where),
        mode=mode,
        answer=answer,
        state=state,
        parallel=parallel,
        followups=_followups_from(tc, mode, where),
    )


def _objects(raw: Any, where: str, field: str, what: str, shape: str = "") -> list[tuple[str, dict[str, Any]]]:
    """``field``'s list of objects (``None``: none), each with its field name (``field[i]``); a value that is not
    a list of objects is an error naming the field or the item."""
    raw = [] if raw is None else _maybe_json(raw, where, field)
    if not isinstance(raw, list):
        raise _fail(where, field, f"must be a list of {what}, got {_type_name(raw)}")
    out = []
    for i, x in enumerate(raw):
        x = _maybe_json(x, where, f"{field}[{i}]")
        if not isinstance(x, dict):
            raise _fail(where, f"{field}[{i}]", f"must be an object{shape}, got {_type_name(x)}")
        out.append((f"{field}[{i}]", x))
    return out


def _followups_from(tc: dict[str, Any], mode: str, where: str) -> tuple[FollowUp, ...]:
    """``tool_call.followups``: the later requests of a calls-mode session, each ``{"request", "expected",
    "prefill"?}`` (see :class:`~envs.types.FollowUp`)."""
    items = _objects(tc.get("followups"), where, "tool_call.followups", "requests", " with 'request' and 'expected'")
    if items and mode != "calls":
        raise _fail(where, "tool_call.followups", f"only calls-mode tasks have follow-up requests (mode is {mode!r})")
    out = []
    for f_name, f in items:
        unknown = [k for k in f if k not in ("request", "expected", "prefill")]
        if unknown:
            raise _fail(where, f"{f_name}.{unknown[0]}", "unknown field (allowed: request, expected, prefill)")
        if not isinstance(f.get("request"), str) or not f["request"].strip():
            raise _fail(where, f"{f_name}.request", "missing or not a non-empty string")
        prefill = f.get("prefill", "")
        if not isinstance(prefill, str):
            raise _fail(where, f"{f_name}.prefill", f"must be a string, got {_type_name(prefill)}")
        if f.get("expected") is None:
            raise _fail(where, f"{f_name}.expected", "missing")
        calls = _expected_from(f, where, f"{f_name}.expected")
        out.append(FollowUp(request=f["request"], expected=calls, prefill=prefill))
    return tuple(out)


def _answers_from(tc: dict[str, Any], mode: str, where: str) -> tuple[str, ...]:
    """``tool_call.answer``: the acceptable final answers (required in answer mode)."""
    raw_answer = [] if tc.get("answer") is None else _maybe_json(tc["answer"], where, "tool_call.answer")
    if not isinstance(raw_answer, list):
        raise _fail(
            where, "tool_call.answer", f"must be a list of acceptable answers (strings), got {_type_name(raw_answer)}"
        )
    for i, a in enumerate(raw_answer):
        if not isinstance(a, str) or not a.strip():
            raise _fail(where, f"tool_call.answer[{i}]", f"must be a non-empty string, got {_type_name(a)} {a!r:.80}")
    if mode == "answer" and not raw_answer:
        raise _fail(where, "tool_call.answer", "answer mode needs at least one acceptable answer")
    return tuple(raw_answer)


def _tools_from(tc: dict[str, Any], where: str) -> tuple[dict[str, Any], ...]:
    """``tool_call.tools``: function schemas with distinct non-empty names."""
    if tc.get("tools") is None:
        raise _fail(where, "tool_call.tools", "missing")
    tools = []
    for f, t in _objects(tc["tools"], where, "tool_call.tools", "function schemas"):
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _fail(where, f"{f}.name", "missing or not a non-empty string")
        params = t.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise _fail(where, f"{f}.parameters", f"must be a JSON Schema object, got {_type_name(params)}")
        tools.append(t)
    tool_names = [t["name"] for t in tools]
    dup = next((n for n in tool_names if tool_names.count(n) > 1), None)
    if dup is not None:
        raise _fail(where, "tool_call.tools", f"function {dup!r} is listed twice")
    return tuple(tools)


def _expected_from(tc: dict[str, Any], where: str, field: str = "tool_call.expected") -> tuple[ExpectedCall, ...]:
    """``tc["expected"]`` (named ``field``): the calls to make, each with its allowed argument values."""
    raw_expected = [] if tc.get("expected") is None else _maybe_json(tc["expected"], where, field)
    if not isinstance(raw_expected, list):
        raise _fail(where, field, f"must be a list of calls, got {_type_name(raw_expected)}")
    return tuple(_expected_call(e, where, f"{field}[{i}]") for i, e in enumerate(raw_expected))


def _expected_call(e: Any, where: str, f: str) -> ExpectedCall:
    e = _maybe_json(e, where, f)
    if not isinstance(e, dict):
        raise _fail(where, f, f"must be an object with 'name' and 'allowed', got {_type_name(e)}")
    if not isinstance(e.get("name"), str) or not e["name"]:
        raise _fail(where, f"{f}.name", "missing or not a non-empty string")
    allowed = e.get("allowed")
    allowed = {} if allowed is None else _maybe_json(allowed, where, f"{f}.allowed")
    if not isinstance(allowed, dict):
        raise _fail(
            where, f"{f}.allowed", f"must be an object mapping parameter -> list of values, got {_type_name(allowed)}"
        )
    for param, values in allowed.items():
        if not isinstance(values, list):
            raise _fail(where, f"{f}.allowed.{param}", f"must be a list of allowed values, got {_type_name(values)}")
    return ExpectedCall(name=e["name"], allowed={k: list(v) for k, v in allowed.items()})


# ---------------------------------------------------------------------------- files

Record = tuple[str, "dict[str, Any] | Task"]
Reader = Callable[[Path], Iterable[Record]]
_READERS: dict[str, Reader] = {}


def register_reader(suffix: str, reader: Reader) -> None:
    """Register ``reader(path) -> iterable of (where, dict or Task)`` for files ending in ``suffix``.

    Longer suffixes win (``.jsonl.gz`` over ``.gz``). Registering a suffix again replaces it.
    """
    _READERS[suffix.lower()] = reader


def read_json_objects(path: str | os.PathLike[str], what: str = "a record") -> Iterator[tuple[str, Any]]:
    """``(file:line, value)`` for every non-blank line of a ``.jsonl`` or ``.jsonl.gz`` file.

    Every file format of jointrl's that is JSON lines (tasks, HumanEval, BFCL, completions)
    reads through here, so their errors read alike: :class:`TaskFormatError` naming
    ``file:line`` for invalid JSON and for a line that is not an object (``what`` names the
    record, e.g. ``"a HumanEval record"``; ``what=""`` lets any JSON value through), and
    naming the file for an unreadable or corrupt one. A missing file raises
    ``FileNotFoundError``.
    """
    p = Path(path)
    opener = gzip.open if p.name.lower().endswith(".gz") else open
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{p}:{lineno}"
                try:
                    d = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TaskFormatError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
                if what and not isinstance(d, dict):
                    raise TaskFormatError(f"{where}: {what} must be a JSON object, got {_type_name(d)}")
                yield where, d
    except FileNotFoundError:
        raise
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # unreadable, or a corrupt gzip stream
        raise TaskFormatError(f"{p}: cannot read: {exc}") from exc


def _read_jsonl(path: Path) -> Iterator[Record]:
    # Non-objects pass through: task_from_dict reports them with the task's own wording.
    yield from read_json_objects(path, what="")


def _read_parquet(path: Path) -> Iterator[Record]:
    import datasets  # heavy import; only when needed

    ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
    for i, row in enumerate(ds):
        yield f"{path}:row {i}", dict(row)


register_reader(".jsonl", _read_jsonl)
register_reader(".jsonl.gz", _read_jsonl)
register_reader(".parquet", _read_parquet)


def _reader_for(path: Path) -> Reader:
    name = path.name.lower()
    for suffix in sorted(_READERS, key=len, reverse=True):
        if name.endswith(suffix):
            return _READERS[suffix]
    raise ValueError(f"{path}: unsupported task file type (supported: {', '.join(sorted(_READERS))})")


def load_tasks(
    path: str | os.PathLike[str], *, harbor_skip_bad: bool = False, skipped: list[str] | None = None
) -> list[Task]:
    """Load every task of a ``.jsonl``, ``.jsonl.gz`` or ``.parquet`` file (or a registered type).

    A directory or a glob is a Harbor task source (:func:`envs.harbor.env.load_harbor_tasks`:
    a directory of task directories, one task directory, or a glob; ``harbor_skip_bad`` leaves out the
    task directories that do not load, their messages appended to ``skipped``).
    Raises ``FileNotFoundError`` naming the path when it does not exist and
    :class:`TaskFormatError` naming ``file:line`` for a malformed record or a duplicate id.
    """
    p = Path(path)
    from envs.harbor.env import HarborSourceError, is_harbor_source, load_harbor_tasks

    if is_harbor_source(p):
        try:
            return load_harbor_tasks(p, skip_bad=harbor_skip_bad, skipped=skipped)
        except HarborSourceError as exc:
            raise TaskFormatError(str(exc)) from None
    if not p.is_file():
        raise FileNotFoundError(f"task file not found: {p}" + (" (it is a directory)" if p.is_dir() else ""))
    reader = _reader_for(p)
    tasks: list[Task] = []
    first_seen: dict[str, str] = {}
    for where, record in reader(p):
        task = record if isinstance(record, Task) else task_from_dict(record, where)
        if task.id in first_seen:
            raise TaskFormatError(f"{where}: field 'id': duplicate id {task.id!r} (first at {first_seen[task.id]})")
        first_seen[task.id] = where
        tasks.append(task)
    return tasks


def save_tasks(tasks: Iterable[Task], path: str | os.PathLike[str]) -> None:
    """Write ``tasks`` as JSON lines (``.jsonl``, or gzip-compressed ``.jsonl.gz``).

    Output is deterministic (stable key order, UTF-8, ``\\n`` line ends, gzip mtime 0).
    Raises :class:`TaskFormatError` on a duplicate id, so that what is written loads back.
    """
    p = Path(path)
    name = p.name.lower()
    if not (name.endswith(".jsonl") or name.endswith(".jsonl.gz")):
        raise ValueError(f"{p}: save_tasks writes .jsonl or .jsonl.gz files")
    lines = []
    seen: set[str] = set()
    for i, task in enumerate(tasks):
        if task.id in seen:
            raise TaskFormatError(f"task #{i}: field 'id': duplicate id {task.id!r}")
        seen.add(task.id)
        lines.append(json.dumps(task_to_dict(task), ensure_ascii=False) + "\n")
    data = "".join(lines).encode("utf-8")
    p.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".gz"):
        with open(p, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            gz.write(data)
    else:
        p.write_bytes(data)
