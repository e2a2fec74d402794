"""Driver-level resume: a run that stopped after its step-2 checkpoint, resumed with
``run.resume=auto``, logs for steps 3-4 exactly what the uninterrupted run logged
(deterministic mode: fp32 engine and learner, per-request sampling seeds)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _recipe(recipe_copy, out: Path) -> Path:
    def edit(d: dict) -> None:
        d["run"].update(save_every=2, keep_checkpoints=3)
        d["model"].update(engine_dtype="float32", autocast=False)
        d["train"].update(steps=4)
        d["wandb"]["mode"] = "disabled"
        # A reward with variance on the random model, so that the updates are not all zero.
        d["rewards"].append({"cls": "rewards.format.OverlongPenalty", "weight": 1.0, "domains": ["tool_call"],
                             "kwargs": {"max_tokens": 24, "buffer_tokens": 20}})

    return recipe_copy("tiny.yaml", out=out.name, filename=f"{out.name}.yaml", edit=edit)


def _run(recipe: Path, *overrides: str) -> None:
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run([str(exe), "train", str(recipe), *overrides], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "WANDB_MODE": "disabled"})
    assert r.returncode == 0, r.stderr[-3000:]


def _steps(path: Path) -> dict[int, dict]:
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        # Wall-clock measurements differ between any two runs; everything else must not.
        out[rec["step"]] = {k: v for k, v in rec.items() if not k.startswith("timing/") and not k.endswith("latency_s")}
    return out


def test_resume_auto_continues_exactly(tmp_path: Path, recipe_copy) -> None:
    a = tmp_path / "a"
    _run(_recipe(recipe_copy, a))
    full = _steps(a / "metrics.jsonl")
    assert sorted(full) == [0, 1, 2, 3, 4]
    assert any(v["grad/norm"] > 0 for s, v in full.items() if s)

    # The same run "killed" after its step-3 log: the step-4 checkpoint never happened.
    b = tmp_path / "b"
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step_000004")
    (b / "DONE").unlink()
    lines = (b / "metrics.jsonl").read_text().splitlines()
    (b / "metrics.jsonl").write_text("\n".join(lines[:4]) + "\n" + lines[4][:20])  # step 3 logged, a torn line
    _run(_recipe(recipe_copy, b), "run.resume=auto")
    resumed = _steps(b / "metrics.jsonl")
    assert sorted(resumed) == [0, 1, 2, 3, 4], "each step once"
    for step in (3, 4):
        # Rewards, losses, KL, gradient norms, counts: identical. The engine-vs-learner logprob gap
        # (~2e-7 here) moves by ~1e-9 with vLLM's fp32 kernel noise, hence the absolute tolerance.
        assert resumed[step] == pytest.approx(full[step], rel=0, abs=1e-8), f"step {step} differs after resume"
        exact = {k for k in full[step] if k.startswith(("reward/", "loss/", "kl/", "grad/", "eval/reward/", "rollout/tokens"))}
        assert {k: resumed[step][k] for k in exact} == {k: full[step][k] for k in exact}
    discarded = [json.loads(x)["step"] for x in (b / "metrics.discarded.jsonl").read_text().splitlines()]
    assert discarded == [3], "the step logged after the last checkpoint is kept aside, not lost"
    assert (b / "DONE").is_file()


def test_second_run_into_same_dir_is_refused(tmp_path: Path, recipe_copy) -> None:
    out = tmp_path / "x"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run([str(exe), "train", str(_recipe(recipe_copy, out))], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "already holds a run" in r.stderr and "run.resume=auto" in r.stderr
