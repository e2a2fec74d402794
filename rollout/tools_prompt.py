"""How a tool-call task's function schemas reach the model's prompt.

A task's ``tool_call.tools`` are the functions the policy may call; the model must see them. Three
placements, chosen per episode by :func:`place_tools` from the recipe's ``rollout.tools_in_prompt``:

* ``"template"``: the schemas go to the tokenizer's chat template as ``tools=`` (each wrapped as
  ``{"type": "function", "function": <schema>}``, the form Hugging Face templates and TRL use), so
  the model sees them in the layout its vendor trained it on (Qwen's ``# Tools`` block, Llama's JSON
  list...). Only for a template that renders ``tools`` (:func:`template_renders_tools`).
* ``"system"``: the schemas are written into the system message by
  :func:`envs.toolcall.format_tools_system_prompt` (the tools one JSON object a line inside
  ``<tools></tools>``, then the ``<tool_call>`` reply format; with the multi-turn lines for
  ``"answer"``-mode tasks and the several-calls line for ``parallel`` ones), after the task's own
  system message and a blank line, or as a new first system message when the task has none. This is
  for templates that ignore ``tools`` (SmolLM2's, the tiny test model's ChatML).
* ``"task"``: the task's system message already lists every one of its tools (each name appears in
  it as a JSON string ``"name"`` or as a signature ``name(``: the shipped task files write their own
  tool prompt); it is rendered as written and the schemas are not given a second time.

``rollout.tools_in_prompt``: ``auto`` (default) takes ``template`` where the template renders tools,
else ``system``; ``template`` requires a tool-aware template (an error otherwise, at start);
``system`` always writes the system message. ``task`` applies in every mode. The choice is logged
once per process, model and placement (the ``system`` fallback as a warning, shown without any
logging set up: the model then reads a tool format its vendor did not train it on). The tools are
never given twice.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from envs.toolcall import format_tools_system_prompt
from envs.types import Message, Task

__all__ = ["MODES", "ToolsPlacement", "template_renders_tools", "lists_tools", "place_tools", "check_mode"]

logger = logging.getLogger("jointrl.rollout")
MODES = ("auto", "template", "system")
_PROBE = "jointrl_probe_tool_7f3a"  # a function name no template writes by itself
_SUPPORT: dict[str, bool] = {}  # chat template text -> whether it renders ``tools``
_LOGGED: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class ToolsPlacement:
    """Where one episode's tool schemas go. ``how``: ``"template"`` (``tools`` is handed to the
    chat template), ``"system"`` (``system_text`` is added to the system message), ``"task"`` (the
    task's system message lists them already) or ``"none"`` (the task has no tools)."""

    how: str = "none"
    tools: tuple[dict[str, Any], ...] = ()  # for the template (``how == "template"`` only)
    system_text: str = ""  # for the system message (``how == "system"`` only)

    def messages(self, msgs: list[Message]) -> list[Message]:
        """``msgs`` as rendered: with ``system_text`` after the first system message's content (or as a
        new first system message); unchanged for the other placements."""
        if not self.system_text:
            return list(msgs)
        if msgs and msgs[0].role == "system":
            first = msgs[0]
            content = f"{first.content}\n\n{self.system_text}" if first.content.strip() else self.system_text
            return [Message("system", content, first.name), *msgs[1:]]
        return [Message("system", self.system_text), *msgs]

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The ``tools=`` argument of ``apply_chat_template`` (None: none is passed)."""
        if self.how != "template" or not self.tools:
            return None
        return [{"type": "function", "function": dict(t)} for t in self.tools]


def _template_key(tokenizer: Any) -> str:
    return repr(getattr(tokenizer, "chat_template", None))


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template writes the ``tools`` it is given: a one-message
    conversation rendered with a probe function must contain the probe's name. A template that
    raises on ``tools`` (or a tokenizer whose ``apply_chat_template`` takes none) does not."""
    key = _template_key(tokenizer)
    if key not in _SUPPORT:
        probe = {"name": _PROBE, "description": "probe", "parameters": {"type": "object", "properties": {}}}
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": "hi"}],
                tools=[{"type": "function", "function": probe}],
                add_generation_prompt=True,
                tokenize=False,
            )
            _SUPPORT[key] = isinstance(text, str) and _PROBE in text
        except Exception:  # noqa: BLE001 - any failure to render tools means the template has no tool support
            _SUPPORT[key] = False
    return _SUPPORT[key]


def lists_tools(msgs: list[Message], tools: tuple[dict[str, Any], ...]) -> bool:
    """Whether the system messages of ``msgs`` name every one of ``tools``: each name appears as a JSON
    string (``"get_weather"``, as in a JSON schema) or as a signature (``get_weather(``)."""
    system = "\n".join(m.content for m in msgs if m.role == "system")
    if not system or not tools:
        return False
    for t in tools:
        name = str(t.get("name", ""))
        if not name or not re.search(rf'"{re.escape(name)}"|(?<![\w.]){re.escape(name)}\(', system):
            return False
    return True


def check_mode(tokenizer: Any, mode: str) -> None:
    """Raise ``ValueError`` for a mode that is not one of :data:`MODES`, or ``template`` with a chat
    template that does not render tools (the run would otherwise train without the schemas)."""
    if mode not in MODES:
        raise ValueError(f"rollout.tools_in_prompt: must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "template" and not template_renders_tools(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"rollout.tools_in_prompt: template, but the chat template of {name} does not render tools= "
            "(use auto or system: the schemas are then written into the system message)"
        )


def place_tools(task: Task, msgs: list[Message], tokenizer: Any, mode: str = "auto") -> ToolsPlacement:
    """Where the tool schemas of ``task`` go when its first messages (from its env) are ``msgs``."""
    spec = task.tool_call
    tools = tuple(dict(t) for t in spec.tools) if spec is not None else ()
    if not tools:
        return ToolsPlacement()
    if lists_tools(msgs, tools):
        placement = ToolsPlacement("task")
    elif mode == "template" or (mode == "auto" and template_renders_tools(tokenizer)):
        check_mode(tokenizer, mode)
        placement = ToolsPlacement("template", tools)
    else:
        text = format_tools_system_prompt(tools, parallel=spec.parallel, multi_turn=spec.mode == "answer")
        placement = ToolsPlacement("system", system_text=text)
    _log_once(placement.how, tokenizer, mode)
    return placement


_WHY = {
    "template": "through the chat template's tools=",
    "system": "written into the system message",
    "task": "as the task's own system message lists them (not given again)",
}


def _log_once(how: str, tokenizer: Any, mode: str) -> None:
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if (how, name) in _LOGGED:
        return
    _LOGGED.add((how, name))
    # The fallback is a warning (shown without logging set up): the model then reads a format its
    # vendor did not train it on. The other placements are as the template or the task intends.
    log = logger.warning if how == "system" else logger.info
    why = " (its chat template does not render tools=)" if how == "system" and mode == "auto" else ""
    log(
        "tool schemas reach the prompt %s (rollout.tools_in_prompt=%s, model %s%s)",
        _WHY[how],
        mode,
        json.dumps(name),
        why,
    )
