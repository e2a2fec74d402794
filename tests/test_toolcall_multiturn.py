"""Tool-call domain, multi-turn: simulated tools, answer-mode env, rewards, BFCL, shipped tasks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from trajs import finished
from envs.base import check_env
from envs.io import TaskFormatError, load_tasks, save_tasks, task_from_dict, task_to_dict
from envs.toolcall import (
    ToolCallEnv,
    bfcl_to_native,
    format_call,
    load_bfcl,
    parse_tool_calls,
    normalize_bfcl_schema,
    validate_arguments,
)
from rl.data.tasks.toolcall_gen import EVAL_FILE, TRAIN_FILE
from rl.data.tasks.toolcall_tasks import OUT_FILE, build_tasks, write_tasks
from envs.toolcall_tools import TOOLS, ToolError, run_tool, safe_eval, tool_schema
from envs.types import ExpectedCall, Message, Task, ToolCall, ToolCallSpec, Trajectory
from rewards.toolcall import (
    ToolAnswerReward,
    ToolCallFormatReward,
    ToolCallReward,
    answer_matches,
    argument_fraction,
    extract_numbers,
    final_answer,
    values_match,
)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "recipes" / "data"

STATE = {
    "users": {
        "42": {"name": "Ana", "email": "ana@example.com", "city": "Lisbon"},
        "7": {"name": "Ben", "email": "ben@mail.com", "city": "Oslo"},
    },
    "orders": {
        "A-1": {"user_id": 42, "status": "shipped", "total_usd": 10.0},
        "A-2": {"user_id": 42, "status": "processing", "total_usd": 5.5},
    },
}


def call(name, **arguments) -> str:
    return format_call(ToolCall(name, arguments))


def answer_task(answer=("21",), tools=("lookup_user", "get_weather", "send_email", "calculator"), state=None) -> Task:
    return Task(
        id="mt-0",
        domain="tool_call",
        messages=(Message("system", "sys"), Message("user", "Weather where user 42 lives?")),
        tool_call=ToolCallSpec(
            tools=tuple(tool_schema(t) for t in tools),
            expected=(),
            mode="answer",
            answer=tuple(answer),
            state=STATE if state is None else state,
        ),
    )


def calls_task(expected, tools=("get_weather", "get_stock_price")) -> Task:
    return Task(
        id="c-0",
        domain="tool_call",
        messages=(Message("system", "sys"), Message("user", "go")),
        tool_call=ToolCallSpec(tools=tuple(tool_schema(t) for t in tools), expected=tuple(expected)),
    )


def traj(task: Task, turns: list[str], between: list[list[Message]] | None = None) -> Trajectory:
    msgs = list(task.messages)
    for i, t in enumerate(turns):
        msgs.append(Message("assistant", t))
        if between and i < len(between):
            msgs += between[i]
    return finished(task, msgs, num_turns=len(turns))


def run_episode(task: Task, turns: list[str], max_turns: int | None = None):
    """Drive ToolCallEnv with scripted turns; return (trajectory, per-step results)."""
    env = ToolCallEnv(max_turns=max_turns or len(turns))
    msgs = env.reset(task)
    steps = []
    for t in turns:
        obs, terminated, truncated, info = env.step(t)
        steps.append((obs, terminated, truncated, info))
        msgs = msgs + [Message("assistant", t)] + obs
        if terminated or truncated:
            break
    env.close()
    tr = dataclasses.replace(
        finished(task, msgs, num_turns=len(steps)), terminated=steps[-1][1], truncated=steps[-1][2]
    )
    return tr, steps


# ----------------------------------------------------------------------------- simulated tools


def test_tools_deterministic_and_hand_checked():
    c = ToolCall("convert_currency", {"amount": 100, "from_currency": "USD", "to_currency": "EUR"})
    assert run_tool(c) == run_tool(c)
    assert run_tool(c)["converted"] == 92
    assert (
        run_tool(ToolCall("convert_currency", {"amount": 92, "from_currency": "eur", "to_currency": "USD"}))[
            "converted"
        ]
        == 100
    )
    w = run_tool(ToolCall("get_weather", {"city": "paris"}))
    assert w == {"city": "Paris", "temperature": 18, "unit": "celsius", "condition": "cloudy", "humidity": 72}
    assert run_tool(ToolCall("get_weather", {"city": "Paris", "unit": "fahrenheit"}))["temperature"] == 64.4
    assert run_tool(ToolCall("get_stock_price", {"symbol": "aapl"})) == {
        "symbol": "AAPL",
        "price": 189.5,
        "currency": "USD",
    }
    assert run_tool(ToolCall("convert_units", {"value": 1, "from_unit": "mi", "to_unit": "km"}))["result"] == 1.6093
    f = ToolCall("search_flights", {"origin": "Paris", "destination": "Rome", "date": "2024-07-01"})
    first = run_tool(f)
    assert first == run_tool(f) and len(first["flights"]) == 3
    assert first != run_tool(
        ToolCall("search_flights", {"origin": "Paris", "destination": "Rome", "date": "2024-07-02"})
    )
    deps = [x["departure"] for x in first["flights"]]
    assert deps == sorted(deps)


@pytest.mark.parametrize(
    "c, fragment",
    [
        (ToolCall("get_weather", {"city": "Atlantis"}), "unknown city"),
        (ToolCall("get_weather", {"city": 3}), "invalid arguments"),
        (ToolCall("get_weather", {"city": "Paris", "extra": 1}), "invalid arguments"),
        (ToolCall("get_weather", {}), "invalid arguments"),
        (ToolCall("convert_currency", {"amount": 1, "from_currency": "USD", "to_currency": "XYZ"}), "unknown currency"),
        (ToolCall("convert_units", {"value": 1, "from_unit": "kg", "to_unit": "km"}), "cannot convert"),
        (ToolCall("search_flights", {"origin": "A", "destination": "B", "date": "tomorrow"}), "YYYY-MM-DD"),
        (ToolCall("search_flights", {"origin": "Oslo", "destination": "oslo", "date": "2024-01-01"}), "same"),
        (ToolCall("teleport", {}), "no simulated implementation"),
        (ToolCall("lookup_user", {"user_id": 99}), "no user with id 99"),
        (ToolCall("get_order_status", {"order_id": "Z-9"}), "no order"),
        (ToolCall("send_email", {"to": "not-an-address", "subject": "x"}), "invalid email"),
        (ToolCall("set_timer", {"minutes": 0}), "invalid arguments"),
    ],
)
def test_tools_errors(c, fragment):
    with pytest.raises(ToolError, match=fragment):
        run_tool(c, json.loads(json.dumps(STATE)))


def test_database_tools_and_recording():
    state = json.loads(json.dumps(STATE))
    assert run_tool(ToolCall("lookup_user", {"user_id": 42}), state)["city"] == "Lisbon"
    assert run_tool(ToolCall("get_order_status", {"order_id": "A-2"}), state)["status"] == "processing"
    assert run_tool(ToolCall("list_user_orders", {"user_id": 42}), state) == {
        "user_id": 42,
        "order_ids": ["A-1", "A-2"],
    }
    assert run_tool(ToolCall("list_user_orders", {"user_id": 7}), state)["order_ids"] == []
    r1 = run_tool(ToolCall("send_email", {"to": "ana@example.com", "subject": "hi"}), state)
    r2 = run_tool(ToolCall("send_email", {"to": "ben@mail.com", "subject": "yo", "body": "b"}), state)
    assert (r1["message_id"], r2["message_id"]) == ("msg-1", "msg-2")
    assert state["outbox"] == [
        {"to": "ana@example.com", "subject": "hi", "body": ""},
        {"to": "ben@mail.com", "subject": "yo", "body": "b"},
    ]
    assert run_tool(ToolCall("set_timer", {"minutes": 5}), state)["timer_id"] == "timer-1"
    assert "outbox" not in STATE  # the caller's copy is what changes


@pytest.mark.parametrize(
    "expr, value",
    [
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("2 ** 10", 1024),
        ("10 / 4", 2.5),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("-3 + +2", -1),
        ("sqrt(16)", 4.0),
        ("round(2.345, 2)", 2.35),
        ("max(1, 5, 3) - min(4, 2)", 3),
        ("abs(-2.5)", 2.5),
        ("0.1 + 0.2", 0.3),
        ("1,000".replace(",", ""), 1000),
        (" 2480 * 0.175 ", 434.0),
    ],
)
def test_calculator_values(expr, value):
    assert safe_eval(expr) == pytest.approx(value)
    assert run_tool(ToolCall("calculator", {"expression": expr}))["result"] == pytest.approx(value)


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('echo hacked')",
        "().__class__.__bases__",
        "open('/etc/passwd')",
        "x",
        "x + 1",
        "'abc'",
        "[1, 2]",
        "1 if 1 else 2",
        "lambda: 1",
        "2 ^ 3",
        "9 ** 9 ** 9",
        "10 ** 400",
        "1 / 0",
        "5 % 0",
        "True + 1",
        "sqrt(-1)",
        "round(1.5, ndigits=1)",
        "print(1)",
        "abs()",
        "1 < 2",
        "(1).real",
        "{}",
        "1; 2",
        "1" * 201,
        "",
        "2 +",
        "\x00",
    ],
)
def test_calculator_rejects(expr):
    with pytest.raises(ToolError):
        safe_eval(expr)


def test_registry_schemas_valid():
    for name, tool in TOOLS.items():
        assert tool.name == name and tool_schema(name) == tool.schema and tool_schema(name) is not tool.schema
        assert tool.schema["parameters"]["required"]
        errors = validate_arguments(ToolCall(name, {}), [tool.schema])
        assert errors and all("required property" in e for e in errors), errors


# ----------------------------------------------------------------------------- env, answer mode


def test_env_contract_answer_mode():
    task = answer_task()
    check_env(ToolCallEnv(max_turns=4), task)  # "" is a final answer: terminates on turn 1
    check_env(ToolCallEnv(max_turns=3), task, action=call("lookup_user", user_id=42))  # truncates on turn 3


def test_scripted_episode_answer_mode():
    task = answer_task()
    turns = [call("lookup_user", user_id=42), call("get_weather", city="Lisbon"), "It is 21 °C in Lisbon."]
    tr, steps = run_episode(task, turns, max_turns=5)
    (obs1, term1, trunc1, info1), (obs2, _, _, info2), (obs3, term3, trunc3, info3) = steps
    assert (term1, trunc1) == (False, False)
    assert obs1 == [Message("tool", json.dumps({"user_id": 42, **STATE["users"]["42"]}), name="lookup_user")]
    assert info1["calls"] == [{"name": "lookup_user", "arguments": {"user_id": 42}}]
    assert info1["tool_results"] == [
        {
            "name": "lookup_user",
            "arguments": {"user_id": 42},
            "ok": True,
            "result": {"user_id": 42, **STATE["users"]["42"]},
        }
    ]
    assert info1["problems"] == [] and info1["schema_errors"] == [] and "answer" not in info1
    assert json.loads(obs2[0].content)["temperature"] == 21 and obs2[0].name == "get_weather"
    assert (obs3, term3, trunc3) == ([], True, False)
    assert info3["answer"] == "It is 21 °C in Lisbon." and info3["tool_results"] == []
    assert [m.role for m in tr.messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert final_answer(tr) == "It is 21 °C in Lisbon."
    assert ToolAnswerReward()(tr) == 1.0
    assert ToolCallFormatReward()(tr) == 1.0
    assert ToolCallReward()(tr) is None


def test_parallel_calls_one_message_each_in_order():
    task = answer_task()
    text = "\n".join(
        [call("get_weather", city="Oslo"), call("lookup_user", user_id=7), call("get_weather", city="Tokyo")]
    )
    env = ToolCallEnv(max_turns=2)
    env.reset(task)
    obs, terminated, truncated, info = env.step(text)
    assert (terminated, truncated) == (False, False)
    assert [m.name for m in obs] == ["get_weather", "lookup_user", "get_weather"]
    assert [json.loads(m.content).get("city") for m in obs] == ["Oslo", "Oslo", "Tokyo"]
    assert all(r["ok"] for r in info["tool_results"]) and len(info["calls"]) == 3


def test_invalid_arguments_and_errors_are_results():
    task = answer_task()
    env = ToolCallEnv(max_turns=3, max_calls_per_turn=4)
    env.reset(task)
    text = "".join(
        [
            call("get_weather", city=5),  # schema error
            call("get_weather", city="Atlantis"),  # ToolError
            call("get_stock_price", symbol="AAPL"),  # not among the task's tools
            call("calculator", expression="__import__('os')"),  # rejected expression
            call("get_weather", city="Oslo"),  # over max_calls_per_turn
            "<tool_call>{not json</tool_call>",  # unparseable block
        ]
    )
    obs, terminated, truncated, info = env.step(text)
    assert (terminated, truncated) == (False, False)
    payloads = [json.loads(m.content) for m in obs]
    assert [m.name for m in obs] == ["get_weather", "get_weather", "get_stock_price", "calculator", "get_weather", None]
    assert all(set(p) == {"error"} for p in payloads)
    assert "invalid arguments" in payloads[0]["error"] and "city" in payloads[0]["error"]
    assert "unknown city" in payloads[1]["error"]
    assert "unknown function 'get_stock_price'" in payloads[2]["error"]
    assert "unsupported" in payloads[3]["error"]
    assert "too many calls" in payloads[4]["error"]
    assert "could not parse 1 tool call block" in payloads[5]["error"]
    assert [r["ok"] for r in info["tool_results"]] == [False] * 5
    assert len(info["schema_errors"]) == 2 and info["problems"]
    # The episode goes on: the policy can read the errors and answer.
    obs, terminated, truncated, info = env.step("I could not find it.")
    assert (obs, terminated, truncated, info["answer"]) == ([], True, False, "I could not find it.")


def test_max_turns_truncates_while_calling():
    task = answer_task()
    env = ToolCallEnv(max_turns=2)
    env.reset(task)
    assert env.step(call("lookup_user", user_id=42))[1:3] == (False, False)
    obs, terminated, truncated, info = env.step(call("get_weather", city="Lisbon"))
    assert (terminated, truncated) == (False, True) and len(obs) == 1 and "answer" not in info
    with pytest.raises(RuntimeError):
        env.step("21")
    tr, _ = run_episode(task, [call("lookup_user", user_id=42), call("get_weather", city="Lisbon")], max_turns=2)
    assert tr.truncated and final_answer(tr) is None and ToolAnswerReward()(tr) == 0.0
    # max_turns=1 with an answer-mode task: a calling first turn is cut at once.
    env = ToolCallEnv()
    env.reset(task)
    assert env.step(call("lookup_user", user_id=42))[1:3] == (False, True)


def test_env_state_is_per_episode():
    task = answer_task()
    env = ToolCallEnv(max_turns=3)
    env.reset(task)
    env.step(call("send_email", to="ana@example.com", subject="hi"))
    assert env.state["outbox"] == [{"to": "ana@example.com", "subject": "hi", "body": ""}]
    assert "outbox" not in task.tool_call.state
    env.reset(task)
    assert "outbox" not in env.state


# ----------------------------------------------------------------------------- rewards


@pytest.mark.parametrize(
    "text, acceptable, ok",
    [
        ("It is 21 °C.", ["21"], True),
        ("It is 21.0 degrees", ["21"], True),
        ("about 92.50 EUR", ["92.5"], True),
        ("92.46", ["92.5"], False),
        ("total: 1,234.5 USD", ["1234.5"], True),
        ("It is 210 °C.", ["21"], False),
        ("-5 degrees", ["-5"], True),
        ("5 degrees", ["-5"], False),
        ("The order was Cancelled!", ["cancelled"], True),
        ("it was uncancelled", ["cancelled"], False),
        ("Flight ba706 is cheapest", ["BA706"], True),
        ("Order B-2001, delivered 2024-05-28", ["B-2001 && 2024-05-28"], True),
        ("Order B-2001, delivered 2024-05-29", ["B-2001 && 2024-05-28", "B-2001 && May 28"], False),
        ("Order B-2001 came on May 28", ["B-2001 && 2024-05-28", "B-2001 && May 28"], True),
        ("New-York!", ["new york"], True),
        ("<think>maybe 21?</think> It is 18.", ["21"], False),
        ("anything", [], False),
    ],
)
def test_answer_matches(text, acceptable, ok):
    assert answer_matches(text, acceptable) is ok


def test_extract_numbers():
    assert extract_numbers("18°C (64.4°F), A-1001, 2024-05-03, 1,234.50, -5, x2") == [
        18,
        64.4,
        1001,
        2024,
        5,
        3,
        1234.5,
        -5,
    ]


def test_tool_answer_reward():
    r = ToolAnswerReward()
    assert (r.name, r.domains) == ("tool_answer", ("tool_call",))
    task = answer_task()
    assert r(traj(task, [call("get_weather", city="Lisbon"), "It's 21 degrees."])) == 1.0
    assert r(traj(task, [call("get_weather", city="Lisbon"), "It's 18 degrees."])) == 0.0
    assert r(traj(task, ["It's 21 degrees.", call("get_weather", city="Lisbon")])) == 0.0  # ends calling
    assert r(traj(task, [])) == 0.0
    assert r(traj(calls_task([]), ["21"])) is None
    assert r(traj(Task(id="x", domain="tool_call", messages=(Message("user", "u"),)), ["21"])) is None


def test_toolcall_reward_none_in_answer_mode():
    assert ToolCallReward()(traj(answer_task(), [call("get_weather", city="Lisbon")])) is None


def test_format_reward_hand_computed():
    r = ToolCallFormatReward()
    assert (r.name, r.domains) == ("toolcall_format", ("tool_call",))
    task = answer_task()
    good, bad = call("get_weather", city="Oslo"), '<tool_call>{"name": "get_weather"}</tool_call>'  # missing arguments
    assert r(traj(task, [good, bad, "It is 5."])) == pytest.approx(2 / 3)
    assert r(traj(task, [good, good + "</tool_call>", "It is 5."])) == pytest.approx(2 / 3)  # stray closing tag
    assert r(traj(task, [good, "   "])) == pytest.approx(1 / 2)  # blank final answer
    assert r(traj(task, [good, good])) == 1.0  # truncated while calling: both turns parse
    assert r(traj(task, [])) == 0.0
    ct = calls_task([ExpectedCall("get_weather", {"city": ["Oslo"]})])
    assert r(traj(ct, [good])) == 1.0
    assert r(traj(ct, ["It is sunny."])) == 0.0  # no call in calls mode
    assert r(traj(ct, [bad])) == 0.0
    assert r(traj(calls_task([]), ["No function fits."])) == 1.0  # the right answer is no call
    assert r(traj(Task(id="x", domain="tool_call", messages=(Message("user", "u"),)), [good])) is None


def test_parallel_calls_order_insensitive_in_calls_mode():
    expected = [
        ExpectedCall("get_weather", {"city": ["Tokyo"], "unit": ["", "celsius"]}),
        ExpectedCall("get_stock_price", {"symbol": ["AAPL"]}),
    ]
    task = calls_task(expected)
    a, b = call("get_weather", city="Tokyo"), call("get_stock_price", symbol="AAPL")
    assert ToolCallReward()(traj(task, [a + b])) == pytest.approx(1.0)
    assert ToolCallReward()(traj(task, [b + "\n" + a])) == pytest.approx(1.0)
    assert ToolCallReward()(traj(task, [b])) == pytest.approx(0.2 + 0.3 / 2 + 0.5 / 2)


# ----------------------------------------------------------------------------- io


def test_io_round_trip_new_fields(tmp_path):
    task = answer_task(answer=("21", "B-1 && May 28"))
    task = Task(
        id=task.id,
        domain=task.domain,
        messages=task.messages,
        tool_call=ToolCallSpec(
            tools=task.tool_call.tools,
            expected=(ExpectedCall("lookup_user", {"user_id": [42]}),),
            mode="answer",
            answer=task.tool_call.answer,
            state=STATE,
            parallel=True,
        ),
    )
    d = task_to_dict(task)
    assert d["tool_call"]["mode"] == "answer" and d["tool_call"]["answer"] == ["21", "B-1 && May 28"]
    assert d["tool_call"]["state"] == STATE and d["tool_call"]["parallel"] is True
    assert json.loads(json.dumps(d)) == d
    assert task_from_dict(d) == task
    path = tmp_path / "t.jsonl"
    save_tasks([task], path)
    assert load_tasks(path) == [task]
    # Defaults are not written.
    plain = calls_task([ExpectedCall("get_weather", {"city": ["Oslo"]})])
    assert set(task_to_dict(plain)["tool_call"]) == {"tools", "expected"}
    assert task_from_dict(task_to_dict(plain)).tool_call.mode == "calls"
    # Answer mode may omit "expected"; parquet-style JSON strings work.
    d2 = task_to_dict(answer_task())
    del d2["tool_call"]["expected"]
    d2["tool_call"]["state"] = json.dumps(d2["tool_call"]["state"])
    d2["tool_call"]["answer"] = json.dumps(d2["tool_call"]["answer"])
    assert task_from_dict(d2) == answer_task()


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda tc: tc.update(mode="chat"), "tool_call.mode"),
        (lambda tc: tc.update(answer="21"), "tool_call.answer"),
        (lambda tc: tc.update(answer=[21]), "tool_call.answer[0]"),
        (lambda tc: tc.update(answer=[]), "tool_call.answer"),
        (lambda tc: tc.update(state=[1]), "tool_call.state"),
        (lambda tc: tc.update(parallel="yes"), "tool_call.parallel"),
        (lambda tc: tc.update(bogus=1), "tool_call.bogus"),
    ],
)
def test_io_new_fields_validated(mutate, field):
    d = task_to_dict(answer_task())
    mutate(d["tool_call"])
    with pytest.raises(TaskFormatError) as exc:
        task_from_dict(d, "f.jsonl:3")
    assert str(exc.value).startswith("f.jsonl:3: ") and repr(field) in str(exc.value), str(exc.value)


@pytest.mark.parametrize("name", [TRAIN_FILE, EVAL_FILE, OUT_FILE])
def test_data_files_round_trip_byte_identical(tmp_path, name):
    tasks = load_tasks(DATA / name)
    save_tasks(tasks, tmp_path / name)
    assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes()
    if name != OUT_FILE:
        assert all(t.tool_call.mode == "calls" and t.tool_call.state == {} and not t.tool_call.answer for t in tasks)


# ----------------------------------------------------------------------------- BFCL

_INT, _STRG = {"type": "integer"}, {"type": "string"}
BFCL_QUESTIONS = [
    {
        "id": "simple_0",
        "question": [
            [{"role": "user", "content": "Find the area of a triangle with a base of 10 units and height of 5 units."}]
        ],
        "function": [
            {
                "name": "calculate_triangle_area",
                "description": "Calculate the area of a triangle given its base and height.",
                "parameters": {
                    "type": "dict",
                    "properties": {
                        "base": {"type": "integer", "description": "The base of the triangle."},
                        "height": {"type": "integer", "description": "The height of the triangle."},
                        "unit": {
                            "type": "string",
                            "description": "The unit of measure (defaults to 'units' if not specified)",
                        },
                    },
                    "required": ["base", "height"],
                },
            }
        ],
    },
    {
        "id": "simple_1",
        "question": [[{"role": "user", "content": "Velocity of a car covering 100 m in 9.58 s, precisely."}]],
        "function": [
            {
                "name": "physics.calc_velocity",
                "description": "Velocity from distance and time.",
                "parameters": {
                    "type": "dict",
                    "properties": {
                        "distance": {"type": "float", "description": "Distance in m."},
                        "time": {"type": "float", "description": "Time in s."},
                        "dims": {"type": "tuple", "items": {"type": "integer"}, "description": "Dimensions."},
                        "options": {
                            "type": "dict",
                            "properties": {"precise": {"type": "boolean"}, "type": {"type": "string"}},
                        },
                        "extra": {"type": "any", "description": "Anything."},
                    },
                    "required": ["distance", "time"],
                },
            }
        ],
    },
    {
        "id": "multiple_0",
        "question": [[{"role": "user", "content": "What is the capital of Brazil?"}]],
        "function": [
            {
                "name": "country_info.capital",
                "description": "Capital of a country.",
                "parameters": {"type": "dict", "properties": {"country": _STRG}, "required": ["country"]},
            },
            {
                "name": "country_info.population",
                "description": "Population of a country.",
                "parameters": {"type": "dict", "properties": {"country": _STRG, "year": _INT}, "required": ["country"]},
            },
        ],
    },
    {
        "id": "parallel_0",
        "question": [
            [{"role": "user", "content": "Play songs from Taylor Swift for 20 minutes and Maroon 5 for 15 minutes."}]
        ],
        "function": [
            {
                "name": "spotify.play",
                "description": "Play specific artist songs for a duration.",
                "parameters": {
                    "type": "dict",
                    "properties": {"artist": _STRG, "duration": _INT},
                    "required": ["artist", "duration"],
                },
            }
        ],
    },
    {
        "id": "live_simple_0-0-0",
        "question": [
            [
                {"role": "system", "content": "You are a weather bot."},
                {"role": "user", "content": "Weather in Boston in fahrenheit?"},
            ]
        ],
        "function": [
            {
                "name": "get_current_weather",
                "description": "Current weather.",
                "parameters": {
                    "type": "dict",
                    "properties": {"location": _STRG, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                    "required": ["location"],
                },
            }
        ],
        "ground_truth": [{"get_current_weather": {"location": ["Boston, MA", "Boston"], "unit": ["fahrenheit"]}}],
    },
]
BFCL_ANSWERS = [
    {
        "id": "simple_0",
        "ground_truth": [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}],
    },
    {
        "id": "simple_1",
        "ground_truth": [
            {
                "physics.calc_velocity": {
                    "distance": [100.0],
                    "time": [9.58],
                    "dims": ["", [1, 2]],
                    "options": ["", {"precise": True, "type": "exact"}],
                    "extra": [""],
                }
            }
        ],
    },
    {"id": "multiple_0", "ground_truth": [{"country_info.capital": {"country": ["Brazil"]}}]},
    {
        "id": "parallel_0",
        "ground_truth": [
            {"spotify.play": {"artist": ["Taylor Swift"], "duration": [20]}},
            {"spotify.play": {"artist": ["Maroon 5"], "duration": [15]}},
        ],
    },
]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def bfcl_files(tmp_path):
    return write_jsonl(tmp_path / "BFCL_v3_test.json", BFCL_QUESTIONS), write_jsonl(
        tmp_path / "answers.json", BFCL_ANSWERS
    )


def _all_types(schema):
    if isinstance(schema, dict):
        if "type" in schema and isinstance(schema["type"], str):
            yield schema["type"]
        for k, v in schema.items():
            if k == "properties":
                for sub in v.values():
                    yield from _all_types(sub)
            elif k in ("items", "additionalProperties"):
                yield from _all_types(v)


def test_bfcl_loader(bfcl_files):
    tasks = load_bfcl(*bfcl_files)
    assert [t.id for t in tasks] == [q["id"] for q in BFCL_QUESTIONS]
    by_id = {t.id: t for t in tasks}
    for t in tasks:
        assert t.domain == "tool_call" and t.prefill == "" and t.tool_call.mode == "calls"
        assert (
            t.messages[0].role == "system"
            and "<tools>" in t.messages[0].content
            and "Example:" not in t.messages[0].content
        )
        assert t.meta["source"] == "bfcl"
        for tool in t.tool_call.tools:
            assert json.dumps(tool) in t.messages[0].content
            assert set(_all_types(tool["parameters"])) <= {"object", "integer", "string", "number", "array", "boolean"}
    velocity = by_id["simple_1"].tool_call.tools[0]["parameters"]
    assert velocity["type"] == "object"
    assert velocity["properties"]["distance"]["type"] == "number"
    assert velocity["properties"]["dims"] == {
        "type": "array",
        "items": {"type": "integer"},
        "description": "Dimensions.",
    }
    assert velocity["properties"]["options"]["properties"]["type"] == {"type": "string"}  # a property named "type"
    assert velocity["properties"]["extra"] == {"description": "Anything."}
    assert BFCL_QUESTIONS[1]["function"][0]["parameters"]["type"] == "dict"  # input not mutated
    assert by_id["simple_0"].tool_call.expected == (
        ExpectedCall("calculate_triangle_area", {"base": [10], "height": [5], "unit": ["units", ""]}),
    )
    assert by_id["parallel_0"].tool_call.parallel and len(by_id["parallel_0"].tool_call.expected) == 2
    assert not by_id["simple_0"].tool_call.parallel
    live = by_id["live_simple_0-0-0"]  # inline ground truth, own system message kept after the tools prompt
    assert [m.role for m in live.messages] == ["system", "user"] and live.messages[0].content.endswith(
        "You are a weather bot."
    )
    assert live.tool_call.expected[0].allowed["location"] == ["Boston, MA", "Boston"]
    assert [by_id[i].meta["category"] for i in ("simple_0", "parallel_0", "live_simple_0-0-0")] == [
        "simple",
        "parallel",
        "live_simple",
    ]


def test_bfcl_reference_answers_score_one(bfcl_files):
    tasks = {t.id: t for t in load_bfcl(*bfcl_files)}
    r = ToolCallReward()
    answers = {
        "simple_0": call("calculate_triangle_area", base=10, height=5),
        "simple_1": call(
            "physics.calc_velocity", distance=100, time=9.58, dims=[1, 2], options={"precise": True, "type": "exact"}
        ),
        "multiple_0": call("country_info.capital", country="Brazil"),
        "parallel_0": call("spotify.play", artist="Maroon 5", duration=15)
        + call("spotify.play", artist="Taylor Swift", duration=20),
        "live_simple_0-0-0": call("get_current_weather", location="Boston", unit="fahrenheit"),
    }
    for tid, text in answers.items():
        t = tasks[tid]
        assert r(traj(t, [text])) == pytest.approx(1.0), tid
        env = ToolCallEnv()
        env.reset(t)
        assert env.step(text)[3]["schema_errors"] == [], tid
    assert r(traj(tasks["multiple_0"], [call("country_info.population", country="Brazil")])) == pytest.approx(0.2)
    assert r(traj(tasks["parallel_0"], [call("spotify.play", artist="Maroon 5", duration=15)])) == pytest.approx(0.6)
    assert ToolCallFormatReward()(traj(tasks["simple_0"], [answers["simple_0"]])) == 1.0


def test_bfcl_to_native(bfcl_files, tmp_path):
    dst = tmp_path / "bfcl.jsonl"
    tasks = bfcl_to_native(*bfcl_files, dst)
    assert load_tasks(dst) == tasks == load_bfcl(*bfcl_files)


def test_bfcl_errors_name_file_and_line(tmp_path):
    q, a = BFCL_QUESTIONS[:2], BFCL_ANSWERS[:2]
    qp, ap = tmp_path / "q.json", tmp_path / "a.json"
    write_jsonl(qp, q)
    with pytest.raises(TaskFormatError, match=r"q\.json:1: field 'ground_truth': missing"):
        load_bfcl(qp)
    write_jsonl(ap, a[:1])
    with pytest.raises(TaskFormatError, match=r"q\.json:2: field 'ground_truth'"):
        load_bfcl(qp, ap)
    qp.write_text(json.dumps(q[0]) + "\n\n{oops\n")
    with pytest.raises(TaskFormatError, match=r"q\.json:3: invalid JSON"):
        load_bfcl(qp, ap)
    bad = json.loads(json.dumps(q[0]))
    bad["function"][0]["parameters"]["properties"]["base"]["type"] = "HashMap"
    write_jsonl(qp, [bad])
    with pytest.raises(
        TaskFormatError,
        match=r"q\.json:1: function\[0\]\.parameters\.properties\.base\.type: unknown BFCL type 'HashMap'",
    ):
        load_bfcl(qp, ap)
    write_jsonl(qp, [q[0]])
    write_jsonl(ap, [{"id": "simple_0", "ground_truth": [{"nope": {}}]}])
    with pytest.raises(TaskFormatError, match=r"a\.json:1: field 'ground_truth\[0\]': function 'nope'"):
        load_bfcl(qp, ap)
    with pytest.raises(FileNotFoundError):
        load_bfcl(tmp_path / "missing.json")


def test_normalize_bfcl_schema_unions():
    assert normalize_bfcl_schema({"type": ["float", "null"]}) == {"type": ["number", "null"]}
    assert normalize_bfcl_schema({"type": ["string", "any"], "description": "d"}) == {"description": "d"}
    assert normalize_bfcl_schema({"type": "array", "items": [{"type": "dict"}]}) == {
        "type": "array",
        "items": [{"type": "object"}],
    }


# ----------------------------------------------------------------------------- shipped tasks

SHIPPED = load_tasks(DATA / OUT_FILE)
CALLS = [t for t in SHIPPED if t.tool_call.mode == "calls"]
ANSWER = [t for t in SHIPPED if t.tool_call.mode == "answer"]


def test_shipped_tasks_match_generator(tmp_path):
    assert write_tasks(tmp_path / OUT_FILE).read_bytes() == (DATA / OUT_FILE).read_bytes(), (
        "regenerate: python -m rl.data.tasks.toolcall_tasks"
    )
    assert build_tasks() == SHIPPED


def test_shipped_tasks_shape():
    kinds = [t.meta["kind"] for t in SHIPPED]
    assert len(SHIPPED) >= 50
    assert kinds.count("single") >= 18 and kinds.count("parallel") >= 15 and kinds.count("multi_turn") >= 15
    assert len({t.id for t in SHIPPED}) == len(SHIPPED)
    assert len({t.messages[1].content for t in SHIPPED}) == len(SHIPPED)
    for t in SHIPPED:
        assert t.domain == "tool_call" and t.prefill == "" and t.meta["source"] == "jointrl"
        assert [m.role for m in t.messages] == ["system", "user"]
        assert t.tool_call.mode == ("answer" if t.meta["kind"] == "multi_turn" else "calls")
        names = [tool["name"] for tool in t.tool_call.tools]
        assert len(names) == len(set(names)) and all(n in TOOLS for n in names)
        for tool in t.tool_call.tools:
            assert json.dumps(tool) in t.messages[0].content
        if t.meta["kind"] == "single":
            assert len(t.tool_call.expected) == 1 and not t.tool_call.parallel
        if t.meta["kind"] == "parallel":
            assert 2 <= len(t.tool_call.expected) <= 3 and t.tool_call.parallel
        assert {e.name for e in t.tool_call.expected} < set(names)  # at least one distractor


def _reference_calls(task: Task) -> str:
    blocks = []
    for e in task.tool_call.expected:
        args = {p: next(v for v in vals if v != "") for p, vals in e.allowed.items() if any(v != "" for v in vals)}
        blocks.append(format_call(ToolCall(e.name, args)))
    return "\n".join(blocks)


@pytest.mark.parametrize("task", CALLS, ids=lambda t: t.id)
def test_shipped_calls_task_solvable(task):
    ref = _reference_calls(task)
    tr, steps = run_episode(task, [ref], max_turns=4)
    obs, terminated, truncated, info = steps[0]
    assert (obs, terminated, truncated) == ([], True, False)
    assert info["problems"] == [] and info["schema_errors"] == []
    assert ToolCallReward()(tr) == pytest.approx(1.0)
    assert ToolCallFormatReward()(tr) == 1.0 and ToolAnswerReward()(tr) is None
    # The expected calls also run on the simulated tools without error.
    state = json.loads(json.dumps(task.tool_call.state))
    for c in steps[0][3]["calls"]:
        run_tool(ToolCall(c["name"], c["arguments"]), state)
    assert ToolCallReward()(traj(task, ["I can't help with that."])) == 0.0


@pytest.mark.parametrize("task", ANSWER, ids=lambda t: t.id)
def test_shipped_answer_task_solvable(task):
    ref = task.meta["reference"]
    assert len(ref) >= 2 and all("<tool_call>" in t for t in ref[:-1]) and "<tool_call>" not in ref[-1]
    tr, steps = run_episode(task, ref)
    assert len(steps) == len(ref) and tr.terminated and not tr.truncated
    for obs, _, _, info in steps[:-1]:
        assert info["problems"] == [] and info["schema_errors"] == []
        assert info["tool_results"] and all(r["ok"] for r in info["tool_results"]), info["tool_results"]
        assert len(obs) == len(info["calls"]) and all("error" not in json.loads(m.content) for m in obs)
    assert steps[-1][3]["answer"] == ref[-1].strip()
    assert ToolAnswerReward()(tr) == 1.0
    assert ToolCallFormatReward()(tr) == 1.0 and ToolCallReward()(tr) is None
    # A wrong final answer scores 0, and so does repeating the prompt (the answer is not in it).
    wrong, _ = run_episode(task, ref[:-1] + ["Sorry, I could not find that information."])
    assert ToolAnswerReward()(wrong) == 0.0
    echo, _ = run_episode(task, ref[:-1] + [" ".join(m.content for m in task.messages).replace("<tool_call>", "")])
    assert ToolAnswerReward()(echo) == 0.0
    # Answering at once, without calling the tools, does not score with the prompt's numbers either.
    assert ToolAnswerReward()(traj(task, [task.messages[1].content])) == 0.0


# ----------------------------------------------------------------------------- answers that game the match


def _answer_attacks(task: Task, tr: Trajectory) -> dict[str, str]:
    """Wrong final answers, each naming the right value among others (or hiding it in noise)."""
    ref = task.meta["reference"][-1]
    right = ref.rsplit("<answer>", 1)[1].split("</answer>")[0]
    tool_text = " ".join(m.content for m in tr.messages if m.role == "tool")
    nums = sorted({int(x) for x in extract_numbers(right)} | {0})
    spread = ", ".join(str(n + d) for n in nums for d in range(-3, 4))
    attacks = {
        "candidates_around_the_value": f"<answer>{right}, {spread}</answer>",
        "candidates_untagged": f"It is one of {spread} or {right}, or 1, 2, 3, 1000.",
        "two_answer_blocks": f"<answer>{right}</answer> or maybe <answer>{spread}</answer>",
        "unclosed_answer_block": f"{right} <answer>{spread}",
        "every_integer": "<answer>" + " ".join(str(i) for i in range(-50, 3000)) + f" {right}</answer>",
    }
    # The tool results pasted as the answer are a list of candidates when they hold a number that
    # is neither the value nor the request's (else they hold the one value: a right answer).
    request = task.messages[-1].content
    values = set(extract_numbers(" ".join(task.tool_call.answer)))  # the value and its rounded variants
    if set(extract_numbers(tool_text)) - set(extract_numbers(request)) - values:
        attacks["tool_results_dumped"] = f"<answer>{tool_text}</answer>"
        attacks["tool_results_dumped_untagged"] = tool_text
    return attacks


@pytest.mark.parametrize("task", ANSWER, ids=lambda t: t.id)
def test_answers_listing_candidates_score_zero_on_every_shipped_answer_task(task):
    ref = task.meta["reference"]
    tr, _ = run_episode(task, ref)
    assert ToolAnswerReward()(tr) == 1.0  # the baseline the attacks must not reach
    for name, final in _answer_attacks(task, tr).items():
        wrong, _ = run_episode(task, ref[:-1] + [final])
        assert ToolAnswerReward()(wrong) == 0.0, (name, final[:300])


@pytest.mark.parametrize(
    "text, acceptable, ok",
    [
        ("<answer>21</answer>", ["21"], True),
        ("Lisbon is at 21 °C, user 42 says.", ["21"], True),  # 42 is the request's number
        ("<answer>20, 21, 22</answer>", ["21"], False),
        ("It is 21 or 22.", ["21"], False),
        ("21.000001", ["21"], False),  # integers compare exactly
        ("21.0", ["21"], True),
        ("92.5 EUR, about 93", ["92.5", "93"], True),  # rounded variants of the one value
        ("<answer>B-2001 or B-2002</answer>", ["B-2001"], False),
        ("<answer>2024-05-28, UPS</answer>", ["2024-05-28 && UPS"], True),
        ("<answer>2024-05-28 or 2024-05-29, UPS</answer>", ["2024-05-28 && UPS"], False),
        ("<answer>1" + "0" * 400 + "</answer>", ["21"], False),  # overflow is a mismatch
        ("<answer>21</answer><answer>21</answer>", ["21"], False),
    ],
)
def test_one_answer_span_one_candidate(text, acceptable, ok):
    assert answer_matches(text, acceptable, "What is the temperature where user 42 lives?") is ok


def test_integers_compare_exactly_and_overflow_is_a_mismatch():
    big = 10**400
    assert values_match(big, big) and not values_match(big + 1, big) and not values_match(big, 5.0)
    assert not values_match(5.0, big) and values_match(20, 20.0) and not values_match(2**60 + 1, 2**60)
    expected = [ExpectedCall("get_weather", {"city": ["Lisbon"], "days": [3]})]
    r = ToolCallReward()
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Lisbon", "days": 1' + "0" * 400 + "}}</tool_call>"
    assert r.score(text, expected) == pytest.approx(0.5)  # format + name, the arguments do not match
    ok = '<tool_call>{"name": "get_weather", "arguments": {"city": "Lisbon", "days": 3}}</tool_call>'
    assert r.score(ok, expected) == pytest.approx(1.0)
    assert argument_fraction(parse_tool_calls(text)[0][0], expected[0]) == pytest.approx(0.5)


def test_a_400_digit_argument_is_a_tool_error_not_an_exception():
    task = answer_task(tools=("convert_currency", "convert_units", "set_timer"))
    big = "1" + "0" * 400
    turns = [
        '<tool_call>{"name": "convert_currency", "arguments": {"amount": ' + big + ', "from_currency": "USD", '
        '"to_currency": "EUR"}}</tool_call>\n<tool_call>{"name": "convert_units", "arguments": {"value": 1e400, '
        '"from_unit": "m", "to_unit": "km"}}</tool_call>',
        "<answer>21</answer>",
    ]
    tr, steps = run_episode(task, turns)
    results = steps[0][3]["tool_results"]
    assert [r["ok"] for r in results] == [False, False], results
    assert all("too large" in json.loads(m.content)["error"] for m in steps[0][0])
    assert ToolAnswerReward()(tr) == 1.0 and ToolCallFormatReward()(tr) == 1.0


def test_a_text_answer_naming_other_values_from_the_data_scores_zero():
    task = answer_task(answer=("shipped",), tools=("get_order_status", "list_user_orders", "lookup_user"))
    turns = [call("list_user_orders", user_id=42), call("get_order_status", order_id="A-1")]
    ok, _ = run_episode(task, turns + ["Order A-1 is <answer>shipped</answer>."])
    assert ToolAnswerReward()(ok) == 1.0
    for final in (
        "<answer>shipped or processing</answer>",  # processing: A-2's status, in the task's state
        "It is shipped, unless it is processing.",
        '<answer>{"status": "shipped"} {"status": "processing"}</answer>',
    ):
        tr, _ = run_episode(task, turns + [final])
        assert ToolAnswerReward()(tr) == 0.0, final
    # Not in the data, not detected (documented): a candidate word the tools never returned.
    tr, _ = run_episode(task, turns + ["<answer>shipped or returned</answer>"])
    assert ToolAnswerReward()(tr) == 1.0
