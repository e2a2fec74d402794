"""Tool-call domain: parser, schema validation, env, reward, quickstart data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.base import Env, check_env, resolve
from envs.io import load_tasks
from envs.toolcall import (
    ToolCallEnv,
    format_call,
    format_tools_system_prompt,
    parse_tool_calls,
    validate_arguments,
)
from rl.data.tasks.toolcall_gen import EVAL_FILE, FUNCTIONS, TRAIN_FILE, generate, write_quickstart
from envs.types import ExpectedCall, Message, Task, ToolCall, ToolCallSpec, Trajectory
from rewards.toolcall import ToolCallReward, argument_fraction, arguments_match, values_match

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "recipes" / "data"

WEATHER = FUNCTIONS["get_weather"].schema
CURRENCY = FUNCTIONS["convert_currency"].schema
TIMER = FUNCTIONS["set_timer"].schema
STOCK = FUNCTIONS["get_stock_price"].schema


def make_task(expected, tools=(WEATHER, CURRENCY, TIMER, STOCK), prefill="<tool_call>") -> Task:
    return Task(
        id="t0",
        domain="tool_call",
        messages=(Message("system", "sys"), Message("user", "do it")),
        prefill=prefill,
        tool_call=ToolCallSpec(tools=tuple(tools), expected=tuple(expected)),
    )


def make_traj(task: Task, completion: str) -> Trajectory:
    return Trajectory(
        task=task,
        group_id=0,
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5],
        loss_mask=[1, 1],
        logprobs=[-0.1, -0.2],
        messages=[*task.messages, Message("assistant", completion)],
        terminated=True,
        truncated=False,
        finish_reason="stop",
    )


def block(name, arguments) -> str:
    return format_call(ToolCall(name, arguments))


# ----------------------------------------------------------------------------- parser


def test_parse_well_formed():
    calls, problems = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>')
    assert calls == [ToolCall("get_weather", {"city": "Paris"})]
    assert problems == []


def test_parse_whitespace_and_surrounding_text():
    text = 'Sure!\n<tool_call>\n  {\n "name": "set_timer",\n "arguments": {"minutes": 5}\n }\n</tool_call>\nDone.'
    calls, problems = parse_tool_calls(text)
    assert calls == [ToolCall("set_timer", {"minutes": 5})]
    assert problems == []


def test_parse_multiple_blocks():
    text = block("get_weather", {"city": "Oslo"}) + "\n" + block("set_timer", {"minutes": 3})
    calls, problems = parse_tool_calls(text)
    assert [c.name for c in calls] == ["get_weather", "set_timer"]
    assert calls[1].arguments == {"minutes": 3}
    assert problems == []


def test_parse_nested_braces_in_strings():
    text = '<tool_call>{"name": "send_email", "arguments": {"to": "a@b.c", "subject": "x {y} } {{z"}}</tool_call>'
    calls, problems = parse_tool_calls(text)
    assert problems == []
    assert calls == [ToolCall("send_email", {"to": "a@b.c", "subject": "x {y} } {{z"})]


def test_parse_no_blocks():
    assert parse_tool_calls("The weather is nice.") == ([], [])


@pytest.mark.parametrize(
    "body, fragment",
    [
        ('{"name": "f", "arguments": {"a": 1}', "invalid JSON"),
        ("", "empty block"),
        ('["f", {}]', "not an object"),
        ('{"arguments": {}}', "missing 'name'"),
        ('{"name": 3, "arguments": {}}', "'name' must be a non-empty string"),
    ],
)
def test_parse_malformed_without_call(body, fragment):
    calls, problems = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert calls == []
    assert len(problems) == 1 and fragment in problems[0], problems


@pytest.mark.parametrize(
    "body, fragment, arguments",
    [
        ('{"name": "f"}', "missing 'arguments'", {}),
        ('{"name": "f", "arguments": [1]}', "'arguments' must be an object", {}),
        ('{"name": "f", "arguments": "{\\"a\\": 1}"}', "'arguments' is a string", {"a": 1}),
        ('{"name": "f", "arguments": {}} trailing', "unexpected text", {}),
    ],
)
def test_parse_malformed_with_call(body, fragment, arguments):
    calls, problems = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert calls == [ToolCall("f", arguments)]
    assert len(problems) == 1 and fragment in problems[0], problems


def test_parse_unclosed_at_end_still_parsed():
    calls, problems = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"a": 1}}\n')
    assert calls == [ToolCall("f", {"a": 1})]
    assert len(problems) == 1 and "missing closing" in problems[0]


def test_parse_unclosed_followed_by_block():
    text = '<tool_call>{"name": "f", "arguments": {}}\n' + block("g", {"b": 2})
    calls, problems = parse_tool_calls(text)
    assert [c.name for c in calls] == ["f", "g"]
    assert len(problems) == 1 and problems[0].startswith("block 1: missing closing")


def test_parse_stray_closing_tag():
    calls, problems = parse_tool_calls(block("f", {}) + "</tool_call>")
    assert calls == [ToolCall("f", {})]
    assert len(problems) == 1 and "stray" in problems[0]


# ----------------------------------------------------------------------------- schema validation


def test_validate_ok_and_optional():
    assert validate_arguments(ToolCall("get_weather", {"city": "Paris"}), [WEATHER]) == []
    assert validate_arguments(ToolCall("get_weather", {"city": "Paris", "unit": "fahrenheit"}), [WEATHER]) == []
    assert (
        validate_arguments(ToolCall("set_timer", {"minutes": 20.0}), [TIMER]) == []
    )  # 20.0 is an integer in JSON Schema


def test_validate_errors():
    errs = validate_arguments(ToolCall("get_weather", {"unit": "kelvin"}), [WEATHER])
    assert any("'city' is a required property" in e for e in errs), errs
    assert any("unit" in e and "kelvin" in e for e in errs), errs
    errs = validate_arguments(
        ToolCall("convert_currency", {"amount": "10", "from_currency": "USD", "to_currency": "EUR"}), [CURRENCY]
    )
    assert len(errs) == 1 and "amount" in errs[0] and "number" in errs[0]
    errs = validate_arguments(ToolCall("set_timer", {"minutes": 2.5}), [TIMER])
    assert len(errs) == 1 and "integer" in errs[0]


def test_validate_unknown_function():
    errs = validate_arguments(ToolCall("launch_rocket", {}), [WEATHER, TIMER])
    assert len(errs) == 1 and "unknown function 'launch_rocket'" in errs[0] and "get_weather" in errs[0]


def test_validate_draft7_schema():
    tool = {
        "name": "f",
        "parameters": {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
            "additionalProperties": False,
        },
    }
    assert validate_arguments(ToolCall("f", {"n": 1}), [tool]) == []
    errs = validate_arguments(ToolCall("f", {"n": 1, "x": 2}), [tool])
    assert len(errs) == 1 and "Additional properties" in errs[0]


# ----------------------------------------------------------------------------- env


def test_env_contract():
    task = make_task([ExpectedCall("get_weather", {"city": ["Paris"]})])
    env = ToolCallEnv()
    assert isinstance(env, Env)
    check_env(env, task)


def test_env_step_info():
    task = make_task([ExpectedCall("get_weather", {"city": ["Paris"]})])
    env = ToolCallEnv(max_turns=1)
    assert env.reset(task) == list(task.messages)
    obs, terminated, truncated, info = env.step(
        '<tool_call>{"name": "get_weather", "arguments": {"unit": "kelvin"}}</tool_call>'
    )
    assert (obs, terminated, truncated) == ([], True, False)
    assert info["calls"] == [{"name": "get_weather", "arguments": {"unit": "kelvin"}}]
    assert info["problems"] == []
    assert len(info["schema_errors"]) == 2
    with pytest.raises(RuntimeError):
        env.step("again")
    env.reset(task)  # reusable for the next task
    assert env.step("no call")[1] is True
    env.close()
    env.close()
    with pytest.raises(RuntimeError):
        env.step("x")


def test_env_step_before_reset():
    with pytest.raises(RuntimeError, match="before reset"):
        ToolCallEnv().step("x")


def test_env_calls_mode_single_turn_whatever_max_turns():
    # max_turns > 1 is supported now (answer mode, tests/test_toolcall_multiturn.py); calls-mode
    # tasks still end after the first turn.
    env = ToolCallEnv(max_turns=3)
    env.reset(make_task([ExpectedCall("get_weather", {"city": ["Paris"]})]))
    assert env.step(block("get_weather", {"city": "Paris"}))[1:3] == (True, False)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_turns"):
            ToolCallEnv(max_turns=bad)


def test_check_env_catches_violations():
    class BothFlags:
        def reset(self, task):
            return list(task.messages)

        def step(self, action):
            return [], True, True, {}

        def close(self):
            pass

    class NoRaiseAfterEnd(BothFlags):
        def step(self, action):
            return [], True, False, {}

    class BadTypes(BothFlags):
        def step(self, action):
            return [], 1, False, {}

    task = make_task([])
    with pytest.raises(AssertionError, match="both True"):
        check_env(BothFlags(), task)
    with pytest.raises(AssertionError, match="RuntimeError"):
        check_env(NoRaiseAfterEnd(), task)
    with pytest.raises(TypeError, match="terminated must be a bool"):
        check_env(BadTypes(), task)
    with pytest.raises(TypeError, match="Env protocol"):
        check_env(object(), task)


def test_resolve():
    assert resolve("envs.toolcall.ToolCallEnv") is ToolCallEnv
    assert resolve("envs.toolcall:ToolCallEnv") is ToolCallEnv
    assert resolve("rewards.toolcall.ToolCallReward.name") == "toolcall"
    with pytest.raises(ImportError, match="envs.toolcall.NoSuchEnv.*no attribute 'NoSuchEnv'"):
        resolve("envs.toolcall.NoSuchEnv")
    with pytest.raises(ImportError, match="no_such_pkg.mod.X"):
        resolve("no_such_pkg.mod.X")
    with pytest.raises(ImportError, match="dotted path"):
        resolve("ToolCallEnv")


# ----------------------------------------------------------------------------- reward

R = ToolCallReward()
WEATHER_PARIS = ExpectedCall("get_weather", {"city": ["Paris"], "unit": ["", "celsius"]})
TIMER_20 = ExpectedCall("set_timer", {"minutes": [20]})


def score(expected, completion, **kw):
    reward = ToolCallReward(**kw) if kw else R
    return reward(make_traj(make_task(expected), completion))


def test_reward_attributes():
    assert R.name == "toolcall" and R.domains == ("tool_call",)
    with pytest.raises(ValueError):
        ToolCallReward(format_weight=-1)


def test_reward_none_without_spec():
    task = Task(id="c", domain="code", messages=(Message("user", "hi"),))
    assert R(make_traj(task, "x")) is None


def test_reward_perfect():
    assert score([WEATHER_PARIS], block("get_weather", {"city": "Paris"})) == pytest.approx(1.0)
    # the completion includes the prefill, as the rollout records it
    assert score(
        [WEATHER_PARIS], '<tool_call>{"name": "get_weather", "arguments": {"city": " Paris "}}</tool_call>'
    ) == pytest.approx(1.0)


def test_reward_right_name_wrong_args():
    assert score([WEATHER_PARIS], block("get_weather", {"city": "London"})) == pytest.approx(0.5)
    assert score([WEATHER_PARIS], block("get_weather", {"city": "paris"})) == pytest.approx(0.5)  # case-sensitive
    assert score([WEATHER_PARIS], block("get_weather", {})) == pytest.approx(0.5)  # required param missing


def test_reward_wrong_name():
    assert score([WEATHER_PARIS], block("get_stock_price", {"city": "Paris"})) == pytest.approx(0.2)


def test_reward_invalid_json_and_no_call():
    assert (
        score([WEATHER_PARIS], '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}</tool_call>') == 0.0
    )
    assert score([WEATHER_PARIS], "It is sunny in Paris.") == 0.0


def test_reward_format_problem_keeps_name_and_args_credit():
    # unclosed block at the end: no format credit, but the call is still parsed and scored
    assert score(
        [WEATHER_PARIS], '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
    ) == pytest.approx(0.8)


def test_reward_parallel_swapped_order():
    text = block("set_timer", {"minutes": 20}) + "\n" + block("get_weather", {"city": "Paris"})
    assert score([WEATHER_PARIS, TIMER_20], text) == pytest.approx(1.0)


def test_reward_parallel_one_missing():
    # 0.2 + (0.3 * 1 + 0.5 * 1) / 2
    assert score([WEATHER_PARIS, TIMER_20], block("set_timer", {"minutes": 20})) == pytest.approx(0.6)


def test_reward_one_extra_spurious_call():
    text = block("get_weather", {"city": "Paris"}) + block("set_timer", {"minutes": 5})
    # 0.2 + (0.3 * 1 + 0.5 * 1) / max(1, 2)
    assert score([WEATHER_PARIS], text) == pytest.approx(0.6)
    # a duplicate of the right call is spurious too
    assert score([WEATHER_PARIS], block("get_weather", {"city": "Paris"}) * 2) == pytest.approx(0.6)


def test_reward_optimal_assignment_prefers_full_match():
    # two calls of the same function; the one with the right args must be paired
    text = block("get_weather", {"city": "Rome"}) + block("get_weather", {"city": "Paris"})
    # 0.2 + (0.3 * 1 + 0.5 * 1) / 2
    assert score([WEATHER_PARIS], text) == pytest.approx(0.6)
    two = [WEATHER_PARIS, ExpectedCall("get_weather", {"city": ["Rome"], "unit": [""]})]
    assert score(two, text) == pytest.approx(1.0)


def test_reward_numeric_equality():
    assert score([TIMER_20], block("set_timer", {"minutes": 20.0})) == pytest.approx(1.0)
    assert score(
        [ExpectedCall("set_timer", {"minutes": [20.0]})], block("set_timer", {"minutes": 20})
    ) == pytest.approx(1.0)
    assert score([TIMER_20], block("set_timer", {"minutes": "20"})) == pytest.approx(0.5)  # a string is not a number
    assert score([TIMER_20], block("set_timer", {"minutes": 21})) == pytest.approx(0.5)


def test_reward_optional_param():
    assert score([WEATHER_PARIS], block("get_weather", {"city": "Paris"})) == pytest.approx(1.0)  # omitted
    assert score([WEATHER_PARIS], block("get_weather", {"city": "Paris", "unit": "celsius"})) == pytest.approx(1.0)
    assert score([WEATHER_PARIS], block("get_weather", {"city": "Paris", "unit": "fahrenheit"})) == pytest.approx(0.5)
    # a parameter without "" in allowed may not be omitted
    strict = ExpectedCall("get_weather", {"city": ["Paris"], "unit": ["celsius"]})
    assert score([strict], block("get_weather", {"city": "Paris"})) == pytest.approx(0.5)


def test_reward_extra_param_not_matched():
    assert score([WEATHER_PARIS], block("get_weather", {"city": "Paris", "country": "FR"})) == pytest.approx(0.5)


def test_reward_custom_weights_and_no_expected_calls():
    assert score(
        [WEATHER_PARIS], block("get_weather", {"city": "Paris"}), format_weight=0, name_weight=0, args_weight=1
    ) == pytest.approx(1.0)
    assert score([], "No function fits this request.") == pytest.approx(1.0)
    assert score([], block("get_weather", {"city": "Paris"})) == 0.0


def test_values_and_arguments_match():
    assert values_match(1, 1.0) and not values_match(True, 1) and not values_match(1, True)
    assert values_match([1, "a "], [1.0, "a"]) and not values_match([1], [1, 2])
    assert values_match({"a": 1}, {"a": 1.0}) and values_match(None, None) and not values_match(0, None)
    assert not arguments_match(ToolCall("set_timer", {"minutes": 20}), WEATHER_PARIS)


BOOK = ExpectedCall("book_table", {"restaurant": ["Olive Tree"], "time": ["16:00"], "party_size": [6], "note": [""]})


def test_argument_fraction_counts_required_and_given_parameters():
    frac = argument_fraction
    assert frac(ToolCall("book_table", {"restaurant": "Olive Tree", "time": "16:00", "party_size": 6}), BOOK) == 1.0
    assert frac(ToolCall("book_table", {"restaurant": "Olive Tree", "time": "16:00"}), BOOK) == pytest.approx(2 / 3)
    assert frac(ToolCall("book_table", {"restaurant": "Olive Tree", "time": "12:00"}), BOOK) == pytest.approx(1 / 3)
    # An optional parameter left out counts for nothing; given, it is counted (and here wrong: "" only allows omission).
    assert (
        frac(ToolCall("book_table", {"restaurant": "Olive Tree", "time": "16:00", "party_size": 6, "note": "x"}), BOOK)
        == 0.75
    )
    # Padding with keys the call should not have lowers the share; leaving everything out earns nothing.
    padded = {"restaurant": "Olive Tree", "time": "16:00", "party_size": 6, "a": 1, "b": 2, "c": 3}
    assert frac(ToolCall("book_table", padded), BOOK) == 0.5
    assert frac(ToolCall("book_table", {}), BOOK) == 0.0
    assert frac(ToolCall("get_weather", {"restaurant": "Olive Tree"}), BOOK) == 0.0
    assert frac(ToolCall("ping", {}), ExpectedCall("ping", {})) == 1.0
    assert frac(ToolCall("ping", {"x": 1}), ExpectedCall("ping", {})) == 0.0
    assert frac(ToolCall("get_weather", {}), WEATHER_PARIS) == 0.0
    assert frac(ToolCall("get_weather", {"city": "Paris"}), WEATHER_PARIS) == 1.0


def test_argument_fraction_is_one_exactly_when_the_arguments_match():
    """Over every shipped tool-call task and perturbations of its reference call (a value changed,
    a parameter dropped or added), the partial credit is 1.0 iff the all-or-nothing match holds."""
    import random

    rng = random.Random(0)
    seen = {True: 0, False: 0}
    for path in sorted(DATA.glob("toolcall_*.jsonl")):
        for task in load_tasks(path)[:40]:
            for e in task.tool_call.expected if task.tool_call else ():
                ref = {
                    p: next(v for v in vals if v != "") for p, vals in e.allowed.items() if any(v != "" for v in vals)
                }
                variants = [dict(ref), {}, {**ref, "extra": 1}]
                for p in ref:
                    variants += [{k: v for k, v in ref.items() if k != p}, {**ref, p: "wrong-" + str(rng.random())}]
                for args in variants:
                    call = ToolCall(e.name, args)
                    match = arguments_match(call, e)
                    assert (argument_fraction(call, e) == 1.0) == match, (task.id, args)
                    seen[match] += 1
    assert seen[True] > 20 and seen[False] > 100


def test_fraction_credit_in_the_reward():
    full = block("book_table", {"restaurant": "Olive Tree", "time": "16:00", "party_size": 6})
    two = block("book_table", {"restaurant": "Olive Tree", "time": "16:00"})
    assert score([BOOK], two) == pytest.approx(0.2 + 0.3)  # all-or-nothing: no argument credit
    assert score([BOOK], two, args_credit="fraction") == pytest.approx(0.2 + 0.3 + 0.5 * 2 / 3)
    assert score([BOOK], full, args_credit="fraction") == pytest.approx(1.0) == score([BOOK], full)
    # Two expected calls, one made right and one half right; a spurious third call enlarges the denominator.
    half_timer = ExpectedCall("set_timer", {"minutes": [20], "label": ["tea"]})
    made = block("book_table", {"restaurant": "Olive Tree", "time": "16:00", "party_size": 6}) + block(
        "set_timer", {"minutes": 20}
    )
    assert score([BOOK, half_timer], made, args_credit="fraction") == pytest.approx(0.2 + 0.3 + 0.5 * 1.5 / 2)
    spam = made + block("set_timer", {"minutes": 20})
    assert score([BOOK, half_timer], spam, args_credit="fraction") == pytest.approx(0.2 + 0.3 * 2 / 3 + 0.5 * 1.5 / 3)
    with pytest.raises(ValueError, match="args_credit must be 'all' or 'fraction'"):
        ToolCallReward(args_credit="partial")


# ----------------------------------------------------------------------------- quickstart data


def reference_completion(task: Task) -> str:
    blocks = []
    for e in task.tool_call.expected:
        args = {p: next(v for v in vals if v != "") for p, vals in e.allowed.items() if any(v != "" for v in vals)}
        blocks.append(format_call(ToolCall(e.name, args)))
    return "\n".join(blocks)


def test_generator_deterministic():
    assert generate(seed=0) == generate(seed=0)
    assert generate(seed=0) != generate(seed=1)


def test_shipped_data_matches_generator(tmp_path):
    train_path, eval_path = write_quickstart(tmp_path)
    assert train_path.read_bytes() == (DATA / TRAIN_FILE).read_bytes(), (
        "regenerate: python -m rl.data.tasks.toolcall_gen --out-dir recipes/data"
    )
    assert eval_path.read_bytes() == (DATA / EVAL_FILE).read_bytes(), (
        "regenerate: python -m rl.data.tasks.toolcall_gen --out-dir recipes/data"
    )


def test_shipped_data_shape():
    train, evaluation = load_tasks(DATA / TRAIN_FILE), load_tasks(DATA / EVAL_FILE)
    assert (len(train), len(evaluation)) == (200, 50)
    requests = [{t.messages[1].content for t in split} for split in (train, evaluation)]
    assert len(requests[0]) == 200 and len(requests[1]) == 50
    assert not requests[0] & requests[1], "train and eval share user requests"
    assert not {t.id for t in train} & {t.id for t in evaluation}
    examples = set()
    for t in train + evaluation:
        assert t.domain == "tool_call" and t.prefill == "<tool_call>"
        assert [m.role for m in t.messages] == ["system", "user"]
        tool_names = [tool["name"] for tool in t.tool_call.tools]
        assert 1 <= len(tool_names) <= 2
        assert t.meta["source"] == "toolcall_quickstart" and t.meta["functions"] == tool_names
        ex = t.meta["example_function"]
        assert ex not in tool_names and f'"name": "{ex}"' in t.messages[0].content
        examples.add(ex)
        system = t.messages[0].content
        for tool in t.tool_call.tools:
            assert json.dumps(tool) in system
    assert examples == set(FUNCTIONS), "the worked example should vary across all functions"


@pytest.mark.parametrize("split", [TRAIN_FILE, EVAL_FILE])
def test_shipped_expected_calls_valid_and_reference_scores_one(split):
    env = ToolCallEnv()
    for t in load_tasks(DATA / split):
        assert len(t.tool_call.expected) == 1
        ref = reference_completion(t)
        assert ref.startswith(t.prefill)
        for e in t.tool_call.expected:
            assert e.name in t.meta["functions"]
            args = json.loads(ref[len("<tool_call>") : -len("</tool_call>")])["arguments"]
            assert validate_arguments(ToolCall(e.name, args), t.tool_call.tools) == [], (t.id, args)
        assert R(make_traj(t, ref)) == pytest.approx(1.0), t.id
        env.reset(t)
        _, _, _, info = env.step(ref)
        assert info["problems"] == [] and info["schema_errors"] == []
    env.close()


def test_system_prompt_helper():
    text = format_tools_system_prompt(
        [TIMER], example=("Convert 5 USD to EUR.", ToolCall("convert_currency", {"amount": 5}))
    )
    assert json.dumps(TIMER) in text and "<tool_call>" in text and "Example:" in text
    assert "Example:" not in format_tools_system_prompt([TIMER])
