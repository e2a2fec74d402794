"""A group's shared prompt and all its responses in one trunk call, without padding.

``pack(members, rows_b, T)`` lays out the samples of one group (they share a prompt) as one
sequence ``[prompt, r_1[:-1], r_2[:-1], ...]`` (a response's last token predicts nothing, so it is
not run). A 4D boolean attention mask lets every token see the prompt and, causally, its own
response only; position ids restart after the prompt for each response. So each response token
has exactly the keys, values and positions it has in the padded layout (a prompt call whose
key/value cache every member attends to, then the members' responses padded to the longest):
the same log-probs up to float summation order (tests/test_learner_packing.py).

Against that padded layout it computes no response padding (a group's responses of 32-64
tokens padded to 63 are ~16% of its tokens), keeps no per-member copy of the prompt's keys and
values (the padded layout repeats the prompt cache for every member, and attention saves the
repeated keys/values of every layer for the backward), and makes one trunk call per group
instead of two, over more rows (larger matmuls). The mask stays the definition of who sees whom
(and what a model without ``rl.trainer.packed_attention`` or on CUDA attends with); on CPU the
learner's models attend through that module instead, which reads ``Packed.segments`` and runs
the prompt's causal part and each response's own part without the dense ``S x S`` mask (a masked
kernel skips no blocks of it).

Groups are not batched into one call with each other: padding rows to a common length changes
a sample's float rounding with what it is batched with, and a group's numbers should not depend
on that (a skipped zero-advantage sample must leave the others' updates bit for bit the same).

``Packed`` says where each masked response token's predicting hidden state sits (``cols``), its
target, and its index into the micro-batch's ``[B, T]`` response grid, in (sample, position)
order. This module runs no model and computes no loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.algos.batch import Sample
from rl.trainer.packed_attention import Segments

__all__ = ["Packed", "pack", "packed_length", "prompt_groups"]


@dataclass
class Packed:
    input_ids: torch.Tensor  # [1, S]
    position_ids: torch.Tensor  # [1, S]
    mask: torch.Tensor  # [1, 1, S, S]: bool (True = may attend), or additive (0 / the dtype's min) in mask_dtype
    cols: torch.Tensor  # [N] position of the hidden state that predicts each masked response token
    targets: torch.Tensor  # [N]
    index: torch.Tensor  # [N] b * T + j in the [B, T] response grid
    segments: Segments  # the prompt's length and the response segments, for the mask-free attention


def prompt_groups(samples: list[Sample]) -> list[list[int]]:
    """The positions in ``samples`` of each group of samples that share a prompt (a GRPO group, or the part of
    one in a micro-batch), groups in order of first appearance, members in order."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(tuple(s.input_ids[: s.prompt_len]), []).append(i)
    return list(groups.values())


def packed_length(members: list[Sample]) -> int:
    """Tokens the packed sequence of a group (members sharing a prompt) runs."""
    return members[0].prompt_len + sum(max(len(s.input_ids) - s.prompt_len - 1, 0) for s in members)


def pack(
    members: list[Sample],
    rows_b: list[int],
    T: int,
    device: torch.device | str = "cpu",
    mask_dtype: torch.dtype | None = None,
) -> Packed:
    """The packed layout of ``members`` (one group; ``rows_b``: their rows in the ``[B, T]`` grid).

    ``mask_dtype``: the attention mask as an additive float mask of that dtype (the attention's
    compute dtype), made once for every layer; a boolean mask (None) is converted to float by
    ``scaled_dot_product_attention`` in every layer, and each copy is kept for the backward.
    """
    p = members[0].prompt_len
    prompt = members[0].input_ids[:p]
    if p < 1:
        raise ValueError("a sample has an empty prompt: a shared-prompt pass needs prompt_len >= 1")
    if any(s.prompt_len != p or s.input_ids[:p] != prompt for s in members):
        raise ValueError("pack: the members do not share one prompt")
    ids, pos, seg = list(prompt), list(range(p)), [0] * p  # seg 0: the prompt; k >= 1: the k-th response
    cols, tgt, ix, lengths = [], [], [], []
    for k, (s, b) in enumerate(zip(members, rows_b), start=1):
        resp = s.input_ids[p:-1]  # every response token but the last is an input
        lengths.append(len(resp))
        start = len(ids)
        ids += resp
        pos += range(p, p + len(resp))
        seg += [k] * len(resp)
        for j, m in enumerate(s.loss_mask):
            if m:
                cols.append(p - 1 if j == 0 else start + j - 1)  # the hidden state before response token j
                tgt.append(s.input_ids[p + j])
                ix.append(b * T + j)
    seg_ids = torch.tensor(seg)
    q = torch.arange(len(ids))
    visible = (seg_ids[None, :] == 0) | (seg_ids[:, None] == seg_ids[None, :])
    mask = (q[:, None] >= q[None, :]) & visible
    if mask_dtype is not None:
        mask = torch.zeros(mask.shape, dtype=mask_dtype).masked_fill_(~mask, torch.finfo(mask_dtype).min)

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    parts = Segments.of(p, lengths, device)
    return Packed(t(ids)[None], t(pos)[None], mask[None, None].to(device), t(cols), t(tgt), t(ix), parts)
