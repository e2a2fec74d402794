"""jointrl's training side: algorithms, learner, mixer, driver loop, recipe config, CLI.

``rl.train`` runs a recipe from Python (a notebook, a script), as ``jointrl train`` does::

    from rl import train

    result = train("recipes/tiny.yaml", ["train.steps=2", "run.output_dir=runs/nb"], local=True)
    result.last["reward/mean"], result.output_dir

Imports inside it are lazy, so ``import rl.config`` stays light.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

__all__ = ["RunResult", "train"]


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a finished run logged: its output dir, last step, and each metric's first and last value.

    ``first`` / ``last`` map every key of ``metrics.jsonl`` (``reward/mean``, ``eval/reward/mean``...)
    to its first and last logged value; ``summary`` is the text ``jointrl train`` prints at the end.
    """

    output_dir: Path
    steps: int
    first: dict[str, Any]
    last: dict[str, Any]
    summary: str


def train(
    recipe: str | os.PathLike | dict[str, Any],
    overrides: list[str] | tuple[str, ...] = (),
    *,
    local: bool = False,
    verbose: bool = False,
    progress: bool = True,
    base_dir: str | os.PathLike = ".",
) -> RunResult:
    """Check and run ``recipe`` (a YAML path, or a dict shaped like one) with ``key=value`` ``overrides``.

    The same checks as ``jointrl train`` come first (a bad recipe raises ``RecipeError`` naming the key
    before anything starts). ``local``: everything in this process, no Ray or vLLM (``train --local``).
    ``base_dir``: what a dict recipe's relative paths are relative to. Returns the run's
    :class:`RunResult`; a run that cannot go on raises (``RunAborted``, ``EngineFailure``) after
    shutting everything down, its outputs so far kept.
    """
    from rl.config.recipe import load_recipe, recipe_from_dict, validate_recipe
    from rl.driver.logger import read_step_records, summary
    from rl.driver.loop import train as run_loop

    if isinstance(recipe, dict):
        cfg = recipe_from_dict(recipe, base_dir, list(overrides))
    else:
        cfg = load_recipe(recipe, list(overrides))
    validate_recipe(cfg)
    runtime = None
    if local:
        from rl.driver.local_runtime import LocalRuntime

        def runtime(c: Any, model_path: str, out: Path, v: bool) -> Any:
            return LocalRuntime(c, model_path, out, v)

    out = run_loop(cfg, verbose=verbose, progress=progress, runtime=runtime)
    first: dict[str, Any] = {}
    last: dict[str, Any] = {}
    timings: dict[str, list[float]] = {}
    for rec in read_step_records(out / "metrics.jsonl"):
        for k, v in rec.items():
            if v is None:
                continue
            first.setdefault(k, v)
            last[k] = v
            if k.startswith("timing/"):
                timings.setdefault(k, []).append(v)
    return RunResult(out, int(last.get("step", 0)), first, last, summary(out, first, last, timings))
