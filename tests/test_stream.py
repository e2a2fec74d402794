"""rl.driver.stream.EpisodeStream with a recording fake pool: what is generated when, with which
weights, and what a checkpoint of an async run holds."""

from __future__ import annotations

import threading
import time

import pytest

from envs.types import Sampling, Task, Trajectory
from rl.driver.stream import EpisodeStream

SAMPLING = Sampling(8, 1.0, 1.0, 1, 64)


class FakePool:
    """Generates 'trajectories' that record the engine weights version they were sampled with."""

    def __init__(self, delay: float = 0.0) -> None:
        self.version = 0
        self.delay = delay
        self.calls: list[tuple[str, int]] = []
        self.busy = threading.Event()

    def generate(self, tasks, groups, seeds, sampling):
        self.busy.set()
        v = self.version
        time.sleep(self.delay)
        self.calls.append(("generate", v))
        self.busy.clear()
        return [(t.id, v, s) for t, s in zip(tasks, seeds)]

    def sync(self) -> None:
        assert not self.busy.is_set(), "weights pushed while the engine was generating"
        self.version += 1
        self.calls.append(("sync", self.version))


def task(i: int) -> Task:
    return Task(id=f"t{i}", domain="tool_call", messages=())


def make(pool: FakePool, max_staleness: int, last: int = 4, drawn=None):
    drawn = drawn if drawn is not None else []

    def draw(step):  # one task, drawn as a group of two
        drawn.append(step)
        return [task(step)] * 2, [0, 0], [step, step]

    def lookup(ids, step):
        return [Task(id=i, domain="tool_call", messages=()) for i in ids], [0] * len(ids), [step] * len(ids)

    return EpisodeStream(pool, draw, pool.sync, SAMPLING, max_staleness, last, lookup), drawn


def run(stream: EpisodeStream, steps: range) -> list[tuple[list, dict]]:
    out = []
    for step in steps:
        trajs = stream.take(step)
        stream.weights_updated()  # the "learner update" of this step
        out.append((trajs, stream.metrics()))
    return out


def test_synchronous_generates_each_step_with_the_newest_weights() -> None:
    pool = FakePool()
    stream, drawn = make(pool, 0)
    res = run(stream, range(1, 5))
    assert drawn == [1, 2, 3, 4]
    assert [trajs[0][1] for trajs, _ in res] == [0, 1, 2, 3], "step t is sampled after t-1 updates"
    assert all(m["rollout/staleness"] == 0.0 for _, m in res)
    assert [c[0] for c in pool.calls] == ["generate", "sync"] * 4
    assert stream.state_dict() == {}


def test_one_step_off_overlaps_and_is_one_update_stale() -> None:
    pool = FakePool(delay=0.05)
    stream, drawn = make(pool, 1)
    res = run(stream, range(1, 5))
    stream.close()
    # Step 1 from the initial weights; step t >= 2 generated (during step t-1's update) with the
    # weights after t-2 updates, and trained by the learner after t-1 updates: staleness 1.
    assert [trajs[0][1] for trajs, _ in res] == [0, 0, 1, 2]
    assert [m["rollout/staleness"] for _, m in res] == [0.0, 1.0, 1.0, 1.0]
    assert [[x[0] for x in t] for t, _ in res] == [["t1"] * 2, ["t2"] * 2, ["t3"] * 2, ["t4"] * 2]
    assert drawn == [1, 2, 3, 4]
    assert pool.calls.count(("generate", 0)) == 2
    assert all(m["timing/generate_s"] >= 0.05 for _, m in res)
    # No sync while generating (FakePool.sync asserts it), and none after the last step's update.
    assert [c for c in pool.calls if c[0] == "sync"] == [("sync", 1), ("sync", 2), ("sync", 3)]


def test_async_wait_is_shorter_than_generation_when_the_update_overlaps_it() -> None:
    pool = FakePool(delay=0.2)
    stream, _ = make(pool, 1)
    stream.take(1)
    stream.metrics()
    time.sleep(0.25)  # the "learner update" of step 1, while step 2 generates
    stream.weights_updated()
    stream.take(2)
    m = stream.metrics()
    stream.close()
    assert m["timing/generate_s"] >= 0.2 and m["timing/rollout_s"] < 0.1


def test_quiesce_waits_and_pushes_the_newest_weights() -> None:
    pool = FakePool(delay=0.05)
    stream, _ = make(pool, 1)
    stream.take(1)
    stream.weights_updated()
    stream.quiesce()  # e.g. before an evaluation
    assert pool.version == 1 and not pool.busy.is_set()
    trajs = stream.take(2)  # generated before the quiesce, with the old weights
    assert trajs[0][1] == 0 and stream.metrics()["rollout/staleness"] == 1.0
    stream.close()


def test_async_checkpoint_holds_the_in_flight_draw_and_resume_regenerates_it() -> None:
    pool = FakePool()
    stream, _ = make(pool, 1)
    run(stream, range(1, 3))  # step 3 is in flight now
    state = stream.state_dict()
    stream.close()
    assert [(s["step"], s["task_ids"]) for s in state["steps"]] == [(3, ["t3"])], "one id per group"

    pool2 = FakePool()
    resumed, drawn = make(pool2, 1)
    resumed.start_at(2)
    resumed.load_state_dict(state)
    trajs = resumed.take(3)
    resumed.close()
    assert [t[0] for t in trajs] == ["t3"] and trajs[0][2] == 3, "same tasks, same step seeds"
    assert drawn == [4], "step 3 was not drawn again; step 4 was drawn as it started"
    assert resumed.metrics()["rollout/staleness"] == 0.0


def test_generation_errors_surface_at_take() -> None:
    class Failing(FakePool):
        def generate(self, *a):
            raise RuntimeError("engine exploded")

    stream, _ = make(Failing(), 1)
    with pytest.raises(RuntimeError, match="engine exploded"):
        stream.take(1)
    stream.close()


def test_bad_mode() -> None:
    with pytest.raises(ValueError, match="rollout.max_staleness must be >= 0"):
        make(FakePool(), -1)


class CountingEngine:
    """Real ``Trajectory`` records whose tokens carry the engine's own count of weight loads, as the engines'
    ``PauseGate`` records them: a resumed run's engines have loaded once (the checkpoint), whatever its step."""

    def __init__(self) -> None:
        self.loads = 0

    def generate(self, tasks, groups, seeds, sampling):
        return [
            Trajectory(t, g, [1], [5, 6, 7], [1, 0, 1], [-0.1, 0.0, -0.2], [], True, False, "stop",
                       token_versions=[self.loads, -1, self.loads])
            for t, g in zip(tasks, groups)
        ]  # fmt: skip

    def sync(self) -> None:
        self.loads += 1


@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_resumed_run_counts_versions_from_its_checkpoint_not_the_engines_loads(k: int) -> None:
    """Resumed at step 5 (the engines loaded the checkpoint once): without partial rollouts the trained groups are
    0 updates stale and their tokens record version 5, 6, ... (the engines' own count, 1, 2, ..., would make
    every group 4 updates stale and, with k < 4, dropped)."""
    pool = CountingEngine()
    stream, _ = make(pool, k, last=8)
    pool.sync()  # the checkpoint's weights into the engines
    stream.start_at(5)
    stream.load_state_dict({"steps": [{"step": 6, "task_ids": ["t6"], "done": ""}]} if k else {})
    try:
        for step in (6, 7, 8):
            trajs = stream.take(step)
            m = stream.metrics()
            # step 6 comes back from the checkpoint's draw (one task per group id there); later steps are drawn
            assert len(trajs) == (1 if step == 6 and k else 2), trajs
            assert m["async/dropped_groups" if k else "rollout/staleness"] == 0.0, m
            assert 0.0 <= m["rollout/staleness"] <= k, m
            for t in trajs:
                assert t.token_versions[1] == -1 and t.token_versions[0] == t.token_versions[2]
                assert step - 1 - t.oldest_version == (0 if step == 6 else m["rollout/staleness"])
            stream.weights_updated()
    finally:
        stream.close()


def test_a_groups_oldest_version_is_its_oldest_policy_token_never_an_env_token() -> None:
    """Env tokens record -1 (no policy sampled them): a multi-turn group is as old as its oldest policy token, or
    the engine's version where no token carries one."""
    from rl.driver.buffer import oldest_version

    def t(versions):
        return Trajectory(
            task(0), 0, [1], [5, 6, 7], [1, 0, 1], [0.0] * 3, [], True, False, "stop", token_versions=versions
        )

    assert oldest_version([t([4, -1, 5]), t([3, -1, -1])], 9) == 3
    assert oldest_version([t([-1, -1, -1]), t(None)], 9) == 9
