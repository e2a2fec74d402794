"""The rollout pool's one queue (``rl.driver.actors.rollout.RolloutPool.generate``): chunks of whole groups
(``rollout.balance.plan_chunks``), pulled by the engines as they finish, so that an engine that ends early
takes the next chunk instead of waiting for the slowest; trajectories come back in the input's order."""

from __future__ import annotations

import os
import time

import pytest
from test_faults import ray_cpus  # noqa: F401 - the module's Ray (2 CPUs)

from envs.types import Sampling, Task
from rollout.balance import plan_chunks, plan_shards


def test_chunks_hold_every_group_once_heaviest_first() -> None:
    sizes, est = [4] * 10, [float(x) for x in (10, 300, 20, 40, 5, 80, 60, 7, 100, 30)]
    chunks = plan_chunks(sizes, est, 2)
    assert len(chunks) == 4 and sorted(g for c in chunks for g in c) == list(range(10))
    loads = [sum(sizes[g] * est[g] for g in c) for c in chunks]
    assert loads == sorted(loads, reverse=True) and all(c == sorted(c) for c in chunks)


def test_one_engine_gets_one_chunk_and_empty_chunks_are_left_out() -> None:
    assert plan_chunks([2, 2, 2], [1.0, 2.0, 3.0], 1) == [[0, 1, 2]], "one engine: one batch, as before"
    assert plan_chunks([2], [1.0], 3) == [[0]]
    assert plan_chunks([], [], 2) == []
    assert plan_chunks([2, 2], [1.0, 1.0], 2, per_engine=1) == plan_shards([2, 2], [1.0, 1.0], 2)
    with pytest.raises(ValueError, match="per_engine must be >= 1"):
        plan_chunks([1], [1.0], 2, per_engine=0)


class Timed:
    """A rollout worker without an engine: each sample's task says how long it takes (``meta["sleep"]``)."""

    def __init__(self, model_path: str, env_specs: list, seed: int = 0) -> None:
        pass

    def generate(self, tasks, groups, seeds, sampling):
        time.sleep(tasks[0].meta["sleep"])  # one group per chunk here
        return [(t.id, g, s, os.getpid()) for t, g, s in zip(tasks, groups, seeds)]

    def health(self):
        return None

    def leftovers(self):
        return [], []

    def pid(self) -> int:
        return os.getpid()


@pytest.mark.slow
def test_an_engine_that_finishes_early_takes_the_next_chunk(ray_cpus) -> None:
    """Two engines, four chunks: one long chunk (1.5 s) and three short ones (0.1 s). Up-front halves would
    put a short chunk after the long one on one engine; from one queue the other engine takes all the short
    ones, and the call ends with the long chunk."""
    from rl.driver.actors.rollout import RolloutPool

    sleeps = {0: 1.5, 1: 0.1, 2: 0.1, 3: 0.1}
    tasks = [Task(id=f"t{g}", domain="tool_call", messages=(), meta={"sleep": s}) for g, s in sleeps.items()]
    tasks = [t for t in tasks for _ in range(2)]
    groups, seeds = [g for g in sleeps for _ in range(2)], list(range(8))
    est = {t.id: 40.0 * t.meta["sleep"] for t in tasks}  # under max_model_len (64), which caps estimates
    pool = RolloutPool(2, "unused", [], num_cpus=0.1, worker_cls=Timed, length_estimator=lambda t: est[t.id])
    try:
        t0 = time.perf_counter()
        out = pool.generate(tasks, groups, seeds, Sampling(8, 1.0, 1.0, 1, 64))
        wall = time.perf_counter() - t0
    finally:
        pool.shutdown()
    assert [(x[0], x[1], x[2]) for x in out] == [(t.id, g, s) for t, g, s in zip(tasks, groups, seeds)]
    long_pid = out[0][3]
    assert all(x[3] != long_pid for x in out[2:]), "the short chunks all went to the other engine"
    assert wall < 1.5 + 0.25 + 1.0, wall  # the long chunk, not the long chunk plus a short one queued behind it
