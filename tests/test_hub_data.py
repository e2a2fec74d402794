"""Tasks from datasets (rl/data/hub_data.py): local dataset folders and a Hub cache the test builds.

No test touches the network: HF_HUB_OFFLINE=1 where a Hub id is read, and the Hub cache is a
folder written here in the layout huggingface_hub reads offline (refs/main -> snapshots/<sha>).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.io import TaskFormatError
from rl.config.recipe import DatasetConfig, RecipeError, load_recipe
from rl.data.hub_data import load_dataset_tasks

ROOT = Path(__file__).resolve().parents[1]
ROWS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "qid": 100 + i} for i in range(4)]


def _write_jsonl(folder: Path, rows: list[dict], name: str = "train.jsonl") -> Path:
    (folder / "data").mkdir(parents=True, exist_ok=True)
    with open(folder / "data" / name, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return folder


def _hub_cache(home: Path, repo: str, rows: list[dict]) -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    d = home / "hub" / f"datasets--{repo.replace('/', '--')}"
    (d / "refs").mkdir(parents=True)
    (d / "refs" / "main").write_text(sha)
    _write_jsonl(d / "snapshots" / sha, rows)


def test_local_jsonl_folder_with_column_mapping(tmp_path):
    folder = _write_jsonl(tmp_path / "qa", ROWS)
    entry = DatasetConfig(
        path=str(folder),
        columns={"prompt": "question", "system": "answer", "id": "qid", "meta.answer": "answer"},
        domain="tool_call",
    )
    tasks = load_dataset_tasks(entry, "data.train_datasets.0")
    assert [t.id for t in tasks] == ["100", "101", "102", "103"]
    t = tasks[1]
    assert t.domain == "tool_call"
    assert [(m.role, m.content) for m in t.messages] == [("system", "2"), ("user", "What is 1 + 1?")]
    assert t.meta == {"answer": "2"}


def test_local_parquet_native_rows_and_generated_ids(tmp_path):
    import datasets

    native = [
        {"id": f"t{i}", "domain": "code", "messages": json.dumps([{"role": "user", "content": f"q{i}"}])}
        for i in range(3)
    ]
    (tmp_path / "nat").mkdir()
    datasets.Dataset.from_list(native).to_parquet(str(tmp_path / "nat" / "train.parquet"))
    tasks = load_dataset_tasks(DatasetConfig(path=str(tmp_path / "nat"), limit=2), "data.eval_datasets.0")
    assert [(t.id, t.domain, t.messages[0].content) for t in tasks] == [("t0", "code", "q0"), ("t1", "code", "q1")]
    # no id column mapped: ids are PATH:SPLIT:ROW
    folder = _write_jsonl(tmp_path / "qa", ROWS)
    tasks = load_dataset_tasks(DatasetConfig(path=str(folder), columns={"prompt": "question"}, domain="d"), "k")
    assert tasks[2].id == f"{folder}:train:2"


def test_missing_column_names_key_column_and_dataset(tmp_path):
    folder = _write_jsonl(tmp_path / "qa", ROWS)
    entry = DatasetConfig(path=str(folder), columns={"prompt": "problem"}, domain="d")
    with pytest.raises(TaskFormatError, match=r"data.train_datasets.1.columns.prompt: column 'problem' is not in "):
        load_dataset_tasks(entry, "data.train_datasets.1")


def test_unknown_split_and_missing_domain(tmp_path):
    folder = _write_jsonl(tmp_path / "qa", ROWS)
    with pytest.raises(TaskFormatError, match=r"data.train_datasets.0: dataset .*Unknown split"):
        load_dataset_tasks(DatasetConfig(path=str(folder), split="test", domain="d"), "data.train_datasets.0")
    with pytest.raises(TaskFormatError, match=r"data.train_datasets.0.domain: .*set data.train_datasets.0.domain"):
        load_dataset_tasks(DatasetConfig(path=str(folder), columns={"prompt": "question"}), "data.train_datasets.0")


def test_hub_id_from_built_hub_cache_offline(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    _hub_cache(home, "acme/qa", ROWS)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    entry = DatasetConfig(path="acme/qa", columns={"prompt": "question"}, domain="tool_call")
    tasks = load_dataset_tasks(entry, "data.train_datasets.0")
    assert [t.messages[0].content for t in tasks] == [r["question"] for r in ROWS]
    assert tasks[0].id == "acme/qa:train:0"


def test_hub_id_not_cached_offline_names_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    entry = DatasetConfig(path="acme/not-there", domain="d")
    with pytest.raises(FileNotFoundError, match=r"data.eval_datasets.2.path: dataset 'acme/not-there' .*not cached"):
        load_dataset_tasks(entry, "data.eval_datasets.2")


def _tiny_recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "r.yaml"
    text = (ROOT / "recipes" / "tiny.yaml").read_text().replace("[data/", f"[{ROOT}/recipes/data/")
    recipe.write_text(text)
    return recipe


def test_recipe_form_and_bad_mapping_key(tmp_path):
    recipe = _tiny_recipe(tmp_path)
    entry = (
        "[{path: acme/qa, split: 'train[:10]', columns: {prompt: question, meta.answer: answer}, domain: tool_call}]"
    )
    cfg = load_recipe(recipe, [f"data.train_datasets={entry}"])
    e = cfg.data.train_datasets[0]
    assert (e.path, e.split, e.columns) == ("acme/qa", "train[:10]", {"prompt": "question", "meta.answer": "answer"})
    with pytest.raises(RecipeError, match=r"data.train_datasets.0.columns.question: not a task field"):
        load_recipe(recipe, ["data.train_datasets=[{path: acme/qa, columns: {question: q}}]"])
    with pytest.raises(RecipeError, match=r"data.train_datasets.0.path: needs a Hub dataset id"):
        load_recipe(recipe, ["data.train_datasets=[{split: train}]"])
    from rl.config.recipe import validate_recipe

    missing = load_recipe(recipe, ["data.eval_datasets=[{path: ./no-such-folder, domain: tool_call}]"])
    with pytest.raises(RecipeError, match=r"data.eval_datasets.0.path: dataset folder not found: .*no-such-folder"):
        validate_recipe(missing, check_imports=False)


def test_train_exits_2_before_actors_when_dataset_not_cached(tmp_path):
    """The CLI: a Hub dataset that is not cached while offline is one message naming the key, exit 2."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "empty-hf"), "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": ""}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "rl.cli.main", "train", str(_tiny_recipe(tmp_path))]
    cmd += [f"run.output_dir={tmp_path / 'out'}", "data.train_datasets=[{path: acme/not-cached, domain: tool_call}]"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("jointrl: error: data.train_datasets.0.path: dataset 'acme/not-cached'"), last


def test_load_task_sets_mixes_files_and_datasets(tmp_path):
    """The driver's loader (before any actor): a dataset entry is one more weighted source, eval rows join
    the held-out tasks, and a dataset task of a domain no env serves is named by its recipe key."""
    from rl.driver.loop import load_task_sets

    folder = _write_jsonl(tmp_path / "qa", ROWS)
    entry = f"{{path: {folder}, columns: {{prompt: question}}, domain: tool_call, weight: 2.5}}"
    cfg = load_recipe(
        _tiny_recipe(tmp_path), [f"data.train_datasets=[{entry}]", f"data.eval_datasets=[{entry}]", "data.eval_limit=0"]
    )
    sources, held = load_task_sets(cfg)
    ds = [s for s in sources if s.name.startswith(str(folder))]
    assert len(ds) == 1 and ds[0].weight == 2.5 and len(ds[0].tasks) == len(ROWS)
    assert len(sources) > 1  # the recipe's task file is still there
    assert {t.id for t in held} >= {t.id for t in ds[0].tasks}
    bad = load_recipe(_tiny_recipe(tmp_path), [f"data.train_datasets=[{entry.replace('tool_call', 'math')}]"])
    with pytest.raises(TaskFormatError, match=r"data.train_datasets.0: task .* has domain 'math'"):
        load_task_sets(bad)
