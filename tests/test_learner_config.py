"""The learner's recipe keys (``algo.*``): validation names the key, and the shipped recipes keep GRPO's defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rl.config.recipe import AlgoConfig, RecipeError, load_recipe, validate_recipe

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tiny(recipe_copy):
    return recipe_copy("tiny.yaml", filename="r.yaml")


@pytest.mark.parametrize("overrides, key, words", [
    (["algo.name=a2c"], "algo.name", "reinforce_pp, ppo"),
    (["algo.critic=shared"], "algo.critic", "value_head, separate"),
    (["algo.dual_clip=0.5"], "algo.dual_clip", "> 1"),
    (["algo.lr_schedule=linear"], "algo.lr_schedule", "constant, cosine"),
    (["algo.lr_min_ratio=2"], "algo.lr_min_ratio", "[0, 1]"),
    (["algo.kl_coef=0", "algo.kl_in_reward=true"], "algo.kl_in_reward", "kl_coef > 0"),
    (["algo.kl_coef=0", "algo.kl_target=0.1"], "algo.kl_target", "kl_coef > 0"),
    (["algo.kl_target=-1"], "algo.kl_target", ">= 0"),
    (["algo.epochs=0"], "algo.epochs", ">= 1"),
    (["algo.minibatches=0"], "algo.minibatches", ">= 1"),
    (["algo.minibatches=17"], "algo.minibatches", "16 samples"),  # tiny: 4 prompts x 4 samples
    (["algo.learner_workers=0"], "algo.learner_workers", ">= 1"),
    (["algo.kl_horizon=0"], "algo.kl_horizon", ">= 1"),
    (["algo.gamma=1.5"], "algo.gamma", "[0, 1]"),
    (["algo.lam=-0.1"], "algo.lam", "[0, 1]"),
    (["algo.entropy_coef=-0.1"], "algo.entropy_coef", ">= 0"),
    (["algo.vf_coef=-1"], "algo.vf_coef", ">= 0"),
    (["algo.value_clip=-0.2"], "algo.value_clip", ">= 0"),
    (["algo.critic_lr=-1"], "algo.critic_lr", ">= 0"),
    (["algo.lr_warmup_steps=-1"], "algo.lr_warmup_steps", ">= 0"),
])
def test_bad_algo_values_name_the_key(tiny: Path, overrides, key, words):
    cfg = load_recipe(tiny, overrides)
    with pytest.raises(RecipeError) as e:
        validate_recipe(cfg, check_imports=False)
    msg = str(e.value)
    assert f": {key}: " in msg and words in msg, msg
    assert "r.yaml:" in msg  # with the line of the key in the recipe


def test_good_learner_settings_validate(tiny: Path):
    cfg = load_recipe(tiny, ["algo.name=ppo", "algo.critic=separate", "algo.kl_in_reward=true", "algo.kl_target=0.05",
                             "algo.epochs=2", "algo.minibatches=4", "algo.lr_schedule=cosine", "algo.dual_clip=3",
                             "algo.learner_workers=2"])
    validate_recipe(cfg, check_imports=False)


@pytest.mark.parametrize("name", ["quickstart.yaml", "tiny.yaml"])
def test_quickstart_and_tiny_keep_the_grpo_path(name: str):
    # The new keys must not change the GRPO quickstart: one optimizer step per batch, KL in the
    # loss with a fixed coefficient, no entropy bonus, no dual clip, constant lr, one learner.
    a = load_recipe(REPO / "recipes" / name).algo
    d = AlgoConfig()
    assert a.name == "grpo" and (a.epochs, a.minibatches, a.learner_workers) == (1, 1, 1)
    assert (a.kl_in_reward, a.kl_target, a.entropy_coef, a.dual_clip) == (False, 0.0, 0.0, 0.0)
    assert (a.lr_warmup_steps, a.lr_schedule) == (0, "constant") and a.share_prompt
    assert dataclasses.replace(a, lr=d.lr, kl_coef=d.kl_coef, zero_variance=d.zero_variance) == d
