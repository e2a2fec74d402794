"""``jointrl difficulty``: measured pass rates land in the task files' metadata, round-trip
through them, and seed the mixer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajs import answered
from envs.io import load_tasks, save_tasks
from envs.toolcall import format_call
from envs.types import ToolCall
from rl.cli.difficulty import apply_difficulty, difficulty_summary
from rl.cli.main import main
from rl.data.mixer import AdaptiveTaskMixer, Source, TaskMixer, difficulty_priors
from rl.data.tasks.ladder import strip_measured

DATA = Path(__file__).resolve().parents[1] / "recipes" / "data"


def _traj(task, text: str, reward: float | None = None):
    return answered(task, text, reward=reward)


def _right(task) -> str:
    e = task.tool_call.expected[0]
    return format_call(ToolCall(e.name, {k: v[0] for k, v in e.allowed.items() if v[0] != ""}))


def test_metadata_round_trips_through_the_task_file(tmp_path):
    # The shipped file carries a measurement already: start from the tasks without it.
    tasks = [strip_measured(t) for t in load_tasks(DATA / "toolcall_ladder.train.jsonl")[:3]]
    rewards = [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.5, None], [1.0, 1.0, 1.0, 1.0]]
    scored = [_traj(t, "", r) for t, rs in zip(tasks, rewards) for r in rs]
    measured = apply_difficulty(tasks, scored, 4, 1.0, "embedded:x", 1.0)
    assert [t.meta["base_pass_rate"] for t in measured] == [0.75, 0.0, 1.0]
    assert measured[1].meta["base_pass"] == {
        "model": "embedded:x",
        "samples": 4,
        "passed": 0,
        "errors": 1,
        "mean_reward": pytest.approx(1 / 6, abs=1e-6),
        "temperature": 1.0,
        "threshold": 1.0,
    }
    path = tmp_path / "t.jsonl"
    save_tasks(measured, path)
    back = load_tasks(path)
    assert back == measured
    assert [strip_measured(t) for t in back] == tasks  # nothing else changed
    s = difficulty_summary(back)["tool_call"]
    assert (s["never"], s["sometimes"], s["always"], s["signal_fraction"]) == (1, 1, 1, pytest.approx(1 / 3, abs=1e-4))
    # The mixer starts from it: curriculum history and the adaptive signal.
    src = [Source("f", "tool_call", back)]
    assert difficulty_priors(src) == {"tool_call": pytest.approx(1 / 3)}
    m = TaskMixer(src, 2, curriculum_window=2)
    assert [m._no_signal(t.id) for t in back] == [False, True, True]
    assert AdaptiveTaskMixer(src, 2).adaptive.signal == {"tool_call": pytest.approx(1 / 3)}


def test_apply_difficulty_checks_alignment():
    tasks = load_tasks(DATA / "toolcall_ladder.train.jsonl")[:2]
    with pytest.raises(ValueError, match="samples per task"):
        apply_difficulty(tasks, [_traj(tasks[0], "", 1.0)], 2, 1.0, "m", 1.0)
    with pytest.raises(ValueError, match="not all of task"):
        apply_difficulty(tasks, [_traj(tasks[1], "", 1.0)] * 2 + [_traj(tasks[0], "", 1.0)] * 2, 2, 1.0, "m", 1.0)


def test_command_writes_measurements_through_the_real_scorer(tmp_path, monkeypatch, capsys, recipe_copy):
    """The whole command with generation replaced: sample i of task j is right iff i < j (task 0
    never solved, task 1 once in 4...), scored by the recipe's own reward."""
    src = tmp_path / "tool.jsonl"
    # The shipped file is partly measured already: start from its tasks without the measurement.
    save_tasks([strip_measured(t) for t in load_tasks(DATA / "toolcall_ladder.train.jsonl")], src)
    k = 4

    def fake_generate(cfg, tasks, n, temperature, batch, verbose):
        assert n == k and temperature == 1.0
        return [
            _traj(t, _right(t) if i < j else '<tool_call>{"name": "nope"}</tool_call>')
            for j, t in enumerate(tasks)
            for i in range(n)
        ]

    monkeypatch.setattr("rl.cli.eval._generate", fake_generate)
    recipe = recipe_copy("joint_rl.yaml")
    assert (
        main(
            ["difficulty", str(recipe), "model.path=embedded:tiny", "--k", str(k), "--files", str(src), "--limit", "6"]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    back = load_tasks(src)
    assert [t.meta["base_pass_rate"] for t in back[:6]] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert all("base_pass_rate" not in t.meta for t in back[6:])  # beyond --limit: untouched
    assert summary["domains"]["tool_call"]["sometimes"] == 3 and summary["domains"]["tool_call"]["tasks"] == 6
    assert back[0].meta["base_pass"]["mean_reward"] < 1.0 and back[0].meta["base_pass"]["model"] == "embedded:tiny"


def test_command_errors_are_one_line(tmp_path, capsys, recipe_copy):
    recipe = recipe_copy("joint_rl.yaml")
    bad = tmp_path / "x.parquet"
    bad.write_text("")
    assert main(["difficulty", str(recipe), "--files", str(bad)]) == 2
    assert "must be .jsonl" in capsys.readouterr().err
    assert main(["difficulty", str(recipe), "--k", "0"]) == 2
    assert "--k" in capsys.readouterr().err


@pytest.mark.slow
def test_command_with_vllm_on_the_tiny_model(tmp_path, capsys, recipe_copy):
    src = tmp_path / "tool.jsonl"
    save_tasks(load_tasks(DATA / "toolcall_ladder.train.jsonl")[:2], src)
    recipe = recipe_copy("joint_rl.yaml")
    assert (
        main(
            [
                "difficulty",
                str(recipe),
                "model.path=embedded:tiny",
                "rollout.max_new_tokens=16",
                "--k",
                "2",
                "--files",
                str(src),
            ]
        )
        == 0
    )
    back = load_tasks(src)
    assert all(t.meta["base_pass"]["samples"] == 2 and 0.0 <= t.meta["base_pass_rate"] <= 1.0 for t in back)
