"""The bounded-staleness stream (``rl.driver.stream`` with ``max_staleness`` k >= 1) against a fake engine pool
whose engines pull groups from a shared queue and take random times per group: no trained sample is ever more
than k learner updates older than the policy trained, groups stay whole, every drawn step is trained once and
the draws stay within AReaL's capacity rule; groups staler than k (by their oldest token) are dropped and
counted; a checkpoint's buffer comes back as it was and only unfinished groups are generated again."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import pytest

from envs.types import Sampling, Task
from rl.driver.buffer import load_done
from rl.driver.stream import EpisodeStream

SAMPLING = Sampling(8, 1.0, 1.0, 1, 64)
DOMAINS = ("code", "tool_call")


class Traj(NamedTuple):
    """A fake trajectory: ``version`` is the engine weights that generated it (recorded by the fake engine,
    not by the stream); ``token_versions`` as partial rollouts record them (None: not recorded)."""

    task: Task
    group_id: int
    seed: int
    version: int
    token_versions: list[int] | None = None


class Engines:
    """``n`` fake engines pulling a round's groups from one queue; each group takes a random time. Records every
    group generated (task id, seed) and asserts that no sync happens while a group generates."""

    def __init__(self, n: int, rng: random.Random, older: dict[str, int] | None = None) -> None:
        self.n, self.rng, self.version = n, rng, 0
        self.older = older or {}  # task id -> how many versions older its oldest token is (partial rollouts)
        self.busy = 0
        self.lock = threading.Lock()
        self.generated: list[tuple[str, int]] = []
        self.learner = lambda: self.version + 1

    def generate(self, tasks, groups, seeds, sampling):
        members: dict[int, list[int]] = {}
        for i, g in enumerate(groups):
            members.setdefault(g, []).append(i)
        queue = deque(members.values())
        out: list[Traj | None] = [None] * len(tasks)

        def engine() -> None:
            while True:
                with self.lock:
                    if not queue:
                        return
                    idx = queue.popleft()
                    self.busy += 1
                    v = self.version
                time.sleep(self.rng.lognormvariate(-6.0, 1.0))  # median ~2.5 ms, long tail
                for i in idx:
                    old = self.older.get(tasks[i].id)
                    tv = [max(v - old, 0), v] if old is not None else None  # versions start at 0
                    out[i] = Traj(tasks[i], groups[i], seeds[i], v, tv)
                with self.lock:
                    self.generated += [(tasks[i].id, seeds[i]) for i in idx]
                    self.busy -= 1

        with ThreadPoolExecutor(self.n) as ex:
            for f in [ex.submit(engine) for _ in range(self.n)]:
                f.result()
        return out

    def sync(self) -> None:
        """The learner's newest weights (its update count, read from the stream: ``learner``)."""
        with self.lock:
            assert self.busy == 0, "weights pushed while an engine was generating"
            self.version = self.learner()


def task(step: int, g: int) -> Task:
    return Task(id=f"s{step}g{g}", domain=DOMAINS[g % 2], messages=())


def make(pool: Engines, k: int, last: int, groups: int = 3, size: int = 2, log: list | None = None):
    log = log if log is not None else []
    holder: list[EpisodeStream] = []

    def draw(step):
        log.append((step, holder[0].learner_version if holder else 0))
        tasks = [task(step, g) for g in range(groups) for _ in range(size)]
        return tasks, [g for g in range(groups) for _ in range(size)], [step * 100 + i for i in range(len(tasks))]

    def lookup(ids, step):
        tasks = [Task(id=i, domain=DOMAINS[int(i.split("g")[1]) % 2], messages=()) for i in ids for _ in range(size)]
        return tasks, [g for g in range(len(ids)) for _ in range(size)], [step * 100 + i for i in range(len(tasks))]

    stream = EpisodeStream(pool, draw, pool.sync, SAMPLING, k, last, lookup)
    holder.append(stream)
    pool.learner = lambda: stream.learner_version
    return stream, log


def check_batch(step: int, trajs: list[Traj], k: int, size: int) -> dict[int, int]:
    """Staleness within k for every sample, whole groups from one generation: {group id: staleness}."""
    by_group: dict[int, list[Traj]] = {}
    for t in trajs:
        by_group.setdefault(t.group_id, []).append(t)
    out = {}
    for g, members in by_group.items():
        assert len(members) == size, f"step {step}: group {g} not whole"
        assert {m.task.id for m in members} == {f"s{step}g{g}"}, "a group of another step in this batch"
        assert len({m.version for m in members}) == 1
        stale = (step - 1) - min(m.version for m in members)
        assert 0 <= stale <= k, f"step {step}: group {g} is {stale} updates stale (max_staleness {k})"
        out[g] = stale
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", range(8))
def test_staleness_is_never_exceeded_and_groups_stay_whole(k: int, seed: int) -> None:
    rng = random.Random(seed * 31 + k)
    steps, groups, size = 7, 3, 2
    pool = Engines(rng.choice([1, 2, 3]), rng)
    stream, drawn = make(pool, k, steps, groups, size)
    try:
        for step in range(1, steps + 1):
            trajs = stream.take(step)
            m = stream.metrics()
            stale = check_batch(step, trajs, k, size)
            assert len(stale) == groups and m["async/dropped_groups"] == 0
            assert m["async/staleness_max"] == max(stale.values()) <= k
            assert m["rollout/staleness"] == pytest.approx(sum(stale.values()) / groups)
            for d in DOMAINS:
                assert m[f"async/staleness_max/{d}"] <= k
            assert m["async/idle_s/learner"] >= 0 and m["async/idle_s/engines"] >= 0
            time.sleep(rng.uniform(0, 0.01))  # the learner's update
            stream.weights_updated()
    finally:
        stream.close()
    assert [s for s, _ in drawn] == list(range(1, steps + 1)), "each step drawn once, in order"
    # AReaL's capacity rule: step s is drawn only once the learner holds >= s - 1 - k updates.
    assert all(s <= learner + k + 1 for s, learner in drawn), drawn
    counts = Counter(pool.generated)
    assert set(counts.values()) == {1} and len(counts) == steps * groups * size, "each sample generated once"


def test_the_stream_overlaps_generation_with_the_update() -> None:
    """k = 2: while the learner trains a step, the engines generate the following steps' groups."""

    class Slow(Engines):
        def generate(self, tasks, groups, seeds, sampling):
            time.sleep(0.25)
            return super().generate(tasks, groups, seeds, sampling)

    pool = Slow(1, random.Random(0))
    stream, _ = make(pool, 2, 4)
    try:
        stream.take(1)
        stream.metrics()
        time.sleep(1.0)  # the update of step 1: steps 2 and 3 generate meanwhile
        stream.weights_updated()
        stream.take(2)
        m = stream.metrics()
    finally:
        stream.close()
    # Without the overlap take(2) would wait at least one round (0.25 s); the margin is for a loaded host.
    assert m["async/idle_s/learner"] < 0.2 and m["timing/generate_s"] >= 0.25


def test_groups_staler_than_the_bound_by_their_oldest_token_are_dropped_whole_and_counted() -> None:
    """Partial rollouts record per-token versions: a group whose oldest token is older than k updates behind
    the learner is dropped (never trained), the rest of the step is trained."""
    pool = Engines(2, random.Random(1), older={"s3g1": 5, "s4g0": 1})
    stream, _ = make(pool, 1, 4)
    got = {}
    try:
        for step in range(1, 5):
            got[step] = (stream.take(step), stream.metrics())
            stream.weights_updated()
    finally:
        stream.close()
    trajs3, m3 = got[3]
    assert m3["async/dropped_groups"] == 1.0
    assert {t.group_id for t in trajs3} == {0, 2} and len(trajs3) == 4, "group 1 dropped whole"
    # s4g0's oldest token is one version older than its engine's: within k = 1 only if that engine was fresh.
    trajs4, m4 = got[4]
    kept4 = {t.group_id for t in trajs4}
    stale4 = 3 - (min(t.version for t in trajs4 if t.group_id == 0) - 1) if 0 in kept4 else None
    assert (0 in kept4) == (stale4 is not None and stale4 <= 1)
    assert m4["async/dropped_groups"] == float(0 not in kept4)
    assert all(m["async/staleness_max"] <= 1 for _, m in got.values())


def test_a_checkpoint_holds_the_buffer_and_a_resume_trains_each_drawn_group_once() -> None:
    """k = 2, a checkpoint after step 2's update: steps 3 and 4 are drawn, some of their groups finished. The
    resumed stream trains the finished groups as they were (not generated again) and re-issues the others
    with the same seeds; steps 3 and 4 are not drawn again."""

    class Gate(Engines):
        """Step 4's groups wait for ``open``: at the checkpoint they are still generating."""

        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            self.open = threading.Event()

        def generate(self, tasks, groups, seeds, sampling):
            if any(t.id.startswith("s4") for t in tasks):
                assert self.open.wait(10)
            return super().generate(tasks, groups, seeds, sampling)

    pool = Gate(2, random.Random(2))
    stream, _ = make(pool, 2, 6)
    for step in (1, 2):
        stream.take(step)
        stream.weights_updated()
    # Step 3 starts on the initial weights; step 4 needs a sync, which waits for step 3's round to end.
    deadline = time.monotonic() + 10
    while not stream.buffer.steps[3].complete():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    state = stream.state_dict()  # step 4 queued or held at the gate: unfinished at the checkpoint
    pool.open.set()
    stream.close()
    steps = {s["step"]: s for s in state["steps"]}
    assert sorted(steps) == [3, 4] and steps[3]["task_ids"] == ["s3g0", "s3g1", "s3g2"]
    finished3 = load_done(steps[3]["done"])
    assert sorted(finished3) == [0, 1, 2] and not load_done(steps[4]["done"])

    pool2 = Engines(2, random.Random(3))
    pool2.version = 2  # the checkpoint's weights
    resumed, drawn = make(pool2, 2, 6)
    resumed.start_at(2)
    resumed.load_state_dict(state)
    out = {}
    try:
        for step in (3, 4, 5, 6):
            out[step] = resumed.take(step)
            check_batch(step, out[step], 2, 2)
            resumed.weights_updated()
    finally:
        resumed.close()
    assert [s for s, _ in drawn] == [5, 6], "steps 3 and 4 came from the checkpoint"
    assert sorted(out[3], key=lambda t: t.seed) == sorted(
        (t for trajs, _ in finished3.values() for t in trajs), key=lambda t: t.seed
    ), "step 3's finished groups trained as they were"
    assert not any(i.startswith("s3") for i, _ in pool2.generated), "finished groups not generated again"
    assert sorted(s for i, s in pool2.generated if i.startswith("s4")) == [400 + i for i in range(6)]
    assert all(t.version >= 2 for t in out[4])


def test_a_one_step_off_checkpoint_loads_as_one_unfinished_step() -> None:
    pool = Engines(1, random.Random(4))
    stream, drawn = make(pool, 1, 4)
    stream.start_at(2)
    stream.load_state_dict({"step": 3, "task_ids": ["s3g0", "s3g1"]})
    try:
        trajs = stream.take(3)
    finally:
        stream.close()
    assert sorted({t.task.id for t in trajs}) == ["s3g0", "s3g1"] and drawn == [(4, 2)]


def test_discard_waits_for_the_round_and_forgets_the_drawn_steps() -> None:
    pool = Engines(1, random.Random(5))
    stream, drawn = make(pool, 2, 6)
    try:
        stream.take(1)
        stream.weights_updated()
        stream.discard()  # back to a checkpoint of step 0
        assert stream.state_dict() == {} and pool.busy == 0
        stream.start_at(0)
        trajs = stream.take(1)
    finally:
        stream.close()
    assert {t.task.id for t in trajs} == {"s1g0", "s1g1", "s1g2"}
    assert [s for s, _ in drawn] == [1, 2, 3, 1, 2, 3]
