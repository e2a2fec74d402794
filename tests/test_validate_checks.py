"""What ``jointrl validate`` catches before anything starts: task files that ``train`` would reject,
domains no reward can score, rewards for domains nobody serves, more actors than the machine has CPUs;
and ``data.eval_limit`` counted per eval file (or domain), so a second domain is still evaluated."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from envs.types import Message, Task
from rl.cli.main import main
from rl.config.recipe import load_recipe
from rl.driver.loop import limit_eval, load_task_sets
from rl.driver.placement import oversubscription

TOOL = json.dumps({"id": "t1", "domain": "tool_call", "messages": [{"role": "user", "content": "hi"}]})
SHAPING = "class Penalty:\n    name = 'penalty'\n    domains = ('tool_call',)\n    shaping = True\n" + (
    "    def __call__(self, traj):\n        return -0.1\n"
)


def _validate(recipe: Path, *overrides: str, capsys) -> tuple[int, str, str]:
    rc = main(["validate", str(recipe), *overrides])
    out, err = capsys.readouterr()
    return rc, out, err


def test_validate_parses_task_files_like_train(tmp_path: Path, recipe_copy, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(TOOL + "\n" + '{"id": "t2", "domain": "tool_call", "messages": [{"role": "bot", "content": "x"}]}\n')
    recipe = recipe_copy("tiny.yaml")
    rc, _, err = _validate(recipe, f"data.eval_files=[{bad}]", capsys=capsys)
    assert rc == 2
    assert f"data.eval_files.0: {bad}:2: field 'messages[0].role': must be one of" in err, err
    dup = tmp_path / "dup.jsonl"
    dup.write_text(TOOL + "\n" + TOOL + "\n")
    rc, _, err = _validate(recipe, f"data.train_files=[{dup}]", capsys=capsys)
    assert rc == 2 and f"data.train_files.0: {dup}:2: field 'id': duplicate id 't1'" in err, err
    other = tmp_path / "other.jsonl"
    other.write_text(TOOL.replace('"tool_call"', '"math"') + "\n")
    rc, _, err = _validate(recipe, f"data.train_files=[{other}]", capsys=capsys)
    assert rc == 2 and "task 't1' has domain 'math', but rollout.envs serves only ['tool_call']" in err, err
    rc, out, _ = _validate(recipe, capsys=capsys)
    assert rc == 0 and out.strip().endswith(": ok")


@pytest.fixture
def penalty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "penalty_mod.py").write_text(SHAPING)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["rewards.0.weight=0"], "rollout.envs.0.domain: no reward can score domain 'tool_call'"),
        (
            ["rewards.0.domains=[code]"],
            "rewards.0.domains: rewards.toolcall.ToolCallReward scores ['code'], which no env",
        ),
        (["rewards.0.cls=penalty_mod.Penalty", "rewards.0.kwargs={}", "rewards.0.domains=[]"], "no reward can score"),
        (
            ["rewards.+={cls: rewards.code.CodeTestsReward, domains: [code]}"],
            "rewards.1.domains: rewards.code.CodeTestsReward scores ['code'], which no env in rollout.envs serves",
        ),
    ],
)
def test_validate_refuses_domains_no_reward_scores(recipe_copy, penalty, capsys, overrides, words) -> None:
    rc, _, err = _validate(recipe_copy("tiny.yaml"), *overrides, capsys=capsys)
    assert rc == 2 and words in err, err


def test_validate_warns_when_actors_exceed_the_cpus(recipe_copy, capsys, monkeypatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    rc, out, err = _validate(recipe_copy("tiny.yaml"), "learner.workers=8", capsys=capsys)
    assert rc == 0 and out.strip().endswith(": ok")
    assert "jointrl: warning: the actors ask for 8.6 CPUs" in err and "learner.workers=8" in err, err
    rc, _, err = _validate(recipe_copy("tiny.yaml"), capsys=capsys)
    assert rc == 0 and "warning" not in err


def test_oversubscription_counts_gpus_too() -> None:
    cfg = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "joint_rl_gpu.yaml")
    warnings = oversubscription(cfg, 64, 1)
    assert len(warnings) == 1 and "GPUs on a machine with 1" in warnings[0]
    assert oversubscription(cfg, 64, 8) == []


def test_oversubscription_names_the_ray_cluster_on_a_multi_node_run() -> None:
    cfg = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "joint_rl_gpu.yaml")
    warnings = oversubscription(cfg, 1, 1, where="the Ray cluster")
    assert len(warnings) == 2 and all("on the Ray cluster with 1" in w for w in warnings), warnings
    assert "cannot all be placed" in warnings[0]


def _tasks(domain: str, n: int) -> list[Task]:
    return [Task(id=f"{domain}-{i}", domain=domain, messages=(Message("user", "q"),)) for i in range(n)]


def test_eval_limit_per_file_domain_or_total() -> None:
    a, b, c = _tasks("tool_call", 5), _tasks("code", 3), _tasks("tool_call", 2)
    ids = lambda ts: [t.id for t in ts]  # noqa: E731
    assert ids(limit_eval([a, b, c], 2, "file")) == ["tool_call-0", "tool_call-1", "code-0", "code-1", *ids(c)]
    assert ids(limit_eval([a, b, c], 2, "domain")) == ["tool_call-0", "tool_call-1", "code-0", "code-1"]
    assert ids(limit_eval([a, b, c], 6, "total")) == [*ids(a), "code-0"]
    assert len(limit_eval([a, b, c], 0, "file")) == 10


def test_eval_limit_keeps_a_second_domain_evaluated(recipe_copy) -> None:
    def edit(d: dict) -> None:
        d["data"]["eval_files"] = [
            str(Path(f).parent / n)
            for f in d["data"]["eval_files"]
            for n in ("code_ladder.eval.jsonl", "toolcall_ladder.eval.jsonl")
        ]
        d["rollout"]["envs"] = [
            {"domain": "tool_call", "cls": "envs.toolcall.ToolCallEnv"},
            {"domain": "code", "cls": "envs.code.CodeEnv"},
        ]

    cfg = load_recipe(recipe_copy("tiny.yaml", edit=edit), ["data.eval_limit=3"])
    _, held = load_task_sets(cfg)
    assert [t.domain for t in held] == ["code"] * 3 + ["tool_call"] * 3
    cfg = load_recipe(recipe_copy("tiny.yaml", edit=edit), ["data.eval_limit=3", "data.eval_limit_per=total"])
    assert {t.domain for t in load_task_sets(cfg)[1]} == {"code"}
