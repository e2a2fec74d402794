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

A plain bias-free ``nn.Linear`` head (every causal LM's ``lm_head``) takes a fused path when the
entropy is not differentiated (``_FusedHead``): the forward turns the [N, V] logits into the
softmax in place, in the logits' dtype (bf16 under autocast), a block of rows at a time through
two float32 block buffers reused for every block (each block's max, exp, sum, log-prob and entropy
while it is in cache), and keeps that softmax for the backward, which turns it into the logits'
gradient in place and runs the two matmuls; the target's own probability, which a bf16 softmax
rounds to 1 when it is near 1, comes from the float32 log-prob. Under bf16 autocast this replaced a
float32 copy of the [N, V] logits (and its bf16 copy back for the backward), which dominated the head's
vocabulary-sized work. Unfused, the same work allocates a fresh [N, V] tensor for each of several
elementwise steps (the logsumexp's, the entropy's, the backward's), and on a CPU each new tensor of that
size also pays its page faults; the op-by-op profiles before and after are in bench/RESULTS.md ("The
learner step on jemalloc, a bf16 kept softmax and one embedding call"). Without grad (a reference or an
inspection pass) the logits are made 512 rows at a time (no vocabulary-sized tensor of more rows). Same
values and gradients up to float summation order (tests/test_fused_head.py, tests/test_chunked_logits.py).

This module does not compute losses and does not pick positions (``rl.trainer.learner`` does).
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import torch
from torch.utils.checkpoint import checkpoint

from rl.algos.losses import entropy_from_logits, token_logprobs

__all__ = ["head_logprobs", "Entropy"]

# "grad": the entropy joins the graph (an entropy bonus); "value": measured only (no graph); "none": skipped.
Entropy = Literal["grad", "value", "none"]


# Rows of the [N, V] logits handled together by the fused path: 64 x 49,152 float32 is 12.6 MB, which
# stays in a CPU's last-level cache through the block's passes.
_BLOCK_ROWS = 64
# Rows per lm_head matmul in a pass without grad: bounded buffers, matmuls still large.
_NOGRAD_ROWS = 512


def _softmax_rows_(
    src: torch.Tensor, t: torch.Tensor, entropy: bool, dst: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [N] of ``t`` under logits ``src`` [N, V] (any float dtype), entropies [N] (empty unless
    ``entropy``), both in float32 (float64 stays); with ``dst`` [N, V] (may be ``src``), ``softmax(src)``
    is written there in ``dst``'s dtype. A block of rows at a time through two float32 block buffers
    reused for every block: a fresh vocabulary-sized tensor per step of every block (the shifted logits,
    their exp, the entropy's product) paid its page faults on a CPU."""
    n, v = src.shape
    acc = torch.float64 if src.dtype == torch.float64 else torch.float32
    lp = torch.empty(n, dtype=acc, device=src.device)
    ent = torch.empty(n if entropy else 0, dtype=acc, device=src.device)
    rows = max(1, min(_BLOCK_ROWS, n))
    z_buf = torch.empty((rows, v), dtype=acc, device=src.device)
    e_buf = torch.empty_like(z_buf)
    for i in range(0, n, rows):
        k = min(rows, n - i)
        z, e, tc = z_buf[:k], e_buf[:k], t[i : i + k]
        z.copy_(src[i : i + k])
        m = z.amax(dim=-1, keepdim=True)
        picked = z.gather(-1, tc.unsqueeze(-1))
        z.sub_(m)  # shifted logits: exp cannot overflow
        torch.exp(z, out=e)
        s = e.sum(dim=-1, keepdim=True)
        log_s = s.log()
        lp[i : i + k] = (picked - m - log_s).squeeze(-1)
        if entropy:  # H = lse - sum p x = log s - sum p (x - m) = log s - (sum e z) / s, as sum p = 1
            ent[i : i + k] = (log_s - z.mul_(e).sum(dim=-1, keepdim=True) / s).squeeze(-1)
        if dst is not None:
            dst[i : i + k].copy_(e.div_(s))
    return lp, ent


class _FusedHead(torch.autograd.Function):
    """(log-probs [N], entropy [N] or empty) of ``h @ w.T``; the softmax is kept for the backward (see module doc)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, entropy: bool) -> tuple[torch.Tensor, ...]:
        logits = h @ w.t()
        # The softmax overwrites the logits, in their dtype: under bf16 autocast a bf16 softmax (the logits'
        # gradient goes into bf16 matmuls anyway); the target's own probability, where bf16 is too coarse
        # (p near 1 rounds to 1, and the gradient there is 1 - p), comes back from the float32 log-prob.
        lp, ent = _softmax_rows_(logits, t, entropy, dst=logits)
        ctx.save_for_backward(h, w, t, logits, lp)
        ctx.mark_non_differentiable(ent)
        ctx.spent = False
        return lp, ent

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, _g_ent: Any) -> tuple[Any, ...]:
        if ctx.spent:  # the kept softmax became the gradient in place
            raise RuntimeError("the fused lm_head log-probs can be differentiated once (no retain_graph)")
        ctx.spent = True
        h, w, t, p, lp = ctx.saved_tensors
        g = g.to(lp.dtype)
        at_target = (g * -torch.expm1(lp)).unsqueeze(-1)  # g (1 - p_t), p_t from the float32 log-prob
        rows = max(1, min(_BLOCK_ROWS, p.shape[0]))
        in_place = p.dtype == lp.dtype  # a float32/64 softmax; a bf16 one goes through a float32 block buffer
        buf = None if in_place else torch.empty((rows, p.shape[1]), dtype=lp.dtype, device=p.device)
        for i in range(0, p.shape[0], rows):  # d logp_t / d x = onehot(t) - softmax(x), times g
            k = min(rows, p.shape[0] - i)
            d = p[i : i + k] if buf is None else buf[:k].copy_(p[i : i + k])
            d.mul_(-g[i : i + k, None])
            d.scatter_(-1, t[i : i + k, None], at_target[i : i + k])
            if buf is not None:
                p[i : i + k].copy_(d)
        dh = p @ w if ctx.needs_input_grad[0] else None
        dw = p.t() @ h if ctx.needs_input_grad[1] else None
        return dh, dw, None, None


def _fusable(head: Any) -> bool:
    return type(head) is torch.nn.Linear and head.bias is None


def _fused(
    head: torch.nn.Linear, h: torch.Tensor, t: torch.Tensor, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused path, in the dtype ``head(h)`` would compute in (autocast's, when it is on)."""
    dev = h.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
    w, h = head.weight.to(dtype), h.to(dtype)
    t = t.long()
    with torch.autocast(dev, enabled=False):
        if torch.is_grad_enabled() and (h.requires_grad or w.requires_grad):
            lp, ent = _FusedHead.apply(h, w, t, entropy)
        else:
            lps, ents = [], []
            buf = torch.empty((min(_NOGRAD_ROWS, h.shape[0]), w.shape[0]), dtype=dtype, device=h.device)
            for i in range(0, h.shape[0], _NOGRAD_ROWS):
                x = torch.mm(h[i : i + _NOGRAD_ROWS], w.t(), out=buf[: min(_NOGRAD_ROWS, h.shape[0] - i)])
                lp_i, ent_i = _softmax_rows_(x, t[i : i + _NOGRAD_ROWS], entropy)
                lps.append(lp_i)
                ents.append(ent_i)
            lp, ent = torch.cat(lps), torch.cat(ents)
    lp, ent = (x if x.dtype == torch.float64 else x.float() for x in (lp, ent))  # float32, as token_logprobs
    return lp, (ent if entropy else None)


def _chunk(
    head: Callable[[torch.Tensor], torch.Tensor],
    h: torch.Tensor,
    t: torch.Tensor,
    entropy: Entropy,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if t.shape != h.shape[:-1]:
        raise ValueError(f"targets has shape {tuple(t.shape)}, expected {tuple(h.shape[:-1])}")
    if entropy != "grad" and _fusable(head):
        # A bias-free linear head: (h / T) @ w.T is the tempered logits, no extra [N, V] pass.
        return _fused(head, h if temperature == 1.0 else h / temperature, t, entropy == "value")  # type: ignore[arg-type]
    logits = head(h)
    if temperature != 1.0:
        logits = logits / temperature
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
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs [N] float32, entropy [N] float32 or None) of ``targets`` [N] given ``hidden`` [N, H].

    ``temperature`` T > 0: of the distribution ``softmax(head(hidden) / T)``, the one an engine sampling
    at temperature T drew from (log-probs, entropy and their gradients all on it).

    ``chunk_tokens``: 0 = all N tokens at once; C > 0 = C tokens at a time, recomputed in the
    backward (see the module docstring). Without grad (a reference or an inspection pass) chunks
    are simply computed one after another.
    """
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be >= 0, got {chunk_tokens}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    n = hidden.shape[0]
    if chunk_tokens == 0 or n <= chunk_tokens:
        return _chunk(head, hidden, targets, entropy, temperature)
    recompute = torch.is_grad_enabled()
    lps, ents = [], []
    for h, t in zip(hidden.split(chunk_tokens), targets.split(chunk_tokens)):
        if recompute:
            lp, ent = checkpoint(_chunk, head, h, t, entropy, temperature, use_reentrant=False)
        else:
            lp, ent = _chunk(head, h, t, entropy, temperature)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps), (torch.cat(ents) if entropy != "none" else None)
