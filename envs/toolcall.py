"""The tool-call domain: Hermes-style call parsing, JSON-Schema validation, the env, BFCL.

A policy calls functions by writing one or more blocks::

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

:func:`parse_tool_calls` extracts them (and reports format problems), :func:`validate_arguments` (of
:mod:`envs.toolcall_schema`, below this module and the simulated tools alike)
checks a call against its function's JSON Schema, :class:`ToolCallEnv` is the env (single
turn in ``"calls"`` mode; multi-turn with simulated tools, :mod:`envs.toolcall_tools`, in
``"answer"`` mode), :func:`format_tools_system_prompt` writes the system prompt that lists
the tools (the shipped task files' tool prompt, and the rollout's fallback for a chat template
that does not render ``tools=``: :mod:`rollout.tools_prompt`), and :func:`load_bfcl` / :func:`bfcl_to_native` read Berkeley Function-Calling
Leaderboard files. Scoring lives in :mod:`rewards.toolcall`.
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from envs.io import ROLES, TaskFormatError, read_json_objects, save_tasks
from envs.toolcall_latency import ToolLatency
from envs.toolcall_schema import validate_arguments
from envs.toolcall_tools import ToolError, run_tool
from envs.types import ExpectedCall, Message, Task, ToolCall, ToolCallSpec

__all__ = [
    "OPEN_TAG",
    "CLOSE_TAG",
    "parse_tool_calls",
    "validate_arguments",
    "format_call",
    "format_tools_system_prompt",
    "ToolCallEnv",
    "normalize_bfcl_schema",
    "load_bfcl",
    "bfcl_to_native",
]

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


MAX_JSON_DEPTH = 32  # deeper JSON in a call is malformed (no tool schema nests so deep)


def _decode_json(text: str) -> tuple[Any, int, str | None]:
    """``(value, end, None)`` for the JSON value at the start of ``text``, or ``(None, 0, why)`` when it is not
    JSON a call can carry. Besides syntax errors that is JSON the host cannot hold or pass on safely: nesting
    past the decoder's recursion limit (unclosed brackets) or past :data:`MAX_JSON_DEPTH`, an integer over
    Python's digit limit, and a string with a lone surrogate escape (not Unicode). An integer too large for a
    float is valid JSON and stays a call argument: rewards compare integers exactly (a mismatch, never an
    overflow) and the simulated tools refuse it as a tool error."""
    try:
        obj, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        return None, 0, f"{exc.msg} at column {exc.colno}"
    except RecursionError:
        return None, 0, "nested too deeply"
    except (MemoryError, OverflowError, ValueError) as exc:  # ValueError: an integer over the digit limit
        return None, 0, f"{type(exc).__name__}: {str(exc)[:80]}"
    why = _unsafe_json(obj)
    return (None, 0, why) if why else (obj, end, None)


def _unsafe_json(obj: Any) -> str | None:
    """Why a decoded JSON value cannot be passed on (too deep, a lone surrogate), or
    None. Iterative, so that no depth makes it recurse."""
    stack = [(obj, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                return f"nested deeper than {MAX_JSON_DEPTH} levels"
            items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
            stack.extend((x, depth + 1) for x in items)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return "a string with a lone surrogate escape"
    return None


def _parse_block(body: str, label: str) -> tuple[ToolCall | None, list[str]]:
    """Parse one block's body; return the call (if it has a usable name) and its problems."""
    problems: list[str] = []
    stripped = body.strip()
    if not stripped:
        return None, [f"{label}: empty block"]
    obj, end, why = _decode_json(stripped)
    if why is not None:
        return None, [f"{label}: invalid JSON ({why})"]
    if stripped[end:].strip():
        problems.append(f"{label}: unexpected text after the JSON object: {stripped[end:].strip()[:40]!r}")
    if not isinstance(obj, dict):
        return None, problems + [f"{label}: JSON is a {type(obj).__name__}, not an object"]
    name = obj.get("name")
    if "name" not in obj:
        return None, problems + [f"{label}: missing 'name'"]
    if not isinstance(name, str) or not name.strip():
        return None, problems + [f"{label}: 'name' must be a non-empty string, got {name!r:.40}"]
    arguments: Any = obj.get("arguments")
    if "arguments" not in obj:
        problems.append(f"{label}: missing 'arguments'")
        arguments = {}
    elif isinstance(arguments, str):
        # OpenAI-style arguments encoded as a string: accept the call, flag the format.
        problems.append(f"{label}: 'arguments' is a string, not an object")
        decoded, end, why = _decode_json(arguments.strip())
        arguments = decoded if why is None and not arguments.strip()[end:].strip() else None
        if not isinstance(arguments, dict):
            arguments = {}
    elif not isinstance(arguments, dict):
        problems.append(f"{label}: 'arguments' must be an object, got {type(arguments).__name__}")
        arguments = {}
    return ToolCall(name=name.strip(), arguments=arguments), problems


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """Extract every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block of ``text``.

    Returns ``(calls, problems)``. Whitespace and newlines inside a block are fine; text
    outside blocks is ignored. Problems (each a short string naming the block) are: an
    empty block, invalid JSON, JSON that is not an object, a missing or non-string
    ``name``, missing ``arguments`` or ``arguments`` that is not an object, text after the
    JSON inside a block (JSON nested past :data:`MAX_JSON_DEPTH`, an integer over Python's digit limit
    and a lone surrogate escape count as invalid JSON), a block without its closing tag (its JSON is still parsed, up to
    the next opening tag or the end of the text), and a stray closing tag. A block whose
    object has a usable ``name`` yields a call even when it has problems (with ``{}`` as
    arguments when they are unusable); text with no blocks yields ``([], [])``.
    """
    calls: list[ToolCall] = []
    problems: list[str] = []
    pos = 0
    k = 0
    while True:
        start = text.find(OPEN_TAG, pos)
        # Closing tags between the previous block and this one have no opening tag.
        segment = text[pos:] if start == -1 else text[pos:start]
        if CLOSE_TAG in segment:
            problems.append(f"stray {CLOSE_TAG} without an opening tag")
        if start == -1:
            break
        k += 1
        label = f"block {k}"
        body_start = start + len(OPEN_TAG)
        close = text.find(CLOSE_TAG, body_start)
        next_open = text.find(OPEN_TAG, body_start)
        if close == -1 or (next_open != -1 and next_open < close):
            body_end = next_open if next_open != -1 else len(text)
            problems.append(f"{label}: missing closing {CLOSE_TAG}")
            pos = body_end
        else:
            body_end = close
            pos = close + len(CLOSE_TAG)
        call, block_problems = _parse_block(text[body_start:body_end], label)
        problems.extend(block_problems)
        if call is not None:
            calls.append(call)
    return calls, problems


def format_call(call: ToolCall) -> str:
    """The canonical text of one call: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""
    payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{OPEN_TAG}{payload}{CLOSE_TAG}"


def format_tools_system_prompt(
    tools: Iterable[Mapping[str, Any]],
    example: tuple[str, ToolCall] | None = None,
    *,
    parallel: bool = False,
    multi_turn: bool = False,
) -> str:
    """A system prompt listing ``tools`` (one JSON schema per line) and the reply format.

    ``example`` is an optional worked example ``(user request, call)``; a small model needs
    one to get the format right, and it should use a function *not* in ``tools`` so that
    copying it never scores. ``parallel`` adds a line saying several calls go in several
    blocks of one reply; ``multi_turn`` adds how tool results come back and that the final
    answer is plain text without a call, with the value in one ``<answer>`` block (for
    ``"answer"``-mode tasks; see :func:`rewards.toolcall.answer_span`). With both False the
    text is exactly what it always was.
    """
    lines = [
        "You are a helpful assistant that can call functions.",
        "You have access to the following functions:",
        "<tools>",
        *(json.dumps(dict(t), ensure_ascii=False) for t in tools),
        "</tools>",
        "",
        "To call a function, reply with a JSON object inside <tool_call></tool_call> tags:",
        f'{OPEN_TAG}{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}{CLOSE_TAG}',
    ]
    if parallel:
        lines.append(
            "To call several functions at once, write one <tool_call></tool_call> block per call in the same reply."
        )
    if multi_turn:
        lines += [
            "Each function's result comes back in a tool message. Call functions until you have what you need,",
            "then reply to the user with the final answer as plain text, without any <tool_call> block.",
            "Put the value asked for, and nothing else, in one <answer></answer> block in that reply,",
            "e.g. <answer>42</answer>; only that block is read, and a block listing several candidates scores 0.",
        ]
    if example is not None:
        request, call = example
        lines += ["", "Example:", f"User: {request}", f"Assistant: {format_call(call)}"]
    return "\n".join(lines)


def _tool_message(name: str | None, payload: Any) -> Message:
    return Message("tool", json.dumps(payload, ensure_ascii=False), name=name)


class ToolCallEnv:
    """The tool-call env, driven by the task's ``tool_call.mode``.

    ``"calls"`` mode (and tasks without a ``tool_call`` spec): one turn a request. ``step(action)``
    parses the turn; no tool runs. With requests left (``tool_call.followups``) it returns the next one as
    a user message, ``([Message("user", request)], False, False, info)`` with ``info["prefill"]`` the next
    turn's pre-start (the rollout starts that turn with it), or, when this was turn ``max_turns``,
    ``([], False, True, info)``; after the last request ``([], True, False, info)`` (a task without
    follow-ups: after its one turn, whatever ``max_turns`` is). The ``toolcall`` reward scores each turn's
    calls against its request's.

    ``"answer"`` mode: multi-turn with simulated tools (:mod:`envs.toolcall_tools`).

    * A turn containing ``<tool_call>`` is a calling turn. Every parsed call, in order, is
      validated against the task's schema (``tool_call.tools``) and, when valid, run by its
      simulated tool on the episode's copy of ``tool_call.state``; the observation has one
      ``Message("tool", <JSON result>, name=<function>)`` per call, in call order. Invalid
      arguments, an unknown or unsimulated function, a :class:`~envs.toolcall_tools.ToolError`
      or any other failure of the tool give ``{"error": "..."}`` as that call's content
      (never an exception). Calls beyond ``max_calls_per_turn`` get an error without
      running. Blocks that do not parse into a call add one trailing tool message
      (``name=None``) with ``{"error": "could not parse ..."}``. The episode continues, or,
      when this was turn ``max_turns``, ends with ``truncated=True``.
    * A turn without ``<tool_call>`` is the final answer: ``terminated=True`` and
      ``info["answer"]`` is the turn's text, stripped. The ``tool_answer`` reward scores it.

    ``info`` always has ``"calls"`` (``{"name", "arguments"}`` dicts), ``"problems"``
    (see :func:`parse_tool_calls`), ``"schema_errors"`` (see :func:`validate_arguments`)
    and ``"tool_results"`` (one ``{"name", "arguments", "ok", "result" | "error"}`` per
    executed call; ``[]`` in calls mode). The env does not score. :attr:`state` is the
    episode's tool state (e.g. ``state["outbox"]`` after ``send_email``).

    The rollout's ``max_turns`` (:class:`~envs.types.Sampling`) caps turns too; set both.

    ``tool_latency`` (off by default; for benches and tests, e.g. ``{median_s: 0.5, sigma: 1.0, cap_s: 20,
    seed: 0}``): each call of a turn (at most ``max_calls_per_turn``; in calls mode each parsed call, as if
    dispatched) first sleeps a seeded lognormal time keyed by task, episode seed (:meth:`seed_episode`), turn
    and call (:class:`~envs.toolcall_latency.ToolLatency`); ``info["tool_latency_s"]`` is the turn's total.
    """

    def __init__(self, max_turns: int = 1, max_calls_per_turn: int = 8, tool_latency: Mapping[str, Any] | None = None):
        for label, v in (("max_turns", max_turns), ("max_calls_per_turn", max_calls_per_turn)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{label} must be an integer >= 1, got {v!r}")
        self.max_turns = max_turns
        self.max_calls_per_turn = max_calls_per_turn
        self.latency = ToolLatency.from_option(tool_latency) if tool_latency is not None else None
        self._sleep = time.sleep  # a test replaces it
        self._episode_seed = 0
        self._task: Task | None = None
        self._state: dict[str, Any] = {}
        self._turns = 0
        self._done = True
        self._closed = False

    @property
    def state(self) -> dict[str, Any]:
        """The current episode's tool state (a deep copy of the task's ``tool_call.state``)."""
        return self._state

    def seed_episode(self, seed: int) -> None:
        """The episode's seed (``rollout.episode`` calls this before ``reset``): keys the tool latency draws."""
        self._episode_seed = int(seed)

    def _wait_for_tools(self, n_calls: int, info: dict[str, Any]) -> None:
        """Sleep the simulated latency of the turn's first ``n_calls`` calls (nothing without ``tool_latency``)."""
        if self.latency is None or self._task is None:
            return
        n = min(n_calls, self.max_calls_per_turn)
        total = sum(self.latency.draw(self._task.id, self._episode_seed, self._turns, i) for i in range(n))
        info["tool_latency_s"] = total
        if total > 0:
            self._sleep(total)

    def reset(self, task: Task) -> list[Message]:
        if self._closed:
            raise RuntimeError("ToolCallEnv.reset() after close()")
        if not task.messages:
            raise ValueError(f"task {task.id!r} has no messages")
        self._task = task
        self._state = copy.deepcopy(dict(task.tool_call.state)) if task.tool_call is not None else {}
        self._turns = 0
        self._done = False
        return list(task.messages)

    def step(self, action: str) -> tuple[list[Message], bool, bool, dict[str, Any]]:
        if self._closed:
            raise RuntimeError("ToolCallEnv.step() after close()")
        if self._task is None:
            raise RuntimeError("ToolCallEnv.step() before reset()")
        if self._done:
            raise RuntimeError("ToolCallEnv.step() after the episode ended; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        spec = self._task.tool_call
        calls, problems = parse_tool_calls(action)
        per_call_errors = [validate_arguments(c, spec.tools) if spec is not None else [] for c in calls]
        self._turns += 1
        info: dict[str, Any] = {
            "calls": [asdict(c) for c in calls],
            "problems": problems,
            "schema_errors": [e for errs in per_call_errors for e in errs],
            "tool_results": [],
        }
        if spec is None or spec.mode != "answer":
            self._wait_for_tools(len(calls), info)
            followups = spec.followups if spec is not None else ()
            if self._turns > len(followups):
                self._done = True
                return [], True, False, info
            if self._turns >= self.max_turns:  # requests left, but no turn for them
                self._done = True
                return [], False, True, info
            nxt = followups[self._turns - 1]
            info["prefill"] = nxt.prefill
            return [Message("user", nxt.request)], False, False, info
        if OPEN_TAG not in action:
            self._done = True
            info["answer"] = action.strip()
            return [], True, False, info
        self._wait_for_tools(len(calls), info)

        observation = []
        for i, (call, errors) in enumerate(zip(calls, per_call_errors)):
            record: dict[str, Any] = {"name": call.name, "arguments": call.arguments}
            if i >= self.max_calls_per_turn:
                error = f"too many calls in one turn (at most {self.max_calls_per_turn}); this call was not run"
            elif errors:
                error = "invalid arguments: " + "; ".join(errors)
            else:
                error = None
                try:
                    record["result"] = run_tool(call, self._state)
                except ToolError as exc:
                    error = str(exc)
                except Exception as exc:  # noqa: BLE001 - a tool bug must not crash the rollout
                    error = f"{call.name} failed: {type(exc).__name__}: {exc}"
            if error is None:
                record["ok"] = True
                observation.append(_tool_message(call.name, record["result"]))
            else:
                record["ok"], record["error"] = False, error
                observation.append(_tool_message(call.name, {"error": error}))
            info["tool_results"].append(record)
        unparsed = action.count(OPEN_TAG) - len(calls)
        if unparsed > 0:
            detail = "; ".join(problems) or "malformed block"
            observation.append(
                _tool_message(None, {"error": f"could not parse {unparsed} tool call block(s): {detail}"})
            )
        truncated = self._turns >= self.max_turns
        self._done = truncated
        return observation, False, truncated, info

    def close(self) -> None:
        self._closed = True
        self._task = None
        self._done = True


# ----------------------------------------------------------------------------- BFCL

# BFCL's (Python-flavoured) type names -> JSON Schema; None drops the "type" keyword.
_BFCL_TYPES: dict[str, str | None] = {
    "dict": "object",
    "object": "object",
    "float": "number",
    "number": "number",
    "double": "number",
    "int": "integer",
    "integer": "integer",
    "str": "string",
    "string": "string",
    "bool": "boolean",
    "boolean": "boolean",
    "tuple": "array",
    "list": "array",
    "array": "array",
    "null": "null",
    "any": None,
}


def normalize_bfcl_schema(schema: Any, where: str = "", path: str = "parameters") -> Any:
    """A JSON Schema from a BFCL parameter schema (a new object; the input is not changed).

    Recursively (through ``properties``, ``items``, ``additionalProperties``, ``anyOf``,
    ``oneOf``, ``allOf``) maps ``"dict"`` -> ``"object"``, ``"float"`` -> ``"number"``,
    ``"tuple"``/``"list"`` -> ``"array"``, ``"int"``/``"str"``/``"bool"`` to their JSON
    Schema names and drops ``"type": "any"``. An unknown type name raises
    :class:`~envs.io.TaskFormatError` naming ``where`` and the schema path.
    """
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            names = value if isinstance(value, list) else [value]
            mapped = []
            for n in names:
                if not isinstance(n, str) or n.lower() not in _BFCL_TYPES:
                    raise TaskFormatError(f"{where + ': ' if where else ''}{path}.type: unknown BFCL type {n!r}")
                mapped.append(_BFCL_TYPES[n.lower()])
            if None in mapped or not mapped:
                continue  # "any" (alone or in a union): no type constraint
            out["type"] = list(dict.fromkeys(mapped)) if isinstance(value, list) else mapped[0]
        elif key == "properties" and isinstance(value, dict):
            out[key] = {k: normalize_bfcl_schema(v, where, f"{path}.properties.{k}") for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = normalize_bfcl_schema(value, where, f"{path}.{key}")
        elif key in ("items", "anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, list):
            out[key] = [normalize_bfcl_schema(v, where, f"{path}.{key}[{i}]") for i, v in enumerate(value)]
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read_bfcl_lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for where, d in read_json_objects(path, "a BFCL entry"):
        if not isinstance(d.get("id"), str) or not d["id"].strip():
            raise TaskFormatError(f"{where}: field 'id': missing or not a non-empty string")
        yield where, d


def _bfcl_messages(question: Any, where: str) -> list[Message]:
    """The first turn of a BFCL ``question`` (a list of turns, each a list of messages)."""
    if isinstance(question, str):  # BFCL v1: a bare string
        question = [[{"role": "user", "content": question}]]
    if not isinstance(question, list) or not question:
        raise TaskFormatError(f"{where}: field 'question': must be a non-empty list of turns")
    turn = question[0] if isinstance(question[0], list) else question  # tolerate a flat list of messages
    if not turn:
        raise TaskFormatError(f"{where}: field 'question[0]': empty turn")
    out = []
    for i, m in enumerate(turn):
        f = f"question[0][{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise TaskFormatError(
                f"{where}: field {f!r}: must be an object with a role ({', '.join(ROLES)}) "
                f"and a string content, got {m!r:.120}"
            )
        out.append(Message(m["role"], m["content"]))
    return out


def _bfcl_functions(functions: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(functions, dict):  # BFCL v1: one function
        functions = [functions]
    if not isinstance(functions, list) or not functions:
        raise TaskFormatError(f"{where}: field 'function': must be a non-empty list of function schemas")
    out = []
    for i, fn in enumerate(functions):
        f = f"function[{i}]"
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise TaskFormatError(f"{where}: field {f!r}: must be an object with a non-empty 'name'")
        tool: dict[str, Any] = {"name": fn["name"], "description": fn.get("description", "")}
        params = fn.get("parameters")
        if params is not None:
            if not isinstance(params, dict):
                raise TaskFormatError(f"{where}: field '{f}.parameters': must be an object")
            tool["parameters"] = normalize_bfcl_schema(params, where, f"{f}.parameters")
        out.append(tool)
    names = [t["name"] for t in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise TaskFormatError(f"{where}: field 'function': function {dup!r} is listed twice")
    return out


def _bfcl_expected(ground_truth: Any, names: set[str], where: str) -> list[ExpectedCall]:
    """BFCL ``ground_truth`` (``[{function: {param: [allowed values]}}]``) as ExpectedCalls."""
    if isinstance(ground_truth, dict):
        ground_truth = [ground_truth]
    if not isinstance(ground_truth, list):
        raise TaskFormatError(f"{where}: field 'ground_truth': must be a list of {{function: {{param: [values]}}}}")
    out = []
    for i, entry in enumerate(ground_truth):
        f = f"ground_truth[{i}]"
        if not isinstance(entry, dict) or len(entry) != 1:
            raise TaskFormatError(f"{where}: field {f!r}: must be an object with exactly one function name")
        ((name, params),) = entry.items()
        if name not in names:
            raise TaskFormatError(f"{where}: field {f!r}: function {name!r} is not among the task's functions")
        if not isinstance(params, dict):
            raise TaskFormatError(f"{where}: field '{f}.{name}': must map parameters to lists of allowed values")
        for param, values in params.items():
            if not isinstance(values, list):
                raise TaskFormatError(f"{where}: field '{f}.{name}.{param}': must be a list of allowed values")
        out.append(ExpectedCall(name=name, allowed={k: copy.deepcopy(v) for k, v in params.items()}))
    return out


def load_bfcl(questions_path: str | os.PathLike[str], answers_path: str | os.PathLike[str] | None = None) -> list[Task]:
    """Tasks from a BFCL question file (JSON lines) and, optionally, its answer file.

    A question line has ``id``, ``question`` (a list of turns, each a list of
    ``{"role", "content"}``; the first turn is used), ``function`` (function schemas with
    BFCL types, normalized by :func:`normalize_bfcl_schema`) and, unless ``answers_path``
    is given, ``ground_truth``. An answer line has ``id`` and ``ground_truth``, a list of
    ``{function_name: {param: [allowed values]}}`` (``""`` allowed = may be omitted); it
    takes precedence over the question's own. Each task is ``domain="tool_call"``, mode
    ``"calls"``, ``prefill=""``, a system prompt by :func:`format_tools_system_prompt`
    (no worked example; prepended to the question's own system message if it has one),
    ``parallel`` when the ground truth has several calls, and ``meta`` ``{"source":
    "bfcl", "category": <id without its number>}``.

    Scoring differences from BFCL's checker: strings compare case-sensitively after
    ``strip()`` (BFCL also drops punctuation and case), and nested dict arguments compare
    exactly (BFCL lists allowed values per key). Raises ``FileNotFoundError`` or
    :class:`~envs.io.TaskFormatError` naming ``file:line``.
    """
    qpath = Path(questions_path)
    for p in (qpath, None if answers_path is None else Path(answers_path)):
        if p is not None and not p.is_file():
            raise FileNotFoundError(f"BFCL file not found: {p}")
    answers: dict[str, tuple[str, Any]] = {}
    if answers_path is not None:
        for where, d in _read_bfcl_lines(Path(answers_path)):
            if "ground_truth" not in d:
                raise TaskFormatError(f"{where}: field 'ground_truth': missing")
            if d["id"] in answers:
                raise TaskFormatError(f"{where}: field 'id': duplicate id {d['id']!r} (first at {answers[d['id']][0]})")
            answers[d["id"]] = (where, d["ground_truth"])

    tasks: list[Task] = []
    first_seen: dict[str, str] = {}
    for where, d in _read_bfcl_lines(qpath):
        task_id = d["id"]
        if task_id in first_seen:
            raise TaskFormatError(f"{where}: field 'id': duplicate id {task_id!r} (first at {first_seen[task_id]})")
        first_seen[task_id] = where
        messages = _bfcl_messages(d.get("question"), where)
        tools = _bfcl_functions(d.get("function"), where)
        if task_id in answers:
            gt_where, ground_truth = answers[task_id]
        elif "ground_truth" in d:
            gt_where, ground_truth = where, d["ground_truth"]
        else:
            missing_in = f" or in {answers_path}" if answers_path is not None else ""
            raise TaskFormatError(
                f"{where}: field 'ground_truth': missing (no ground truth for {task_id!r} here{missing_in})"
            )
        expected = _bfcl_expected(ground_truth, {t["name"] for t in tools}, gt_where)
        system = format_tools_system_prompt(tools, parallel=True)
        if messages[0].role == "system":
            messages[0] = Message("system", system + "\n\n" + messages[0].content)
        else:
            messages.insert(0, Message("system", system))
        tasks.append(
            Task(
                id=task_id,
                domain="tool_call",
                messages=tuple(messages),
                prefill="",
                tool_call=ToolCallSpec(tools=tuple(tools), expected=tuple(expected), parallel=len(expected) > 1),
                meta={"source": "bfcl", "category": re.sub(r"_\d+(?:-\d+)*$", "", task_id)},
            )
        )
    return tasks


def bfcl_to_native(
    questions: str | os.PathLike[str], answers: str | os.PathLike[str] | None, dst: str | os.PathLike[str]
) -> list[Task]:
    """Convert a BFCL question (+ answer) file to a native ``.jsonl``/``.jsonl.gz`` task file.

    Returns the tasks written (see :func:`load_bfcl`); the file loads back with
    :func:`envs.io.load_tasks` into equal tasks.
    """
    tasks = load_bfcl(questions, answers)
    save_tasks(tasks, dst)
    return tasks
