"""Spreading work over N workers: longest-processing-time first, and the rollout's estimate of a sample's work.

:func:`longest_first` is the one balancer of the code base: the rollout pool spreads GRPO groups over engines
with it (:func:`plan_shards`, by estimated tokens; :func:`plan_chunks`: the chunks its engines pull from one queue), the reward service spreads groups over reward workers
(by sample count), and the learner group spreads a batch's groups over learner ranks
(``rl.trainer.sharding.shard_batch``, by the tokens the learner runs). All pure.
"""

from __future__ import annotations

from typing import Callable, Sequence

from envs.types import Sampling, Task

__all__ = ["longest_first", "plan_shards", "plan_chunks", "estimate_length"]


def longest_first(costs: Sequence[float], n: int) -> list[list[int]]:
    """Item indices for each of ``n`` workers, balancing the summed ``costs``. Pure.

    Longest-processing-time first: items in decreasing cost (ties: lower index first) each go to the worker
    with the least cost so far (ties: lower worker index), so workers finish close together: the largest load
    is at most 4/3 of the optimum. Each worker's list is in increasing item index.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    loads = [0.0] * n
    plan: list[list[int]] = [[] for _ in range(n)]
    for g in sorted(range(len(costs)), key=lambda g: (-costs[g], g)):
        k = min(range(n), key=lambda i: (loads[i], i))
        plan[k].append(g)
        loads[k] += costs[g]
    return [sorted(p) for p in plan]


def estimate_length(task: Task, sampling: Sampling, estimator: Callable[[Task], float | None] | None = None) -> float:
    """Estimated trajectory tokens of one sample of ``task``: ``estimator(task)`` when it knows (the
    driver passes the mixer's per-task length EMA), else ``task.meta["est_len"]``, else the sampling
    budget ``max_new_tokens x max_turns``; never more than ``max_model_len``."""
    est = estimator(task) if estimator is not None else None
    if not (isinstance(est, (int, float)) and est > 0):
        prior = task.meta.get("est_len") if isinstance(task.meta, dict) else None
        est = prior if isinstance(prior, (int, float)) and not isinstance(prior, bool) and prior > 0 else None
    if est is None:
        est = sampling.max_new_tokens * max(1, sampling.max_turns)
    return float(min(est, sampling.max_model_len))


def plan_shards(group_sizes: list[int], est_lengths: list[float], n_engines: int) -> list[list[int]]:
    """Group indices for each of ``n_engines`` engines, balancing estimated token work. Pure.

    A group's work is ``size x est_length`` (its samples decode side by side on one engine,
    which keeps the shared prompt in its prefix cache), spread by :func:`longest_first`.
    Each engine's list is in increasing group index. With equal estimates and equal group sizes this reduces to count balancing (each group,
    in order, to the engine with the fewest samples).
    """
    if n_engines < 1:
        raise ValueError(f"n_engines must be >= 1, got {n_engines}")
    if len(group_sizes) != len(est_lengths):
        raise ValueError(f"{len(group_sizes)} group sizes for {len(est_lengths)} length estimates")
    return longest_first([max(0, s) * max(0.0, float(e)) for s, e in zip(group_sizes, est_lengths)], n_engines)


def plan_chunks(
    group_sizes: list[int], est_lengths: list[float], n_engines: int, per_engine: int = 2
) -> list[list[int]]:
    """Group indices of the chunks that ``n_engines`` engines pull from one queue, heaviest first. Pure.

    One chunk per engine when there is one engine (nothing to even out: the whole call is one batch); else
    ``per_engine`` chunks per engine of balanced estimated work (:func:`plan_shards` over that many bins), so
    that an engine whose chunk ends early takes the next one while a slow chunk finishes elsewhere. Empty
    chunks are left out; each chunk's list is in increasing group index.
    """
    if per_engine < 1:
        raise ValueError(f"per_engine must be >= 1, got {per_engine}")
    bins = plan_shards(group_sizes, est_lengths, n_engines if n_engines == 1 else n_engines * per_engine)
    work = [max(0, s) * max(0.0, float(e)) for s, e in zip(group_sizes, est_lengths)]
    load = {i: sum(work[g] for g in b) for i, b in enumerate(bins)}
    return [bins[i] for i in sorted(load, key=lambda i: (-load[i], i)) if bins[i]]
