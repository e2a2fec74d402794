"""Advantage estimators as registered objects: GRPO, Dr.GRPO, RLOO, REINFORCE++ and PPO (GAE).

Each estimator is one small class that declares what it needs and computes its advantages
with the pure tensor functions of ``rl.algos.advantages``:

* ``needs_critic``: the learner keeps a value model (``algo.critic``) and computes GAE;
* ``needs_reference(algo)``: the learner keeps a frozen reference model (``algo.kl.coef > 0``);
* ``sections``: the ``algo`` sub-sections it reads besides the shared ones (a recipe that sets
  ``algo.critic`` or ``algo.returns`` for an estimator that ignores them is refused);
* ``default_agg``: the loss aggregation ``algo.loss.agg: auto`` stands for;
* ``min_group_size``: the smallest group its baseline is defined on (RLOO: 2);
* ``learner_advantages(algo)``: whether the advantages need the learner's models (a critic, or
  the reference model for ``algo.kl.in_reward``), or come from rewards alone (``build_batch``).

The batch builder, the learner and the recipe checks ask the object; none compares names.
Registering by name: decorate a subclass with :func:`register`. A user estimator from its own
package: ``algo.name: mypkg.mymodule.MyEstimator`` (a subclass of :class:`Estimator`), built
with ``algo.kwargs`` as constructor keyword arguments (see docs/algorithms.md).

What this module does not do: reward shaping (``rl.algos.shaping`` runs before the
estimator), losses (``rl.algos.losses``), or anything with models: the learner passes in the
tensors (values, KL penalties) it computed.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch

from rl.algos.advantages import gae, group_normalized, reinforce_pp, whiten
from rl.algos.registry import resolve_class

__all__ = [
    "Estimator",
    "EstimatorError",
    "register",
    "estimator_class",
    "get_estimator",
    "ESTIMATORS",
    "GRPO",
    "DrGRPO",
    "RLOO",
    "ReinforcePP",
    "PPO",
]

ReduceSum = Callable[[torch.Tensor], torch.Tensor]


class EstimatorError(ValueError):
    """``algo.name`` names no estimator (or a class that is not one), or ``algo.kwargs`` do not fit it."""

    def __init__(self, msg: str, key: str = "algo.name") -> None:
        super().__init__(msg)
        self.key = key  # the recipe key to blame


class Estimator:
    """Base class: the declarations and the two ways to compute advantages.

    ``outcome`` gives per-sequence advantages from scalar rewards (used when
    ``learner_advantages`` is false); ``token_advantages`` gives per-token advantages in the
    learner, with a per-token KL penalty and/or critic values.
    """

    name: ClassVar[str] = ""
    needs_critic: ClassVar[bool] = False
    sections: ClassVar[tuple[str, ...]] = ()
    default_agg: ClassVar[str] = "token-mean"
    min_group_size: ClassVar[int] = 1

    def __init__(self, algo: Any) -> None:
        self.algo = algo

    def learner_advantages(self, algo: Any | None = None) -> bool:
        """Whether the learner (not ``build_batch``) computes the advantages."""
        a = algo if algo is not None else self.algo
        return self.needs_critic or bool(a.kl.in_reward)

    def needs_reference(self, algo: Any | None = None) -> bool:
        """Whether the learner keeps a frozen reference model (a KL term, in the loss or in the reward)."""
        a = algo if algo is not None else self.algo
        return a.kl.coef > 0

    def outcome(self, scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Per-sequence advantages. Shapes: ``scores`` float [B], ``group_ids`` long [B] -> [B]."""
        raise NotImplementedError(f"{type(self).__name__} has no outcome-only advantages")

    def token_advantages(
        self,
        scores: torch.Tensor,
        group_ids: torch.Tensor,
        mask: torch.Tensor,
        kl_penalty: torch.Tensor | None,
        values: torch.Tensor | None,
        reduce_sum: ReduceSum | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Learner-side advantages. Shapes: ``scores`` [B], ``group_ids`` [B], ``mask`` bool [B, T],
        ``kl_penalty`` [B, T] (``-coef * kl`` per token, or None), ``values`` [B, T] (critic, or None)
        -> ``(advantages [B, T], returns [B, T] or None)``; 0 off the mask.

        Default (group and batch baselines): the KL penalty summed per sequence joins the
        outcome reward, then :meth:`outcome` and a broadcast over the masked tokens.
        """
        seq = scores if kl_penalty is None else scores + kl_penalty.sum(dim=1)
        per_seq = self.outcome(seq, group_ids)
        return torch.where(mask, per_seq[:, None].to(torch.float32), 0.0), None


ESTIMATORS: dict[str, type[Estimator]] = {}


def register(cls: type[Estimator]) -> type[Estimator]:
    """Class decorator: make ``cls`` choosable as ``algo.name: <cls.name>``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a class attribute `name` to be registered")
    ESTIMATORS[cls.name] = cls
    return cls


@register
class GRPO(Estimator):
    """Group z-score: ``(r - mean_g) / (std_g + eps)`` per group of samples of one prompt."""

    name = "grpo"

    def outcome(self, scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return group_normalized(scores, group_ids, std_normalize=True)


@register
class DrGRPO(Estimator):
    """Dr.GRPO (Liu et al. 2025): the group mean as baseline, no std division, and token losses summed
    per sequence over a constant normalizer (``seq-mean-token-sum-norm``: no length bias)."""

    name = "dr_grpo"
    default_agg = "seq-mean-token-sum-norm"

    def outcome(self, scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return group_normalized(scores, group_ids, std_normalize=False)


@register
class RLOO(Estimator):
    """Leave-one-out baseline: ``r_i - mean of the other members``; groups need 2 or more samples."""

    name = "rloo"
    min_group_size = 2

    def outcome(self, scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return group_normalized(scores, group_ids, leave_one_out=True)


@register
class ReinforcePP(Estimator):
    """REINFORCE++: batch-normalised outcome; with a per-token KL penalty, the discounted return-to-go
    (``algo.returns.gamma``) whitened over the batch."""

    name = "reinforce_pp"
    sections = ("returns",)

    def outcome(self, scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return reinforce_pp(scores, torch.ones(len(scores), 1, dtype=torch.bool, device=scores.device))[:, 0]

    def token_advantages(self, scores, group_ids, mask, kl_penalty, values, reduce_sum=None):
        adv = reinforce_pp(scores, mask, token_rewards=kl_penalty, gamma=self.algo.returns.gamma, reduce_sum=reduce_sum)
        return adv, None


@register
class PPO(Estimator):
    """PPO with a critic: GAE (``algo.returns.gamma``, ``lam``) on the outcome reward at the last
    policy token plus the per-token KL penalty, whitened over the batch."""

    name = "ppo"
    needs_critic = True
    sections = ("critic", "returns")

    def token_advantages(self, scores, group_ids, mask, kl_penalty, values, reduce_sum=None):
        if values is None:
            raise ValueError("PPO needs the critic's values")
        B, T = mask.shape
        rewards = kl_penalty.clone() if kl_penalty is not None else torch.zeros(B, T, device=mask.device)
        pos = torch.arange(T, device=mask.device).expand(B, T)
        last = torch.where(mask, pos, -1).amax(dim=1) if T else torch.zeros(B, dtype=torch.long, device=mask.device)
        rewards = rewards + torch.where(mask & (pos == last[:, None]), scores[:, None].to(rewards.dtype), 0.0)
        r = self.algo.returns
        adv, returns = gae(rewards, values, mask, r.gamma, r.lam)
        return whiten(adv, mask, shift_mean=True, reduce_sum=reduce_sum), returns


def estimator_class(name: str) -> type[Estimator]:
    """The class ``name`` stands for: a registered name, or a dotted path ``pkg.module.Class``."""
    unknown = (
        f"unknown algorithm {name!r}; choose one of {', '.join(ESTIMATORS)}, "
        "or a dotted path pkg.module.Class of an Estimator subclass"
    )
    return resolve_class(name, ESTIMATORS, Estimator, EstimatorError, unknown)


def get_estimator(algo: Any) -> Estimator:
    """The estimator object of ``algo`` (an ``AlgoConfig``); ``algo.kwargs`` go to a user estimator."""
    cls = estimator_class(algo.name)
    kwargs = getattr(algo, "kwargs", {})  # only an estimator named by dotted path has algo.kwargs
    if kwargs and algo.name in ESTIMATORS:
        raise EstimatorError(
            f"algo.kwargs are for an estimator named by dotted path; {algo.name!r} takes its "
            f"settings from algo.* sections",
            key="algo.kwargs",
        )
    try:
        return cls(algo, **kwargs)
    except TypeError as e:
        raise EstimatorError(f"algo.kwargs do not match {algo.name}'s constructor: {e}", key="algo.kwargs") from None
