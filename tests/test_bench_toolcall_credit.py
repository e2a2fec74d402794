"""bench/toolcall_credit.py: re-scoring logged tool-call samples under both argument-credit settings."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.toolcall_credit import main, rescore  # noqa: E402
from envs.types import ExpectedCall, Message, Task, ToolCall, ToolCallSpec  # noqa: E402
from envs.toolcall import format_call  # noqa: E402

BOOK = ExpectedCall("book_table", {"restaurant": ["Olive Tree"], "time": ["16:00"], "party_size": [6]})
TASK = Task(
    id="t-book",
    domain="tool_call",
    messages=(Message("user", "book it"),),
    prefill="<tool_call>",
    tool_call=ToolCallSpec(tools=(), expected=(BOOK,)),
)


def call(**args) -> str:
    return format_call(ToolCall("book_table", args))


def rec(step, group, response, reward, split="train"):
    return {
        "split": split,
        "step": step,
        "group": group,
        "domain": "tool_call",
        "task_id": TASK.id,
        "response": response,
        "reward": reward,
    }


def test_groups_differing_only_in_how_many_arguments_are_right_gain_variance():
    one = call(restaurant="Olive Tree", time="12:00", party_size=2)  # 1 of 3 right: 0.5 all-or-nothing
    two = call(restaurant="Olive Tree", time="16:00", party_size=2)  # 2 of 3 right: 0.5 too
    full = call(restaurant="Olive Tree", time="16:00", party_size=6)
    records = [rec(1, 0, one, 0.5), rec(1, 0, two, 0.5), rec(1, 1, full, 1.0), rec(1, 1, one, 0.5)]
    out = rescore(records, {TASK.id: TASK}, {})["train"]
    assert out["groups"] == 2 and out["groups_with_variance_all"] == 1 and out["groups_with_variance_fraction"] == 2
    assert out["fractional_samples"] == 3 and out.get("mismatches", 0) == 0
    assert out["mean_fraction"] > out["mean_all"]


def test_a_logged_reward_the_rescoring_does_not_reproduce_fails_the_bench(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    from envs.io import task_to_dict

    tasks.write_text(json.dumps(task_to_dict(TASK)) + "\n")
    runs = tmp_path / "rollouts.jsonl"
    good = call(restaurant="Olive Tree", time="16:00", party_size=6)
    runs.write_text(json.dumps(rec(1, 0, good, 1.0)) + "\n")
    assert main([str(runs), "--tasks", str(tasks)]) == 0
    runs.write_text(json.dumps(rec(1, 0, good, 0.7)) + "\n")
    assert main([str(runs), "--tasks", str(tasks)]) == 1
    assert "1 logged rewards not reproduced" in capsys.readouterr().out
