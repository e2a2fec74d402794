"""Attention of the packed shared-prompt layout without a dense mask (CPU).

A packed group (``rl.trainer.packing``) is one sequence ``[prompt (p tokens), r_1, ..., r_G]``: the
prompt attends to itself causally, each response to the whole prompt and causally to itself. Run as
one ``scaled_dot_product_attention`` call with the ``S x S`` mask, the CPU kernel visits every block
of the mask (a masked kernel skips none) and runs a masked inner loop, which costs more than the
unmasked parts below together (bench/RESULTS.md, "What changed in the step"; ``bench/learner_floor.py``
measures the whole step). The two parts:

1. every row against the prompt's keys, causal: with more queries than keys the kernel's causal
   mask is aligned top-left, so the prompt's rows are causal over the prompt and every response
   row sees the whole prompt (one call, no mask);
2. each response's rows against its own keys: causal, the responses padded to the longest (the
   padded keys sit after a row's own, so causality already hides them).

For the response rows the two parts cover disjoint keys; their outputs merge exactly through each
part's log-sum-exp (``o = sum_k exp(lse_k - lse) o_k``, ``lse = logaddexp(lse_1, lse_2)``).
The backward runs the flash backward's formulas for each part with the *merged* output and
log-sum-exp, which gives each part's exact share of the gradient (the same way ring attention
splits keys); the query gradient is the sum of the two shares. Part 1 and long response segments
use PyTorch's CPU flash backward; padded response segments of up to ``_MATH_ROWS`` rows use batched
matmuls (``_causal_backward``), faster than the flash kernel at those sizes (bench/RESULTS.md, "The learner
step on jemalloc"). Values and gradients are the dense call's up to float summation order (tests/test_packed_attention.py).

Plugged into transformers as an attention implementation (``NAME``, registered by ``install``):
it runs the split when the trunk call passes ``packed_segments`` (a ``Segments``) and is
otherwise ``sdpa``, so every other call (unpacked layouts, the padded layout's cache, generation)
is unchanged. On CUDA it falls back to the dense masked call that the packed call also passes
(bench/gpu_learner.py runs that path on a GPU); the split uses the CPU flash kernel's ops
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward).

It does not lay out sequences (``rl.trainer.packing`` does) and computes no loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["NAME", "Segments", "install", "packed_attention", "split_attention"]

NAME = "jointrl_packed_sdpa"


@dataclass(frozen=True)
class Segments:
    """Where a packed sequence's parts lie: the prompt's length and each response segment's rows.

    ``gather`` [G, R]: for response segment g (of the non-empty ones) and its j-th row, that row's
    index among the response rows (0-based after the prompt); padded entries (j >= its length) point
    at the segment's first row. ``valid`` [G, R]: which entries are real. ``flat`` [N]: for each
    response row, its place ``g * R + j`` in the padded grid.
    """

    prompt_len: int
    gather: torch.Tensor
    valid: torch.Tensor
    flat: torch.Tensor

    @classmethod
    def of(cls, prompt_len: int, lengths: list[int], device: torch.device | str = "cpu") -> "Segments":
        lengths = [n for n in lengths if n > 0]
        G, R = len(lengths), max(lengths, default=0)
        gather = torch.zeros((G, R), dtype=torch.long)
        valid = torch.zeros((G, R), dtype=torch.bool)
        flat, start = [], 0
        for g, n in enumerate(lengths):
            gather[g] = start
            gather[g, :n] = torch.arange(start, start + n)
            valid[g, :n] = True
            flat += range(g * R, g * R + n)
            start += n
        return cls(prompt_len, gather.to(device), valid.to(device), torch.tensor(flat, dtype=torch.long, device=device))

    @property
    def rows(self) -> int:
        """Response rows (tokens after the prompt)."""
        return int(self.flat.numel())


def _pad(x: torch.Tensor, seg: Segments) -> torch.Tensor:
    """[1, H, N, ...] response rows -> [G, H, R, ...] padded segments (contiguous)."""
    return x[0][:, seg.gather].transpose(0, 1).contiguous()


def _unpad(x: torch.Tensor, seg: Segments) -> torch.Tensor:
    """[G, H, R, ...] padded segments -> [1, H, N, ...] response rows."""
    G, H, R = x.shape[:3]
    return x.transpose(0, 1).reshape(H, G * R, *x.shape[3:])[:, seg.flat].unsqueeze(0)


# Padded response segments up to this many rows take the backward through batched matmuls
# (``_causal_backward``); longer ones the CPU flash kernel's. On SmolLM2's shapes the matmuls win below
# this size and the flash kernel above it (bench/RESULTS.md, "The learner step on jemalloc").
_MATH_ROWS = 128


def _flash_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                    lse: torch.Tensor, scale: float) -> tuple[torch.Tensor, ...]:  # fmt: skip
    back = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    return back(do, q, k, v, o, lse, 0.0, True, scale=scale)[:3]


def _causal_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                     lse: torch.Tensor, scale: float) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """(dq, dk, dv) [B, H, R, D] of causal attention over R keys (q, k, v, o, do [B, H, R, D]) given the
    log-sum-exp ``lse`` [B, H, R] of each row's softmax, which may span more keys than these (the merged
    one): the flash backward's formulas (``P = exp(s - lse)``, ``dS = P (dP - rowsum(dO o))``) through
    batched matmuls in the inputs' dtype, the softmax arithmetic in float32. Holds [B, H, R, R] scores."""
    rows, acc = q.shape[-2], torch.promote_types(q.dtype, torch.float32)  # float64 stays
    delta = (do.to(acc) * o.to(acc)).sum(-1, keepdim=True)
    pr = torch.matmul(q, k.transpose(-1, -2)).to(acc).mul_(scale).sub_(lse.unsqueeze(-1)).exp_()
    pr.masked_fill_(torch.ones(rows, rows, dtype=torch.bool, device=q.device).triu_(1), 0.0)  # causal
    dv = torch.matmul(pr.to(q.dtype).transpose(-1, -2), do)
    ds = pr.mul_(torch.matmul(do, v.transpose(-1, -2)).to(acc).sub_(delta)).mul_(scale).to(q.dtype)
    return torch.matmul(ds, k), torch.matmul(ds.transpose(-1, -2), q), dv


class _PackedAttention(torch.autograd.Function):
    """One packed sequence's attention: every row against the prompt's keys (top-left causal), the
    responses' rows also against their own keys (causal, padded), merged by log-sum-exp."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: Segments, scale: float
    ) -> torch.Tensor:
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        p = seg.prompt_len
        # Causal with more queries than keys is aligned top-left: query i sees keys 0..i, so the prompt's
        # rows are causal and every response row (i >= p) sees the whole prompt, in one call.
        o, lse = flash(q, k[:, :, :p], v[:, :, :p], 0.0, True, scale=scale)
        if seg.rows:
            o_c, lse_c = flash(*(_pad(x[:, :, p:], seg) for x in (q, k, v)), 0.0, True, scale=scale)
            o_c, lse_c = _unpad(o_c, seg), _unpad(lse_c.unsqueeze(-1), seg).squeeze(-1)
            o_b, lse_b = o[:, :, p:], lse[:, :, p:]
            both = torch.logaddexp(lse_b, lse_c)
            acc = torch.promote_types(o.dtype, torch.float32)  # bf16 outputs merge in float32, float64 stays
            w_b, w_c = (lse_b - both).exp().unsqueeze(-1), (lse_c - both).exp().unsqueeze(-1)
            o[:, :, p:] = (o_b.to(acc) * w_b + o_c.to(acc) * w_c).to(o.dtype)
            lse[:, :, p:] = both
        ctx.save_for_backward(q, k, v, o, lse)  # q, k, v as given (views): no copies kept for the backward
        ctx.seg, ctx.scale = seg, scale
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, o, lse = ctx.saved_tensors
        seg, scale, p = ctx.seg, ctx.scale, ctx.seg.prompt_len
        do = do.contiguous()
        # Each part's backward with the merged output and log-sum-exp: its exact share of the gradient.
        dq, dkp, dvp = _flash_backward(do, q, k[:, :, :p], v[:, :, :p], o, lse, scale)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        dk[:, :, :p], dv[:, :, :p] = dkp, dvp
        if seg.rows:
            # Padded rows get a zero output gradient: they then add nothing to any key's gradient.
            doc = _pad(do[:, :, p:], seg) * seg.valid[:, None, :, None].to(do.dtype)
            lsec = _pad(lse[:, :, p:].unsqueeze(-1), seg).squeeze(-1).contiguous()
            parts = (_pad(x[:, :, p:], seg) for x in (q, k, v, o))
            part_back = _causal_backward if lsec.shape[-1] <= _MATH_ROWS else _flash_backward
            dqc, dkc, dvc = part_back(doc, *parts, lsec, scale)
            dq[:, :, p:] += _unpad(dqc, seg)
            dk[:, :, p:], dv[:, :, p:] = _unpad(dkc, seg), _unpad(dvc, seg)
        return dq, dk, dv, None, None


def split_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: Segments, scale: float) -> torch.Tensor:
    """Attention [1, H, S, D] of one packed sequence's q, k, v [1, H, S, D] (as many key heads as query heads)."""
    return _PackedAttention.apply(q, k, v, seg, scale)


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_segments: Segments | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: the split for a packed CPU call, else ``sdpa`` as it is."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if packed_segments is None or query.device.type != "cpu" or dropout > 0.0 or query.shape[0] != 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
    with torch.autocast("cpu", enabled=False):  # sdpa's own rule under CPU autocast: q, k, v in its dtype
        out = split_attention(query.to(dtype), key.to(dtype), value.to(dtype), packed_segments, scale)
    return out.transpose(1, 2).contiguous(), None


def install(model: Any) -> None:
    """Register the implementation with transformers and switch ``model`` (an sdpa model) to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, packed_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # masks of unpacked calls: as for sdpa
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
