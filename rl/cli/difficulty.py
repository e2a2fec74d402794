"""``jointrl difficulty``: measure each task's pass rate under a model and write it into the task files.

    jointrl difficulty RECIPE [key=value ...] [--k 8] [--files F ...] [--limit N] [--out-dir DIR]

samples ``k`` completions per task (temperature 1.0 by default) with the recipe's model,
envs and rollout settings, scores them with the recipe's rewards (the same path as
``jointrl eval``), and writes into each task's ``meta``:

- ``base_pass_rate``: the fraction of its ``k`` samples whose reward reached
  ``--pass-threshold`` (default 1.0: fully correct);
- ``base_pass``: ``{"model", "samples", "passed", "errors", "mean_reward", "temperature",
  "threshold"}`` (``mean_reward`` keeps partial credit visible).

The task sets are the recipe's ``data.train_files`` and ``data.train_datasets`` unless
``--files`` names files; each file is rewritten in place (or into ``--out-dir``) as soon as it
is measured (one vLLM engine per file, so a stopped run keeps the files it finished), every
other field unchanged, so the measurement travels with the tasks: the mixer's curriculum and
the adaptive domain weights start from it (:mod:`rl.data.mixer`), and the ladder generators
keep it when they regenerate an unchanged task.

A ``data.train_datasets`` entry (a Hub dataset or a local dataset folder, :mod:`rl.data.hub_data`)
cannot be written back: its tasks, measured, go to a native task file
``--out-dir/ORG--NAME[.SUBSET].SPLIT.jsonl`` (``--out-dir`` is then required; without it the
command stops with a message naming ``data.train_datasets.0``). A recipe lists that file in
``data.train_files`` in place of the entry to train from the measurement (the entry itself
reads the dataset as it is, without it).

``--limit N`` measures the first N tasks of each set only (the others keep what they had).
A JSON summary per file and domain is printed: how many tasks have ``0 < pass rate < 1`` (a
group of samples on them has reward variance, i.e. learning signal), how many are never or
always solved, and mean pass@1 / pass@k.

This module does not train; it reuses ``jointrl eval``'s engine loop and scorer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from envs.types import Task, Trajectory

__all__ = ["add_parser", "apply_difficulty", "difficulty_summary", "run_difficulty"]


def add_parser(sub: Any) -> None:
    """Add ``difficulty`` to ``jointrl``'s subparsers."""
    p = sub.add_parser(
        "difficulty",
        help="measure each task's pass rate (k samples) and write it into the task files",
        description="Sample k completions per task with the recipe's model, score them with its "
        "rewards, and write meta.base_pass_rate into the task files.",
    )
    p.add_argument(
        "recipe", help="recipe YAML file (model, rollout, envs, rewards, data.train_files / data.train_datasets)"
    )
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rollout.max_new_tokens=128")
    p.add_argument("--k", type=int, default=8, help="samples per task (default 8)")
    p.add_argument(
        "--files",
        nargs="+",
        help="task files to measure (default: the recipe's data.train_files and data.train_datasets)",
    )
    p.add_argument("--limit", type=int, default=0, help="measure the first N tasks of each file only (0 = all)")
    p.add_argument("--model", help="model to measure with (default: the recipe's model.path)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    p.add_argument(
        "--pass-threshold", type=float, default=1.0, help="a sample passes when reward >= this (default 1.0)"
    )
    p.add_argument(
        "--out-dir",
        help="write the measured files here (same names) instead of in place; required for data.train_datasets "
        "(written as ORG--NAME[.SUBSET].SPLIT.jsonl)",
    )
    # Smaller than eval's 256: a batch that large can put thousands of prompt tokens into one prefill
    # step, and on a CPU engine such a step can outlast vLLM's RPC timeout, which kills the engine.
    p.add_argument("--batch", type=int, default=32, help="episodes per engine call (default 32)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--verbose", action="store_true", help="show vLLM logs")
    p.set_defaults(run=run_difficulty)


def apply_difficulty(
    tasks: list[Task], scored: list[Trajectory], k: int, threshold: float, model: str, temperature: float
) -> list[Task]:
    """``tasks`` with ``meta["base_pass_rate"]`` / ``meta["base_pass"]`` from ``scored``: ``k``
    consecutive samples per task, in task order. An errored sample (reward None) does not pass."""
    if len(scored) != k * len(tasks):
        raise ValueError(f"need {k} samples per task ({k * len(tasks)}), got {len(scored)}")
    out = []
    for i, task in enumerate(tasks):
        group = scored[i * k : (i + 1) * k]
        if any(t.task.id != task.id for t in group):
            raise ValueError(f"samples {i * k}..{(i + 1) * k - 1} are not all of task {task.id!r}")
        rewards = [float(t.reward) for t in group if t.reward is not None]
        passed = sum(r >= threshold for r in rewards)
        info = {
            "model": model,
            "samples": k,
            "passed": passed,
            "errors": k - len(rewards),
            "mean_reward": round(sum(rewards) / len(rewards), 6) if rewards else None,
            "temperature": temperature,
            "threshold": threshold,
        }
        out.append(dataclasses.replace(task, meta={**task.meta, "base_pass_rate": passed / k, "base_pass": info}))
    return out


def difficulty_summary(tasks: list[Task]) -> dict[str, Any]:
    """Per domain, over tasks carrying ``base_pass_rate``: counts of never / sometimes / always
    solved, the share with signal (0 < rate < 1), mean pass@1 and the mean reward."""
    from rl.cli.eval import pass_at_k

    by: dict[str, list[Task]] = {}
    for t in tasks:
        if isinstance(t.meta.get("base_pass_rate"), (int, float)):
            by.setdefault(t.domain, []).append(t)
    out: dict[str, Any] = {}
    for d, ts in sorted(by.items()):
        rates = [float(t.meta["base_pass_rate"]) for t in ts]
        k = int(ts[0].meta["base_pass"]["samples"])
        rewards = [t.meta["base_pass"]["mean_reward"] for t in ts if t.meta["base_pass"].get("mean_reward") is not None]
        out[d] = {
            "tasks": len(ts),
            "never": sum(r == 0 for r in rates),
            "sometimes": sum(0 < r < 1 for r in rates),
            "always": sum(r == 1 for r in rates),
            "signal_fraction": round(sum(0 < r < 1 for r in rates) / len(ts), 4),
            "pass@1": round(sum(rates) / len(ts), 4),
            f"pass@{k}": round(sum(pass_at_k(k, round(r * k), k) for r in rates) / len(ts), 4),
            "mean_reward": round(sum(rewards) / len(rewards), 4) if rewards else None,
        }
    return out


def run_difficulty(args: argparse.Namespace) -> int:
    from rl.cli.common import _guarded

    return _guarded(_difficulty, args)


def _targets(args: argparse.Namespace, cfg: Any) -> list[tuple[str, list[Task], Path]]:
    """(label, tasks, output file) of each task set to measure: ``--files``, else the recipe's
    ``data.train_files`` (written in place or into ``--out-dir``) and ``data.train_datasets``
    (into ``--out-dir`` only: a dataset is not a file the command can rewrite)."""
    from envs.io import load_tasks
    from rl.cli.common import CommandError
    from rl.config.recipe import resolve_path
    from rl.data.hub_data import dataset_file_name, recipe_datasets

    files = [Path(f) for f in args.files] if args.files else [Path(resolve_path(cfg, f)) for f in cfg.data.train_files]
    for f in files:
        if not f.name.endswith((".jsonl", ".jsonl.gz")):
            raise CommandError(f"{f}: difficulty writes into the task file, which must be .jsonl or .jsonl.gz")
    out_dir = Path(args.out_dir) if args.out_dir else None
    targets = [(str(f), load_tasks(f), out_dir / f.name if out_dir else f) for f in files]
    if not args.files and cfg.data.train_datasets:
        if out_dir is None:
            raise CommandError(
                f"{args.recipe}: data.train_datasets.0 ({cfg.data.train_datasets[0].path}) is a dataset, which "
                "difficulty cannot write back into; pass --out-dir DIR to write its measured tasks there as a "
                "native task file (then list that file in data.train_files instead of the dataset entry)"
            )
        for key, entry, tasks in recipe_datasets(cfg, "train"):
            targets.append((key, tasks, out_dir / dataset_file_name(entry)))
    if not targets:
        raise CommandError(f"{args.recipe}: data.train_files and data.train_datasets are empty; pass --files FILE")
    seen: dict[Path, str] = {}
    for label, _, out in targets:
        if out in seen:
            raise CommandError(f"{label} and {seen[out]} would both be written to {out}")
        seen[out] = label
    return targets


def _measure_file(
    args: argparse.Namespace, cfg: Any, scorer: Any, tasks: list[Task], n: int, out: Path
) -> tuple[list[Task], dict[str, Any]]:
    """Measure the first ``n`` of ``tasks``, write all of them to ``out``; (measured, summary)."""
    from envs.io import save_tasks
    from rl.cli.common import CommandError
    from rl.cli.eval import _generate

    t0 = time.perf_counter()
    trajs = _generate(cfg, tasks[:n], args.k, args.temperature, args.batch, args.verbose)
    t1 = time.perf_counter()
    scored = scorer.score(trajs)
    measured = apply_difficulty(tasks[:n], scored, args.k, args.pass_threshold, cfg.model.path, args.temperature)
    try:
        save_tasks(measured + tasks[n:], out)
    except OSError as e:
        raise CommandError(f"cannot write {out}: {e.strerror or e}") from None
    print(f"difficulty: {out}: {n} tasks measured in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return measured, {
        **difficulty_summary(measured),
        "timing": {"generate_s": round(t1 - t0, 3), "score_s": round(time.perf_counter() - t1, 3)},
    }


def _difficulty(args: argparse.Namespace) -> int:
    from rewards.service import reward_specs
    from rl.cli.common import CommandError, make_scorer
    from rl.cli.eval import resolve_model_arg
    from rl.config.recipe import load_recipe, validate_recipe

    if args.k < 1 or args.limit < 0 or args.batch < 1:
        raise CommandError("--k and --batch must be >= 1, --limit >= 0")
    if args.temperature < 0:
        raise CommandError("--temperature must be >= 0")
    cfg = load_recipe(args.recipe, args.overrides)
    if args.model:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=resolve_model_arg(args.model)[0]))
    validate_recipe(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, overwrite=True)))
    targets = _targets(args, cfg)
    chosen = [ts[: args.limit] if args.limit else ts for _, ts, _ in targets]
    served = {e.domain for e in cfg.rollout.envs}
    for (label, _, _), ts in zip(targets, chosen):
        bad = next((t for t in ts if t.domain not in served), None)
        if bad is not None:
            raise CommandError(
                f"{label}: task {bad.id!r} has domain {bad.domain!r}, but the recipe's rollout.envs "
                f"serves only {sorted(served)}"
            )
    if not any(chosen):
        raise CommandError(f"no tasks in {', '.join(label for label, _, _ in targets)}")

    specs = reward_specs(cfg.rewards)
    scorer = make_scorer(specs, cfg.reward_service.timeout_s, f"{args.recipe}: ")
    summary: dict[str, Any] = {
        "model": cfg.model.path,
        "k": args.k,
        "temperature": args.temperature,
        "pass_threshold": args.pass_threshold,
        "files": {},
    }
    measured_all: list[Task] = []
    # One file at a time, each written as soon as it is measured: a long run that is stopped keeps
    # the files it finished (one engine start per file is small next to k samples of every task).
    for (_, ts, out), chosen_ts in zip(targets, chosen):
        if chosen_ts:
            measured, summary["files"][str(out)] = _measure_file(args, cfg, scorer, ts, len(chosen_ts), out)
            measured_all += measured
    summary["domains"] = difficulty_summary(measured_all)
    print(json.dumps(summary, indent=2))
    sys.stdout.flush()
    return 0
