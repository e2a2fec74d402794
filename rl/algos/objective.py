"""The learner's objective as one pure function: typed inputs of a micro-batch in, ``(loss, typed stats)`` out.

``objective(x, policy_loss)`` adds up, on the ``[B, T]`` response grid of one micro-batch:

    loss = policy_loss(x.policy)                                   (rl.algos.policy_losses: ppo_clip, gspo, ...)
         + kl_coef x aggregate(kl(logp, ref_logp, kl_kind))        (with a reference; 0-weighted, only measured,
                                                                    when the KL is in the reward)
         - entropy_coef x aggregate(entropy)                       (with entropy_coef > 0)
         + vf_coef x value_loss(values, old_values, returns, clip) (with a critic)
         + aux_coef x (n / num_tokens) x aux_loss                  (with aux_coef > 0: the model's auxiliary
                                                                    loss, an MoE's router load balancing)

every token term aggregated with the recipe's ``algo.loss.agg`` and the minibatch's denominators (carried by
``x.policy``), so the micro-batches' losses sum to the minibatch's exactly. The auxiliary loss is one number
per micro-batch (``rl.algos.router``: over every token its trunk calls ran), weighted by the micro-batch's
share ``n / num_tokens`` of the minibatch's policy tokens, so the minibatch's term is their token-weighted
mean (it is not linear in the tokens: it depends on how ``learner.micro_batch_tokens`` splits the minibatch,
as a load-balancing loss computed per forward does in every framework). No models, no I/O, no distributed
calls: the learner computes the tensors (log-probs, reference log-probs, entropy, values, the auxiliary loss)
and sums the stats over micro-batches and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rl.algos.losses import kl, value_loss
from rl.algos.policy_losses import LossInputs, PolicyLoss

__all__ = ["Terms", "ObjectiveInputs", "ObjectiveStats", "objective"]


@dataclass(frozen=True)
class Terms:
    """The weights of the terms beside the policy loss (``algo.kl``, ``algo.loss.entropy_coef``, ``algo.critic``,
    ``algo.loss.aux_coef``)."""

    kl_coef: float = 0.0
    kl_kind: str = "k3"
    kl_in_reward: bool = False  # the KL is in the reward: here it is only measured
    entropy_coef: float = 0.0
    vf_coef: float = 0.0
    value_clip: float | None = None
    aux_coef: float = 0.0


@dataclass(frozen=True)
class ObjectiveInputs:
    """``policy``: the policy loss's inputs (log-probs with grad, mask, denominators); the others ``[B, T]`` on
    the same grid, None when the term is off: ``ref_logp`` (the reference's log-probs, no grad), ``entropy``
    (differentiable when ``terms.entropy_coef > 0``), ``values`` (the critic's, with grad), ``old_values`` and
    ``returns`` (from the prepare pass); ``aux_loss``: a scalar with grad, the model's auxiliary loss over the
    micro-batch (present when ``terms.aux_coef > 0``)."""

    policy: LossInputs
    terms: Terms
    ref_logp: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


@dataclass
class ObjectiveStats:
    """One micro-batch's statistics: the aggregated terms (before their coefficients) and token sums/means.

    ``policy``: the policy loss's own stats (its ``stat_names``, token means); ``kl_sum``, ``returns_sum``:
    sums over the masked tokens; ``value_*``: token means over the masked tokens (0 without a critic);
    ``aux_loss``: the auxiliary term as added, its share of the minibatch's before the coefficient."""

    policy_loss: float = 0.0
    kl_loss: float = 0.0
    kl_sum: float = 0.0
    entropy_loss: float = 0.0
    value_loss: float = 0.0
    value_mean: float = 0.0
    value_error: float = 0.0
    value_clip_fraction: float = 0.0
    returns_sum: float = 0.0
    aux_loss: float = 0.0
    policy: dict[str, float] = field(default_factory=dict)


def objective(x: ObjectiveInputs, policy_loss: PolicyLoss) -> tuple[torch.Tensor, ObjectiveStats]:
    """The micro-batch's loss (a scalar to minimise; see the module docstring) and its stats."""
    p, t = x.policy, x.terms
    loss, pst = policy_loss(p)
    st = ObjectiveStats(policy_loss=float(loss.detach()), policy=pst)
    total = loss
    if x.ref_logp is not None:
        kl_tok = kl(p.logp.detach() if t.kl_in_reward else p.logp, x.ref_logp, t.kl_kind)
        kl_loss = p.aggregate(kl_tok)
        st.kl_loss = float(kl_loss.detach())
        st.kl_sum = float((kl_tok.detach() * p.mask).sum())
        if not t.kl_in_reward:
            total = total + t.kl_coef * kl_loss
    if t.entropy_coef > 0 and x.entropy is not None:
        ent_loss = p.aggregate(x.entropy)
        st.entropy_loss = float(ent_loss.detach())
        total = total - t.entropy_coef * ent_loss
    if x.values is not None:
        if x.old_values is None or x.returns is None:
            raise ValueError("a value term needs old_values and returns (the prepare pass's)")
        vloss, vst = value_loss(
            x.values,
            x.old_values,
            x.returns,
            p.mask,
            clip=t.value_clip,
            agg=p.agg,
            num_tokens=p.num_tokens,
            num_seqs=p.num_seqs,
            norm_tokens=p.norm_tokens,
        )
        st.value_loss = float(vloss.detach())
        st.value_mean, st.value_error = vst["value/mean"], vst["value/error"]
        st.value_clip_fraction = vst["value/clip_fraction"]
        st.returns_sum = float((x.returns * p.mask).sum())
        total = total + t.vf_coef * vloss
    if t.aux_coef > 0:
        if x.aux_loss is None:
            raise ValueError("algo.loss.aux_coef > 0 needs the model's auxiliary loss (aux_loss)")
        aux = x.aux_loss * (float(p.mask.sum()) / max(float(p.num_tokens), 1.0))
        st.aux_loss = float(aux.detach())
        total = total + t.aux_coef * aux
    return total, st
