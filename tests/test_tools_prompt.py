"""Tool schemas reach the prompt once: through a tool-aware chat template (``tools=``), else written
into the system message, and not at all when the task's system message lists them already
(``rollout.tools_in_prompt``, :mod:`rollout.tools_prompt`). Offline: the tiny model's ChatML
tokenizer (its template ignores tools) and a copy of it whose Jinja template renders ``tools``."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from envs.io import task_from_dict
from envs.toolcall import ToolCallEnv, format_tools_system_prompt
from envs.types import ExpectedCall, Generation, Message, Sampling, Task, ToolCallSpec, Trajectory
from rl.config.recipe import RecipeError, load_recipe
from rl.driver.logger import RunLogger, rollout_table_rows
from rollout.episode import render, run_episodes
from rollout.tools_prompt import lists_tools, place_tools, template_renders_tools

REPO = Path(__file__).resolve().parents[1]

# ChatML, with the tools first in a block of their own, one JSON object a line (as Qwen's template does,
# in a simpler layout): what a tool-aware template looks like to the rollout.
TOOL_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>tools\\n' }}{% for t in tools %}{{ t['function'] | tojson }}{{ '\\n' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIMER = {
    "name": "set_timer",
    "description": "Start a countdown timer.",
    "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]},
}


@pytest.fixture(scope="module")
def tool_tokenizer(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = TOOL_TEMPLATE
    return tok


def enc(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def eos(tok) -> int:
    return tok.convert_tokens_to_ids("<|im_end|>")


def gen(tok, text: str) -> Generation:
    ids = enc(tok, text) + [eos(tok)]
    return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")


@dataclass
class Scripted:
    """Call k of generate() returns one ``script[k]`` Generation per prompt; records the prompts."""

    script: list[Generation]
    prompts: list[list[int]] = field(default_factory=list)

    def generate(self, prompts, sampling, seeds=None, stops=None):
        k = len(self.prompts)
        self.prompts += [list(p) for p in prompts]
        return [self.script[k]] * len(prompts)


def tc_task(messages, tools=(WEATHER,), mode="calls", state=None) -> Task:
    return Task(
        id="tc",
        domain="tool_call",
        messages=tuple(messages),
        tool_call=ToolCallSpec(
            tools=tuple(tools),
            expected=(ExpectedCall("get_weather", {"city": ["Paris"]}),),
            mode=mode,
            answer=("20",) if mode == "answer" else (),
            state=state or {},
        ),
    )


def run_one(tok, task: Task, texts: list[str], mode: str = "auto", max_turns: int = 1) -> tuple[Trajectory, Scripted]:
    engine = Scripted([gen(tok, t) for t in texts])
    (t,) = run_episodes(
        engine,
        tok,
        lambda d: ToolCallEnv(max_turns=max_turns),
        [task],
        [0],
        [0],
        Sampling(max_turns=max_turns, max_new_tokens=64),
        tools_in_prompt=mode,
    )
    return t, engine


def test_template_support_is_probed(tiny_tokenizer, tool_tokenizer) -> None:
    assert template_renders_tools(tool_tokenizer)
    assert not template_renders_tools(tiny_tokenizer)  # ChatML without tools


def test_tools_go_through_a_tool_aware_template_once(tool_tokenizer) -> None:
    tok = tool_tokenizer
    msgs = [Message("system", "You are terse."), Message("user", "weather in Paris")]
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    t, engine = run_one(tok, tc_task(msgs), [call])
    expected = render(tok, msgs, True, tools=[{"type": "function", "function": WEATHER}])
    assert expected.startswith("<|im_start|>tools\n" + json.dumps(WEATHER))
    assert engine.prompts[0] == enc(tok, expected) == t.prompt_ids
    # The system message is the task's own; the schema is in the prompt exactly once.
    assert "<|im_start|>system\nYou are terse.<|im_end|>" in expected
    assert t.prompt == expected and t.prompt.count('"get_weather"') == 1
    assert t.messages[: len(msgs)] == msgs  # the conversation the rewards see is the task's


def test_fallback_writes_the_tools_into_the_system_message(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    listing = format_tools_system_prompt([WEATHER])
    # After the task's own system message and a blank line...
    t, _ = run_one(tok, tc_task([Message("system", "You are terse."), Message("user", "weather in Paris")]), [call])
    assert t.prompt.startswith(f"<|im_start|>system\nYou are terse.\n\n{listing}<|im_end|>\n<|im_start|>user\n")
    assert t.prompt.count('"get_weather"') == 1
    # ... or as the first message when the task has no system message.
    t, _ = run_one(tok, tc_task([Message("user", "weather in Paris")]), [call])
    assert t.prompt == (
        f"<|im_start|>system\n{listing}<|im_end|>\n<|im_start|>user\nweather in Paris<|im_end|>\n<|im_start|>assistant\n"
    )
    assert [m.role for m in t.messages] == ["user", "assistant"]  # not a message of the conversation


def test_system_mode_on_a_tool_aware_template_and_template_mode_without_one(tiny_tokenizer, tool_tokenizer) -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    task = tc_task([Message("user", "weather in Paris")])
    t, _ = run_one(tool_tokenizer, task, [call], mode="system")
    assert "<|im_start|>tools" not in t.prompt and t.prompt.count('"get_weather"') == 1
    assert format_tools_system_prompt([WEATHER]) in t.prompt
    with pytest.raises(ValueError, match="rollout.tools_in_prompt: template, but the chat template"):
        run_one(tiny_tokenizer, task, [call], mode="template")
    with pytest.raises(ValueError, match="rollout.tools_in_prompt: must be one of auto, template, system"):
        run_one(tiny_tokenizer, task, [call], mode="both")


def test_a_system_message_that_lists_the_tools_is_rendered_as_written(tiny_tokenizer, tool_tokenizer) -> None:
    listed = [Message("system", format_tools_system_prompt([WEATHER, TIMER])), Message("user", "weather in Paris")]
    signature = [Message("system", "You can call:\n- get_weather(city: string)\n- set_timer(minutes: integer)")]
    for msgs in (listed, signature + [Message("user", "weather in Paris")]):
        for tok in (tiny_tokenizer, tool_tokenizer):
            for mode in ("auto", "system"):
                p = place_tools(tc_task(msgs, tools=(WEATHER, TIMER)), msgs, tok, mode)
                assert p.how == "task" and p.messages(msgs) == msgs and p.template_tools() is None
    # Naming one tool of two, naming them in a user message, or in prose (no quotes, no call) is not listing.
    half = [Message("system", "You can call get_weather(city)."), Message("user", "x")]
    in_user = [Message("system", "Be brief."), Message("user", '"get_weather" and "set_timer"')]
    prose = [Message("system", "Use get_weather or set_timer."), Message("user", "x")]
    for msgs in (half, in_user, prose):
        assert not lists_tools(msgs, (WEATHER, TIMER))
        assert place_tools(tc_task(msgs, tools=(WEATHER, TIMER)), msgs, tool_tokenizer).how == "template"
    assert not lists_tools([Message("system", "a.get_weather(")], (WEATHER,))  # a method of something else
    assert place_tools(Task(id="x", domain="code", messages=(Message("user", "x"),)), [], tiny_tokenizer).how == "none"


def test_shipped_task_files_render_as_before(tiny_tokenizer, tool_tokenizer) -> None:
    # Every shipped tool-call file writes its own tool prompt: rendered as written with any template, so the
    # quickstart's and the flagship's prompts are what their measurements used.
    for f in sorted((REPO / "recipes" / "data").glob("toolcall_*.jsonl")):
        lines = [x for x in f.read_text().splitlines() if x.strip()]
        for i in (0, len(lines) - 1):
            task = task_from_dict(json.loads(lines[i]), f"{f}:{i + 1}")
            for tok in (tiny_tokenizer, tool_tokenizer):
                p = place_tools(task, list(task.messages), tok, "auto")
                assert p.how == "task", f"{f.name}:{i + 1}"


def test_multi_turn_with_tools_in_the_template_stays_prefix_stable(tool_tokenizer) -> None:
    tok = tool_tokenizer
    msgs = [Message("user", "weather in Paris")]
    task = tc_task(msgs, mode="answer")
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    t, engine = run_one(tok, task, [call, "It is <answer>20</answer>."], max_turns=3)
    assert t.finish_reason == "stop" and t.terminated and t.num_turns == 2  # no template_mismatch
    # Turn 2's prompt extends turn 1's, the tools block still first and still once.
    assert engine.prompts[1][: len(engine.prompts[0])] == engine.prompts[0]
    text = tok.decode(engine.prompts[1])
    assert text.startswith("<|im_start|>tools\n") and text.count('"description": "Weather of a city"') == 1


def test_the_logged_prompt_is_the_rendered_prompt(tmp_path: Path, tiny_tokenizer) -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    t, _ = run_one(tiny_tokenizer, tc_task([Message("user", "weather in Paris")]), [call])
    lg = RunLogger(tmp_path, {}, mode="disabled")
    lg.rollouts(1, "train", [t])
    lg.close()
    (row,) = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert (
        row["prompt"] == t.prompt and "<tools>" in row["prompt"] and row["prompt"].endswith("<|im_start|>assistant\n")
    )
    _, rows = rollout_table_rows(1, [t])
    assert rows[0][3] == t.prompt


def test_recipe_key(recipe_copy) -> None:
    path = recipe_copy("tiny.yaml", filename="r.yaml")
    assert load_recipe(path).rollout.tools_in_prompt == "auto"
    assert load_recipe(path, ["rollout.tools_in_prompt=system"]).rollout.tools_in_prompt == "system"
    with pytest.raises(RecipeError, match="rollout.tools_in_prompt: choose one of auto, template, system"):
        load_recipe(path, ["rollout.tools_in_prompt=both"])


def test_the_fallback_is_logged_once(tiny_tokenizer, caplog: pytest.LogCaptureFixture) -> None:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.name_or_path = "tiny-for-the-log-test"  # the log is once per process and model: a name no other test uses
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    with caplog.at_level("INFO", logger="jointrl.rollout"):
        for _ in range(2):
            run_one(tok, tc_task([Message("user", "weather in Paris")]), [call])
    notes = [r for r in caplog.records if "tool schemas reach the prompt" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelname == "WARNING"
    assert (
        "written into the system message" in notes[0].getMessage() and "tiny-for-the-log-test" in notes[0].getMessage()
    )


def test_the_rollout_worker_takes_the_recipe_mode(tiny_model_path, tiny_tokenizer) -> None:
    # rollout.tools_in_prompt reaches the worker's episodes; template on a template without tools stops at start.
    from rollout.pool import RolloutWorker

    specs = [("tool_call", "envs.toolcall.ToolCallEnv", {})]
    with pytest.raises(ValueError, match="rollout.tools_in_prompt: template"):
        RolloutWorker(tiny_model_path, specs, engine=Scripted([]), tools_in_prompt="template")
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    worker = RolloutWorker(
        tiny_model_path, specs, engine=Scripted([gen(tiny_tokenizer, call)]), tools_in_prompt="system", env_workers=1
    )
    (t,) = worker.generate([tc_task([Message("user", "weather in Paris")])], [0], [0], Sampling(max_new_tokens=64))
    assert format_tools_system_prompt([WEATHER]) in t.prompt and t.reward_error is None
