"""The padded shared-prompt layout, kept for the benches and tests that compare it with the packed one.

A group's prompt runs once into a key/value cache, then its responses, padded to the group's longest, attend
to it (two trunk calls per group). The learner runs the packed layout (``rl.trainer.packing``: one call per
group, no padding); ``use(lrn)`` makes a learner run this one instead (``Forward.layout``), to time it
(bench/learner_floor.py, bench/learner_memory.py) or to test packed against it (tests/test_learner_packing.py).
"""

from __future__ import annotations

from typing import Any

import torch


class PaddedLayout:
    """``Forward.layout``'s interface: ``hidden``, ``trunk_calls``, ``unit_cost``."""

    def hidden(self, fwd: Any, base: Any, groups: list[tuple[list[Any], list[int]]], T: int) -> list[tuple[Any, ...]]:
        """Each group's (hidden [n, H], targets [n], index [n]) at its masked response tokens."""
        if fwd.cfg.activation_checkpointing:
            # The prompt call fills a key/value cache that recomputed layers would write twice.
            raise RuntimeError("activation checkpointing with a shared prompt needs the packed layout")
        return [_group(fwd, base, members, rows_b, T) for members, rows_b in groups]

    @staticmethod
    def trunk_calls(longest: list[int]) -> int:
        """Trunk calls for groups whose longest responses are ``longest``: the prompt, then the responses when
        longer than 1."""
        return sum(1 + (r > 1) for r in longest)

    @staticmethod
    def unit_cost(group: list[Any]) -> int:
        """Tokens a group computes: its prompt once, each response padded to the longest."""
        longest = max(len(s.input_ids) for s in group)
        return group[0].prompt_len + len(group) * (longest - group[0].prompt_len)


def use(lrn: Any, padded: bool = True) -> None:
    """Make learner ``lrn`` run the padded layout (``padded=False``: back to packed)."""
    from rl.trainer.forward import PackedLayout

    lrn.fwd.layout = PaddedLayout() if padded else PackedLayout()


def is_padded(lrn: Any) -> bool:
    return isinstance(lrn.fwd.layout, PaddedLayout)


def _group(fwd: Any, base: Any, members: list[Any], rows_b: list[int], T: int) -> tuple[Any, ...]:
    """One group: the prompt call (its cache repeated per member), then the responses padded to the longest."""
    p = members[0].prompt_len
    G = len(members)
    R = max(len(s.input_ids) - p for s in members)
    prompt = torch.tensor([members[0].input_ids[:p]], device=fwd.device)
    out = fwd.lock.trunk(base, input_ids=prompt, use_cache=True)
    last = out.last_hidden_state[:, -1:].expand(G, 1, -1)  # predicts response token 0
    if R > 1:
        cache = out.past_key_values
        cache.batch_repeat_interleave(G)
        ids = torch.full((G, R - 1), fwd.pad_id, dtype=torch.long)
        att = torch.zeros((G, p + R - 1), dtype=torch.long)
        att[:, :p] = 1
        for g, s in enumerate(members):
            resp = s.input_ids[p:][: R - 1]
            ids[g, : len(resp)] = torch.tensor(resp)
            att[g, p : p + len(resp)] = 1
        pos = torch.arange(p, p + R - 1).expand(G, -1)
        h2 = fwd.lock.trunk(
            base,
            input_ids=ids.to(fwd.device),
            attention_mask=att.to(fwd.device),
            past_key_values=cache,
            position_ids=pos.to(fwd.device),
            use_cache=True,
        ).last_hidden_state
        hidden = torch.cat([last, h2], dim=1)  # [G, R, H]: position j predicts response token j
    else:
        hidden = last
    g_idx, j_idx, tgt, ix = fwd.select(members, rows_b, T)
    return (
        hidden[
            torch.tensor(g_idx, dtype=torch.long, device=fwd.device),
            torch.tensor(j_idx, dtype=torch.long, device=fwd.device),
        ],
        tgt,
        ix,
    )
