"""Train / held-out splits of the shipped task files, for recipes that evaluate per domain.

``python -m envs.splits`` writes ``<name>.train.jsonl`` and ``<name>.eval.jsonl`` beside
each source file in ``recipes/data`` (every ``EVERY``-th task, in file order, is held out,
so each difficulty level is represented on both sides). Deterministic; a test checks the
shipped files equal a fresh split.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envs.io import load_tasks, save_tasks
from envs.types import Task

SOURCES = ("code_tasks", "terminal_tasks", "toolcall_tasks")
EVERY = 4


def split(tasks: list[Task], every: int = EVERY) -> tuple[list[Task], list[Task]]:
    """(train, held_out): task i is held out when ``i % every == every - 1``."""
    train = [t for i, t in enumerate(tasks) if i % every != every - 1]
    held = [t for i, t in enumerate(tasks) if i % every == every - 1]
    return train, held


def write_splits(data_dir: Path, out_dir: Path | None = None) -> list[Path]:
    out_dir = out_dir or data_dir
    written = []
    for name in SOURCES:
        train, held = split(load_tasks(data_dir / f"{name}.jsonl"))
        for part, tasks in (("train", train), ("eval", held)):
            path = out_dir / f"{name}.{part}.jsonl"
            save_tasks(tasks, path)
            written.append(path)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[1] / "recipes" / "data"))
    args = ap.parse_args()
    for p in write_splits(Path(args.data_dir)):
        print(p)


if __name__ == "__main__":
    main()
