"""Tasks from datasets: ``data.train_datasets`` / ``data.eval_datasets`` entries read through ``datasets``.

An entry (``rl.config.recipe.DatasetConfig``) names a Hub dataset (``org/name``, with ``subset``,
``split``, ``revision``) or a local dataset folder (one ``datasets.load_dataset`` reads: parquet,
jsonl, csv or arrow files), and a column mapping onto the task schema (``envs/io.py``)::

    data:
      train_datasets:
        - path: openai/gsm8k
          subset: main
          split: train
          columns: {prompt: question, meta.answer: answer}
          domain: math

Each row becomes a native task record: mapped columns fill their task fields (``prompt`` is one
user message, ``system`` a system message before it, ``meta.K`` / ``code.K`` / ``terminal.K`` one
key of that part: a code dataset's scored tests go to ``code.tests``, the hidden tests, and the tests
its prompt shows, if any, to ``code.public_tests``, never scored; a code row without hidden tests is
refused naming ``code.tests``); ``domain`` comes from the entry when no
column is mapped to it; ``id`` is
``PATH:SPLIT:ROW`` when no column is. With no mapping every row must already be a native record.
``envs.io.task_from_dict`` then validates it, so errors name the entry and row.

Resolution (on the driver, before any actor starts; ``rl.driver.loop.load_task_sets``):
``datasets.load_dataset`` with the standard variables (``HF_HOME`` / ``HF_HUB_CACHE``,
``HF_HUB_OFFLINE``, ``HF_TOKEN``). Offline, the dataset is read from its snapshot in the Hub cache
(what ``hf download --repo-type dataset`` writes; found by
``huggingface_hub.snapshot_download(local_files_only=True)``), else from ``datasets``' own cache
of an earlier load.
Not found anywhere: ``FileNotFoundError`` naming the recipe key; a mapped column the dataset lacks:
``TaskFormatError`` naming the key, the column and the dataset. Both end a run with exit 2.

``recipe_datasets(cfg, "train" | "eval")`` gives every entry of a recipe with its key and tasks:
``jointrl train``, ``jointrl eval`` and ``jointrl difficulty`` read the same entries the same way.
``dataset_file_name(entry)`` names the native task file a measurement of an entry is written to
(a Hub dataset cannot be written back).

This module does not choose which tasks a step draws (``rl.data.mixer``) nor touch the network
when ``HF_HUB_OFFLINE`` is set.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from envs.code import hidden_tests_problem
from envs.io import TaskFormatError, task_from_dict
from envs.types import Task
from rl.config.recipe import DatasetConfig
from rl.data.hub_cache import hub_cache, hub_offline, hub_token, snapshot

__all__ = ["load_dataset_tasks", "rows_to_tasks", "open_dataset", "recipe_datasets", "dataset_file_name"]


def _local(entry: DatasetConfig, base: Path | None) -> Path | None:
    p = Path(os.path.expanduser(entry.path))
    if not p.is_absolute() and base is not None:
        p = base / p
    return p if p.exists() else None


def open_dataset(entry: DatasetConfig, key: str, base: Path | None = None) -> Any:
    """The ``datasets.Dataset`` of ``entry`` (one split). ``key`` is the entry's recipe key, for errors.

    A local folder is read as is. A Hub id online goes through ``load_dataset`` (which downloads into
    its cache). Offline, the Hub cache's snapshot is read; failing that ``datasets``' own cache, and
    only when ``datasets`` itself runs offline (so that no request can leave the machine).
    """
    import datasets

    kwargs: dict[str, Any] = {"split": entry.split}
    if entry.subset:
        kwargs["name"] = entry.subset
    local = _local(entry, base)
    if local is not None:
        return _load(datasets, str(local), kwargs, key, entry)
    if not hub_offline():
        hub = {"revision": entry.revision or None, "token": hub_token()}
        try:
            return _load(datasets, entry.path, kwargs | hub, key, entry)
        except ConnectionError as e:
            raise _not_cached(entry, key, f"the Hub could not be reached ({e})") from e
    folder = _hub_snapshot(entry)
    if folder is not None:
        return _load(datasets, folder, kwargs, key, entry)
    if datasets.config.HF_HUB_OFFLINE:  # datasets' own cache of an earlier load; it makes no request
        try:
            return _load(datasets, entry.path, kwargs | {"revision": entry.revision or None}, key, entry)
        except ConnectionError as e:
            raise _not_cached(entry, key, "HF_HUB_OFFLINE is set") from e
    raise _not_cached(entry, key, "HF_HUB_OFFLINE is set")


def _load(datasets: Any, path: str, kwargs: dict[str, Any], key: str, entry: DatasetConfig) -> Any:
    try:
        return datasets.load_dataset(path, **kwargs)
    except ValueError as e:  # an unknown split or subset: datasets names the valid ones
        raise TaskFormatError(f"{key}: dataset {entry.path!r}: {e}") from e
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{key}.path: dataset {entry.path!r} not found: {e}") from e


def _hub_snapshot(entry: DatasetConfig) -> str | None:
    """The Hub-cache snapshot folder of ``entry`` at its revision, without any request; None when not cached."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot(entry.path, repo_type="dataset", revision=entry.revision, local_only=True)
    except (LocalEntryNotFoundError, ValueError):  # ValueError: not a valid repo id
        return None


def _not_cached(entry: DatasetConfig, key: str, how: str) -> FileNotFoundError:
    rev = entry.revision or "main"
    return FileNotFoundError(
        f"{key}.path: dataset {entry.path!r} (revision {rev!r}, split {entry.split!r}) is not cached "
        f"(neither in the Hub cache {hub_cache()} nor in the datasets cache) and {how}; download it "
        f"where the Hub is reachable (`hf download {entry.path} --repo-type dataset --revision {rev}`) "
        f"or point {key}.path at a local dataset folder"
    )


def rows_to_tasks(rows: Iterable[dict[str, Any]], columns: list[str], entry: DatasetConfig, key: str) -> list[Task]:
    """Tasks from dataset rows (``columns``: the dataset's column names), validated by ``task_from_dict``."""
    missing = [(target, col) for target, col in entry.columns.items() if col not in columns]
    if missing:
        target, col = missing[0]
        raise TaskFormatError(
            f"{key}.columns.{target}: column {col!r} is not in dataset {entry.path!r} "
            f"(split {entry.split!r}; its columns: {', '.join(columns)})"
        )
    if not entry.domain and "domain" not in entry.columns and (entry.columns or "domain" not in columns):
        raise TaskFormatError(f"{key}.domain: dataset {entry.path!r} has no domain column mapped; set {key}.domain")
    tasks, seen = [], {}
    for i, row in enumerate(rows):
        if entry.limit and i >= entry.limit:
            break
        where = f"{key} ({entry.path}:{entry.split} row {i})"
        task = task_from_dict(_record(row, entry, i), where)
        problem = None if task.code is None else hidden_tests_problem(task.code)
        if problem:  # a recipe trains and evaluates code only on hidden tests (docs/envs.md)
            raise TaskFormatError(f"{where}: field 'code.tests': {problem}")
        if task.id in seen:
            raise TaskFormatError(f"{where}: field 'id': duplicate id {task.id!r} (first at row {seen[task.id]})")
        seen[task.id] = i
        tasks.append(task)
    return tasks


def _record(row: dict[str, Any], entry: DatasetConfig, i: int) -> dict[str, Any]:
    """One row as a native task record (see the module docstring)."""
    if not entry.columns:
        rec = dict(row)
    else:
        rec = {}
        for target, col in entry.columns.items():
            value = row[col]
            if target == "prompt":
                rec.setdefault("messages", []).append({"role": "user", "content": value})
            elif target == "system":
                continue  # placed before the prompt below
            elif "." in target:
                part, sub = target.split(".", 1)
                rec.setdefault(part, {})[sub] = value
            else:
                rec[target] = value
        if "system" in entry.columns:
            rec["messages"].insert(0, {"role": "system", "content": row[entry.columns["system"]]})
    if rec.get("id") is None:
        rec["id"] = f"{entry.path}:{entry.split}:{i}"
    elif not isinstance(rec["id"], str):
        rec["id"] = str(rec["id"])  # integer ids are common in Hub datasets
    if entry.domain and rec.get("domain") is None:
        rec["domain"] = entry.domain
    return rec


def load_dataset_tasks(entry: DatasetConfig, key: str, base: Path | None = None) -> list[Task]:
    """The tasks of one ``data.*_datasets`` entry; ``key`` (e.g. ``data.train_datasets.0``) names it in errors."""
    ds = open_dataset(entry, key, base)
    return rows_to_tasks(ds, list(ds.column_names), entry, key)


def recipe_datasets(cfg: Any, which: str) -> list[tuple[str, DatasetConfig, list[Task]]]:
    """(recipe key, entry, tasks) of each ``data.{which}_datasets`` entry of the recipe ``cfg``, in order.

    Relative local paths are read against the recipe file's folder, as ``data.*_files`` are.
    """
    if which not in ("train", "eval"):
        raise ValueError(f"which must be 'train' or 'eval', not {which!r}")
    base = Path(cfg.source).parent if cfg.source else None
    out = []
    for i, entry in enumerate(getattr(cfg.data, f"{which}_datasets")):
        key = f"data.{which}_datasets.{i}"
        out.append((key, entry, load_dataset_tasks(entry, key, base)))
    return out


def dataset_file_name(entry: DatasetConfig) -> str:
    """A file name for the tasks of ``entry`` as a native task file: ``ORG--NAME[.SUBSET].SPLIT.jsonl``
    (a local folder: its last path part), characters outside ``[A-Za-z0-9._-]`` replaced by ``_``."""
    import re

    path = entry.path.rstrip("/")
    stem = Path(path).name if _looks_local(path) else path.replace("/", "--")
    parts = [stem, *([entry.subset] if entry.subset else []), entry.split]
    return re.sub(r"[^A-Za-z0-9._-]", "_", ".".join(parts)) + ".jsonl"


def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or path.count("/") != 1
