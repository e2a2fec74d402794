"""The learner's recipe keys (``algo.*``, ``learner.*``): validation names the key, and the shipped recipes keep GRPO's defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rl.config.recipe import AlgoConfig, RecipeError, load_recipe, validate_recipe

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tiny(recipe_copy):
    return recipe_copy("tiny.yaml", filename="r.yaml")


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (["algo.name=a2c"], "algo.name", "reinforce_pp, ppo"),
        (["algo.name=ppo", "algo.critic.model=shared"], "algo.critic.model", "value_head, separate"),
        (["algo.loss.dual_clip=0.5"], "algo.loss.dual_clip", "> 1"),
        (["algo.optim.schedule=linear"], "algo.optim.schedule", "constant, cosine"),
        (["algo.optim.min_lr_ratio=2"], "algo.optim.min_lr_ratio", "[0, 1]"),
        (["algo.kl.coef=0", "algo.kl.in_reward=true"], "algo.kl.in_reward", "kl.coef > 0"),
        (["algo.kl.coef=0", "algo.kl.target=0.1"], "algo.kl.target", "kl.coef > 0"),
        (["algo.kl.target=-1"], "algo.kl.target", ">= 0"),
        (["algo.update.epochs=0"], "algo.update.epochs", ">= 1"),
        (["algo.update.minibatches=0"], "algo.update.minibatches", ">= 1"),
        (["algo.update.minibatches=17"], "algo.update.minibatches", "16 samples"),  # tiny: 4 prompts x 4 samples
        (["learner.workers=0"], "learner.workers", ">= 1"),
        (["algo.kl.horizon=0"], "algo.kl.horizon", ">= 1"),
        (["algo.name=ppo", "algo.returns.gamma=1.5"], "algo.returns.gamma", "[0, 1]"),
        (["algo.name=ppo", "algo.returns.lam=-0.1"], "algo.returns.lam", "[0, 1]"),
        (["algo.loss.entropy_coef=-0.1"], "algo.loss.entropy_coef", ">= 0"),
        (["algo.name=ppo", "algo.critic.vf_coef=-1"], "algo.critic.vf_coef", ">= 0"),
        (["algo.name=ppo", "algo.critic.value_clip=-0.2"], "algo.critic.value_clip", ">= 0"),
        (["algo.name=ppo", "algo.critic.lr=-1"], "algo.critic.lr", ">= 0"),
        (["algo.optim.warmup_steps=-1"], "algo.optim.warmup_steps", ">= 0"),
    ],
)
def test_bad_algo_values_name_the_key(tiny: Path, overrides, key, words):
    with pytest.raises(RecipeError) as e:
        validate_recipe(load_recipe(tiny, overrides), check_imports=False)
    msg = str(e.value)
    assert f": {key}: " in msg and words in msg, msg
    assert "r.yaml:" in msg  # with the line of the key in the recipe


def test_good_learner_settings_validate(tiny: Path):
    cfg = load_recipe(
        tiny,
        [
            "algo.name=ppo",
            "algo.critic.model=separate",
            "algo.kl.in_reward=true",
            "algo.kl.target=0.05",
            "algo.update.epochs=2",
            "algo.update.minibatches=4",
            "algo.optim.schedule=cosine",
            "algo.loss.dual_clip=3",
            "learner.workers=2",
        ],
    )
    validate_recipe(cfg, check_imports=False)


@pytest.mark.parametrize("name", ["quickstart.yaml", "tiny.yaml"])
def test_quickstart_and_tiny_keep_the_grpo_path(name: str):
    # The new keys must not change the GRPO quickstart: one optimizer step per batch, KL in the
    # loss with a fixed coefficient, no entropy bonus, no dual clip, constant lr, one learner.
    cfg = load_recipe(REPO / "recipes" / name)
    a, d = cfg.algo, AlgoConfig()
    assert a.name == "grpo" and (a.update.epochs, a.update.minibatches, cfg.learner.workers) == (1, 1, 1)
    assert (a.kl.in_reward, a.kl.target, a.loss.entropy_coef, a.loss.dual_clip) == (False, 0.0, 0.0, 0.0)
    assert (a.optim.warmup_steps, a.optim.schedule) == (0, "constant") and cfg.learner.share_prompt
    assert a.loss.agg == "token-mean"  # GRPO's own aggregation, resolved from `auto`
    assert (
        dataclasses.replace(
            a, optim=d.optim, kl=dataclasses.replace(a.kl, coef=d.kl.coef), update=d.update, loss=d.loss
        )
        == d
    )
