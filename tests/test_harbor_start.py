"""A run's Harbor images built before its actors start (``envs.harbor.prebuild``, ``rl.driver.harbor_start``):
one line per task (cached or built), a task without an image or a task dir that does not load refuses the run
naming the task, file and line, or is left out and counted with ``data.harbor_skip_bad``.

The tasks here are ``FROM scratch`` images (the real builder, no mmdebstrap), in a per-test cache.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from envs.harbor.prebuild import prebuild_images
from envs.io import TaskFormatError
from rl.driver.harbor_start import HarborImageError, prepare_harbor_images
from rl.driver.logger import STARTUP


def _task(root: Path, name: str, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text('version = "1.0"\n')
    (d / "instruction.md").write_text(f"Do {name}.\n")
    (d / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        (d / "environment" / rel).write_text(text)
    return d


def _task_set(root: Path) -> Path:
    tasks = root / "tasks"
    _task(tasks, "alpha", "FROM scratch\nCOPY a /a\n", {"a": "1"})
    _task(tasks, "beta", "FROM scratch\nCOPY b /b\n", {"b": "2"})
    _task(tasks, "broken", "FROM scratch\nWORKDIR /w\nCOPY missing.txt /w/\n")
    return tasks


def _recipe(recipe_copy, tasks: str, cache: Path, skip: bool) -> Path:
    def edit(d: dict) -> None:
        d["data"]["train_files"] += [tasks]
        d["data"]["harbor_skip_bad"] = skip
        d["rollout"]["envs"] = [
            {"domain": "tool_call", "cls": "envs.toolcall.ToolCallEnv", "kwargs": {"max_turns": 1}},
            {"domain": "harbor", "cls": "envs.harbor.env.HarborEnv", "kwargs": {"image_cache_dir": str(cache)}},
        ]
        d["rewards"].append({"cls": "rewards.harbor.HarborVerifierReward", "domains": ["harbor"]})

    return recipe_copy("tiny.yaml", edit=edit)


def test_prebuild_builds_each_image_once_and_names_every_failure(tmp_path: Path) -> None:
    tasks = _task_set(tmp_path)
    dirs = [str(p) for p in sorted(tasks.iterdir())]
    lines: list[str] = []
    first = prebuild_images(dirs, str(tmp_path / "cache"), say=lines.append)
    assert (first.built, first.cached) == (2, 0)
    assert lines[0].startswith("Harbor image 1/3 alpha: built in ") and lines[1].startswith("Harbor image 2/3 beta")
    assert lines[2].startswith("Harbor image 3/3 broken: FAILED")
    [f] = first.failures
    assert f.task == "broken" and f.task_dir == dirs[2]
    assert "environment/Dockerfile line 3" in f.message and "missing.txt" in f.message, f.message
    lines.clear()
    again = prebuild_images(dirs[:2], str(tmp_path / "cache"), say=lines.append)
    assert (again.built, again.cached, again.failures) == (0, 2, ())
    assert lines == ["Harbor image 1/2 alpha: cached", "Harbor image 2/2 beta: cached"]


def test_a_task_dir_that_does_not_load_is_a_prebuild_failure(tmp_path: Path) -> None:
    d = _task(tmp_path, "no-verifier", "FROM scratch\n")
    (d / "tests" / "test.sh").unlink()
    report = prebuild_images([str(d)], str(tmp_path / "cache"), say=lambda _: None)
    assert report.failures[0].task == "no-verifier" and "tests/test.sh" in report.failures[0].message


def _load(path: Path):
    from rl.config.recipe import load_recipe
    from rl.driver.loop import load_task_sets

    cfg = load_recipe(path)
    return cfg, *load_task_sets(cfg)


def test_a_task_without_an_image_refuses_the_run_before_its_actors_start(tmp_path: Path, recipe_copy) -> None:
    from rl.driver.loop import train

    cache = tmp_path / "cache"
    path = _recipe(recipe_copy, str(_task_set(tmp_path)), cache, skip=False)
    cfg, sources, eval_tasks = _load(path)

    def runtime(*args):
        raise AssertionError("the runtime (the actors) started before the images were built")

    err = io.StringIO()
    STARTUP.start(enabled=True, stream=err)
    try:
        with pytest.raises(HarborImageError) as e:
            prepare_harbor_images(cfg, sources, eval_tasks)
        with pytest.raises(HarborImageError):
            train(cfg, progress=False, runtime=runtime)
    finally:
        STARTUP.start(enabled=False)
    msg = str(e.value)
    assert "1 Harbor task(s) of the recipe have no image" in msg and "data.harbor_skip_bad" in msg
    assert "broken (" in msg and "environment/Dockerfile line 3" in msg, msg
    out = err.getvalue()
    assert "Harbor images: 3 task(s)" in out and "Harbor image 1/3 alpha: built in" in out, out
    assert "Harbor images: 2 built, 0 cached, 1 failed" in out, out
    assert len(list((cache / "images").iterdir())) == 2  # the good images are built (and kept) all the same


def test_jointrl_train_names_the_task_without_an_image_and_exits_2(tmp_path: Path, recipe_copy, capsys) -> None:
    from rl.cli.main import main

    path = _recipe(recipe_copy, str(_task_set(tmp_path)), tmp_path / "cache", skip=False)
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "jointrl: error: 1 Harbor task(s) of the recipe have no image" in err, err
    assert "broken (" in err and "environment/Dockerfile line 3" in err and "Ray:" not in err, err


def test_harbor_skip_bad_leaves_those_tasks_out_and_says_how_many(tmp_path: Path, recipe_copy, capsys) -> None:
    tasks = _task_set(tmp_path)
    path = _recipe(recipe_copy, str(tasks), tmp_path / "cache", skip=True)
    cfg, sources, eval_tasks = _load(path)
    kept, kept_eval = prepare_harbor_images(cfg, sources, eval_tasks)
    harbor = [t.id for s in kept if s.domain == "harbor" for t in s.tasks]
    assert harbor == ["alpha", "beta"] and kept_eval == eval_tasks
    assert "skipped 1 of 3 task(s) (data.harbor_skip_bad)" in capsys.readouterr().err
    assert [s.domain for s in kept] == [s.domain for s in sources]  # the other domains' sources untouched


def test_a_bad_task_dir_refuses_the_run_at_load_or_is_skipped_and_counted(tmp_path: Path, recipe_copy, capsys) -> None:
    tasks = _task_set(tmp_path)
    shutil.rmtree(tasks / "broken")
    bad = _task(tasks, "bad-toml", "FROM scratch\n")
    (bad / "task.toml").write_text("version = [\n")
    with pytest.raises(TaskFormatError, match=r"1 Harbor task\(s\) do not load:\n.*bad-toml.*task.toml"):
        _load(_recipe(recipe_copy, str(tasks), tmp_path / "cache", skip=False))
    from rl.config.recipe import load_recipe, validate_recipe

    path = _recipe(recipe_copy, str(tasks), tmp_path / "cache", skip=True)
    validate_recipe(load_recipe(path))  # the knob lets validation pass too
    _, sources, _ = _load(path)
    assert [t.id for s in sources if s.domain == "harbor" for t in s.tasks] == ["alpha", "beta"]
    err = capsys.readouterr().err
    assert "skipped 1 task dir(s) of" in err and "bad-toml" in err and "task.toml" in err, err
