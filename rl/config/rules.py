"""The rules that span sections of a recipe, in one place: ``cross_section_rules``.

Each rule yields ``(key, message)`` naming the key to blame; ``validate_recipe`` reports the first.
They need nothing outside the recipe but the estimator and policy-loss registries (``algo.name``
and ``algo.loss.policy`` name entries of them): what an estimator needs (a group size, outcome or
learner-side advantages, a critic) is asked of its object, never compared by name. An estimator's
own settings, and a policy loss's, need no rule here: they exist only in its arm of the ``algo`` union or
of the ``algo.loss`` union (``rl/config/algo.py``).
"""

from __future__ import annotations

from typing import Any, Iterator

from rl.config.algo import LossConfig, UserAlgoConfig
from rl.config.schema import Recipe

__all__ = ["cross_section_rules"]


def _policy_loss_rules(loss: LossConfig) -> Iterator[tuple[str, str]]:
    """``algo.loss.policy`` names a policy loss that its settings build (a loss's own keys, ``kwargs`` among
    them, are checked by its arm of the ``algo.loss`` union when the recipe loads)."""
    from rl.algos.policy_losses import PolicyLossError, get_policy_loss

    try:
        get_policy_loss(loss)
    except PolicyLossError as e:
        yield e.key, str(e)


def cross_section_rules(recipe: Recipe) -> Iterator[tuple[str, str]]:
    """``(key, message)`` for each broken rule that spans sections, in order; the one place for them."""
    from rl.algos.estimators import EstimatorError, get_estimator

    try:
        est = get_estimator(recipe.algo)
    except EstimatorError as e:
        yield e.key, str(e)
        return
    yield from _policy_loss_rules(recipe.algo.loss)
    yield from _estimator_rules(recipe, est)
    yield from _domain_rules(recipe)
    yield from _partial_rollout_rules(recipe)
    critic = getattr(recipe.algo, "critic", None)  # only the arms of estimators with a critic have one
    if recipe.learner.lora.rank > 0 and est.needs_critic and critic is not None and critic.model == "separate":
        yield "learner.lora.rank", "LoRA with a separate critic is not supported (use algo.critic.model: value_head)"
    if not recipe.data.train_files and not recipe.data.train_datasets:
        yield "data.train_files", "at least one task file (or data.train_datasets entry) is needed"
    if not recipe.rewards:
        yield "rewards", "at least one reward class is needed"


def _partial_rollout_rules(recipe: Recipe) -> Iterator[tuple[str, str]]:
    """``rollout.partial_rollouts`` interrupts generations at weight updates made while they run."""
    r = recipe.rollout
    if not r.partial_rollouts:
        return
    if not r.async_steps:
        yield (
            "rollout.partial_rollouts",
            "interrupts generations at a weight update made while they run; with rollout.async_steps 0 no update "
            "happens during generation: set async_steps 1, or partial_rollouts false",
        )
    if recipe.learner.routing_replay == "r3":
        yield (
            "rollout.partial_rollouts",
            "a resumed turn's routing is recomputed on the new weights, not the routing its kept tokens were "
            "sampled with, which learner.routing_replay r3 replays: use r2 or none, or partial_rollouts false",
        )


def _estimator_rules(recipe: Recipe, est: Any) -> Iterator[tuple[str, str]]:
    """What the estimator needs of the batch (group size, minibatches, steps) and of the advantages."""
    r, a = recipe.rollout, recipe.algo
    if r.group_size < est.min_group_size:
        yield "rollout.group_size", f"{a.name} needs a group of at least {est.min_group_size} samples"
    n = r.prompts_per_step * r.group_size
    if a.update.minibatches > n:
        yield (
            "algo.update.minibatches",
            (
                f"{a.update.minibatches} minibatches from batches of {n} samples "
                "(rollout.prompts_per_step x rollout.group_size) would leave some empty"
            ),
        )
    if a.optim.schedule == "cosine" and recipe.train.steps == 0:
        yield "algo.optim.schedule", "cosine decays over the run's optimizer steps; train.steps is 0 (use constant)"
    # Both act on outcome advantages computed before the learner; the learner computes them
    # itself for a critic (GAE) or for a per-token KL penalty in the reward.
    why = (
        f"{a.name!r} computes its advantages in the learner (GAE on the critic)"
        if est.needs_critic
        else "algo.kl.in_reward puts a per-token KL penalty in the reward, so the learner computes the advantages"
    )
    if a.reward_norm.mode != "none" and est.learner_advantages(a):
        yield "algo.reward_norm.mode", f"per-domain normalization shapes outcome rewards before the estimator; {why}"
    if recipe.mixer.seq_level_domains and est.learner_advantages(a):
        yield "mixer.seq_level_domains", f"rescales outcome advantages per sequence; {why}, so it would be ignored"
    if isinstance(a, UserAlgoConfig):
        yield from _user_estimator_sections(a, est)


def _user_estimator_sections(a: UserAlgoConfig, est: Any) -> Iterator[tuple[str, str]]:
    """A user estimator reads ``algo.critic`` and ``algo.returns`` only when its class lists them in
    ``sections``; set for one that does not, they would be ignored."""
    default = UserAlgoConfig(name=a.name)
    for f in ("critic", "returns"):
        if f not in est.sections and getattr(a, f) != getattr(default, f):
            yield (
                f"algo.{f}",
                f"{a.name} does not read it (its class lists {list(est.sections)} in `sections`)",
            )


def _domain_rules(recipe: Recipe) -> Iterator[tuple[str, str]]:
    """The mixer's domains are served by ``rollout.envs``, and the adaptive bounds fit them."""
    mx = recipe.mixer
    domains = {e.domain for e in recipe.rollout.envs}
    for key, used in (("mixer.domain_weights", mx.domain_weights), ("mixer.seq_level_domains", mx.seq_level_domains)):
        bad = sorted(set(used) - domains)
        if bad:
            yield key, f"domains {bad} have no env in rollout.envs"
    if mx.min_groups_per_domain:
        weighted = (
            sorted(domains)
            if mx.mode == "adaptive" or not mx.domain_weights
            else sorted(d for d, w in mx.domain_weights.items() if w > 0)
        )
        need = mx.min_groups_per_domain * len(weighted)
        if need > recipe.rollout.prompts_per_step:
            yield (
                "mixer.min_groups_per_domain",
                f"{mx.min_groups_per_domain} prompts for each of {len(weighted)} domains ({', '.join(weighted)}) is "
                f"{need} per step; rollout.prompts_per_step is {recipe.rollout.prompts_per_step}",
            )
    if mx.mode == "adaptive":
        try:
            mx.adaptive.bounds(sorted(domains))
        except ValueError as e:
            yield "mixer.adaptive", str(e).removeprefix("mixer.adaptive: ")
