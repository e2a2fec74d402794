"""Attacks on the tool-call reward's partial credit: calls that know no value of the task.

Scored through :class:`rewards.toolcall.ToolCallReward` with the weights and ``args_credit``
of ``recipes/joint_rl.yaml`` (the recipe that trains on the tool-call ladder). The baseline is
what a well-formed call with a wrong value for every argument earns (format and function-name
credit, paid by design); each attack must score no more than it, and the reference call 1.0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from envs.io import load_tasks
from envs.toolcall import format_call
from envs.types import ExpectedCall, ToolCall
from rewards.toolcall import ToolCallReward, argument_fraction, arguments_match
from trajs import answered

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "recipes" / "data"


def _recipe_reward() -> ToolCallReward:
    recipe = yaml.safe_load((REPO / "recipes" / "joint_rl.yaml").read_text())
    (spec,) = [r for r in recipe["rewards"] if r["cls"] == "rewards.toolcall.ToolCallReward"]
    assert spec["kwargs"]["args_credit"] == "fraction"  # the partial credit these attacks aim at
    return ToolCallReward(**spec["kwargs"])


OMIT = object()


def _calls(expected: tuple[ExpectedCall, ...], value) -> str:
    """One call per expected call, every parameter it lists given ``value(param, allowed)`` (left out on OMIT)."""
    args = [{p: value(p, a) for p, a in e.allowed.items()} for e in expected]
    return "".join(
        format_call(ToolCall(e.name, {p: v for p, v in a.items() if v is not OMIT})) for e, a in zip(expected, args)
    )


def _wrong(param: str, allowed: list) -> object:
    real = next((v for v in allowed if v != ""), "x")
    if isinstance(real, bool):
        return not real
    if isinstance(real, (int, float)):
        return real + 1000
    return f"not-{param}"


def _reference(param: str, allowed: list) -> object:
    return next((v for v in allowed if v != ""), OMIT)


def _omit_only_tasks(path: Path):
    for task in load_tasks(path):
        spec = task.tool_call
        if (
            spec is not None
            and spec.mode == "calls"
            and any(a == [""] for e in spec.expected for a in e.allowed.values())
        ):
            yield task


@pytest.mark.parametrize("name", ["toolcall_ladder.train.jsonl", "toolcall_ladder.eval.jsonl"])
def test_empty_strings_for_every_argument_earn_no_more_than_a_wrong_call(name):
    """``""`` is allowed only as the "omit" marker; spelling it out for a parameter that may only
    be omitted, and for all the others, must earn nothing beyond a wrong call (it earned the
    omit-only parameters' share: 0.67 on toolcall_ladder-train-one_tool-001 against 0.5)."""
    reward = _recipe_reward()
    tasks = list(_omit_only_tasks(DATA / name))
    assert len(tasks) >= 5, "the ladder has tasks with omit-only parameters (the attack's target)"
    for task in tasks:
        expected = task.tool_call.expected
        base = reward(answered(task, _calls(expected, _wrong)))
        blanks = reward(answered(task, _calls(expected, lambda p, a: "")))
        spaces = reward(answered(task, _calls(expected, lambda p, a: "   ")))
        # The omit-only parameters given as "" with wrong values for the rest: still a wrong call.
        mixed = reward(answered(task, _calls(expected, lambda p, a: "" if a == [""] else _wrong(p, a))))
        assert max(blanks, spaces, mixed) <= base, (task.id, base, blanks, spaces, mixed)
        assert reward(answered(task, _calls(expected, _reference))) == 1.0, task.id


def test_an_omit_only_parameter_spelled_as_empty_counts_for_nothing_either_way():
    e = ExpectedCall("translate_text", {"text": ["hi"], "target_language": ["Portuguese"], "source_language": [""]})
    frac = argument_fraction
    assert frac(ToolCall(e.name, {"text": "", "target_language": "", "source_language": ""}), e) == 0.0
    assert frac(ToolCall(e.name, {"text": "hi", "target_language": "x", "source_language": ""}), e) == 0.5
    assert frac(ToolCall(e.name, {"text": "hi", "target_language": "x"}), e) == 0.5
    # The right call with the omission spelled out still matches, all-or-nothing and as a fraction.
    right = ToolCall(e.name, {"text": "hi", "target_language": "Portuguese", "source_language": ""})
    assert arguments_match(right, e) and frac(right, e) == 1.0
    # A non-empty value for an omit-only parameter is given and wrong.
    assert frac(ToolCall(e.name, {"text": "hi", "target_language": "Portuguese", "source_language": "en"}), e) == 2 / 3
    # An empty string where a value is required is a wrong value, not an omission.
    assert frac(ToolCall(e.name, {"text": "", "target_language": "Portuguese"}), e) == 0.5
