"""The task mixer: exact counts, strata, curriculum, seeded and resumable draws.
(Per-domain reward normalization moved to rl/algos/shaping.py: tests/test_shaping.py.)"""

from __future__ import annotations

import collections
import json
import random

import pytest

from envs.types import Message, Task, Trajectory
from rl.data.mixer import Source, TaskMixer, largest_remainder, sources_by_domain


def mk(domain: str, i: int, est_len: int | None = None, prefix: str = "") -> Task:
    meta = {"est_len": est_len} if est_len is not None else {}
    return Task(id=f"{prefix or domain}-{i}", domain=domain, messages=(Message("user", f"q{i}"),), meta=meta)


def traj(t: Task, reward: float | None, n_tokens: int, group: int = 0) -> Trajectory:
    return Trajectory(
        task=t,
        group_id=group,
        prompt_ids=[1],
        response_ids=[5] * n_tokens,
        loss_mask=[1] * n_tokens,
        logprobs=[-1.0] * n_tokens,
        messages=[],
        terminated=True,
        truncated=False,
        finish_reason="stop",
        reward=reward,
    )


def sources() -> list[Source]:
    return [
        Source("code", "code", [mk("code", i, 100 + 10 * i) for i in range(30)]),
        Source("term_a", "terminal", [mk("terminal", i, 400 + i, "ta") for i in range(12)], weight=3.0),
        Source("term_b", "terminal", [mk("terminal", i, 900 + i, "tb") for i in range(6)], weight=1.0),
        Source("tool", "tool_call", [mk("tool_call", i, 20 + i) for i in range(20)]),
    ]


def test_largest_remainder_hand_values() -> None:
    # 8 * (0.4, 0.3, 0.3) = 3.2, 2.4, 2.4 -> floors 3, 2, 2 (7); one unit to a 0.4 remainder.
    assert largest_remainder(8, [0.4, 0.3, 0.3]) == [3, 3, 2]
    assert largest_remainder(10, [1, 1, 0]) == [5, 5, 0]
    assert largest_remainder(7, [1, 2, 4]) == [1, 2, 4]
    assert sum(largest_remainder(13, [0.1, 0.7, 0.2], random.Random(0))) == 13
    with pytest.raises(ValueError):
        largest_remainder(3, [0, 0])


def test_exact_per_step_counts_and_long_run_proportions() -> None:
    m = TaskMixer(sources(), per_step=8, seed=1, domain_weights={"code": 0.4, "terminal": 0.3, "tool_call": 0.3})
    totals: collections.Counter = collections.Counter()
    src_totals: collections.Counter = collections.Counter()
    for step in range(1, 401):
        tasks = m.sample(step)
        c = collections.Counter(t.domain for t in tasks)
        assert len(tasks) == 8
        # Every step: floor or ceil of the exact share (3.2 -> 3 or 4, 2.4 -> 2 or 3).
        assert c["code"] in (3, 4) and c["terminal"] in (2, 3) and c["tool_call"] in (2, 3)
        totals.update(c)
        src_totals.update(t.id[:2] for t in tasks if t.domain == "terminal")
    n = 400 * 8
    assert abs(totals["code"] / n - 0.4) < 0.01 and abs(totals["terminal"] / n - 0.3) < 0.01
    # Datasets within a domain by their weights (3:1).
    assert abs(src_totals["ta"] / (src_totals["ta"] + src_totals["tb"]) - 0.75) < 0.03


def test_every_stratum_represented_and_proportions() -> None:
    m = TaskMixer(sources(), per_step=12, seed=0, domain_weights={"code": 1.0}, strata=3)
    seen: collections.Counter = collections.Counter()
    for step in range(1, 11):
        tasks = m.sample(step)
        # 12 code prompts over three equal strata (10 tasks each by length): exactly 4 each.
        assert [m.last_counts[f"mixer/code/stratum_{k}/count"] for k in range(3)] == [4.0, 4.0, 4.0]
        seen.update(t.id for t in tasks)
    assert set(seen) == {f"code-{i}" for i in range(30)}, "every task visited"
    # Custom proportions: the short stratum gets half.
    m2 = TaskMixer(sources(), per_step=8, seed=0, domain_weights={"code": 1.0}, strata=2, strata_proportions=[1, 1])
    m2.sample(1)
    assert m2.last_counts["mixer/code/stratum_0/count"] == 4.0
    m3 = TaskMixer(sources(), per_step=8, seed=0, domain_weights={"code": 1.0}, strata=2, strata_proportions=[3, 1])
    tasks = m3.sample(1)
    assert m3.last_counts["mixer/code/stratum_0/count"] == 6.0
    assert sum(1 for t in tasks if t.meta["est_len"] < 250) == 6, "stratum 0 holds the 15 shortest tasks"


def test_length_estimates_move_tasks_between_strata() -> None:
    src = [Source("s", "code", [mk("code", i, 100) for i in range(4)])]
    m = TaskMixer(src, per_step=2, seed=0, strata=2, length_ema=1.0)
    m.update([traj(src[0].tasks[0], 1.0, 900), traj(src[0].tasks[1], 1.0, 800)])
    strata = m._strata_of(0)
    assert sorted(strata[1]) == [0, 1], "the two long observed tasks moved to the long stratum"
    assert m.stats["code-0"].est_len == 900.0


def test_seed_reproducibility_and_exact_resume() -> None:
    kw = dict(
        domain_weights={"code": 0.5, "terminal": 0.25, "tool_call": 0.25},
        strata=2,
        curriculum_window=2,
        curriculum_weight=0.3,
    )
    a = TaskMixer(sources(), 6, 7, **kw)
    b = TaskMixer(sources(), 6, 7, **kw)
    c = TaskMixer(sources(), 6, 8, **kw)
    draws_a = [[t.id for t in a.sample(s)] for s in range(1, 6)]
    assert draws_a == [[t.id for t in b.sample(s)] for s in range(1, 6)]
    assert draws_a != [[t.id for t in c.sample(s)] for s in range(1, 6)]
    # Feedback, then a checkpoint (through JSON, as it is stored), then 5 more steps.
    for s in range(6, 9):
        tasks = a.sample(s)
        a.update([traj(t, float(i % 2), 50 + 7 * i) for i, t in enumerate(tasks)])
    state = json.loads(json.dumps(a.state_dict()))
    cont = [[t.id for t in a.sample(s)] for s in range(9, 14)]
    r = TaskMixer(sources(), 6, 7, **kw)
    r.load_state_dict(state)
    assert [[t.id for t in r.sample(s)] for s in range(9, 14)] == cont


def test_curriculum_defers_tasks_without_signal() -> None:
    src = [Source("s", "code", [mk("code", i) for i in range(10)])]
    m = TaskMixer(src, per_step=5, seed=0, curriculum_window=2, curriculum_weight=0.0)
    solved = src[0].tasks[:5]
    for _ in range(2):  # tasks 0-4 solved on their last 2 visits: no signal
        m.update([traj(t, 1.0, 10) for t in solved])
    counts: collections.Counter = collections.Counter()
    for s in range(1, 41):
        counts.update(t.id for t in m.sample(s))
    no_signal = sum(counts[t.id] for t in solved)
    assert no_signal < 0.35 * 200, f"no-signal tasks drawn {no_signal} of 200 times"
    m_off = TaskMixer(src, per_step=5, seed=0)
    c_off = collections.Counter(t.id for s in range(1, 41) for t in m_off.sample(s))
    assert sum(c_off[t.id] for t in solved) == 100


def test_uniform_draw_over_a_mixed_file() -> None:
    # (TaskSampler, this mixer with domains weighted by their task counts, was dead code: the loop builds it so.)
    tasks = [mk("code", i) for i in range(6)] + [mk("tool_call", i) for i in range(2)]
    srcs = sources_by_domain(tasks, "train")
    s = TaskMixer(srcs, 4, 0, domain_weights={x.domain: len(x.tasks) for x in srcs})
    c = collections.Counter(t.domain for step in range(1, 51) for t in s.sample(step))
    assert c["code"] == 150 and c["tool_call"] == 50  # 4 x (6/8, 2/8) = 3, 1 per step
    assert sources_by_domain(tasks, "f")[0].name == "f[code]"


def test_domain_weights_must_name_domains_with_tasks() -> None:
    with pytest.raises(ValueError, match="without tasks"):
        TaskMixer(sources(), 4, 0, domain_weights={"math": 1.0})
