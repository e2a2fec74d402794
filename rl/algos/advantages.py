"""Advantage estimators: GAE, group-normalised outcome advantages (GRPO / Dr.GRPO / RLOO),
REINFORCE++ and masked whitening.

What this module does: pure functions from torch tensors to torch tensors. Shapes use
``B`` for the batch (sequences) and ``T`` for token positions. A ``mask`` of shape [B, T]
is 1 (or True) on the policy's own response tokens and 0 elsewhere: prompt, padding at the
end of a ragged row, and environment/tool tokens in the middle of a multi-turn row. Any
dtype is accepted for a mask; it is read as ``mask != 0``.

What it does not do: no classes, no I/O, no global state, no logging, no torch.distributed
calls, and no gradient: advantages are targets, so every function runs under
``torch.no_grad``. Every statistic is over the tensors passed in (the local batch), except
that :func:`whiten` and :func:`reinforce_pp` accept ``reduce_sum``: a function applied to
each vector of partial sums before it is used (e.g. an all-reduce SUM over data-parallel
ranks, see ``rl.trainer.collectives.all_reduce_sum``), so that shards of one batch get the
statistics of the whole batch. ``group_normalized`` needs no such hook when whole groups
stay on one shard.

Conventions shared by all functions:

* Positions where ``mask`` is 0 are *skipped*: their inputs (rewards, values, scores on
  those tokens) are ignored, whatever they hold (even NaN or inf), and their outputs are 0.
* The recursions (:func:`gae`, the return-to-go in :func:`reinforce_pp`) link each masked
  token to the next masked token of the same row, so env tokens in the middle of a
  multi-turn row are transparent: the row behaves as if they had been cut out.
"""

from __future__ import annotations

from typing import Callable

import torch

from rl.algos.losses import _as_bool_mask

__all__ = ["gae", "group_normalized", "reinforce_pp", "whiten"]


def _float_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation over the masked tokens of each row.

    Shapes: ``rewards``, ``values``, ``mask``: [B, T] -> ``(advantages, returns)``: [B, T] each,
    in the floating dtype of ``rewards``/``values``.

    For each row, let ``t' = next(t)`` be the next position after ``t`` with ``mask == 1``
    (unmasked positions in between, e.g. env tokens of a multi-turn episode, are skipped);
    after the last masked token of a row ``V(next) = 0`` and ``A(next) = 0`` (terminal)::

        delta_t = r_t + gamma * V_{next(t)} - V_t
        A_t     = delta_t + gamma * lam * A_{next(t)}
        R_t     = A_t + V_t

    on masked positions, and ``A_t = R_t = 0`` on unmasked ones. Rewards placed on unmasked
    positions are ignored: put per-token rewards (outcome reward, KL penalty) on masked
    tokens, typically the outcome on the last one. ``gamma`` is applied once per masked-token
    step, not per raw position.

    Computed in one backward loop over ``T``, vectorised over ``B``; no gradient.
    """
    if rewards.dim() != 2 or values.shape != rewards.shape:
        raise ValueError(
            f"rewards and values must both be [B, T]; got {tuple(rewards.shape)} and {tuple(values.shape)}"
        )
    m = _as_bool_mask(mask, rewards)
    dtype = _float_dtype(rewards, values)
    r = rewards.to(dtype)
    v = values.to(dtype)
    B, T = r.shape
    advantages = torch.zeros_like(r)
    next_value = r.new_zeros(B)
    next_adv = r.new_zeros(B)
    zero = r.new_zeros(())
    for t in range(T - 1, -1, -1):
        m_t = m[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        a_t = delta + (gamma * lam) * next_adv
        a_t = torch.where(m_t, a_t, zero)
        advantages[:, t] = a_t
        next_adv = torch.where(m_t, a_t, next_adv)
        next_value = torch.where(m_t, v[:, t], next_value)
    returns = torch.where(m, advantages + v, zero)
    return advantages, returns


@torch.no_grad()
def group_normalized(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    std_normalize: bool = True,
    leave_one_out: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Outcome advantages normalised within groups of samples of the same prompt.

    Shapes: ``scores`` float [B], ``group_ids`` integer [B] -> advantages [B]. Group ids are
    arbitrary integers (any order, not contiguous, negative allowed). For a sample ``i`` of
    group ``g`` with ``n_g`` members, mean ``mu_g`` and unbiased std
    ``sigma_g = sqrt(sum_j (s_j - mu_g)^2 / (n_g - 1))``:

    * GRPO (default, ``std_normalize=True``):   ``A_i = (s_i - mu_g) / (sigma_g + eps)``
    * Dr.GRPO (``std_normalize=False``):        ``A_i = s_i - mu_g``
    * RLOO (``leave_one_out=True``):            ``A_i = s_i - (sum_g - s_i) / (n_g - 1)``
      (= ``n_g / (n_g - 1) * (s_i - mu_g)``); no std division, ``std_normalize`` is ignored.

    Single-member groups (``n_g == 1``): GRPO and Dr.GRPO give ``A_i = 0`` (a lone sample
    has no baseline information and its unbiased std is undefined); RLOO raises
    ``ValueError`` naming the offending group id(s), since a leave-one-out baseline needs at
    least 2 members. A group whose scores are all equal gets 0 in every mode.

    Vectorised with ``torch.unique`` + ``index_add``; no Python loop over groups. To broadcast
    to tokens: ``A[:, None] * mask``.
    """
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(
            f"scores and group_ids must both be [B]; got {tuple(scores.shape)} and {tuple(group_ids.shape)}"
        )
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    s = scores.to(_float_dtype(scores))
    if s.numel() == 0:
        return s.clone()
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    G = uniq.numel()
    counts = torch.zeros(G, dtype=s.dtype, device=s.device).index_add_(0, inv, torch.ones_like(s))
    sums = torch.zeros(G, dtype=s.dtype, device=s.device).index_add_(0, inv, s)
    n = counts[inv]
    single = n < 2
    # A group whose scores are all equal carries no signal: its advantages are exactly 0 in every
    # mode (float rounding of sum/count would otherwise leave ~1e-11 residues, e.g. for 0.2).
    gmax = torch.full((G,), -torch.inf, dtype=s.dtype, device=s.device).scatter_reduce(0, inv, s, "amax")
    gmin = torch.full((G,), torch.inf, dtype=s.dtype, device=s.device).scatter_reduce(0, inv, s, "amin")
    constant = (gmax == gmin)[inv]

    if leave_one_out:
        if bool(single.any()):
            lone = uniq[counts < 2].tolist()
            raise ValueError(f"RLOO (leave_one_out=True) needs >= 2 samples per group; group id(s) {lone} have 1")
        return torch.where(constant, torch.zeros_like(s), s - (sums[inv] - s) / (n - 1))

    mean = sums / counts
    centered = s - mean[inv]
    adv = centered
    if std_normalize:
        sq = torch.zeros(G, dtype=s.dtype, device=s.device).index_add_(0, inv, centered * centered)
        var = sq / (counts - 1).clamp(min=1)  # unbiased; single-member groups zeroed below
        adv = centered / (var.sqrt()[inv] + eps)
    return torch.where(single | constant, torch.zeros_like(adv), adv)


@torch.no_grad()
def whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Masked whitening: statistics over all masked entries of ``values`` (any shape).

    With ``mu`` and ``var`` the mean and the *population* (biased, divide-by-N) variance of
    the N masked entries::

        shift_mean=True:   out = (x - mu) / sqrt(var + eps)
        shift_mean=False:  out = (x - mu) / sqrt(var + eps) + mu   (unit variance, mean kept)

    on masked entries, 0 on unmasked ones. With no masked entry the result is all zeros.
    The population variance is used so that a single masked entry gives 0 rather than NaN.

    ``reduce_sum`` (default: identity) maps the local partial sums, a vector
    ``[sum x, count]`` and then ``[sum (x - mu)^2]``, to the sums over the whole batch
    (two passes, as in the local computation): with an all-reduce over the shards of a
    batch, each shard gets the whitening of the whole batch.
    """
    m = _as_bool_mask(mask, values)
    x = values.to(_float_dtype(values))
    zero = x.new_zeros(())
    xm = torch.where(m, x, zero)
    if reduce_sum is None:
        n = m.sum().to(x.dtype).clamp(min=1)
        mu = xm.sum() / n
        centered = torch.where(m, x - mu, zero)
        var = (centered * centered).sum() / n
    else:
        s = reduce_sum(torch.stack([xm.sum(), m.sum().to(x.dtype)]))
        n = s[1].clamp(min=1)
        mu = s[0] / n
        centered = torch.where(m, x - mu, zero)
        var = reduce_sum((centered * centered).sum().reshape(1))[0] / n
    out = centered * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mu
    return torch.where(m, out, zero)


@torch.no_grad()
def reinforce_pp(
    scores: torch.Tensor,
    mask: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    eps: float = 1e-6,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """REINFORCE++ advantages (batch-level baseline, no critic, no groups).

    Shapes: ``scores`` float [B] (one outcome reward per sequence), ``mask`` [B, T],
    optional ``token_rewards`` float [B, T] (e.g. a per-token KL penalty ``-beta * kl``)
    -> advantages [B, T], 0 on unmasked positions.

    Two variants, chosen by ``token_rewards``:

    1. ``token_rewards is None`` (outcome only; ``gamma`` unused): sequence-level
       normalisation over the batch, then broadcast to every masked token of the row::

           A_{i,t} = (s_i - mean_j s_j) / (std_j s_j + eps)      for mask[i, t] = 1

       ``mean``/``std`` are over all B scores, one per sequence (rows with no masked token
       still count), and ``std`` is the *population* (biased) std, so B = 1 gives 0, not NaN.

    2. ``token_rewards`` given: per-token rewards ``r_{i,t} = token_rewards[i,t] +
       s_i * [t is the last masked token of row i]`` on masked tokens (values on unmasked
       tokens are ignored), discounted return-to-go linking each masked token to the next
       masked one (``G_t = r_t + gamma * G_{next(t)}``, ``G = 0`` after the last), then
       :func:`whiten` over all masked *tokens* of the batch::

           A = (G - mu_tok) / sqrt(var_tok + eps)

       with token-weighted mean and population variance. Note that this differs from
       variant 1 even when ``token_rewards`` is all zeros (token vs. sequence weighting, and
       ``sqrt(var + eps)`` vs. ``std + eps``).

    ``reduce_sum`` (default: identity) maps local partial sums to whole-batch sums (e.g. an
    all-reduce over the shards of a data-parallel batch): ``[sum s, B]`` then
    ``[sum (s - mu)^2]`` in variant 1, and :func:`whiten`'s sums in variant 2.
    """
    if mask.dim() != 2 or scores.shape != mask.shape[:1]:
        raise ValueError(f"scores must be [B] and mask [B, T]; got {tuple(scores.shape)} and {tuple(mask.shape)}")
    m = mask if mask.dtype == torch.bool else mask != 0
    s = scores.to(_float_dtype(scores))
    if token_rewards is None:
        if reduce_sum is None:
            if s.numel() == 0:
                return s.new_zeros(m.shape)
            mu = s.mean()
            std = (s - mu).pow(2).mean().sqrt()
        else:
            tot = reduce_sum(torch.stack([s.sum(), s.new_tensor(float(s.numel()))]))
            mu = tot[0] / tot[1].clamp(min=1)
            std = (reduce_sum((s - mu).pow(2).sum().reshape(1))[0] / tot[1].clamp(min=1)).sqrt()
        adv = (s - mu) / (std + eps)
        return torch.where(m, adv[:, None], s.new_zeros(()))

    if token_rewards.shape != m.shape:
        raise ValueError(f"token_rewards has shape {tuple(token_rewards.shape)}, expected {tuple(m.shape)}")
    dtype = _float_dtype(s, token_rewards)
    T = m.shape[1]
    # last masked position of each row (rows with no masked token get no outcome reward)
    positions = torch.arange(T, device=m.device).expand_as(m)
    last = torch.where(m, positions, -1).amax(dim=1) if T > 0 else m.new_zeros(m.shape[0], dtype=torch.long)
    is_last = m & (positions == last[:, None])
    zero = torch.zeros((), dtype=dtype, device=m.device)
    rewards = torch.where(m, token_rewards.to(dtype), zero)
    rewards = rewards + torch.where(is_last, s.to(dtype)[:, None], zero)
    returns, _ = gae(rewards, torch.zeros_like(rewards), m, gamma=gamma, lam=1.0)
    return whiten(returns, m, shift_mean=True, eps=eps, reduce_sum=reduce_sum)
