"""Policy losses as registered objects: PPO's clipped surrogate (clip-higher, dual clip, truncated IS),
GSPO's sequence-level ratio and CISPO's clipped stop-gradient IS weight.

Each loss is a small class that declares what it needs and is called on a typed :class:`LossInputs`:

* ``needs``: what the learner computes for it beyond the always-present ones (the policy's and the old
  log-probs, the advantages, the mask): ``"engine_logprobs"`` (the sampling engine's log-probs of the
  tokens, for importance weights against the behaviour policy), ``"entropy"`` (the per-token entropy,
  differentiable, for a loss that adds an entropy term of its own), ``"ref_logprobs"`` (the frozen
  reference's log-probs: the learner then keeps a reference model) and ``"aux_loss"`` (the model's auxiliary
  loss from its outputs, an MoE's router load balancing, ``rl.algos.router``: the trunk then returns its
  router logits). The learner computes nothing else;
* ``no_gradient_at_zero_advantage``: every term of the loss is proportional to the advantage, so a sample
  whose advantage is exactly 0 has exactly no gradient and ``build_batch`` may skip its forward and backward
  (False by default: a loss that adds a term of its own, an entropy or a reference pull, trains every sample);
* ``stat_names``: the token-mean statistics it reports (metric keys), in order; the learner sums
  ``value x tokens`` over micro-batches and ranks and logs their means;
* ``__call__(inputs) -> (loss, stats)``: a scalar to minimise (the micro-batch's part of the minibatch's
  loss: its denominators are in ``inputs``) and one float per name of ``stat_names``.

The learner adds the other terms of the objective (``algo.kl``, ``algo.loss.entropy_coef``, the value
loss, ``algo.loss.aux_coef``) itself (``rl.algos.objective``); a loss may return additional terms in its scalar (anything differentiable it computes
from its inputs). Chosen by ``algo.loss.policy``: a registered name or a dotted path
``pkg.module.Class`` of a :class:`PolicyLoss` subclass, built with ``algo.loss.kwargs`` (see
docs/algorithms.md). Pure tensor code: no models, no I/O, no distributed calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rl.algos.losses import LOG_RATIO_CLAMP, aggregate, policy_loss, truncated_is_weights
from rl.algos.registry import resolve_class

__all__ = [
    "LossInputs",
    "PolicyLoss",
    "PolicyLossError",
    "register",
    "loss_class",
    "get_policy_loss",
    "LOSSES",
    "NEEDS",
    "PPOClip",
    "GSPO",
    "CISPO",
]

NEEDS = frozenset({"engine_logprobs", "entropy", "ref_logprobs", "aux_loss"})


class PolicyLossError(ValueError):
    """``algo.loss.policy`` names no loss (or a class that is not one), or ``algo.loss.kwargs`` do not fit it."""

    def __init__(self, msg: str, key: str = "algo.loss.policy") -> None:
        super().__init__(msg)
        self.key = key  # the recipe key to blame


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch on its ``[B, T]`` response grid (B samples, T the longest response).

    ``logp`` (current policy, requires grad), ``old_logp`` (before this batch's updates, no grad),
    ``advantages``: float ``[B, T]``; ``mask``: bool ``[B, T]``, True on the policy tokens (a harness failure
    never gets here: ``build_batch`` drops it); ``engine_logp``, ``entropy`` and
    ``ref_logp`` ``[B, T]`` and ``aux_loss`` (a scalar with grad over the whole micro-batch, not yet weighted by its
    share of the minibatch): present when the loss ``needs`` them, else None. ``agg``, ``num_tokens``,
    ``num_seqs``, ``norm_tokens``: the aggregation and the minibatch's denominators
    (``rl.algos.losses.aggregate``), so micro-batch losses sum to the minibatch's exactly.
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    agg: str
    num_tokens: float
    num_seqs: float
    norm_tokens: int | None = None
    engine_logp: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None

    def aggregate(self, per_token: torch.Tensor) -> torch.Tensor:
        """``per_token`` [B, T] reduced with the recipe's aggregation and the minibatch's denominators."""
        return aggregate(
            per_token,
            self.mask,
            self.agg,
            num_tokens=self.num_tokens,
            num_seqs=self.num_seqs,
            norm_tokens=self.norm_tokens,
        )


class PolicyLoss:
    """Base class: the declarations; subclasses implement ``__call__``. ``loss`` is the recipe's
    ``algo.loss`` section (clip ranges, ``tis_cap``); ``kwargs`` are ``algo.loss.kwargs``."""

    name: ClassVar[str] = ""
    needs: ClassVar[frozenset[str]] = frozenset()
    no_gradient_at_zero_advantage: ClassVar[bool] = False

    def __init__(self, loss: Any) -> None:
        self.cfg = loss

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ()

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError


LOSSES: dict[str, type[PolicyLoss]] = {}


def register(cls: type[PolicyLoss]) -> type[PolicyLoss]:
    """Class decorator: make ``cls`` choosable as ``algo.loss.policy: <cls.name>``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a class attribute `name` to be registered")
    unknown = set(cls.needs) - NEEDS
    if unknown:
        raise ValueError(f"{cls.__name__}.needs: unknown {sorted(unknown)}; known: {sorted(NEEDS)}")
    LOSSES[cls.name] = cls
    return cls


class _TISLoss(PolicyLoss):
    """A loss with optional truncated IS (``algo.loss.tis_cap``): it needs the engine's log-probs only then."""

    needs = frozenset({"engine_logprobs"})

    def __init__(self, loss: Any) -> None:
        super().__init__(loss)
        self.needs = frozenset({"engine_logprobs"}) if loss.tis_cap else frozenset()


def _tis(x: LossInputs, cap: float) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Truncated IS weights ``min(exp(old - engine), cap)`` and their stats (None, {} when ``cap`` is 0)."""
    if not cap:
        return None, {}
    if x.engine_logp is None:
        raise ValueError("algo.loss.tis_cap > 0 needs the engine's log-probs (the loss must declare engine_logprobs)")
    return truncated_is_weights(x.old_logp, x.engine_logp, x.mask, cap)


@register
class PPOClip(_TISLoss):
    """PPO's clipped surrogate, ``rl.algos.losses.policy_loss``: per token ``max(-A r, -A clip(r, 1 - clip_low,
    1 + clip_high))`` with ``r = exp(logp - old_logp)``, dual clip ``min(., -A c)`` for ``A < 0`` (``dual_clip``),
    times the truncated IS weight ``min(exp(old - engine), tis_cap)`` when ``tis_cap > 0``; aggregated with
    ``algo.loss.agg``. Shapes as :class:`LossInputs`."""

    name = "ppo_clip"
    no_gradient_at_zero_advantage = True

    @property
    def stat_names(self) -> tuple[str, ...]:
        names = ("clip/fraction",)
        if self.cfg.dual_clip:
            names += ("clip/dual_fraction",)
        if self.cfg.tis_cap:
            names += ("is/weight_mean", "is/truncated_fraction")
        return names

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.cfg
        is_w, ist = _tis(x, c.tis_cap)
        loss, pst = policy_loss(
            x.logp,
            x.old_logp,
            x.advantages,
            x.mask,
            clip_low=c.clip_low,
            clip_high=c.clip_high,
            dual_clip=c.dual_clip or None,
            agg=x.agg,
            num_tokens=x.num_tokens,
            num_seqs=x.num_seqs,
            norm_tokens=x.norm_tokens,
            is_weights=is_w,
        )
        stats = {**pst, **ist}
        return loss, {k: stats[k] for k in self.stat_names}


def _seq_mean(values: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked mean of each row [B], whether the row has a masked token [B])."""
    n = m.sum(dim=1)
    s = torch.where(m, values, values.new_zeros(())).sum(dim=1)
    return s / n.clamp(min=1).to(values.dtype), n > 0


@register
class GSPO(PolicyLoss):
    """GSPO (Zheng et al., 2025): a sequence-level importance ratio, clipped per sequence.

    With ``m`` the mask ``[B, T]``, ``|y_i| = sum_t m_it`` and the sequence advantage ``A_i`` (the masked mean
    of ``advantages[i]``; GRPO's is constant over a row)::

        s_i  = exp( (1 / |y_i|) sum_t m_it (logp_it - old_logp_it) )                  [B]
        l_i  = max(-A_i s_i, -A_i clip(s_i, 1 - clip_low, 1 + clip_high))             [B]
        loss = sum_i l_i / num_seqs       (sequences with a masked token; sequence-level by definition)

    ``algo.loss.agg`` is not used: the loss is a mean over sequences. The paper's clip ranges are small
    (``clip_low: 3e-4``, ``clip_high: 4e-4``). The mean log-ratio is clamped to +-20 before ``exp``.
    Stats: ``clip/fraction``: fraction of sequences whose clipped branch is strictly larger, reported
    per token (the learner's token weighting) - each of a sequence's tokens carries its sequence's flag.
    """

    name = "gspo"
    no_gradient_at_zero_advantage = True

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("clip/fraction",)

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        m = x.mask
        lr = torch.where(m, x.logp - x.old_logp, x.logp.new_zeros(()))
        seq_lr, has = _seq_mean(lr, m)
        s = torch.exp(seq_lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        adv, _ = _seq_mean(x.advantages.to(x.logp.dtype), m)
        l1 = -adv * s
        l2 = -adv * s.clamp(1.0 - self.cfg.clip_low, 1.0 + self.cfg.clip_high)
        per_seq = torch.where(has, torch.maximum(l1, l2), l1.new_zeros(()))
        loss = per_seq.sum() / max(float(x.num_seqs), 1.0)
        with torch.no_grad():
            n = int(m.sum())
            clipped = float(((l2 > l1) & has).to(m.dtype).mul(m.sum(dim=1)).sum()) if n else 0.0
        return loss, {"clip/fraction": clipped / n if n else 0.0}


@register
class CISPO(_TISLoss):
    """CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, stop-gradient importance weight on the log-prob.

    Per masked token, with ``r = exp(logp - old_logp)`` ``[B, T]``::

        w    = sg( min(r, 1 + clip_high) )           (the paper bounds the weight above only)
        l    = -w * A * logp                            [B, T]
        loss = aggregate(l, mask, algo.loss.agg, ...)

    Unlike PPO's clip no token loses its gradient: a clipped token still contributes ``-w A grad logp``.
    ``tis_cap > 0`` multiplies ``w`` by the truncated engine IS weight as for PPO. Stats: ``clip/fraction``
    (tokens whose weight was capped) and, with ``tis_cap``, ``is/weight_mean``, ``is/truncated_fraction``.
    """

    name = "cispo"
    no_gradient_at_zero_advantage = True

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("clip/fraction",) + (("is/weight_mean", "is/truncated_fraction") if self.cfg.tis_cap else ())

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        m = x.mask
        zero = x.logp.new_zeros(())
        with torch.no_grad():
            r = torch.exp(torch.where(m, x.logp - x.old_logp, zero).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
            w = r.clamp(max=1.0 + self.cfg.clip_high)
            is_w, ist = _tis(x, self.cfg.tis_cap)
            if is_w is not None:
                w = w * is_w
            n = int(m.sum())
            stats = {"clip/fraction": float((m & (r > 1.0 + self.cfg.clip_high)).sum()) / n if n else 0.0, **ist}
        logp = torch.where(m, x.logp, zero)
        loss = x.aggregate(-w * x.advantages.to(logp.dtype) * logp)
        return loss, {k: stats[k] for k in self.stat_names}


def loss_class(name: str) -> type[PolicyLoss]:
    """The class ``name`` stands for: a registered name, or a dotted path ``pkg.module.Class``."""
    unknown = (
        f"unknown policy loss {name!r}; choose one of {', '.join(LOSSES)}, "
        "or a dotted path pkg.module.Class of a PolicyLoss subclass"
    )
    cls = resolve_class(name, LOSSES, PolicyLoss, PolicyLossError, unknown)
    unknown_needs = set(cls.needs) - NEEDS
    if unknown_needs:
        raise PolicyLossError(f"{name}.needs: unknown {sorted(unknown_needs)}; known: {sorted(NEEDS)}")
    return cls


def get_policy_loss(loss: Any) -> PolicyLoss:
    """The loss object of ``loss`` (an ``algo.loss`` section); ``loss.kwargs`` go to its constructor."""
    cls = loss_class(loss.policy)
    try:
        return cls(loss, **loss.kwargs)
    except TypeError as e:
        raise PolicyLossError(
            f"algo.loss.kwargs do not match {loss.policy}'s constructor: {e}", key="algo.loss.kwargs"
        ) from None
