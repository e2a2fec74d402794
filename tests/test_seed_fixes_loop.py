"""The seed-divergence keys (``mixer.min_groups_per_domain``, ``algo.reward_norm.prior_samples``) through the
whole training loop on the in-process runtime: the run logs the floor's draws and the prior's std."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rl.config.recipe import load_recipe, validate_recipe
from rl.driver.local_runtime import LocalRuntime
from rl.driver.loop import train


def _local(cfg, model_path, out, verbose):
    return LocalRuntime(cfg, model_path, out, verbose)


def test_floor_and_prior_reach_the_run(tmp_path: Path, recipe_copy) -> None:
    def edit(d: dict) -> None:
        d["wandb"] = {"mode": "disabled"}
        d["model"].update(engine_dtype="float32", autocast=False)
        d["run"]["threads"] = 1
        d["rollout"].update(prompts_per_step=3, group_size=4, max_new_tokens=8)
        d["data"]["eval_limit"] = 2
        d["train"] = {"steps": 2, "eval_at_start": False}
        d["mixer"] = {"min_groups_per_domain": 3}
        d["algo"] = {"name": "dr_grpo", "optim": {"lr": 1e-3}, "reward_norm": {"mode": "domain", "prior_samples": 8}}

    cfg = load_recipe(recipe_copy("tiny.yaml", out="out", filename="r.yaml", edit=edit))
    validate_recipe(cfg)
    out = train(cfg, progress=False, runtime=_local)
    steps = {m["step"]: m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    rewards = [
        r["reward"]
        for r in map(json.loads, (out / "rollouts.jsonl").read_text().splitlines())
        if r["split"] == "train" and r["step"] == 1
    ]
    assert steps[1]["mixer/tool_call/count"] == 3.0 and len(rewards) == 12
    mean = sum(rewards) / 12
    m2 = sum((r - mean) ** 2 for r in rewards)
    # Welford with 8 pseudo-rewards of std 0.5: (M2 + 8 * 0.25) / (12 - 1 + 8)
    assert steps[1]["reward/tool_call/running_std"] == pytest.approx(math.sqrt((m2 + 2.0) / 19))
