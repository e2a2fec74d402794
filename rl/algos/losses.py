"""Loss functions for policy-gradient training: KL estimators, masked aggregation, the PPO
clipped policy loss (with clip-higher and dual clip), the clipped value loss, and the
token-level entropy / log-prob helpers the learner uses on logits.

What this module does: pure, differentiable functions on torch tensors. Per-token tensors
are [B, T]; ``mask`` [B, T] is 1 (or True) on tokens that enter the loss (the policy's
response tokens) and 0 elsewhere; any dtype is accepted and read as ``mask != 0``.
Unmasked positions never influence a loss or its gradient, even when they hold garbage
(inf, NaN, huge log-ratios): they are selected away with ``torch.where`` *before* any
operation whose backward could turn ``0 * inf`` into NaN.

What it does not do: no classes, no I/O, no global state, no logging, no distributed
all-reduce. Statistics are returned as plain Python floats for the caller to log; they are
computed over the tensors given (one micro-batch), and a caller accumulating over
micro-batches or ranks must combine them itself. Denominators for exact gradient
accumulation are passed in explicitly (``num_tokens`` / ``num_seqs``, see
:func:`aggregate`).
"""

from __future__ import annotations

import torch

__all__ = [
    "kl",
    "aggregate",
    "policy_loss",
    "value_loss",
    "entropy_from_logits",
    "token_logprobs",
]

KL_KINDS = ("k1", "k2", "k3")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOG_RATIO_CLAMP = 20.0  # |log pi/pi_old| bound before exp in policy_loss (verl, OpenRLHF: 20)
_K3_LOG_RATIO_CLAMP = 20.0


def _as_bool_mask(mask: torch.Tensor, like: torch.Tensor, name: str = "mask") -> torch.Tensor:
    if mask.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(like.shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def kl(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Elementwise estimator of KL(pi || pi_ref) from sampled-token log-probs.

    Shapes: ``logp``, ``ref_logp``: any (same) shape, e.g. [B, T] -> same shape. With
    ``d = logp - ref_logp`` (log pi - log pi_ref of the sampled token):

    * ``"k1"``: ``d``                              (unbiased, can be negative)
    * ``"k2"``: ``0.5 * d**2``                     (biased, >= 0)
    * ``"k3"``: ``exp(-d) - (-d) - 1``             (unbiased, >= 0; Schulman's estimator)

    For ``k3`` the log-ratio ``-d = ref_logp - logp`` is clamped to [-20, 20] before use
    (both in the ``exp`` and in the linear term), so the result is finite, still >= 0, and
    has zero gradient for tokens beyond the clamp. Any other ``kind`` raises ``ValueError``.
    No masking here: aggregate with :func:`aggregate`.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}; valid kinds are {', '.join(KL_KINDS)}")
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    x = (-d).clamp(-_K3_LOG_RATIO_CLAMP, _K3_LOG_RATIO_CLAMP)
    return torch.exp(x) - x - 1.0


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    agg: str,
    num_tokens: int | float | torch.Tensor | None = None,
    num_seqs: int | float | torch.Tensor | None = None,
    norm_tokens: int | float | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values`` [B, T] to a scalar over masked tokens.

    * ``"token-mean"``:          ``sum_{i,t} m*x / N``, with ``N = num_tokens`` if given,
      else the number of masked tokens.
    * ``"seq-mean-token-mean"``: ``sum_i (sum_t m*x / sum_t m) / S``: each sequence's masked
      mean, averaged over sequences.
    * ``"seq-mean-token-sum"``:  ``sum_i (sum_t m*x) / S``: each sequence's masked sum,
      averaged over sequences.
    * ``"seq-mean-token-sum-norm"``: ``sum_i (sum_t m*x) / (S * L)`` with the constant
      ``L = norm_tokens`` (required; e.g. the generation budget): Dr.GRPO's aggregation
      (verl's mode of the same name), no per-sequence length normalisation, so a long
      response's tokens weigh as much as a short one's.

    For the ``seq-mean-*`` modes ``S = num_seqs`` if given, else the number of sequences
    with at least one masked token: a sequence with no masked token contributes 0 and is not
    counted (so fully padded rows are harmless).

    Gradient accumulation: split one batch into micro-batches and pass the *full batch's*
    denominator to each: ``num_tokens`` = masked tokens in the full batch (token-mean),
    ``num_seqs`` = sequences with >= 1 masked token in the full batch (seq-mean-*). Then
    ``sum_mb aggregate(mb, ...) == aggregate(full)`` exactly, and so are the gradients.
    The per-sequence part of ``seq-mean-*`` is local to a sequence, so ``num_tokens`` is not
    used by those modes (and ``num_seqs`` not by token-mean). A zero denominator (nothing
    masked) yields 0 with a zero (not NaN) gradient. Any other ``agg`` raises ``ValueError``.
    """
    if agg not in AGG_MODES:
        raise ValueError(f"unknown aggregation {agg!r}; valid modes are {', '.join(AGG_MODES)}")
    if agg == "seq-mean-token-sum-norm" and not (norm_tokens and norm_tokens > 0):
        raise ValueError(f"seq-mean-token-sum-norm needs norm_tokens > 0 (a constant), got {norm_tokens!r}")
    if values.dim() != 2:
        raise ValueError(f"values must be [B, T], got shape {tuple(values.shape)}")
    m = _as_bool_mask(mask, values)
    x = torch.where(m, values, values.new_zeros(()))
    dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    x = x.to(dtype)

    def _safe(denom: torch.Tensor) -> torch.Tensor:
        return torch.where(denom > 0, denom, torch.ones_like(denom))

    if agg == "token-mean":
        n = m.sum() if num_tokens is None else num_tokens
        n = torch.as_tensor(n, dtype=dtype, device=x.device)
        return x.sum() / _safe(n)

    seq_sum = x.sum(dim=1)
    seq_len = m.sum(dim=1).to(dtype)
    if agg == "seq-mean-token-mean":
        per_seq = seq_sum / _safe(seq_len)  # rows with no masked token: 0 / 1 = 0
    else:
        per_seq = seq_sum
    s = (seq_len > 0).sum() if num_seqs is None else num_seqs
    s = torch.as_tensor(s, dtype=dtype, device=x.device)
    if agg == "seq-mean-token-sum-norm":
        s = s * float(norm_tokens)  # type: ignore[arg-type]
    return per_seq.sum() / _safe(s)


def _masked_mean(x: torch.Tensor, m: torch.Tensor, n: torch.Tensor) -> float:
    return float(torch.where(m, x, x.new_zeros(())).sum() / n)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    num_tokens: int | float | torch.Tensor | None = None,
    num_seqs: int | float | torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    norm_tokens: int | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate loss (to minimise), with asymmetric clip and optional dual clip.

    Shapes: ``logp`` (current policy, requires grad), ``old_logp`` (behaviour policy),
    ``mask``: [B, T]; ``advantages``: [B, T] or [B] (broadcast over T). Returns
    ``(loss, stats)``, ``loss`` a scalar. Per masked token, with ``r = exp(logp - old_logp)``::

        pg = max(-A * r, -A * clamp(r, 1 - clip_low, 1 + clip_high))
        if dual_clip is c and A < 0:  pg = min(pg, -A * c)        (c must be > 1)

    then ``pg * is_weights`` when given (``[B, T]``, no gradient: per-token importance weights
    for samples drawn by a behaviour policy other than ``old_logp``'s, e.g. truncated IS
    ``min(exp(old_logp - engine_logp), C)``; see ``truncated_is_weights``), then
    ``aggregate(pg, mask, agg, num_tokens, num_seqs, norm_tokens)``. ``clip_high > clip_low`` is
    DAPO's clip-higher. The log-ratio is zeroed on unmasked tokens before ``exp`` (no
    overflow, no NaN gradient from padding) and clamped to ``[-20, 20]`` on masked ones (as
    verl and OpenRLHF do): ``exp`` of a log-ratio of e.g. 99.5 (old log-prob -100, new -0.5)
    overflows float32 to inf, and ``0 * inf`` in the backward of a clipped token is NaN.

    ``stats`` (Python floats, over masked tokens only; all 0.0 when nothing is masked):

    * ``"clip/fraction"``: fraction of tokens where the clipped branch is strictly larger,
      i.e. the clamp changed the objective (and zeroed the gradient);
    * ``"clip/dual_fraction"``: fraction of tokens where the dual clip is active
      (``A < 0`` and ``-A * c`` strictly below the clipped objective); 0 without dual clip;
    * ``"kl/old_approx"``: mean of the k2 estimator ``0.5 * (logp - old_logp)**2``.

    (Mean and max of ``r`` are not computed: each cost a device sync per micro-batch and no
    caller read them.)
    """
    m, advantages = _policy_loss_inputs(logp, old_logp, advantages, mask, dual_clip)
    zero = logp.new_zeros(())
    A = torch.where(m, advantages.to(logp.dtype), zero)
    log_ratio = torch.where(m, logp - old_logp, zero).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    pg1 = -A * ratio
    pg2 = -A * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg1, pg2)
    dual_active = torch.zeros_like(m)
    if dual_clip is not None:
        pg3 = -A * dual_clip
        dual_active = m & (A < 0) & (pg3 < pg)
        pg = torch.where(A < 0, torch.minimum(pg, pg3), pg)
    if is_weights is not None:
        if is_weights.shape != logp.shape:
            raise ValueError(f"is_weights has shape {tuple(is_weights.shape)}, expected {tuple(logp.shape)}")
        pg = pg * torch.where(m, is_weights.detach().to(pg.dtype), zero)
    loss = aggregate(pg, m, agg, num_tokens=num_tokens, num_seqs=num_seqs, norm_tokens=norm_tokens)

    with torch.no_grad():
        stats = _clip_stats(m, pg1, pg2, dual_active, log_ratio)
    return loss, stats


def _policy_loss_inputs(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    dual_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``policy_loss``'s shapes checked; returns the boolean mask and the advantages as ``[B, T]``."""
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp has shape {tuple(old_logp.shape)}, expected {tuple(logp.shape)}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    m = _as_bool_mask(mask, logp)
    if advantages.shape == logp.shape[:1]:
        advantages = advantages[:, None].expand_as(logp)
    elif advantages.shape != logp.shape:
        raise ValueError(
            f"advantages must be [B, T] or [B]; got {tuple(advantages.shape)} for logp {tuple(logp.shape)}"
        )
    return m, advantages


def _clip_stats(
    m: torch.Tensor, pg1: torch.Tensor, pg2: torch.Tensor, dual_active: torch.Tensor, log_ratio: torch.Tensor
) -> dict[str, float]:
    """``policy_loss``'s stats over masked tokens (all 0.0 when none is masked); see its docstring."""
    n_masked = int(m.sum())
    if n_masked == 0:
        return dict.fromkeys(("clip/fraction", "clip/dual_fraction", "kl/old_approx"), 0.0)
    n = torch.tensor(float(n_masked), dtype=log_ratio.dtype, device=log_ratio.device)
    clipped = m & (pg2 > pg1)
    return {
        "clip/fraction": float(clipped.sum()) / n_masked,
        "clip/dual_fraction": float(dual_active.sum()) / n_masked,
        "kl/old_approx": _masked_mean(0.5 * log_ratio * log_ratio, m, n),
    }


def truncated_is_weights(
    old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights ``w = min(exp(old_logp - behaviour_logp), cap)`` (no gradient).

    Shapes: all ``[B, T]``; returns ``(w, stats)`` with ``w`` 0 on unmasked tokens. ``old_logp``
    is the learner's policy before the update, ``behaviour_logp`` what the engine that sampled
    the tokens gave them (one policy version older in one-step-off async mode; in synchronous
    mode the same weights, differing only by kernels and precision). Truncation bounds the
    variance that a large ratio would add (Yao et al., 2025, "truncated importance sampling").

    ``stats``: ``"is/weight_mean"`` (mean of the truncated weights over masked tokens) and
    ``"is/truncated_fraction"`` (fraction of masked tokens whose raw weight exceeded ``cap``).
    """
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    if old_logp.shape != behaviour_logp.shape:
        raise ValueError(f"behaviour_logp has shape {tuple(behaviour_logp.shape)}, expected {tuple(old_logp.shape)}")
    m = _as_bool_mask(mask, old_logp)
    with torch.no_grad():
        zero = old_logp.new_zeros(())
        raw = torch.exp(torch.where(m, old_logp - behaviour_logp, zero))
        w = torch.where(m, raw.clamp(max=cap), zero)
        n = int(m.sum())
        stats = {
            "is/weight_mean": float(w.sum()) / n if n else 0.0,
            "is/truncated_fraction": float((m & (raw > cap)).sum()) / n if n else 0.0,
        }
    return w, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    num_tokens: int | float | torch.Tensor | None = None,
    num_seqs: int | float | torch.Tensor | None = None,
    norm_tokens: int | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped value loss (to minimise).

    Shapes: ``values`` (critic output, requires grad), ``old_values`` (critic at rollout
    time), ``returns`` (targets, e.g. from :func:`rl.algos.advantages.gae`), ``mask``: [B, T].
    Per masked token::

        v_clip = clamp(v, old_v - clip, old_v + clip)
        vf     = 0.5 * max((v - R)**2, (v_clip - R)**2)      ; clip=None: 0.5 * (v - R)**2

    then ``aggregate(vf, mask, agg, num_tokens, num_seqs, norm_tokens)``. ``clip`` must be >= 0 or None.

    ``stats`` (Python floats over masked tokens, all 0.0 when nothing is masked):
    ``"value/clip_fraction"`` (fraction where the clipped term is strictly larger, i.e.
    selected; 0 with clip=None), ``"value/mean"`` (mean of ``v``), ``"value/error"``
    (mean of ``(v - R)**2``, unclipped, without the 0.5).
    """
    if values.dim() != 2:
        raise ValueError(f"values must be [B, T], got shape {tuple(values.shape)}")
    for name, t in (("old_values", old_values), ("returns", returns)):
        if t.shape != values.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(values.shape)}")
    if clip is not None and clip < 0:
        raise ValueError(f"clip must be >= 0 or None, got {clip}")
    m = _as_bool_mask(mask, values)
    zero = values.new_zeros(())
    v = torch.where(m, values, zero)
    old = torch.where(m, old_values.to(values.dtype), zero)
    R = torch.where(m, returns.to(values.dtype), zero)
    vf1 = (v - R) ** 2
    if clip is None:
        vf = vf1
        clipped = torch.zeros_like(m)
    else:
        v_clip = torch.clamp(v, old - clip, old + clip)
        vf2 = (v_clip - R) ** 2
        vf = torch.maximum(vf1, vf2)
        clipped = m & (vf2 > vf1)
    loss = aggregate(0.5 * vf, m, agg, num_tokens=num_tokens, num_seqs=num_seqs, norm_tokens=norm_tokens)

    with torch.no_grad():
        n_masked = int(m.sum())
        if n_masked == 0:
            stats = {"value/clip_fraction": 0.0, "value/mean": 0.0, "value/error": 0.0}
        else:
            n = torch.tensor(float(n_masked), dtype=v.dtype, device=v.device)
            stats = {
                "value/clip_fraction": float(clipped.sum()) / n_masked,
                "value/mean": _masked_mean(v, m, n),
                "value/error": _masked_mean(vf1, m, n),
            }
    return loss, stats


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution over the last dim, in float32.

    Shapes: ``logits`` [..., V] (any float dtype, e.g. bf16) -> [...] float32 (float64 stays
    float64). Computed as ``H = -sum_v p_v * log p_v`` with ``log p = log_softmax(logits)``
    (i.e. ``logits - logsumexp(logits)``, stable for large logits), after casting to float32.
    Logits of ``-inf`` (masked vocabulary entries) contribute 0, with a finite gradient.
    Differentiable.
    """
    x = logits if logits.dtype == torch.float64 else logits.float()
    logp = x.log_softmax(dim=-1)
    p = logp.exp()
    # p == 0 exactly where logp == -inf; clamping makes 0 * finite = 0 (value and gradient).
    logp = logp.clamp(min=torch.finfo(logp.dtype).min)
    return -(p * logp).sum(dim=-1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``targets`` under ``softmax(logits)``, in float32.

    Shapes: ``logits`` [..., V], ``targets`` integer [...] -> [...] float32 (float64 stays
    float64). ``logp = logits[target] - logsumexp(logits)`` computed on ``logits.float()``;
    unlike ``log_softmax(...).gather(...)`` no [..., V] log-prob tensor is materialised, so
    peak memory is the float32 copy of the logits (none if already float32) plus
    ``logsumexp``'s workspace. Differentiable w.r.t. ``logits``. The caller does the usual
    shift (logits at position t predict token t + 1).
    """
    if targets.shape != logits.shape[:-1]:
        raise ValueError(
            f"targets has shape {tuple(targets.shape)}, expected logits.shape[:-1] = {tuple(logits.shape[:-1])}"
        )
    x = logits if logits.dtype == torch.float64 else logits.float()
    picked = x.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(x, dim=-1)
