"""The recipe's task files, loaded once and checked as ``train`` would load them.

``load_task_files`` parses every file of ``data.train_files`` and ``data.eval_files`` once (a file
that does not load keeps its error); ``check_task_files`` runs every check over that one load:

* the file loads (``envs.io.load_tasks``: the error ``train`` would give, ``file:line: field ...``);
* no terminal task's check reads a reference value from the work dir, where the policy could
  rewrite it (``envs.terminal.reference_problems``);
* every code task has hidden tests (``code.tests``): the code reward is computed on them, and a
  task scored on the tests its prompt and feedback show pays for copying them;
* with ``domains``, ``rollout.envs`` serves each task's domain (``jointrl validate``; ``train``
  checks it when it loads the files itself).

Dataset entries (``data.*_datasets``) are read when the run starts (they may need the network).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rl.config.loading import Fail, failer, resolve_path
from rl.config.schema import Recipe

if TYPE_CHECKING:
    from envs.types import Task

__all__ = ["TaskFile", "load_task_files", "check_task_files"]


@dataclass(frozen=True)
class TaskFile:
    """One task file of the recipe: its recipe key (``data.train_files.<i>``), its path, and its tasks, or
    the error loading it gave (``error`` non-empty, ``tasks`` empty)."""

    key: str
    path: Path
    tasks: tuple[Task, ...] = ()
    error: str = ""


def load_task_files(recipe: Recipe) -> list[TaskFile]:
    """Every task file of the recipe, parsed once, in recipe order (train files, then eval files)."""
    from envs.io import TaskFormatError, load_tasks

    out = []
    for key, files in (("data.train_files", recipe.data.train_files), ("data.eval_files", recipe.data.eval_files)):
        for i, f in enumerate(files):
            path = resolve_path(recipe, f)
            try:
                out.append(
                    TaskFile(f"{key}.{i}", path, tuple(load_tasks(path, harbor_skip_bad=recipe.data.harbor_skip_bad)))
                )
            except (TaskFormatError, OSError) as e:
                out.append(TaskFile(f"{key}.{i}", path, error=str(e)))
    return out


def check_task_files(
    recipe: Recipe, files: list[TaskFile] | None = None, fail: Fail | None = None, *, domains: bool = True
) -> int:
    """Run the checks of this module over ``files`` (default: ``load_task_files(recipe)``); returns the number
    of tasks. ``fail(key, msg)`` reports the first problem (default: ``RecipeError`` naming the key's line);
    ``domains``: also check that ``rollout.envs`` serves each task's domain."""
    from envs.code import hidden_tests_problem
    from envs.terminal import reference_problems

    fail = fail or failer(recipe)
    served = sorted({e.domain for e in recipe.rollout.envs})
    n = 0
    for tf in load_task_files(recipe) if files is None else files:
        if tf.error:
            fail(tf.key, tf.error)
        for t in tf.tasks:
            for problem in reference_problems(t):
                fail(tf.key, f"{tf.path}: {problem}")
            problem = None if t.code is None else hidden_tests_problem(t.code)
            if problem:
                fail(tf.key, f"{tf.path}: task {t.id!r}: field 'code.tests': {problem}")
            if domains and t.domain not in served:
                fail(tf.key, f"{tf.path}: task {t.id!r} has domain {t.domain!r}, but rollout.envs serves only {served}")
        n += len(tf.tasks)
    return n
