"""What the generated task ladders share: templates, rungs, the split by template, writing.

A *ladder* is a family of task templates of one domain, each on a difficulty *rung*
(0 = near-trivial ... 3 = hard). A template draws instances from a seeded RNG (names,
values, texts). Every template belongs to exactly one split: ``train`` templates make the
training file, ``eval`` templates the held-out file, so a held-out gain needs the policy
to generalize to task shapes (wordings, functions, file layouts) it never trained on, not
only to new values. Each rung has templates on both sides, so both files span the ladder.

:func:`draw` turns templates into tasks: instances are drawn round-robin over the split's
templates (rung-balanced), an instance equal to an earlier one (prompt and spec) is redrawn, ids are
``<source>-<split>-<template>-<nnn>``, and ``meta`` holds ``source``, ``template``,
``rung`` and ``split``. Same seed, same tasks. This module knows nothing of a domain;
:mod:`rl.data.tasks.code_gen`, :mod:`rl.data.tasks.terminal_gen` and
:mod:`rl.data.tasks.toolcall_gen` define the templates.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from envs.io import load_tasks, save_tasks, task_to_dict
from envs.types import Task

__all__ = ["SPLITS", "N_TRAIN", "N_EVAL", "Template", "draw", "write_ladder", "strip_measured", "MEASURED_KEYS"]

SPLITS = ("train", "eval")
# Tasks per split of every shipped ladder (recipes/data/*_ladder.*.jsonl): the generators' defaults.
# 300 held out per domain: a paired standard error shrinks as 1/sqrt(tasks). The flagship's per-task
# SD of paired differences is about 0.3 (terminal, code) and 0.2 (tool calls), so over 100 tasks a true
# gain of 0.07 clears two SE in 55-65% of runs; over 300, in 95-98%. The first 100 tasks
# are the earlier 100-task files (draw is round-robin over one seeded stream).
N_TRAIN, N_EVAL = 120, 300
# Keys the `jointrl difficulty` command adds to meta; a regenerated file keeps them.
MEASURED_KEYS = ("base_pass_rate", "base_pass")


@dataclass(frozen=True)
class Template:
    """One task shape: ``make(rng)`` returns a task (its id and meta are filled in by :func:`draw`)."""

    name: str
    rung: int
    split: str
    make: Callable[[random.Random], Task]

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"template {self.name!r}: split must be one of {SPLITS}, got {self.split!r}")
        if not 0 <= self.rung <= 3:
            raise ValueError(f"template {self.name!r}: rung must be 0..3, got {self.rung}")


def _content_key(task: Task) -> str:
    """The task's content (prompt and spec; not its id or meta): two instances with equal keys are one task."""
    return json.dumps(task_to_dict(dataclasses.replace(task, id="-", meta={})), sort_keys=True)


def draw(templates: Iterable[Template], split: str, n: int, seed: int, source: str) -> list[Task]:
    """``n`` distinct tasks of ``split``'s templates, round-robin over them; deterministic in ``seed``."""
    pool = sorted((t for t in templates if t.split == split), key=lambda t: (t.rung, t.name))
    if not pool:
        raise ValueError(f"{source}: no {split} templates")
    names = [t.name for t in pool]
    if len(set(names)) != len(names):
        raise ValueError(f"{source}: duplicate template names in {names}")
    rng = random.Random(f"{source}:{split}:{seed}")
    seen: set[str] = set()
    per_template: dict[str, int] = {}
    out: list[Task] = []
    attempts = 0
    while len(out) < n:
        template = pool[len(out) % len(pool)]
        attempts += 1
        if attempts > 50 * n + 500:
            raise RuntimeError(
                f"{source}: cannot draw {n} distinct {split} tasks; template {template.name!r} "
                f"repeats its prompts (its value pools are too small)"
            )
        task = template.make(rng)
        key = _content_key(task)
        if key in seen:
            continue
        seen.add(key)
        k = per_template.get(template.name, 0)
        per_template[template.name] = k + 1
        meta = {**task.meta, "source": source, "template": template.name, "rung": template.rung, "split": split}
        out.append(dataclasses.replace(task, id=f"{source}-{split}-{template.name}-{k:03d}", meta=meta))
    return out


def strip_measured(task: Task) -> Task:
    """``task`` without the measured-difficulty meta keys (to compare against a fresh generation)."""
    if not any(k in task.meta for k in MEASURED_KEYS):
        return task
    return dataclasses.replace(task, meta={k: v for k, v in task.meta.items() if k not in MEASURED_KEYS})


def _same_tests(task: Task) -> Task:
    """``task`` with its code tests as one list (public, then hidden): a file written before the
    public/hidden split and its regeneration with the split hold the same tests, so a measured
    pass rate (every test passed) still applies to it."""
    if task.code is None or not task.code.public_tests:
        return task
    merged = task.code.public_tests + task.code.tests
    return dataclasses.replace(task, code=dataclasses.replace(task.code, tests=merged, public_tests=""))


def write_ladder(tasks_by_split: dict[str, list[Task]], out_dir: str | Path, source: str) -> list[Path]:
    """Write ``<source>.<split>.jsonl`` per split into ``out_dir``; return the paths.

    Measured difficulty (``meta["base_pass_rate"]``, ``meta["base_pass"]``) that an existing
    file holds for a task with the same id and the same content (code tests compared as one
    list, whether or not split into public and hidden) is carried over, so
    regenerating a ladder does not throw away a measurement that still applies.
    """
    paths = []
    for split, tasks in tasks_by_split.items():
        path = Path(out_dir) / f"{source}.{split}.jsonl"
        old = {t.id: t for t in load_tasks(path)} if path.is_file() else {}
        merged = []
        for t in tasks:
            prev = old.get(t.id)
            if prev is not None and _same_tests(strip_measured(prev)) == _same_tests(t):
                t = dataclasses.replace(t, meta=prev.meta)
            merged.append(t)
        save_tasks(merged, path)
        paths.append(path)
    return paths


def generate_split(
    templates: Iterable[Template], source: str, n_train: int, n_eval: int, seed: int
) -> tuple[list[Task], list[Task]]:
    """(train, eval) tasks of one ladder: train from its train templates, eval from its eval ones."""
    templates = tuple(templates)
    return draw(templates, "train", n_train, seed, source), draw(templates, "eval", n_eval, seed, source)


def ladder_main(prog: str, description: str, write: Callable[..., list[Path]], argv: list[str] | None = None) -> None:
    """The command line every ladder generator shares: ``--out-dir --n-train --n-eval --seed``."""
    import argparse

    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parents[3] / "recipes" / "data"))
    ap.add_argument("--n-train", type=int, default=N_TRAIN)
    ap.add_argument("--n-eval", type=int, default=N_EVAL)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for p in write(args.out_dir, args.n_train, args.n_eval, args.seed):
        print(p)
