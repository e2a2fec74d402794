"""The bounded-staleness stream with partial rollouts (``rollout.partial_rollouts``): a learner update made
while a round generates is pushed into it at once through ``update_in_flight`` (not after the round), the
tokens sampled after it carry the new version, and a group's staleness is that of its oldest token."""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

from envs.types import Sampling, Task
from rl.driver.stream import EpisodeStream

SAMPLING = Sampling(8, 1.0, 1.0, 1, 64)
TOKENS = 4  # per sample


class Traj(NamedTuple):
    task: Task
    group_id: int
    token_versions: list[int]


class PausableEngine:
    """One fake engine sampling ``TOKENS`` tokens per sample, each recording the weights it was sampled with;
    ``update_in_flight`` stops it between tokens, loads, and resumes under the given version."""

    def __init__(self, token_s: float) -> None:
        self.token_s, self.version = token_s, 0
        self.lock = threading.Lock()  # held while a token is sampled
        self.generating = False
        self.mid_round_updates = 0
        self.calls: list[int | None] = []

    def generate(self, tasks, groups, seeds, sampling):
        self.generating = True
        out = []
        try:
            for t, g in zip(tasks, groups):
                versions = []
                for _ in range(TOKENS):
                    with self.lock:
                        versions.append(self.version)
                    time.sleep(self.token_s)
                out.append(Traj(t, g, versions))
        finally:
            self.generating = False
        return out

    def update_in_flight(self, sync, version=None) -> None:
        with self.lock:  # the engine is between tokens
            self.mid_round_updates += self.generating
            sync()
            self.calls.append(version)
            if version is not None:
                self.version = version

    def sync(self) -> None:
        raise AssertionError("with partial rollouts every push goes through update_in_flight")


def make(pool: PausableEngine, k: int, last: int, groups: int = 2, size: int = 2) -> EpisodeStream:
    def draw(step):
        tasks = [Task(id=f"s{step}g{g}", domain="code", messages=()) for g in range(groups) for _ in range(size)]
        return tasks, [g for g in range(groups) for _ in range(size)], list(range(len(tasks)))

    return EpisodeStream(pool, draw, lambda: None, SAMPLING, k, last, partial=True)


def test_updates_reach_a_running_round_and_tokens_carry_their_version() -> None:
    pool = PausableEngine(token_s=0.01)  # a step's round: 2 steps x 4 samples x 4 tokens x 10 ms
    k, steps = 2, 5
    stream = make(pool, k, steps)
    seen = []
    try:
        for step in range(1, steps + 1):
            trajs = stream.take(step)
            m = stream.metrics()
            for t in trajs:
                v = t.token_versions
                assert v == sorted(v), "versions only grow within a sample"
                assert (step - 1) - v[0] <= k, f"step {step}: a token {step - 1 - v[0]} updates stale (k {k})"
            seen.append(trajs)
            assert m["async/staleness_max"] <= k
            time.sleep(0.05)  # the learner's update, while the engine generates the next steps
            t0 = time.perf_counter()
            stream.weights_updated()  # pushed now, even into a running round
            assert time.perf_counter() - t0 < 0.2, "the update waited for the round (a round here takes ~0.3 s)"
            assert stream.engine_version == stream.learner_version == step
    finally:
        stream.close()
    assert pool.calls[0] == 0, "the engines' count is set to the stream's before the first round"
    assert pool.mid_round_updates >= 1, "no update reached a running round"
    mixed = [t for trajs in seen for t in trajs if len(set(t.token_versions)) > 1]
    assert mixed, "no sample has tokens of two policy versions"
    assert sum(len(t) for t in seen) == steps * 4, "every sample trained once"


def test_without_partial_rollouts_a_sync_waits_for_the_round() -> None:
    """The same engine, ``partial`` off: the stream never calls ``update_in_flight``."""
    pool = PausableEngine(token_s=0.002)
    synced = []

    def draw(step):
        return [Task(id=f"s{step}", domain="code", messages=())] * 2, [0, 0], [0, 1]

    def sync():
        assert not pool.generating, "a sync while the engine generates"
        synced.append(1)

    stream = EpisodeStream(pool, draw, sync, SAMPLING, 1, 3)
    try:
        for step in range(1, 4):
            stream.take(step)
            stream.weights_updated()
    finally:
        stream.close()
    assert pool.calls == [] and synced
