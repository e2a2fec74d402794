"""Nothing lost to an interrupt or a crash (issue #38 item 3), on the in-process runtime (fast).

SIGINT at start-up, mid-step (during the update: the step is finished first) and between steps
(during the next step's generation: that step is discarded) leaves a checkpoint of the last finished
step whatever ``run.save_every`` says, a ``STOPPED`` folder that ``jointrl runs`` shows as interrupted
and resumable, and a ``run.resume=auto`` that ``validate`` and ``train`` agree on and that logs each step
once, exactly as the uninterrupted run did. An unexpected error after start-up ends with one message
naming it and exit 3, the step before it checkpointed, and the run resumable.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from rl.cli.main import main
from rl.cli.report import render_report
from rl.cli.runs import format_runs, list_runs, run_info
from rl.config.recipe import RecipeError, validate_recipe
from rl.driver.checkpoints import prepare_output_dir
from rl.driver.local_runtime import LocalRuntime
from rl.driver.loop import RunCrashed, latest_checkpoint, train
from runlog import comparable_steps
from test_loop_inprocess import _cfg, local, user_rewards  # noqa: F401 - user_rewards is a fixture

STEPS = 4


def _steps(out: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]


def _on(method: str, call: int, action):
    """A runtime factory: the in-process runtime whose ``method`` runs ``action()`` at its ``call``-th call."""

    def make(cfg, model_path, out, verbose):
        rt = LocalRuntime(cfg, model_path, out, verbose)
        orig, calls = getattr(rt, method), []

        def wrapped(*a, **kw):
            calls.append(1)
            if len(calls) == call:
                action()
            return orig(*a, **kw)

        setattr(rt, method, wrapped)
        return rt

    return make


def _sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture
def full(tmp_path: Path, recipe_copy, user_rewards) -> Path:  # noqa: F811
    """The uninterrupted run (save_every 0: only the final checkpoint)."""
    return train(_cfg(recipe_copy, out="full", train={"steps": STEPS}), progress=False, runtime=local)


def _resume_and_compare(recipe_copy, out_name: str, full: Path, capsys) -> Path:
    """``validate`` then ``train`` with run.resume=auto: each step logged once, as in the uninterrupted run."""
    cfg = _cfg(recipe_copy, out=out_name, train={"steps": STEPS}, run={"resume": "auto"})
    assert main(["validate", cfg.source, "run.resume=auto"]) == 0
    plan = capsys.readouterr().out
    out = train(cfg, progress=False, runtime=local)
    assert _steps(out) == list(range(STEPS + 1)), "each step once"
    want, got = comparable_steps(full / "metrics.jsonl"), comparable_steps(out / "metrics.jsonl")
    for s in range(1, STEPS + 1):
        assert got[s] == pytest.approx(want[s], rel=1e-5, abs=1e-7), f"step {s} differs after the resume"
    assert (out / "DONE").is_file() and not (out / "STOPPED").exists()
    assert run_info(out).status == "done"
    return plan


@pytest.mark.parametrize(
    "where, method, call, finished",
    [
        ("mid-step", "train_step", 2, 2),  # during step 2's update: step 2 is finished, then the stop
        ("between steps", "generate", 4, 2),  # step 3's generation (call 1: baseline eval): step 3 discarded
    ],
)
def test_sigint_checkpoints_the_last_finished_step_and_resumes_exactly(
    tmp_path: Path,
    recipe_copy,
    user_rewards,
    full: Path,
    capsys,
    where,
    method,
    call,
    finished,  # noqa: F811
) -> None:
    cfg = _cfg(recipe_copy, out="b", train={"steps": STEPS})
    assert cfg.run.save_every == 0
    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False, runtime=_on(method, call, _sigint))
    out = Path(cfg.run.output_dir)
    assert _steps(out) == list(range(finished + 1)), where
    assert latest_checkpoint(out).name == f"step_{finished:06d}", "checkpointed at the signal, save_every 0"
    stopped = json.loads((out / "STOPPED").read_text())
    assert stopped["status"] == "interrupted" and stopped["step"] == finished
    info = run_info(out)
    assert info.status == "interrupted" and info.resume_step == finished
    assert f"interrupted (resumable: after step {finished})" in format_runs(list_runs(tmp_path))
    assert f"status <b>interrupted (resumable: after step {finished})</b>" in render_report(out)
    assert f"continues from {out / 'checkpoints' / f'step_{finished:06d}'}" in capsys.readouterr().err
    plan = _resume_and_compare(recipe_copy, "b", full, capsys)
    assert f"continues {out} after step {finished}" in plan, "validate says what train does"


def test_sigint_at_start_up_leaves_a_folder_resume_auto_starts_again(
    tmp_path: Path,
    recipe_copy,
    user_rewards,
    full: Path,
    capsys,  # noqa: F811
) -> None:
    cfg = _cfg(recipe_copy, out="b", train={"steps": STEPS})
    with pytest.raises(KeyboardInterrupt):  # during the baseline eval, before step 1
        train(cfg, progress=False, runtime=_on("generate", 1, _sigint))
    out = Path(cfg.run.output_dir)
    assert latest_checkpoint(out) is None and json.loads((out / "STOPPED").read_text())["step"] == 0
    (out / "metrics.jsonl").write_text('{"step": 0, "half": "a line logged before the signal"}\n')
    assert run_info(out).status == "interrupted" and run_info(out).resume_step == 0
    with pytest.raises(RecipeError, match="already holds a run"):  # resume=never: validate refuses ...
        validate_recipe(cfg)
    with pytest.raises(FileExistsError, match="already holds a run"):  # ... and so does train
        prepare_output_dir(cfg)
    plan = _resume_and_compare(recipe_copy, "b", full, capsys)
    assert "starts again from step 1" in plan
    assert "a line logged before the signal" in (out / "metrics.discarded.jsonl").read_text(), "kept aside"


def test_a_run_killed_before_its_first_checkpoint_is_refused_by_validate_and_train_alike(
    tmp_path: Path,
    recipe_copy,
    user_rewards,  # noqa: F811
) -> None:
    """No checkpoint and no ``STOPPED`` (killed, or still running): resume=auto is refused by both, naming why."""
    cfg = _cfg(recipe_copy, out="b", run={"resume": "auto"})
    out = Path(cfg.run.output_dir)
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(RecipeError, match="run.output_dir: .*no checkpoint to resume from.*run.overwrite=true"):
        validate_recipe(cfg)
    with pytest.raises(FileExistsError, match="no checkpoint to resume from"):
        prepare_output_dir(cfg)
    assert main(["train", cfg.source, "--local", "run.resume=auto"]) == 2


def test_crash_after_start_is_one_message_exit_3_and_resumes(
    tmp_path: Path,
    recipe_copy,
    user_rewards,
    full: Path,
    capsys,  # noqa: F811
) -> None:
    """A driver-side error in step 3 (as a user estimator returning the wrong dtype): one message naming it,
    exit 3, no traceback; step 2 checkpointed at the crash (save_every 0); resume=auto gives each step once."""

    def bad_dtype() -> None:
        raise TypeError("advantages must be float32, got torch.int64")

    cfg = _cfg(recipe_copy, out="b", train={"steps": STEPS})
    recipe = Path(cfg.source)
    import rl.cli.main as cli

    orig = cli._local_runtime
    cli._local_runtime = _on("score", 4, bad_dtype)  # calls: baseline eval, steps 1, 2, 3
    try:
        rc = main(["train", str(recipe), "--local"])
    finally:
        cli._local_runtime = orig
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "step 3: TypeError: advantages must be float32, got torch.int64" in err and "Traceback" not in err
    out = Path(cfg.run.output_dir)
    assert "TypeError" in (out / "crash.log").read_text()
    assert latest_checkpoint(out).name == "step_000002"
    stopped = json.loads((out / "STOPPED").read_text())
    assert stopped["status"] == "crashed" and "advantages must be float32" in stopped["reason"]
    assert run_info(out).status == "crashed"
    _resume_and_compare(recipe_copy, "b", full, capsys)


def test_crash_mid_update_does_not_save_a_half_step(tmp_path: Path, recipe_copy, user_rewards) -> None:  # noqa: F811
    def boom() -> None:
        raise RuntimeError("learner fell over")

    cfg = _cfg(recipe_copy, out="b", train={"steps": STEPS}, run={"save_every": 1})
    with pytest.raises(RunCrashed, match="step 2: RuntimeError: learner fell over.*continues from .*step_000001"):
        train(cfg, progress=False, runtime=_on("train_step", 2, boom))
    out = Path(cfg.run.output_dir)
    assert latest_checkpoint(out).name == "step_000001"
    assert json.loads((out / "STOPPED").read_text())["step"] == 1


def test_sigint_in_async_mode_keeps_the_in_flight_draw_and_resumes_each_step_once(
    tmp_path: Path,
    recipe_copy,
    user_rewards,  # noqa: F811
) -> None:
    """rollout.max_staleness=1: step 3's episodes are in flight while step 2 trains; a signal during step 2's
    update checkpoints step 2 with that draw, and the resumed run generates those tasks for step 3."""
    common = dict(train={"steps": STEPS}, rollout={"max_staleness": 1})
    cfg = _cfg(recipe_copy, out="b", **common)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False, runtime=_on("train_step", 2, _sigint))
    out = Path(cfg.run.output_dir)
    state = json.loads((latest_checkpoint(out) / "driver.json").read_text())
    (drawn,) = state["episodes"]["steps"]
    assert latest_checkpoint(out).name == "step_000002" and drawn["step"] == 3
    train(_cfg(recipe_copy, out="b", run={"resume": "auto"}, **common), progress=False, runtime=local)
    assert _steps(out) == list(range(STEPS + 1))
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    step3 = {r["task_id"] for r in rollouts if r["split"] == "train" and r["step"] == 3}
    assert step3 == set(drawn["task_ids"]), "the in-flight draw of the checkpoint"
