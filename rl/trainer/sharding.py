"""Sharding a batch over the data-parallel learner ranks: whole GRPO groups per shard, balanced by token count.

Every shard keeps the *global* loss denominators (``num_tokens``, ``num_seqs`` of the full batch), so each
rank's loss is its part of the full-batch loss and the SUM of the ranks' gradients (``rl.trainer.collectives``)
is the single-learner gradient. Group statistics stay local to one rank because a group is never split.
"""

from __future__ import annotations

from dataclasses import replace

from rl.algos.batch import Batch, Sample
from rollout.balance import longest_first

__all__ = ["shard_batch"]


def shard_batch(batch: Batch, n: int) -> list[Batch]:
    """Split ``batch`` into ``n`` shards of whole groups (``Sample.group_id``), balanced by token count.

    Greedy longest-first (``rollout.balance.longest_first``): groups in decreasing cost (the tokens the learner
    runs: prompt once plus every computed member's response; skipped members cost nothing) go to the shard with
    the least cost so far (ties: lowest index). Skipped (zero-advantage) members follow their group. Every shard
    keeps the batch's global ``num_tokens``, ``num_seqs`` and ``domains`` (its samples' when the batch has none).
    Samples keep their batch order (by ``uid``) within a shard. Pure.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    groups: dict[int, tuple[list[Sample], list[Sample]]] = {}
    for s in batch.samples:
        groups.setdefault(s.group_id, ([], []))[0].append(s)
    for s in batch.skipped:
        groups.setdefault(s.group_id, ([], []))[1].append(s)

    def cost(g: tuple[list[Sample], list[Sample]]) -> int:
        comp = g[0]
        if not comp:
            return 0
        return max(s.prompt_len for s in comp) + sum(len(s.input_ids) - s.prompt_len for s in comp)

    gids = sorted(groups)  # ties in cost: the lower group id first, as before
    # the whole batch's domains on every shard: the ranks' per-domain sums line up in the all-reduce
    domains = batch.domains or tuple(sorted({s.domain for s in [*batch.samples, *batch.skipped]}))
    shards = []
    for plan in longest_first([cost(groups[g]) for g in gids], n):
        chosen = [gids[k] for k in plan]
        samples = sorted((s for g in chosen for s in groups[g][0]), key=lambda s: s.uid)
        skipped = sorted((s for g in chosen for s in groups[g][1]), key=lambda s: s.uid)
        shards.append(replace(batch, samples=samples, skipped=skipped, domains=domains))
    return shards
