"""``jointrl eval`` and ``jointrl difficulty`` read the recipe's ``data.*_datasets`` as ``jointrl train`` does.

No network: the datasets are local folders (and one Hub id read offline from a Hub cache the test
builds). Generation is replaced (``rl.cli.eval._generate``); the recipe's own reward scores it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajs import answered
from envs.io import load_tasks, save_tasks
from envs.toolcall import format_call
from envs.types import ToolCall
from rl.cli.main import main
from rl.config.recipe import DatasetConfig
from rl.data.hub_data import dataset_file_name

REPO = Path(__file__).resolve().parents[1]
EVAL_FILE = REPO / "recipes" / "data" / "toolcall_quickstart.eval.jsonl"
TRAIN_FILE = REPO / "recipes" / "data" / "toolcall_quickstart.train.jsonl"  # other ids than the eval file's


def _dataset(folder: Path, tasks, split: str = "train") -> Path:
    """A local dataset folder (``data/SPLIT.jsonl``) of native task records."""
    save_tasks(tasks, folder / "data" / f"{split}.jsonl")
    return folder


def _right(task) -> str:
    e = task.tool_call.expected[0]
    return format_call(ToolCall(e.name, {k: v[0] for k, v in e.allowed.items() if v[0] != ""}))


def _traj(task, text: str):
    return answered(task, text)


@pytest.fixture
def generated(monkeypatch):
    """Replace generation: task j's samples are right iff j is even; record which task ids were asked for."""
    seen: list[str] = []

    def fake(cfg, tasks, n, temperature, batch, verbose, *rest):
        seen.extend(t.id for t in tasks)
        return [_traj(t, _right(t) if j % 2 == 0 else "no call") for j, t in enumerate(tasks) for _ in range(n)]

    monkeypatch.setattr("rl.cli.eval._generate", fake)
    return seen


def _no_files(d):
    d["data"]["eval_files"] = []
    d["data"]["train_files"] = []


def test_eval_reads_eval_datasets(tmp_path, capsys, recipe_copy, generated):
    tasks = load_tasks(TRAIN_FILE)[:4]
    folder = _dataset(tmp_path / "held", tasks, "test")

    def edit(d):
        d["data"]["eval_datasets"] = [{"path": str(folder), "split": "test"}]

    recipe = recipe_copy(edit=edit)
    out = tmp_path / "failed.jsonl"
    assert main(["eval", str(recipe), "--out", str(out)]) == 0, capsys.readouterr().err
    s = json.loads(capsys.readouterr().out)
    n_files = len(load_tasks(EVAL_FILE))
    assert generated[:n_files] == [t.id for t in load_tasks(EVAL_FILE)]  # the recipe's eval file first,
    assert generated[n_files:] == [t.id for t in tasks]  # then the dataset's rows
    assert s["tasks"] == n_files + 4 and "data.eval_datasets.0" in s["tasks_from"]
    # Only datasets (no eval file): the same tasks, scored by the recipe's reward.
    generated.clear()
    recipe = recipe_copy(edit=lambda d: (edit(d), d["data"].update(eval_files=[])), filename="only.yaml")
    assert main(["eval", str(recipe), "--out", str(out)]) == 0, capsys.readouterr().err
    s = json.loads(capsys.readouterr().out)
    assert generated == [t.id for t in tasks]
    assert s["domains"]["tool_call"]["pass@1"] == 0.5  # tasks 0 and 2 of 4 answered right
    assert {t.id for t in load_tasks(out)} == {tasks[1].id, tasks[3].id}


def test_eval_dataset_errors_name_the_key(tmp_path, capsys, recipe_copy, generated, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = recipe_copy(
        edit=lambda d: d["data"].update(eval_datasets=[{"path": "acme/absent", "domain": "tool_call"}])
    )
    assert main(["eval", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "data.eval_datasets.0.path: dataset 'acme/absent'" in err and "not cached" in err
    assert generated == []  # before any engine
    recipe = recipe_copy(edit=lambda d: d["data"].update(eval_files=[]), filename="none.yaml")
    assert main(["eval", str(recipe)]) == 2
    assert "data.eval_files is empty; pass --tasks FILE (or set data.eval_datasets)" in capsys.readouterr().err


def test_difficulty_writes_dataset_measurements_to_out_dir(tmp_path, capsys, recipe_copy, generated, monkeypatch):
    tasks = load_tasks(EVAL_FILE)[:5]
    folder = _dataset(tmp_path / "local-qa", tasks)
    # And a Hub id, read offline from a Hub cache built here (refs/main -> snapshots/<sha>).
    home, sha = tmp_path / "hf", "0123456789abcdef0123456789abcdef01234567"
    repo = home / "hub" / "datasets--acme--calls"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    hub_tasks = load_tasks(EVAL_FILE)[5:8]
    _dataset(repo / "snapshots" / sha, hub_tasks)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def edit(d):
        _no_files(d)
        d["data"]["train_datasets"] = [{"path": str(folder)}, {"path": "acme/calls"}]

    recipe = recipe_copy(edit=edit)
    assert main(["difficulty", str(recipe), "--k", "2"]) == 2  # no --out-dir: cannot write into a dataset
    err = capsys.readouterr().err
    assert "data.train_datasets.0" in err and "--out-dir" in err
    assert generated == []

    out_dir = tmp_path / "measured"
    assert main(["difficulty", str(recipe), "--k", "2", "--limit", "4", "--out-dir", str(out_dir)]) == 0
    summary = json.loads(capsys.readouterr().out)
    local = load_tasks(out_dir / "local-qa.train.jsonl")
    assert [t.id for t in local] == [t.id for t in tasks]
    assert [t.meta.get("base_pass_rate") for t in local] == [1.0, 0.0, 1.0, 0.0, None]  # 5th: beyond --limit
    hub = load_tasks(out_dir / "acme--calls.train.jsonl")
    assert [t.meta["base_pass_rate"] for t in hub] == [1.0, 0.0, 1.0]
    assert hub[0].messages == hub_tasks[0].messages and hub[0].tool_call == hub_tasks[0].tool_call
    assert set(summary["files"]) == {str(out_dir / "local-qa.train.jsonl"), str(out_dir / "acme--calls.train.jsonl")}
    assert summary["domains"]["tool_call"]["tasks"] == 7


def test_dataset_file_name():
    assert (
        dataset_file_name(DatasetConfig(path="openai/gsm8k", subset="main", split="test"))
        == "openai--gsm8k.main.test.jsonl"
    )
    assert dataset_file_name(DatasetConfig(path="/data/my qa/", split="train[:10]")) == "my_qa.train__10_.jsonl"
    assert dataset_file_name(DatasetConfig(path="./qa")) == "qa.train.jsonl"
