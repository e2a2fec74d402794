"""The shipped single-turn text-answer env and reward functions given as plain functions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envs.base import check_env
from envs.text import TextAnswerEnv
from envs.types import Message, Task
from rewards.protocol import FunctionReward, build_reward, check_reward_kwargs
from rl.config.recipe import RecipeError, load_recipe, validate_recipe

TASK = Task(
    id="q1", domain="qa", messages=(Message("system", "Answer briefly."), Message("user", "Capital of France?"))
)


def test_text_env_keeps_the_contract_and_ends_after_one_answer() -> None:
    check_env(TextAnswerEnv(), TASK, action="Paris")
    env = TextAnswerEnv()
    assert env.reset(TASK) == list(TASK.messages)
    assert env.step("Paris") == ([], True, False, {"over_length": False})
    with pytest.raises(RuntimeError):
        env.step("again")


def test_text_env_marks_an_over_long_answer_truncated() -> None:
    env = TextAnswerEnv(max_answer_chars=5)
    env.reset(TASK)
    assert env.step("Paris, of course") == ([], False, True, {"over_length": True})
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_answer_chars"):
            TextAnswerEnv(max_answer_chars=bad)


def short(traj, limit: int = 10):
    return float(len(traj) <= limit)


async def later(traj):
    return 1.0


def test_plain_function_reward_is_wrapped_with_its_kwargs() -> None:
    fn = build_reward(short, {"limit": 3})
    assert isinstance(fn, FunctionReward) and fn.name == "short" and fn.domains == ()
    assert fn("abc") == 1.0 and fn("abcd") == 0.0
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        check_reward_kwargs(short, {"nope": 1})
    with pytest.raises(TypeError, match="async function cannot be a reward"):
        build_reward(later, {})


@pytest.fixture
def fn_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "fn_rewards.py").write_text(
        "def right(traj, word='Paris'):\n    return float(word in traj.completion)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fn_rewards", None)
    yield
    sys.modules.pop("fn_rewards", None)


def test_validate_checks_a_function_reward_and_names_the_key(recipe_copy, fn_module) -> None:
    path = recipe_copy("tiny.yaml")
    ok = ["rewards.0.cls=fn_rewards.right", "rewards.0.kwargs={word: Rome}"]
    validate_recipe(load_recipe(path, ok))
    with pytest.raises(RecipeError, match=r"rewards\.0\.kwargs: do not match fn_rewards\.right's signature"):
        validate_recipe(load_recipe(path, ["rewards.0.cls=fn_rewards.right", "rewards.0.kwargs={city: Rome}"]))
