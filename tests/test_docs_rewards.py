"""docs/rewards.md cannot go stale: its example files are extracted and run.

A fenced block preceded by ``<!-- file: NAME -->`` is written to NAME in a temp dir; the
block after ``<!-- run -->`` is the shell command, run there with the venv's ``jointrl``
on PATH; the block after ``<!-- expect: summary -->`` must be a subset of the JSON the
command prints. The example module also goes through ``RewardScorer`` directly, and the
recipe snippet through ``jointrl validate`` (merged into the tiny recipe).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "rewards.md"
BLOCK = re.compile(r"<!-- (file: (?P<file>[\w.\-]+)|run|expect: (?P<expect>\w+)) -->\n```\w*\n(?P<body>.*?)\n```", re.S)


def blocks() -> tuple[dict[str, str], str, dict[str, str]]:
    files, run, expect = {}, "", {}
    for m in BLOCK.finditer(DOC.read_text()):
        if m.group("file"):
            files[m.group("file")] = m.group("body") + "\n"
        elif m.group("expect"):
            expect[m.group("expect")] = m.group("body")
        else:
            run = m.group("body")
    return files, run, expect


def is_subset(want, got, path="") -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{path}: want an object, got {got!r}"
        for k, v in want.items():
            assert k in got, f"{path}.{k}: missing in {sorted(got)}"
            is_subset(v, got[k], f"{path}.{k}")
    elif isinstance(want, float):
        assert got == pytest.approx(want), f"{path}: want {want}, got {got}"
    else:
        assert got == want, f"{path}: want {want!r}, got {got!r}"


@pytest.fixture
def example(tmp_path, monkeypatch):
    files, run, expect = blocks()
    assert {"my_rewards.py", "recipe.yaml", "tasks.jsonl", "completions.jsonl"} <= set(files), sorted(files)
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_rewards", None)
    yield tmp_path, run, expect
    sys.modules.pop("my_rewards", None)


def test_example_runs_through_jointrl_score(example):
    tmp, run, expect = example
    assert run.startswith("PYTHONPATH=. jointrl score ")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-c", run], cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    is_subset(json.loads(expect["summary"]), summary)
    # --out in the documented command: one line per sample.
    out = shlex.split(run)[shlex.split(run).index("--out") + 1]
    rows = [json.loads(x) for x in (tmp / out).read_text().splitlines()]
    assert len(rows) == 4 and {"task_id", "sample", "domain", "reward", "passed", "scores", "reward_error"} <= set(
        rows[0]
    )


def test_example_module_through_the_scorer(example):
    """The classes behave as their docstrings say, through RewardScorer (batched and async paths included)."""
    tmp, _, _ = example
    from envs.io import load_tasks
    from rewards.protocol import AsyncRewardFn, BatchedRewardFn, RewardFn, call_mode
    from rewards.service import RewardFnSpec, RewardScorer
    from rl.cli.score import build_trajectories, read_completions

    import my_rewards

    assert isinstance(my_rewards.Brevity(), RewardFn)
    assert isinstance(my_rewards.Distinct(), BatchedRewardFn) and call_mode(my_rewards.Distinct()) == "batch"
    assert isinstance(my_rewards.CallsTool(), AsyncRewardFn) and call_mode(my_rewards.CallsTool()) == "async"
    spec = yaml.safe_load((tmp / "recipe.yaml").read_text())
    specs = [RewardFnSpec(r["cls"], r["weight"], tuple(r["domains"]), r["kwargs"]) for r in spec["rewards"]]
    tasks = load_tasks(tmp / "tasks.jsonl")
    trajs, _ = build_trajectories(tasks, read_completions(str(tmp / "completions.jsonl")), "tasks.jsonl")
    out = RewardScorer(specs, timeout_s=30).score(trajs)
    assert [t.scores["distinct"] for t in out] == [0.0, 0.0, 1.0, 1.0]  # the two identical weather-1 answers
    assert [t.scores["calls_tool"] for t in out] == [1.0, 1.0, 1.0, 0.0]
    assert all(0.0 <= t.scores["brevity"] <= 1.0 for t in out) and out[3].scores["brevity"] == 1.0
    for t in out:
        s = t.scores
        assert t.reward == pytest.approx(
            s["toolcall"] + 0.2 * s["brevity"] + 0.1 * s["distinct"] + 0.1 * s["calls_tool"]
        )
    # Plain __call__ works too (for notebooks and tests), also on the batched and async classes.
    assert my_rewards.Distinct()(trajs[0]) == 1.0 and my_rewards.CallsTool()(trajs[3]) == 0.0
    with pytest.raises(ValueError):
        my_rewards.Brevity(max_chars=0)


def test_recipe_snippet_validates(example):
    tmp, _, _ = example
    from rl.config.recipe import load_recipe, validate_recipe

    d = yaml.safe_load((REPO / "recipes" / "tiny.yaml").read_text())
    d["data"]["train_files"] = [str(REPO / "recipes" / f) for f in d["data"]["train_files"]]
    d["data"]["eval_files"] = [str(REPO / "recipes" / f) for f in d["data"]["eval_files"]]
    d["run"]["output_dir"] = str(tmp / "out")
    d.update(yaml.safe_load((tmp / "recipe.yaml").read_text()))
    p = tmp / "full.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    validate_recipe(load_recipe(p))


def test_every_builtin_in_the_table_imports():
    from envs.base import resolve

    text = DOC.read_text()
    table = [line for line in text.splitlines() if line.startswith("| `rewards.")]
    assert len(table) == 9
    for line in table:
        cells = line.split("|")
        cls_path, name = re.findall(r"`([^`]+)`", cells[1])[0], cells[2].strip().strip("`")
        cls = resolve(cls_path)
        assert cls.name == name, (cls_path, name)
