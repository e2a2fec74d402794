"""Recipe keys of older layouts: each is refused, naming its new place (the migration table).

``RENAMED`` maps an old dotted key (list items as ``<i>``) to the key that replaced it; the
builder (``rl.config.fields.build``) names the new place when it meets an old key, with its YAML
line. ``OLD_NORMALIZATIONS``: the values of the moved ``mixer.normalization`` that were estimators of
their own, and the settings that give each now. An old key is not translated silently: a recipe
states its settings in today's words, and a test loads each old key's new place.
"""

from __future__ import annotations

from rl.config.fields import FieldError

__all__ = ["RENAMED", "OLD_NORMALIZATIONS", "refuse_old_normalization"]

# The flat layout before the nested one: an old key is refused, naming its new place.
RENAMED = {
    "algo.lr": "algo.optim.lr",
    "algo.weight_decay": "algo.optim.weight_decay",
    "algo.max_grad_norm": "algo.optim.max_grad_norm",
    "algo.lr_warmup_steps": "algo.optim.warmup_steps",
    "algo.lr_schedule": "algo.optim.schedule",
    "algo.lr_min_ratio": "algo.optim.min_lr_ratio",
    "algo.clip_low": "algo.loss.clip_low",
    "algo.clip_high": "algo.loss.clip_high",
    "algo.dual_clip": "algo.loss.dual_clip",
    "algo.tis_cap": "algo.loss.tis_cap",
    "algo.loss_agg": "algo.loss.agg",
    "algo.entropy_coef": "algo.loss.entropy_coef",
    "algo.kl_coef": "algo.kl.coef",
    "algo.kl_kind": "algo.kl.kind",
    "algo.kl_in_reward": "algo.kl.in_reward",
    "algo.kl_target": "algo.kl.target",
    "algo.kl_horizon": "algo.kl.horizon",
    "algo.epochs": "algo.update.epochs",
    "algo.minibatches": "algo.update.minibatches",
    "algo.zero_variance": "algo.update.zero_variance",
    "algo.critic": "algo.critic.model",
    "algo.critic_lr": "algo.critic.lr",
    "algo.vf_coef": "algo.critic.vf_coef",
    "algo.value_clip": "algo.critic.value_clip",
    "algo.gamma": "algo.returns.gamma",
    "algo.lam": "algo.returns.lam",
    "algo.micro_batch_tokens": "learner.micro_batch_tokens",
    "algo.share_prompt": "learner.share_prompt",
    "algo.learner_workers": "learner.workers",
    "mixer.normalization": "algo.reward_norm.mode",
    "mixer.norm_stat": "algo.reward_norm.stat",
    "mixer.norm_ema": "algo.reward_norm.ema",
    "rollout.async_steps": "rollout.max_staleness",  # same values: 0 synchronous, 1 one-step-off
}
# Values of mixer.normalization that were estimators of their own, and what gives them now.
OLD_NORMALIZATIONS = {
    "group": "algo.name: grpo with algo.reward_norm.mode: none (GRPO's group z-score)",
    "domain_then_group": "algo.reward_norm.mode: domain with algo.name: dr_grpo (group baseline, domain scale)",
    "domain": "algo.reward_norm.mode: domain (the estimator then runs on the normalized rewards)",
}


def refuse_old_normalization(raw: dict) -> None:
    """``mixer.normalization`` moved, and two of its values were estimators of their own: name what gives each now."""
    old = raw["mixer"].get("normalization") if isinstance(raw.get("mixer"), dict) else None
    if old is not None:
        then = f"; for {old!r} use {OLD_NORMALIZATIONS[old]}" if old in OLD_NORMALIZATIONS else ""
        raise FieldError(
            "mixer.normalization", f"recipe key 'mixer.normalization' moved to 'algo.reward_norm.mode'{then}"
        )
