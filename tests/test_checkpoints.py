"""The output dir and its checkpoints (``rl.driver.checkpoints``): overwrite, resume pick-up, rotation. No model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rl.config.recipe import load_recipe
from rl.driver.checkpoints import latest_checkpoint, prepare_output_dir, write_checkpoint


class Runtime:
    """The learner's side of a checkpoint: one file."""

    def save(self, path: str) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "model.bin").write_bytes(b"new")


def _old_run(out: Path, steps: tuple[int, ...] = (8, 9)) -> None:
    """What a finished run leaves: logs, checkpoints (step 9 the newest), W&B files, its placement."""
    for s in steps:
        ck = out / "checkpoints" / f"step_{s:06d}"
        ck.mkdir(parents=True)
        (ck / "step.json").write_text(json.dumps({"step": s}) + "\n")
        (ck / "driver.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 0}\n{"step": 9}\n')
    (out / "metrics.discarded.jsonl").write_text('{"step": 10}\n')
    (out / "rollouts.jsonl").write_text('{"step": 9}\n')
    (out / "DONE").write_text('{"steps": 9}\n')
    (out / "placement.json").write_text("{}")
    (out / "wandb" / "offline-run-1").mkdir(parents=True)
    (out / "notes.txt").write_text("the user's own file")


def _cfg(recipe_copy, out: Path, **run):
    cfg = load_recipe(recipe_copy("tiny.yaml", out=out.name))
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, **run))


def test_overwrite_leaves_nothing_a_resume_could_pick_up(tmp_path: Path, recipe_copy) -> None:
    out = tmp_path / "out"
    _old_run(out)
    got, resume_from = prepare_output_dir(_cfg(recipe_copy, out, overwrite=True, resume="never"))
    assert got == out and resume_from is None
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "recipe.resolved.yaml"], "only the user's file stays"
    assert latest_checkpoint(out) is None
    # The new run checkpoints steps 1 and 2 (keep 2): the old run's step 9 cannot evict them ...
    write_checkpoint(Runtime(), out, 1, 2, {})
    write_checkpoint(Runtime(), out, 2, 2, {})
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    # ... and a later resume=auto resumes the new run, not the old one.
    _, resume_from = prepare_output_dir(_cfg(recipe_copy, out, resume="auto"))
    assert resume_from == out / "checkpoints" / "step_000002"


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_fresh_start_removes_what_a_run_that_crashed_at_start_up_left(tmp_path: Path, recipe_copy, overwrite) -> None:
    """A run that stopped before logging a step leaves STOPPED and crash.log (no metrics: the dir holds no run).
    The next run into that dir must not keep them: killed in turn, it would read as the old crash."""
    out = tmp_path / "out"
    (out / "stacks").mkdir(parents=True)
    (out / "stacks" / "driver.txt").write_text("stack")
    (out / "STOPPED").write_text('{"status": "crashed", "step": 0}\n')
    (out / "crash.log").write_text("Traceback ...\n")
    (out / "placement.json").write_text("{}")
    (out / "notes.txt").write_text("the user's own file")
    got, resume_from = prepare_output_dir(_cfg(recipe_copy, out, overwrite=overwrite, resume="never"))
    assert got == out and resume_from is None
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "recipe.resolved.yaml"], "only the user's file stays"


def test_checkpoints_alone_count_as_a_run(tmp_path: Path, recipe_copy) -> None:
    """A dir with an old run's checkpoints but no metrics (deleted by hand) is refused without overwrite."""
    out = tmp_path / "out"
    _old_run(out)
    (out / "metrics.jsonl").unlink()
    with pytest.raises(FileExistsError, match="already holds a run.*run.overwrite=true"):
        prepare_output_dir(_cfg(recipe_copy, out, overwrite=False, resume="never"))
    assert latest_checkpoint(out).name == "step_000009", "nothing removed without overwrite"


def test_resume_auto_keeps_the_run_and_splits_its_logs(tmp_path: Path, recipe_copy) -> None:
    out = tmp_path / "out"
    _old_run(out, steps=(4,))
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(7)))
    _, resume_from = prepare_output_dir(_cfg(recipe_copy, out, overwrite=True, resume="auto"))
    assert resume_from == out / "checkpoints" / "step_000004", "resume wins over overwrite"
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4]
    assert [json.loads(x)["step"] for x in (out / "metrics.discarded.jsonl").read_text().splitlines()] == [10, 5, 6]
    assert not (out / "DONE").exists()
