"""Dispatch by estimated length: ``rollout.balance.plan_shards`` (pure LPT) and ``estimate_length``."""

from __future__ import annotations

import itertools
import random

import pytest

from envs.types import Message, Sampling, Task
from rollout.balance import estimate_length, plan_shards


def _loads(plan: list[list[int]], sizes: list[int], est: list[float]) -> list[float]:
    return [sum(sizes[g] * est[g] for g in p) for p in plan]


def test_every_group_once_whole_and_sorted() -> None:
    sizes, est = [4, 4, 2, 8, 1], [10.0, 300.0, 50.0, 5.0, 1000.0]
    plan = plan_shards(sizes, est, 3)
    assert len(plan) == 3
    assert sorted(g for p in plan for g in p) == list(range(5))
    assert all(p == sorted(p) for p in plan)


def test_long_groups_are_spread_not_counted() -> None:
    # Two long groups (0 and 2) among short ones on 2 engines. Count balancing (each group in order to
    # the engine with fewer samples) alternates engines, so groups 0 and 2 both land on engine 0;
    # LPT gives each engine one long group and evens out the short ones.
    sizes = [4] * 8
    est = [500.0, 20.0, 500.0, 20.0, 20.0, 20.0, 20.0, 20.0]
    counted = [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert max(_loads(counted, sizes, est)) == 4 * (500 + 500 + 20 + 20)
    plan = plan_shards(sizes, est, 2)
    assert {0, 2} - set(plan[0]) and {0, 2} - set(plan[1])
    loads = _loads(plan, sizes, est)
    assert loads == [4 * (500 + 3 * 20), 4 * (500 + 3 * 20)]


def test_equal_estimates_reproduce_count_balancing() -> None:
    """Equal sizes and estimates: each group in order to the engine with the fewest samples (the former rule)."""
    for n_groups, n_eng in itertools.product(range(0, 9), range(1, 4)):
        sizes = [4] * n_groups
        shards: list[list[int]] = [[] for _ in range(n_eng)]
        for g in range(n_groups):
            min(shards, key=len).append(g)
        assert plan_shards(sizes, [64.0] * n_groups, n_eng) == shards


def test_within_four_thirds_of_optimum() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n, k = rng.randint(1, 7), rng.randint(1, 3)
        sizes = [rng.randint(1, 8) for _ in range(n)]
        est = [float(rng.randint(1, 400)) for _ in range(n)]
        plan = plan_shards(sizes, est, k)
        best = min(
            max(sum(sizes[g] * est[g] for g in range(n) if a[g] == e) for e in range(k))
            for a in itertools.product(range(k), repeat=n)
        )
        assert max(_loads(plan, sizes, est)) <= 4 / 3 * best + 1e-9


def test_more_engines_than_groups_and_errors() -> None:
    assert plan_shards([2], [10.0], 3) == [[0], [], []]
    assert plan_shards([], [], 2) == [[], []]
    with pytest.raises(ValueError, match="n_engines"):
        plan_shards([1], [1.0], 0)
    with pytest.raises(ValueError, match="estimates"):
        plan_shards([1, 2], [1.0], 2)


def _task(meta: dict) -> Task:
    return Task(id="t", domain="tool_call", messages=(Message("user", "hi"),), meta=meta)


def test_estimate_length_sources() -> None:
    s = Sampling(max_new_tokens=64, temperature=1.0, top_p=1.0, max_turns=3, max_model_len=1024)
    assert estimate_length(_task({}), s) == 192.0  # no estimate: the sampling budget
    assert estimate_length(_task({"est_len": 40}), s) == 40.0  # the task's prior
    assert estimate_length(_task({"est_len": 40}), s, lambda t: 77.5) == 77.5  # the driver's EMA wins
    assert estimate_length(_task({"est_len": 40}), s, lambda t: None) == 40.0  # unknown to it: the prior
    assert estimate_length(_task({"est_len": 5000}), s) == 1024.0  # capped at max_model_len
    assert estimate_length(_task({"est_len": True}), s) == 192.0  # not a number
