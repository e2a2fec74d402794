"""One trunk call per micro-batch: each group's prompt once, its responses packed after it, no per-group padding.

``pack(samples, T, pad_id)`` lays a micro-batch out for ``learner.share_prompt`` as one
row per distinct prompt: ``[prompt, r_1[:-1], r_2[:-1], ...]`` (a response's last token
predicts nothing, so it is not run). A 4D boolean attention mask lets every token see the
prompt and, causally, its own response only; position ids restart after the prompt for
each response, so each response token has exactly the keys, values and positions it has
when the group runs padded (a prompt call whose key/value cache every member attends to).
The rows are padded to the longest row of the micro-batch (pad tokens attend to the prompt
and to each other, so no attention row is empty, and are never read).

Against the padded layout (a prompt call, then the group's responses padded to its longest
against the prompt cache repeated per member) this computes no response padding, repeats no
prompt keys/values per member, and makes one trunk call of ``rows x S`` tokens per
micro-batch instead of two small ones per group (larger matmuls). What it costs: attention
runs over the whole ``S x S`` mask of a row (a masked kernel skips no blocks), where the
padded layout's prompt call runs causal and its response call ``R x (p + R)``.

The returned ``Packed`` says where each masked response token's predicting hidden state sits
(``rows``, ``cols``), its target, and its index into the micro-batch's ``[B, T]`` response
grid, in row-major (sample, position) order. This module runs no model and computes no loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.algos.batch import Sample

__all__ = ["Packed", "pack", "row_lengths"]


@dataclass
class Packed:
    input_ids: torch.Tensor  # [n, S]
    position_ids: torch.Tensor  # [n, S]
    mask: torch.Tensor  # [n, 1, S, S] bool: True = may attend
    rows: torch.Tensor  # [N] row of the hidden state that predicts each masked response token
    cols: torch.Tensor  # [N] its column
    targets: torch.Tensor  # [N]
    index: torch.Tensor  # [N] b * T + j in the [B, T] response grid

    @property
    def computed_tokens(self) -> int:
        """Tokens the trunk call runs, padding included."""
        return self.input_ids.numel()


def _prompt_key(s: Sample) -> tuple[int, ...]:
    return tuple(s.input_ids[: s.prompt_len])


def row_lengths(samples: list[Sample]) -> list[int]:
    """Length of each packed row (one per distinct prompt, in order of first appearance)."""
    lengths: dict[tuple[int, ...], int] = {}
    for s in samples:
        key = _prompt_key(s)
        lengths[key] = lengths.get(key, s.prompt_len) + max(len(s.input_ids) - s.prompt_len - 1, 0)
    return list(lengths.values())


def pack(samples: list[Sample], T: int, pad_id: int, device: torch.device | str = "cpu") -> Packed:
    """The packed layout of ``samples`` (see the module docstring); ``T``: the response grid's width."""
    row_of: dict[tuple[int, ...], int] = {}
    ids: list[list[int]] = []
    pos: list[list[int]] = []
    seg: list[list[int]] = []  # 0: prompt; k >= 1: the k-th response of the row
    rows, cols, tgt, ix = [], [], [], []
    for b, s in enumerate(samples):
        p = s.prompt_len
        if p < 1:
            raise ValueError(f"sample {b} has an empty prompt: a shared-prompt pass needs prompt_len >= 1")
        key = _prompt_key(s)
        if key not in row_of:
            row_of[key] = len(ids)
            ids.append(list(key))
            pos.append(list(range(p)))
            seg.append([0] * p)
        r = row_of[key]
        resp = s.input_ids[p:-1]  # every response token but the last one is an input
        start = len(ids[r])
        ids[r] += resp
        pos[r] += range(p, p + len(resp))
        seg[r] += [max(seg[r]) + 1] * len(resp)
        for j, m in enumerate(s.loss_mask):
            if m:
                rows.append(r)
                cols.append(p - 1 if j == 0 else start + j - 1)  # the hidden state before response token j
                tgt.append(s.input_ids[p + j])
                ix.append(b * T + j)
    n, S = len(ids), max(len(x) for x in ids)
    input_ids = torch.full((n, S), pad_id, dtype=torch.long)
    position_ids = torch.zeros((n, S), dtype=torch.long)
    segments = torch.full((n, S), -1, dtype=torch.long)  # -1: padding, its own segment
    for r in range(n):
        k = len(ids[r])
        input_ids[r, :k] = torch.tensor(ids[r])
        position_ids[r, :k] = torch.tensor(pos[r])
        segments[r, :k] = torch.tensor(seg[r])
    q = torch.arange(S)
    causal = q[:, None] >= q[None, :]
    visible = (segments[:, None, :] == 0) | (segments[:, :, None] == segments[:, None, :])
    mask = (causal & visible).unsqueeze(1)

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    return Packed(input_ids.to(device), position_ids.to(device), mask.to(device), t(rows), t(cols), t(tgt), t(ix))
