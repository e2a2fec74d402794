"""The shipped train/held-out split files equal a fresh split of their source files."""

from __future__ import annotations

from pathlib import Path

from envs.io import load_tasks
from envs.splits import SOURCES, split, write_splits

DATA = Path(__file__).resolve().parents[1] / "recipes" / "data"


def test_split_rule() -> None:
    train, held = split(list(range(10)), every=4)  # type: ignore[arg-type]
    assert held == [3, 7] and train == [0, 1, 2, 4, 5, 6, 8, 9]


def test_shipped_splits_are_current(tmp_path: Path) -> None:
    write_splits(DATA, tmp_path)
    for name in SOURCES:
        for part in ("train", "eval"):
            assert (tmp_path / f"{name}.{part}.jsonl").read_bytes() == (DATA / f"{name}.{part}.jsonl").read_bytes(), (
                f"run `python -m envs.splits` to refresh {name}.{part}.jsonl"
            )
        train = {t.id for t in load_tasks(DATA / f"{name}.train.jsonl")}
        held = {t.id for t in load_tasks(DATA / f"{name}.eval.jsonl")}
        assert train and held and not train & held
        assert train | held == {t.id for t in load_tasks(DATA / f"{name}.jsonl")}
