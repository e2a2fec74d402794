"""Nothing lost on resume with the bounded-staleness stream: ``jointrl train --local`` with
``rollout.max_staleness: 2`` SIGKILLed once step 3 is logged (the step-2 checkpoint holds steps 3 and 4,
drawn and untrained, some groups finished), then resumed with ``run.resume=auto``: every drawn group is
trained once or counted dropped, none twice; the checkpoint's finished groups are trained as they were
generated, the others on the same tasks and seeds. With partial rollouts (``rollout.partial_rollouts``) too: the
engines' version count after the resume is the stream's, so every token generated after it records a version
at least the checkpoint's step (and none newer than the learner that trains it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from rl.driver.buffer import load_done

pytestmark = pytest.mark.slow

STEPS, PROMPTS, GROUP = 6, 4, 4
_ENV = {**os.environ, "WANDB_MODE": "disabled"}


def _recipe(recipe_copy, partial: bool) -> Path:
    def edit(d: dict) -> None:
        d["run"].update(save_every=2, keep_checkpoints=5, rollouts_every=1)
        d["rollout"].update(max_staleness=2, prompts_per_step=PROMPTS, group_size=GROUP, partial_rollouts=partial)
        d["algo"]["loss"].update(tis_cap=2.0)
        d["data"]["eval_files"] = []
        d["train"].update(steps=STEPS)
        d["wandb"]["mode"] = "disabled"

    return recipe_copy("tiny.yaml", edit=edit)


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _kill_after_step_3(recipe: Path, out: Path) -> None:
    exe = Path(sys.executable).with_name("jointrl")
    proc = subprocess.Popen(
        [str(exe), "train", "--local", str(recipe)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_ENV,
        start_new_session=True,
    )
    deadline = time.monotonic() + 500
    try:
        while 3 not in {r.get("step") for r in _rows(out / "metrics.jsonl")}:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no step 3 logged: {proc.stderr.read().decode()[-3000:]}")
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)  # no cleanup code runs (nothing to kill if it ended on its own)
        proc.wait(timeout=30)


@pytest.mark.parametrize("partial", [False, True], ids=["whole", "partial"])
def test_a_sigkilled_streaming_run_resumes_each_drawn_group_once(recipe_copy, partial: bool) -> None:
    recipe = _recipe(recipe_copy, partial)
    out = recipe.parent / "out"
    _kill_after_step_3(recipe, out)
    assert not (out / "DONE").exists()
    state = json.loads((out / "checkpoints" / "step_000002" / "driver.json").read_text())["episodes"]
    drawn = {s["step"]: s for s in state["steps"]}
    assert sorted(drawn) == [3, 4], "k = 2: steps 3 and 4 drawn at step 2's end"

    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run(
        [str(exe), "train", "--local", str(recipe), "run.resume=auto"],
        capture_output=True,
        text=True,
        timeout=600,
        env=_ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "DONE").is_file()
    metrics = {m["step"]: m for m in _rows(out / "metrics.jsonl")}
    assert sorted(s for s in metrics if s >= 1) == list(range(1, STEPS + 1)), "each step logged once"
    rows = [x for x in _rows(out / "rollouts.jsonl") if x["split"] == "train"]
    per_group = Counter((x["step"], x["group"]) for x in rows)
    for step in range(1, STEPS + 1):
        trained = {g for (s, g) in per_group if s == step}
        dropped = metrics[step].get("async/dropped_groups", 0.0)
        assert len(trained) + dropped == PROMPTS, f"step {step}: every drawn group trained once or dropped"
        assert all(per_group[(step, g)] == GROUP for g in trained), f"step {step}: a group trained twice or split"
        assert metrics[step]["async/staleness_max"] <= 2
    for step, s in drawn.items():
        got = {x["group"]: x["task_id"] for x in rows if x["step"] == step}
        assert got == {g: tid for g, tid in enumerate(s["task_ids"]) if g in got}, "the checkpoint's draw"
    # The checkpoint's finished groups: trained as they were generated, not generated again.
    for step, s in drawn.items():
        for g, (trajs, _) in load_done(s["done"]).items():
            resumed = sorted(x["response"] for x in rows if x["step"] == step and x["group"] == g)
            assert resumed == sorted(t.completion for t in trajs), f"step {step} group {g}"
    if partial:
        _check_versions_after_resume(rows, drawn, resumed_at=2)


def _check_versions_after_resume(rows: list[dict], drawn: dict[int, dict], resumed_at: int) -> None:
    """Groups generated after the resume (all but the checkpoint's finished ones): every token's version is at
    least the checkpoint's step and at most the training learner's (``step - 1``)."""
    kept = {(step, g) for step, s in drawn.items() for g in load_done(s["done"])}
    after = [x for x in rows if x["step"] > resumed_at and (x["step"], x["group"]) not in kept]
    assert after, "nothing generated after the resume"
    for x in after:
        assert resumed_at <= x["oldest_version"] <= x["newest_version"] <= x["step"] - 1, x
