"""Per-token log-probs and entropy from final hidden states through ``lm_head``, optionally in chunks.

``head_logprobs(head, hidden, targets, chunk_tokens, entropy)`` returns the log-probability of
each target token (float32, ``rl.algos.losses.token_logprobs``) and, when asked, the entropy
of each position's distribution (``entropy_from_logits`` when it is differentiated; as a measured
value, one logsumexp shared with the log-probs and fewer passes over the logits). Unchunked (``chunk_tokens == 0``) the
[N, V] logits of all N tokens exist at once, and autograd keeps them (and their float32 copy)
until the backward. With ``chunk_tokens = C > 0`` the tokens go through ``lm_head`` C at a time,
each chunk under ``torch.utils.checkpoint`` (non-reentrant): the forward frees a chunk's logits as
soon as its log-probs are taken, and the backward recomputes them one chunk at a time, so at
most one chunk's [C, V] tensors are alive in either pass. The cost is one more ``lm_head``
matmul per chunk in the backward; the values and gradients are the unchunked ones up to float
summation order (tests/test_chunked_logits.py).

Works for any callable ``head`` (a plain ``nn.Linear``, a peft-adapted one); under FSDP2 it must be
called inside the root's forward (``rl.trainer.fsdp.Lockstep.root``), where the root's parameters
are gathered; the root keeps them gathered until its backward, where the recompute runs.

This module does not compute losses and does not pick positions (``rl.trainer.learner`` does).
"""

from __future__ import annotations

from typing import Callable, Literal

import torch
from torch.utils.checkpoint import checkpoint

from rl.algos.losses import entropy_from_logits, token_logprobs

__all__ = ["head_logprobs", "Entropy"]

# "grad": the entropy joins the graph (an entropy bonus); "value": measured only (no graph); "none": skipped.
Entropy = Literal["grad", "value", "none"]


def _chunk(
    head: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, t: torch.Tensor, entropy: Entropy
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = head(h)
    if entropy == "none":
        return token_logprobs(logits, t), None
    if entropy == "grad":
        return token_logprobs(logits, t), entropy_from_logits(logits)
    return _logprobs_and_entropy_value(logits, t)


def _logprobs_and_entropy_value(logits: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs`` (differentiable) and the entropy as a measured value, sharing one logsumexp.

    ``H = lse - sum_v p_v x_v`` with ``p = exp(x - lse)``: fewer passes over the [N, V] logits than
    ``entropy_from_logits`` (no log-softmax tensor, no clamp, a dot product instead of a product and a
    sum), the vocabulary-sized work a step without an entropy bonus does only to report ``entropy/mean``
    (bench/RESULTS.md, learner_floor). The log-probs are ``token_logprobs``' formula. Assumes finite
    logits (``lm_head``'s are): a ``-inf`` logit would make the dot product NaN.
    """
    if t.shape != logits.shape[:-1]:
        raise ValueError(f"targets has shape {tuple(t.shape)}, expected {tuple(logits.shape[:-1])}")
    x = logits if logits.dtype == torch.float64 else logits.float()
    lse = torch.logsumexp(x, dim=-1)
    lp = x.gather(-1, t.long().unsqueeze(-1)).squeeze(-1) - lse
    with torch.no_grad():
        xd, lsed = x.detach(), lse.detach()
        p = (xd - lsed.unsqueeze(-1)).exp_()
        ent = lsed - torch.linalg.vecdot(p, xd)
    return lp, ent


def head_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    chunk_tokens: int = 0,
    entropy: Entropy = "none",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs [N] float32, entropy [N] float32 or None) of ``targets`` [N] given ``hidden`` [N, H].

    ``chunk_tokens``: 0 = all N tokens at once; C > 0 = C tokens at a time, recomputed in the
    backward (see the module docstring). Without grad (a reference or an inspection pass) chunks
    are simply computed one after another.
    """
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be >= 0, got {chunk_tokens}")
    n = hidden.shape[0]
    if chunk_tokens == 0 or n <= chunk_tokens:
        return _chunk(head, hidden, targets, entropy)
    recompute = torch.is_grad_enabled()
    lps, ents = [], []
    for h, t in zip(hidden.split(chunk_tokens), targets.split(chunk_tokens)):
        if recompute:
            lp, ent = checkpoint(_chunk, head, h, t, entropy, use_reentrant=False)
        else:
            lp, ent = _chunk(head, h, t, entropy)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps), (torch.cat(ents) if entropy != "none" else None)
