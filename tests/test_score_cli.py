"""``jointrl score``: recorded completions through the reward service; summary, per-sample output, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from envs.io import save_tasks
from envs.sandbox import SandboxUnavailable, check_sandbox
from envs.types import ExpectedCall, Message, Task, TerminalSpec, ToolCallSpec
from rl.cli.main import main

REPO = Path(__file__).resolve().parents[1]

try:
    check_sandbox()
    _NO_SANDBOX = ""
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    _NO_SANDBOX = str(exc)
needs_sandbox = pytest.mark.skipif(bool(_NO_SANDBOX), reason=f"bubblewrap sandbox unavailable: {_NO_SANDBOX}")

TOOLS = (
    {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
    {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
)


def call(name: str, **args) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def tool_tasks() -> list[Task]:
    msgs = (Message("system", "tools"), Message("user", "weather and time?"))
    return [
        Task(
            id="single",
            domain="tool_call",
            messages=msgs,
            prefill="<tool_call>",
            tool_call=ToolCallSpec(tools=TOOLS, expected=(ExpectedCall("get_weather", {"city": ["Paris", "paris"]}),)),
        ),
        Task(
            id="parallel",
            domain="tool_call",
            messages=msgs,
            tool_call=ToolCallSpec(
                tools=TOOLS,
                parallel=True,
                expected=(
                    ExpectedCall("get_weather", {"city": ["Oslo"]}),
                    ExpectedCall("get_time", {"tz": ["CET", ""]}),
                ),
            ),
        ),
        Task(
            id="answer",
            domain="tool_call",
            messages=msgs,
            tool_call=ToolCallSpec(tools=TOOLS, expected=(), mode="answer", answer=("18",)),
        ),
        Task(
            id="term",
            domain="terminal",
            messages=(Message("user", "make a file"),),
            terminal=TerminalSpec(setup="true", check="test -f out"),
        ),
    ]


@pytest.fixture
def files(tmp_path: Path):
    tasks = tmp_path / "tasks.jsonl"
    save_tasks(tool_tasks(), tasks)
    rows = [
        # The prefill "<tool_call>" is prepended when the completion does not start with it ...
        {
            "task_id": "single",
            "completion": json.dumps({"name": "get_weather", "arguments": {"city": "paris"}}) + "</tool_call>",
        },
        # ... and not doubled when it does.
        {"task_id": "single", "completion": call("get_weather", city="Rome")},
        # Parallel calls match in any order; "tz" may be omitted ("" is allowed).
        {"task_id": "parallel", "completion": call("get_time") + call("get_weather", city="Oslo")},
        # Multi-turn answer mode: the messages after the prompt.
        {
            "task_id": "answer",
            "messages": [
                {"role": "assistant", "content": call("get_weather", city="Oslo")},
                {"role": "tool", "content": '{"temp": 18}', "name": "get_weather"},
                {"role": "assistant", "content": "It is 18 degrees."},
            ],
        },
        {"task_id": "term", "completion": "touch out\nDONE", "env_reward": 1.0, "sample": 3},
        {"task_id": "term", "completion": "DONE"},  # never checked: no env_reward -> a recorded error
    ]
    comps = tmp_path / "completions.jsonl"
    comps.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path, tasks, comps


def run(capsys, *argv: str) -> tuple[int, dict | None, str]:
    rc = main(["score", *argv])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def test_summary_and_per_sample_scores(files, capsys):
    tmp, tasks, comps = files
    rc, s, err = run(capsys, "--tasks", str(tasks), "--completions", str(comps), "--out", str(tmp / "scores.jsonl"))
    assert rc == 0, err
    assert (s["count"], s["scored"], s["errors"]) == (6, 5, 1)
    tc = s["domains"]["tool_call"]
    assert (tc["count"], tc["scored"], tc["errors"]) == (4, 4, 0)
    assert tc["mean"] == pytest.approx((1.0 + 0.5 + 1.0 + 1.0) / 4)  # Rome: format + name, wrong city
    assert tc["pass_rate"] == pytest.approx(3 / 4)
    fns = tc["functions"]
    assert fns["toolcall"]["count"] == 3 and fns["toolcall"]["none"] == 1  # the answer-mode task
    assert fns["tool_answer"]["count"] == 1 and fns["tool_answer"]["mean"] == 1.0
    assert fns["toolcall_format"]["weight"] == 0.0 and fns["toolcall_format"]["count"] == 4
    assert fns["toolcall"]["latency_s"] >= 0 and fns["toolcall"]["errors"] == 0
    term = s["domains"]["terminal"]
    assert (term["count"], term["scored"], term["errors"], term["pass_rate"]) == (2, 1, 1, 0.5)
    rows = [json.loads(x) for x in (tmp / "scores.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["sample"]) for r in rows] == [
        ("single", 0),
        ("single", 1),
        ("parallel", 0),
        ("answer", 0),
        ("term", 3),
        ("term", 4),
    ]
    assert rows[0]["reward"] == 1.0 and rows[0]["passed"] is True and rows[0]["scores"]["toolcall"] == 1.0
    assert rows[1]["reward"] == pytest.approx(0.5) and rows[1]["passed"] is False
    assert rows[5]["reward"] is None and "no reward function scored" in rows[5]["reward_error"]


def test_pass_threshold(files, capsys):
    _, tasks, comps = files
    rc, s, _ = run(capsys, "--tasks", str(tasks), "--completions", str(comps), "--pass-threshold", "0.5")
    assert rc == 0 and s["domains"]["tool_call"]["pass_rate"] == 1.0 and s["pass_threshold"] == 0.5


def test_rescoring_a_runs_rollouts_file(tmp_path, capsys):
    """rollouts.jsonl lines (task_id + response) are valid completions input."""
    eval_file = REPO / "recipes" / "data" / "toolcall_quickstart.eval.jsonl"
    from envs.io import load_tasks

    t = load_tasks(eval_file)[0]
    (e,) = t.tool_call.expected
    good = call(e.name, **{k: v[0] for k, v in e.allowed.items() if v[0] != ""})
    lines = [
        {"step": 0, "split": "eval", "domain": "tool_call", "task_id": t.id, "response": good, "reward": 0.0},
        {"step": 1, "split": "eval", "domain": "tool_call", "task_id": t.id, "response": "<tool_call>??"},
    ]
    p = tmp_path / "rollouts.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rc, s, err = run(capsys, "--tasks", str(eval_file), "--completions", str(p))
    assert rc == 0, err
    assert s["domains"]["tool_call"]["functions"]["toolcall"]["mean"] == pytest.approx(0.5)  # 1.0 and 0.0


USER_MODULE = textwrap.dedent("""
    import math

    class Shout:
        name = "shout"
        domains = ("tool_call",)
        def __init__(self, bonus=1.0):
            self.bonus = bonus
        def __call__(self, traj):
            return self.bonus if traj.completion.isupper() else 0.0

    class Broken:
        name = "broken"
        domains = ("tool_call",)
        def __call__(self, traj):
            return math.nan
""")


def write_recipe(tmp: Path, rewards: list[dict], **service) -> Path:
    d = yaml.safe_load((REPO / "recipes" / "tiny.yaml").read_text())
    d["rewards"] = rewards
    d["reward_service"] = {**d.get("reward_service", {}), **service}  # recipes list only what they change
    p = tmp / "recipe.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "score_cli_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "score_cli_rewards"


def test_rewards_from_a_recipe(files, user_module, capsys):
    tmp, tasks, comps = files
    recipe = write_recipe(
        tmp,
        [
            {"cls": "rewards.toolcall.ToolCallReward", "weight": 1.0, "domains": [], "kwargs": {}},
            {"cls": f"{user_module}.Shout", "weight": 0.5, "domains": [], "kwargs": {"bonus": 2.0}},
            {"cls": f"{user_module}.Broken", "weight": 1.0, "domains": ["terminal"], "kwargs": {}},
        ],
    )
    rc, s, err = run(capsys, "--tasks", str(tasks), "--completions", str(comps), "--recipe", str(recipe))
    assert rc == 0, err
    assert [r["name"] for r in s["rewards"]] == ["toolcall", "shout", "broken"]
    tc = s["domains"]["tool_call"]
    assert tc["functions"]["shout"]["count"] == 4 and tc["functions"]["shout"]["mean"] == 0.0
    # The answer-mode task: toolcall does not apply, shout (a real reward) scores it 0.0.
    assert (tc["scored"], tc["errors"]) == (4, 0)
    term = s["domains"]["terminal"]
    assert term["errors"] == 2 and term["functions"]["broken"]["errors"] == 2  # NaN is an error, never a 0
    assert term["error_reasons"] == {"broken returned nan, not a finite number": 2}, term["error_reasons"]
    assert s["error_reasons"] == term["error_reasons"] and tc["error_reasons"] == {}


def test_score_takes_key_value_overrides_of_its_recipe(files, user_module, capsys):
    """``score --recipe R key=value``: the overrides change the recipe's rewards, as in every recipe command."""
    tmp, tasks, comps = files
    recipe = write_recipe(
        tmp, [{"cls": f"{user_module}.Shout", "weight": 0.5, "domains": [], "kwargs": {"bonus": 2.0}}]
    )
    args = ("--tasks", str(tasks), "--completions", str(comps), "--recipe", str(recipe))
    rc, s, err = run(capsys, *args, "rewards.0.weight=0.25", "rewards.+={cls: rewards.toolcall.ToolCallReward}")
    assert rc == 0, err
    assert [(r["name"], r["weight"]) for r in s["rewards"]] == [("shout", 0.25), ("toolcall", 1.0)]
    rc, _, err = run(capsys, *args, "rewards.0.kwargs.nope=1")
    assert rc == 2 and "rewards.0.kwargs: do not match" in err, err
    rc, _, err = run(capsys, "--tasks", str(tasks), "--completions", str(comps), "train.steps=2")
    assert rc == 2 and "pass it with --recipe" in err, err


def test_user_reward_failure_modes_are_per_sample_errors(tmp_path, user_module, capsys):
    tasks = tmp_path / "t.jsonl"
    save_tasks(tool_tasks()[:1], tasks)
    comps = tmp_path / "c.jsonl"
    comps.write_text(json.dumps({"task_id": "single", "completion": "X"}) + "\n")
    recipe = write_recipe(tmp_path, [{"cls": f"{user_module}.Broken", "weight": 1.0, "domains": [], "kwargs": {}}])
    rc, s, err = run(capsys, "--tasks", str(tasks), "--completions", str(comps), "--recipe", str(recipe))
    assert rc == 0, err
    assert s["errors"] == 1 and s["scored"] == 0 and s["mean"] is None and s["pass_rate"] == 0.0


@pytest.mark.parametrize(
    "reward, message",
    [
        ({"cls": "no_such_module.Reward"}, "rewards.0.cls: cannot import 'no_such_module.Reward'"),
        ({"cls": "rewards.toolcall.ToolCallReward", "kwargs": {"nope": 1}}, "rewards.0.kwargs: do not match"),
        ({"cls": "rewards.toolcall.ToolCallReward", "kwargs": {"format_weight": -1}}, "cannot construct"),
    ],
)
def test_bad_recipe_rewards_exit_2(files, capsys, reward, message):
    tmp, tasks, comps = files
    recipe = write_recipe(tmp, [{"weight": 1.0, "domains": [], "kwargs": {}, **reward}])
    rc, _, err = run(capsys, "--tasks", str(tasks), "--completions", str(comps), "--recipe", str(recipe))
    assert rc == 2 and message in err and str(recipe) in err, err


def lines(tmp: Path, *rows: str) -> Path:
    p = tmp / "bad.jsonl"
    p.write_text("".join(r + "\n" for r in rows))
    return p


GOOD = json.dumps({"task_id": "single", "completion": "x"})


@pytest.mark.parametrize(
    "rows, message",
    [
        ((GOOD, "{not json"), "bad.jsonl:2: invalid JSON"),
        ((GOOD, "", json.dumps({"task_id": "nope", "completion": "x"})), "bad.jsonl:3: task_id 'nope' is not in"),
        ((json.dumps({"completion": "x"}),), "bad.jsonl:1: field 'task_id': missing"),
        (
            (json.dumps({"task_id": "single"}),),
            "bad.jsonl:1: need exactly one of 'completion', 'response' or 'messages'",
        ),
        ((json.dumps({"task_id": "single", "completion": "a", "response": "b"}),), "got completion, response"),
        ((json.dumps({"task_id": "single", "completion": 3}),), "bad.jsonl:1: field 'completion': must be a string"),
        ((json.dumps({"task_id": "single", "completion": "a", "sample": -1}),), "field 'sample'"),
        ((json.dumps({"task_id": "single", "completion": "a", "env_reward": "1"}),), "field 'env_reward'"),
        (
            (json.dumps({"task_id": "single", "messages": [{"role": "tool", "content": "x"}]}),),
            "has no assistant message",
        ),
        ((json.dumps({"task_id": "single", "messages": [{"role": "bot", "content": "x"}]}),), "field 'messages[0]'"),
        (
            (
                json.dumps({"task_id": "single", "completion": "a", "sample": 1}),
                json.dumps({"task_id": "single", "completion": "b", "sample": 1}),
            ),
            "bad.jsonl:2: duplicate sample 1",
        ),
        (("[1, 2]",), "bad.jsonl:1: a completion record must be a JSON object"),
    ],
)
def test_bad_completions_exit_2_naming_file_and_line(files, capsys, rows, message):
    tmp, tasks, _ = files
    rc, _, err = run(capsys, "--tasks", str(tasks), "--completions", str(lines(tmp, *rows)))
    assert rc == 2 and err.startswith("jointrl: error: ") and message in err, err


def test_missing_files_and_bad_tasks_exit_2(files, capsys):
    tmp, tasks, comps = files
    rc, _, err = run(capsys, "--tasks", str(tmp / "nope.jsonl"), "--completions", str(comps))
    assert rc == 2 and "task file not found" in err and "nope.jsonl" in err
    rc, _, err = run(capsys, "--tasks", str(tasks), "--completions", str(tmp / "none.jsonl"))
    assert rc == 2 and "completions file not found" in err and "none.jsonl" in err
    bad_tasks = tmp / "bad_tasks.jsonl"
    bad_tasks.write_text('{"id": "a", "domain": "tool_call", "messages": []}\n')
    rc, _, err = run(capsys, "--tasks", str(bad_tasks), "--completions", str(comps))
    assert rc == 2 and "bad_tasks.jsonl:1" in err and "messages" in err
    rc, _, err = run(capsys, "--tasks", str(tmp / "tasks.txt"), "--completions", str(comps))
    assert rc == 2
    (tmp / "tasks.txt").write_text("x")
    rc, _, err = run(capsys, "--tasks", str(tmp / "tasks.txt"), "--completions", str(comps))
    assert rc == 2 and "unsupported task file type" in err
    rc, _, err = run(capsys, "--tasks", str(tasks), "--completions", str(comps), "--answers", "x")
    assert rc == 2 and "--answers goes with --format bfcl" in err


HUMANEVAL = [
    {
        "task_id": "HumanEval/0",
        "prompt": 'def add(a, b):\n    """Add."""\n',
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n",
        "entry_point": "add",
    },
    {
        "task_id": "HumanEval/1",
        "prompt": "def neg(a):\n",
        "canonical_solution": "    return -a\n",
        "test": "def check(candidate):\n    assert candidate(1) == -1\n",
        "entry_point": "neg",
    },
]


@needs_sandbox
def test_humaneval_format(tmp_path, capsys):
    he = tmp_path / "he.jsonl"
    he.write_text("".join(json.dumps(x) + "\n" for x in HUMANEVAL))
    comps = tmp_path / "c.jsonl"
    comps.write_text(
        "".join(
            json.dumps(x) + "\n"
            for x in [
                {"task_id": "HumanEval/0", "completion": "```python\ndef add(a, b):\n    return a + b\n```"},
                {"task_id": "HumanEval/0", "completion": "```python\ndef add(a, b):\n    return a - b\n```"},
                {"task_id": "HumanEval/1", "completion": "no code at all"},
            ]
        )
    )
    rc, s, err = run(
        capsys,
        "--tasks",
        str(he),
        "--format",
        "humaneval",
        "--completions",
        str(comps),
        "--out",
        str(tmp_path / "o.jsonl"),
    )
    assert rc == 0, err
    code = s["domains"]["code"]
    assert code["count"] == 3 and code["mean"] == pytest.approx(1 / 3) and code["pass_rate"] == pytest.approx(1 / 3)
    assert code["functions"]["code_format"]["mean"] == pytest.approx(2 / 3)
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rows] == [1.0, 0.0, 0.0]


def test_bfcl_format_parallel_order_insensitive(tmp_path, capsys):
    q = tmp_path / "q.jsonl"
    fns = [
        {
            "name": "get_weather",
            "description": "",
            "parameters": {
                "type": "dict",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    q.write_text(
        json.dumps({"id": "parallel_0", "question": [[{"role": "user", "content": "Paris and Oslo"}]], "function": fns})
        + "\n"
    )
    a = tmp_path / "a.jsonl"
    a.write_text(
        json.dumps(
            {
                "id": "parallel_0",
                "ground_truth": [
                    {"get_weather": {"city": ["Paris"], "unit": ["", "celsius"]}},
                    {"get_weather": {"city": ["Oslo"], "unit": ["", "celsius"]}},
                ],
            }
        )
        + "\n"
    )
    comps = tmp_path / "c.jsonl"
    comps.write_text(
        "".join(
            json.dumps(x) + "\n"
            for x in [
                {
                    "task_id": "parallel_0",
                    "completion": call("get_weather", city="Oslo", unit="celsius") + call("get_weather", city="Paris"),
                },
                {
                    "task_id": "parallel_0",
                    "completion": call("get_weather", city="Oslo", unit="kelvin") + call("get_weather", city="Paris"),
                },
            ]
        )
    )
    rc, s, err = run(
        capsys,
        "--tasks",
        str(q),
        "--format",
        "bfcl",
        "--answers",
        str(a),
        "--completions",
        str(comps),
        "--out",
        str(tmp_path / "o.jsonl"),
    )
    assert rc == 0, err
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    # 0.2 format + 0.3 names + 0.5 * (1 of 2 argument sets) for the kelvin one.
    assert [r["reward"] for r in rows] == [pytest.approx(1.0), pytest.approx(0.75)]


def test_tokenizer_gives_length_rewards_token_counts(files, tmp_path, capsys, tiny_model_path):
    _, tasks, _ = files
    comps = tmp_path / "c.jsonl"
    comps.write_text(
        "".join(
            json.dumps({"task_id": "single", "completion": c}) + "\n"
            for c in [call("get_weather", city="Paris"), call("get_weather", city="Paris " * 40)]
        )
    )
    recipe = write_recipe(
        tmp_path,
        [
            {"cls": "rewards.toolcall.ToolCallReward", "weight": 1.0, "domains": [], "kwargs": {}},
            {
                "cls": "rewards.format.OverlongPenalty",
                "weight": 1.0,
                "domains": [],
                "kwargs": {"max_tokens": 60, "buffer_tokens": 20},
            },
        ],
    )
    out = tmp_path / "o.jsonl"
    rc, s, err = run(
        capsys, "--tasks", str(tasks), "--completions", str(comps), "--recipe", str(recipe), "--out", str(out)
    )
    assert rc == 0, err
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["scores"]["overlong"] for r in rows] == [None, None]  # no token counts without --tokenizer
    rc, s, err = run(
        capsys,
        "--tasks",
        str(tasks),
        "--completions",
        str(comps),
        "--recipe",
        str(recipe),
        "--out",
        str(out),
        "--tokenizer",
        tiny_model_path,
    )
    assert rc == 0, err
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0]["scores"]["overlong"] == 0.0 and rows[0]["reward"] == 1.0
    assert rows[1]["scores"]["overlong"] == -1.0 and rows[1]["reward"] == pytest.approx(0.5 - 1.0)


@pytest.mark.slow  # starts Ray
def test_workers_use_the_ray_service(files, user_module, capsys):
    tmp, tasks, comps = files
    rc, local, err = run(capsys, "--tasks", str(tasks), "--completions", str(comps), "--out", str(tmp / "a.jsonl"))
    assert rc == 0, err
    rc, remote, err = run(
        capsys, "--tasks", str(tasks), "--completions", str(comps), "--out", str(tmp / "b.jsonl"), "--workers", "2"
    )
    assert rc == 0, err
    assert remote["service"] == {"workers": 2, "restarts": 0, "worker_errors": 0}
    assert (tmp / "a.jsonl").read_text() == (tmp / "b.jsonl").read_text()
    for d in local["domains"]:
        assert remote["domains"][d]["mean"] == local["domains"][d]["mean"]


def test_entry_point(files):
    tmp, tasks, comps = files
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run(
        [str(exe), "score", "--tasks", str(tasks), "--completions", str(comps)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["count"] == 6
