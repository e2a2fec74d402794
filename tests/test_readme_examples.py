"""The README's short code blocks run, so they cannot go stale.

A fenced block preceded by ``<!-- file: NAME -->`` is written to NAME in a temp dir; the block after
``<!-- run: python -->`` is executed there (the own-data recipe on the tiny random model, in this
process: ``rl.train(..., local=True)``). The reward function and class, the env, the dataset snippet
and the override examples of "Commands" are checked against the real loaders and checkers.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from envs.base import check_env
from envs.io import load_tasks
from envs.types import Message, Task, Trajectory
from rewards.service import RewardFnSpec, RewardScorer
from rl.config.recipe import RecipeError, load_recipe, validate_recipe

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
BLOCK = re.compile(r"<!-- (file: (?P<file>[\w.\-]+)|run: (?P<run>\w+)) -->\n```\w*\n(?P<body>.*?)\n```", re.S)


def _blocks() -> tuple[dict[str, str], str]:
    files, run = {}, ""
    for m in BLOCK.finditer(README):
        if m.group("file"):
            files[m.group("file")] = m.group("body") + "\n"
        else:
            run = m.group("body")
    return files, run


@pytest.fixture
def example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    files, run = _blocks()
    assert {"arith.jsonl", "arith.yaml", "my_rewards.py", "my_envs.py"} <= set(files), sorted(files)
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for mod in ("my_rewards", "my_envs"):
        sys.modules.pop(mod, None)
    yield tmp_path, run
    for mod in ("my_rewards", "my_envs"):
        sys.modules.pop(mod, None)


def _traj(task: Task, completion: str) -> Trajectory:
    return Trajectory(
        task=task,
        group_id=0,
        prompt_ids=[1],
        response_ids=[2],
        loss_mask=[1],
        logprobs=[-1.0],
        messages=[*task.messages, Message("assistant", completion)],
        terminated=True,
        truncated=False,
        finish_reason="stop",
    )


def test_own_data_recipe_validates(example) -> None:
    tmp, _ = example
    cfg = load_recipe(tmp / "arith.yaml", ["model.path=embedded:tiny"])
    validate_recipe(cfg)
    assert [e.cls for e in cfg.rollout.envs] == ["envs.text.TextAnswerEnv"]
    assert [t.meta["answer"] for t in load_tasks(tmp / "arith.jsonl")] == [42, 63]


def test_reward_function_and_class(example) -> None:
    tmp, _ = example
    task = load_tasks(tmp / "arith.jsonl")[0]  # 17 + 25, answer 42
    scorer = RewardScorer(
        [
            RewardFnSpec("my_rewards.exact_answer", 1.0, ("arith",), {}),
            RewardFnSpec("my_rewards.Brevity", 0.0, (), {"max_chars": 20}),
        ]
    )
    cases = {
        "17 + 25 = 42": 1.0,
        "It is 41": 0.0,
        "42? no: 43": 0.0,  # the last number counts, so listing candidates does not pass
        "no number at all": 0.0,
    }
    out = scorer.score([_traj(task, c) for c in cases])
    assert [t.scores["exact_answer"] for t in out] == list(cases.values())
    assert [t.scores["brevity"] for t in out] == [1.0, 1.0, 1.0, 1.0]
    assert all(t.reward_error is None for t in out)
    long = scorer.score([_traj(task, "the answer, after much thought, is 42")])[0]
    assert long.scores == {"exact_answer": 1.0, "brevity": 0.0}


def test_env_example_keeps_the_contract(example) -> None:
    tmp, _ = example
    from my_envs import CheckTwice

    task = load_tasks(tmp / "arith.jsonl")[0]
    check_env(CheckTwice(), task, action="42")
    env = CheckTwice()
    env.reset(task)
    obs, terminated, truncated, _ = env.step("41")
    assert not terminated and not truncated and obs[0].role == "user"
    assert env.step("42")[1:3] == (True, False)


def test_dataset_snippet_and_override_examples_load(example) -> None:
    tmp, _ = example
    snippet = next(b for b in re.findall(r"```yaml\n(.*?)```", README, re.S) if "train_datasets" in b)
    ds = yaml.safe_load(snippet)["data"]["train_datasets"][0]
    cfg = load_recipe(tmp / "arith.yaml", [f"data.train_datasets=[{json.dumps(ds)}]"])
    assert cfg.data.train_datasets[0].columns == {"prompt": "question", "meta.answer": "answer"}
    commands = README.split("## Commands", 1)[1]
    overrides = re.findall(r"`(rewards\.[^`]+)`", commands)
    assert "rewards.1.kwargs.max_chars=120" in overrides and any(o.startswith("rewards.+=") for o in overrides)
    append = next(o for o in overrides if o.startswith("rewards.+="))
    cfg = load_recipe(tmp / "arith.yaml", ["model.path=embedded:tiny", append, "rewards.1.kwargs.max_chars=120"])
    validate_recipe(cfg)
    assert [r.cls for r in cfg.rewards] == ["my_rewards.exact_answer", "my_rewards.Brevity"]
    assert cfg.rewards[1].kwargs == {"max_chars": 120} and cfg.rewards[1].weight == 0.1
    with pytest.raises(RecipeError, match=r"no item 5: the list has 1 items"):
        load_recipe(tmp / "arith.yaml", ["rewards.5.weight=2"])


def test_python_api_example_trains_the_own_data_recipe(example) -> None:
    """The "From Python" block, run as written on the README's recipe with the tiny model (made small)."""
    tmp, run = example
    recipe = yaml.safe_load((tmp / "arith.yaml").read_text())
    recipe["model"] = {"path": "embedded:tiny", "engine_dtype": "float32", "autocast": False}
    recipe["wandb"] = {"mode": "disabled"}
    recipe["run"] = {"threads": 1}
    recipe["rollout"] |= {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8}
    (tmp / "arith.yaml").write_text(yaml.safe_dump(recipe))
    scope: dict = {}
    exec(compile(run, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    result = scope["result"]
    assert result.steps == 2 and result.output_dir.resolve() == (tmp / "runs/arith").resolve()
    assert "eval/reward/arith/mean" in result.first and "eval/reward/arith/mean" in result.last
    assert 0.0 <= result.last["reward/mean"] <= 1.0
    rows = [json.loads(x) for x in (tmp / "runs/arith/rollouts.jsonl").read_text().splitlines()]
    assert {r["domain"] for r in rows} == {"arith"} and all("exact_answer" in r["scores"] for r in rows)
    assert (tmp / "runs/arith/DONE").is_file() and result.summary.startswith(f"run: {result.output_dir}")
