"""Policy losses as registered objects: PPO's clipped surrogate (clip-higher, dual clip, truncated or masked IS),
GSPO's sequence-level ratio, CISPO's clipped stop-gradient IS weight and decoupled PPO (AReaL's off-policy
correction: clip against the proximal policy, weight by proximal / behaviour).

Each loss is a small class that declares what it needs and is called on a typed :class:`LossInputs`:

* ``needs``: what the learner computes for it beyond the always-present ones (the policy's and the old
  log-probs, the advantages, the mask): ``"engine_logprobs"`` (the sampling engine's log-probs of the
  tokens, for importance weights against the behaviour policy), ``"proximal_logprobs"`` (the old log-probs
  must be the policy's before the step's first update, computed by the prepare pass even when the step makes one
  update: decoupled PPO's proximal policy), ``"entropy"`` (the per-token entropy,
  differentiable, for a loss that adds an entropy term of its own), ``"ref_logprobs"`` (the frozen
  reference's log-probs: the learner then keeps a reference model) and ``"aux_loss"`` (the model's auxiliary
  loss from its outputs, an MoE's router load balancing, ``rl.algos.router``: the trunk then returns its
  router logits). The learner computes nothing else;
* ``no_gradient_at_zero_advantage``: every term of the loss is proportional to the advantage, so a sample
  whose advantage is exactly 0 has exactly no gradient and ``build_batch`` may skip its forward and backward
  (False by default: a loss that adds a term of its own, an entropy or a reference pull, trains every sample);
* ``settings``: its own ``algo.loss`` keys, a ``LossConfig`` subclass (the arm of the ``algo.loss`` union
  that ``algo.loss.policy`` chooses, ``rl/config/algo.py``); the loss reads them from ``self.cfg``. The
  default, ``UserLossConfig``, has ``algo.loss.kwargs``, given to the constructor;
* ``stat_names``: the token-mean statistics it reports (metric keys), in order; the learner sums
  ``value x tokens`` over micro-batches and ranks and logs their means;
* ``__call__(inputs) -> (loss, stats)``: a scalar to minimise (the micro-batch's part of the minibatch's
  loss: its denominators are in ``inputs``) and one float per name of ``stat_names``.

The learner adds the other terms of the objective (``algo.kl``, ``algo.loss.entropy_coef``, the value
loss, ``algo.loss.aux_coef``) itself (``rl.algos.objective``); a loss may return additional terms in its scalar (anything differentiable it computes
from its inputs). Chosen by ``algo.loss.policy``: a registered name or a dotted path
``pkg.module.Class`` of a :class:`PolicyLoss` subclass, built with its ``settings`` (see docs/algorithms.md). Pure tensor code: no models, no I/O, no distributed calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rl.algos.losses import LOG_RATIO_CLAMP, aggregate, policy_loss
from rl.algos.registry import resolve_class
from rl.config.algo import (
    CISPOLossConfig,
    DecoupledPPOLossConfig,
    GSPOLossConfig,
    LossConfig,
    PPOClipLossConfig,
    UserLossConfig,
)

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
    "DecoupledPPO",
    "engine_is_weights",
]

NEEDS = frozenset({"engine_logprobs", "proximal_logprobs", "entropy", "ref_logprobs", "aux_loss"})


class PolicyLossError(ValueError):
    """``algo.loss.policy`` names no loss (or a class that is not one, or one whose ``settings`` are no
    ``LossConfig``), or ``algo.loss`` does not fit it."""

    def __init__(self, msg: str, key: str = "algo.loss.policy") -> None:
        super().__init__(msg)
        self.key = key  # the recipe key to blame


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch on its ``[B, T]`` response grid (B samples, T the longest response).

    ``logp`` (current policy, requires grad), ``old_logp`` (before this batch's updates, no grad: the prepare
    pass's, or with one update and no prepare pass ``logp`` detached, the same numbers; the proximal policy),
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
    ``algo.loss`` section, an instance of ``settings`` (its clip ranges, ``tis_cap``, ...); with the default
    ``settings`` (``UserLossConfig``) the constructor also gets ``algo.loss.kwargs`` as keyword arguments."""

    name: ClassVar[str] = ""
    settings: ClassVar[type[LossConfig]] = UserLossConfig
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
    _check_settings(cls, cls.__name__, ValueError)
    LOSSES[cls.name] = cls
    return cls


def _check_settings(cls: type[PolicyLoss], name: str, error: type[Exception]) -> None:
    """``cls.settings`` is an ``algo.loss`` section: a ``LossConfig`` subclass (the union itself is none)."""
    s = cls.settings
    if not (isinstance(s, type) and issubclass(s, LossConfig)) or s is LossConfig:
        raise error(f"{name}.settings must be a subclass of rl.config.algo.LossConfig, got {s!r}")


def _corrects(cfg: Any) -> bool:
    """Whether ``cfg`` (an arm with the IS-correction keys) truncates or masks the engine IS weight."""
    return bool(cfg.tis_cap or cfg.mis_low or cfg.mis_high)


class _ISLoss(PolicyLoss):
    """A loss with optional truncated or masked IS against the engine (``algo.loss.tis_cap``, ``mis_low``,
    ``mis_high`` at ``is_level``): it needs the engine's log-probs only then."""

    needs = frozenset({"engine_logprobs"})

    def __init__(self, loss: Any) -> None:
        super().__init__(loss)
        self.needs = frozenset({"engine_logprobs"}) if _corrects(loss) else frozenset()

    def _is_stat_names(self, always: bool = False) -> tuple[str, ...]:
        c = self.cfg
        names = ("is/weight_mean",) if always or _corrects(c) else ()
        names += ("is/truncated_fraction",) if c.tis_cap else ()
        return names + (("is/masked_fraction",) if c.mis_low or c.mis_high else ())


def engine_is_weights(
    old_logp: torch.Tensor,
    engine_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    tis_cap: float = 0.0,
    mis_low: float = 0.0,
    mis_high: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights of the learner's policy before the update over the engine's (the behaviour policy's),
    truncated (TIS) and/or masked (MIS, IcePop), without gradient.

    Shapes: ``old_logp``, ``engine_logp`` float ``[B, T]``, ``mask`` bool ``[B, T]`` (the policy tokens); returns
    ``w`` ``[B, T]`` (0 off the mask) and stats. With ``m`` the mask::

        token:    log rho_it = old_it - engine_it                                   [B, T]
        sequence: log rho_i  = sum_t m_it (old_it - engine_it), the same for every t  [B] -> [B, T]
        rho      = exp(min(log rho, 20))
        keep     = (mis_low == 0 or rho >= mis_low) and (mis_high == 0 or rho <= mis_high)
        w        = m * keep * (min(rho, tis_cap) if tis_cap > 0 else rho)

    Truncation (Yao et al., 2025, TIS) bounds the variance a large weight adds but keeps the token's gradient;
    masking (MIS, Liu et al., 2025; IcePop's two-sided ``[mis_low, mis_high]``, e.g. ``[0.5, 5]``) drops the
    tokens (sequences) whose engine probability disagrees too much with the learner's, which are more likely
    engine numerics or a stale policy than signal. A masked token stays in the loss's denominators (its weight
    is 0), so the minibatch's aggregation is unchanged. Sequence level weighs a whole sequence by the product
    of its token ratios: the unbiased sequence IS weight, of high variance over long sequences.

    ``stats`` (token means over the mask; at sequence level each token carries its sequence's value):
    ``is/weight_mean`` (of ``w``), ``is/truncated_fraction`` (``rho > tis_cap``, with ``tis_cap``),
    ``is/masked_fraction`` (not ``keep``, with ``mis_low`` or ``mis_high``).
    """
    if old_logp.shape != engine_logp.shape:
        raise ValueError(f"engine_logp has shape {tuple(engine_logp.shape)}, expected {tuple(old_logp.shape)}")
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be token or sequence, got {level!r}")
    with torch.no_grad():
        m = mask.bool()
        zero = old_logp.new_zeros(())
        log_rho = torch.where(m, old_logp - engine_logp, zero)
        if level == "sequence":
            log_rho = log_rho.sum(dim=1, keepdim=True).expand_as(log_rho)
        rho = torch.exp(log_rho.clamp(max=LOG_RATIO_CLAMP))  # no inf (a mask would multiply it by 0)
        keep = m.clone()
        if mis_low > 0:
            keep &= rho >= mis_low
        if mis_high > 0:
            keep &= rho <= mis_high
        w = torch.where(keep, rho.clamp(max=tis_cap) if tis_cap > 0 else rho, zero)
        n = int(m.sum())
        stats = {"is/weight_mean": float(w.sum()) / n if n else 0.0}
        if tis_cap > 0:
            stats["is/truncated_fraction"] = float((m & (rho > tis_cap)).sum()) / n if n else 0.0
        if mis_low > 0 or mis_high > 0:
            stats["is/masked_fraction"] = float((m & ~keep).sum()) / n if n else 0.0
    return w, stats


def _correction(x: LossInputs, cfg: Any, always: bool = False) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The engine IS weights of ``cfg``'s correction keys and their stats (None, {} when there is no correction
    and ``always`` is False: the loss then has no weight)."""
    if not (always or _corrects(cfg)):
        return None, {}
    if x.engine_logp is None:
        raise ValueError(
            "algo.loss.tis_cap, mis_low, mis_high (and decoupled_ppo) need the engine's log-probs "
            "(the loss must declare engine_logprobs)"
        )
    keys = {k: getattr(cfg, k) for k in ("tis_cap", "mis_low", "mis_high")}
    return engine_is_weights(x.old_logp, x.engine_logp, x.mask, level=cfg.is_level, **keys)


@register
class PPOClip(_ISLoss):
    """PPO's clipped surrogate, ``rl.algos.losses.policy_loss``: per token ``max(-A r, -A clip(r, 1 - clip_low,
    1 + clip_high))`` with ``r = exp(logp - old_logp)``, dual clip ``min(., -A c)`` for ``A < 0`` (``dual_clip``),
    times the engine IS weight ``w`` of :func:`engine_is_weights` (``min(exp(old - engine), tis_cap)``, masked
    outside ``[mis_low, mis_high]``, per token or sequence: ``is_level``) when a correction is on; aggregated with
    ``algo.loss.agg``. Shapes as :class:`LossInputs`."""

    name = "ppo_clip"
    settings = PPOClipLossConfig
    no_gradient_at_zero_advantage = True
    always_weighted: ClassVar[bool] = False  # the IS weight even with no truncation or mask (decoupled_ppo)

    @property
    def stat_names(self) -> tuple[str, ...]:
        names = ("clip/fraction",)
        if self.cfg.dual_clip:
            names += ("clip/dual_fraction",)
        return names + self._is_stat_names(self.always_weighted)

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.cfg
        is_w, ist = _correction(x, c, self.always_weighted)
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


@register
class DecoupledPPO(PPOClip):
    """Decoupled PPO (Fu et al., 2025, AReaL): PPO's clip against the proximal policy, weighted by the importance
    weight of the proximal policy over the behaviour policy that sampled the tokens.

    The proximal policy is the learner's before this step's first update: ``old_logp``, which the prepare pass
    computes because the loss needs ``proximal_logprobs`` (also with one update per batch); the behaviour
    policy's log-probs are the engine's, ``engine_logp``. Per masked token, all ``[B, T]``::

        r    = exp(logp - old_logp)                                     (current / proximal)
        l    = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))       (dual clip min(l, -A c) for A < 0)
        w    = exp(old_logp - engine_logp)                              (proximal / behaviour, no gradient)
        loss = aggregate(w * l, mask, algo.loss.agg, ...)

    ``w`` is truncated at ``tis_cap`` and masked outside ``[mis_low, mis_high]`` as :func:`engine_is_weights`
    (per token or per sequence, ``is_level``); AReaL's cap drops tokens with ``w`` above it: ``mis_high``. The
    trust region is thus centred on the newest policy the learner has, not on a stale behaviour policy, while
    the weight keeps the gradient unbiased for the behaviour samples. With ``engine_logp == old_logp`` (``w`` =
    1) it is ``ppo_clip`` exactly. Stats: ``clip/fraction`` (``clip/dual_fraction``), ``is/weight_mean`` and,
    with their keys, ``is/truncated_fraction``, ``is/masked_fraction``.
    """

    name = "decoupled_ppo"
    settings = DecoupledPPOLossConfig
    needs = frozenset({"engine_logprobs", "proximal_logprobs"})
    always_weighted = True

    def __init__(self, loss: Any) -> None:
        PolicyLoss.__init__(self, loss)


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
    settings = GSPOLossConfig
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
class CISPO(_ISLoss):
    """CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, stop-gradient importance weight on the log-prob.

    Per masked token, with ``r = exp(logp - old_logp)`` ``[B, T]``::

        w    = sg( min(r, 1 + clip_high) )           (the paper bounds the weight above only)
        l    = -w * A * logp                            [B, T]
        loss = aggregate(l, mask, algo.loss.agg, ...)

    Unlike PPO's clip no token loses its gradient: a clipped token still contributes ``-w A grad logp``.
    A correction (``tis_cap``, ``mis_low``, ``mis_high`` at ``is_level``) multiplies ``w`` by the engine IS
    weight of :func:`engine_is_weights` as for PPO. Stats: ``clip/fraction`` (tokens whose weight was capped)
    and, with a correction, ``is/weight_mean``, ``is/truncated_fraction``, ``is/masked_fraction`` (their keys).
    """

    name = "cispo"
    settings = CISPOLossConfig
    no_gradient_at_zero_advantage = True

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("clip/fraction",) + self._is_stat_names()

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        m = x.mask
        zero = x.logp.new_zeros(())
        with torch.no_grad():
            r = torch.exp(torch.where(m, x.logp - x.old_logp, zero).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
            w = r.clamp(max=1.0 + self.cfg.clip_high)
            is_w, ist = _correction(x, self.cfg)
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
    _check_settings(cls, name, PolicyLossError)
    return cls


def get_policy_loss(loss: LossConfig) -> PolicyLoss:
    """The loss object of ``loss`` (an ``algo.loss`` section, the arm of its policy); a loss without settings
    of its own gets ``loss.kwargs`` as constructor keyword arguments."""
    cls = loss_class(loss.policy)
    if not isinstance(loss, cls.settings):
        raise PolicyLossError(
            f"algo.loss is a {type(loss).__name__}; {loss.policy} reads a {cls.settings.__name__} "
            "(build it with LossConfig(policy=...))"
        )
    kwargs = loss.kwargs if isinstance(loss, UserLossConfig) else {}
    try:
        return cls(loss, **kwargs)
    except TypeError as e:
        raise PolicyLossError(
            f"algo.loss.kwargs do not match {loss.policy}'s constructor: {e}", key="algo.loss.kwargs"
        ) from None
