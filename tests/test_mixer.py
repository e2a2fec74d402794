"""The task mixer: exact counts, strata, curriculum, seeded and resumable draws.
(Per-domain reward normalization moved to rl/algos/shaping.py: tests/test_shaping.py.)"""

from __future__ import annotations

import collections
import json
import random

import pytest

from envs.types import Message, Task, Trajectory
from rl.data.mixer import AdaptiveTaskMixer, Source, TaskMixer, largest_remainder, sources_by_domain


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
    assert_resumes_exactly(a, lambda: TaskMixer(sources(), 6, 7, **kw), range(6, 9), range(9, 14))


def assert_resumes_exactly(a: TaskMixer, fresh, fed: range, after: range) -> None:
    """``a`` draws and gets feedback for the steps in ``fed``, is checkpointed through JSON (as it is stored), and
    a mixer from ``fresh()`` loaded from that state draws for the steps in ``after`` exactly what ``a`` draws."""
    for s in fed:
        tasks = a.sample(s)
        a.update([traj(t, float(i % 2), 50 + 7 * i) for i, t in enumerate(tasks)])
    state = json.loads(json.dumps(a.state_dict()))
    cont = [[t.id for t in a.sample(s)] for s in after]
    r = fresh()
    r.load_state_dict(state)
    assert [[t.id for t in r.sample(s)] for s in after] == cont


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


# ---------------------------------------------------------------------------- the per-domain floor
# (mixer.min_groups_per_domain)

FLOOR_DOMAINS = ("code", "terminal", "tool_call")
WEIGHTS = {"code": 0.05, "terminal": 0.05, "tool_call": 0.9}


def floor_sources(n: int = 30) -> list[Source]:
    return [Source(d, d, [mk(d, i) for i in range(n)]) for d in FLOOR_DOMAINS]


def test_the_floor_holds_in_every_draw_and_the_rest_follows_the_weights():
    m = TaskMixer(floor_sources(), per_step=8, seed=0, domain_weights=WEIGHTS, min_groups_per_domain=2)
    totals: collections.Counter = collections.Counter()
    for step in range(1, 101):
        c = collections.Counter(t.domain for t in m.sample(step))
        assert sum(c.values()) == 8 and min(c[d] for d in FLOOR_DOMAINS) >= 2, (step, c)
        assert {d: m.last_counts[f"mixer/{d}/count"] for d in FLOOR_DOMAINS} == {d: float(c[d]) for d in FLOOR_DOMAINS}
        totals.update(c)
    # 2 each by the floor; the other 2 x 100 prompts by 0.05 / 0.05 / 0.9 (cumulative targets: exact at 100 steps)
    assert dict(totals) == {"code": 200 + 10, "terminal": 200 + 10, "tool_call": 200 + 180}


def test_without_the_floor_a_small_domain_misses_steps():
    m = TaskMixer(floor_sources(), per_step=8, seed=0, domain_weights=WEIGHTS)
    per_step = [collections.Counter(t.domain for t in m.sample(s))["code"] for s in range(1, 41)]
    assert per_step.count(0) == 24 and per_step.count(1) == 16  # 0.4 prompts a step: 16 of 40 steps draw one


def test_floor_zero_draws_exactly_what_the_mixer_drew_before():
    kw = dict(domain_weights={"code": 0.25, "terminal": 0.4, "tool_call": 0.35}, strata=2)
    a = TaskMixer(floor_sources(), 8, 5, **kw)
    b = TaskMixer(floor_sources(), 8, 5, **kw, min_groups_per_domain=0)
    assert [[t.id for t in a.sample(s)] for s in range(1, 30)] == [[t.id for t in b.sample(s)] for s in range(1, 30)]


def test_a_domain_of_weight_zero_gets_no_floor():
    m = TaskMixer(floor_sources(), 6, 0, domain_weights={"code": 1.0, "terminal": 1.0}, min_groups_per_domain=3)
    for s in range(1, 11):
        c = collections.Counter(t.domain for t in m.sample(s))
        assert c == {"code": 3, "terminal": 3}


def test_a_floor_the_step_cannot_hold_is_refused():
    with pytest.raises(
        ValueError, match=r"min_groups_per_domain 3 for 3 domains needs 9 prompts per step; per_step is 8"
    ):
        TaskMixer(floor_sources(), 8, 0, min_groups_per_domain=3)
    with pytest.raises(ValueError, match="min_groups_per_domain -1"):
        TaskMixer(floor_sources(), 8, 0, min_groups_per_domain=-1)


def test_the_floor_holds_under_adaptive_weights_and_resumes_exactly():
    def run(steps: int, resume_at: int | None = None) -> list[list[str]]:
        kw = dict(adaptive={"floor": 0.02, "ceiling": 0.96, "rate": 1.0}, min_groups_per_domain=2)
        m = AdaptiveTaskMixer(floor_sources(), per_step=8, seed=3, **kw)
        rng, out = random.Random(0), []
        for step in range(1, steps + 1):
            if step == resume_at:
                state = json.loads(json.dumps(m.state_dict()))
                m = AdaptiveTaskMixer(floor_sources(), per_step=8, seed=3, **kw)
                m.load_state_dict(state)
            tasks = m.sample(step)
            c = collections.Counter(t.domain for t in tasks)
            assert len(tasks) == 8 and min(c[d] for d in FLOOR_DOMAINS) >= 2, (step, c)
            out.append([t.id for t in tasks])
            # only tool calls vary: the others' adaptive weights fall to their floor, their prompts to 2
            m.update([traj(t, rng.random() if t.domain == "tool_call" else 0.0, 8, g) for g, t in enumerate(tasks)])
        assert m.domain_weights["code"] < 0.1 and collections.Counter(x.split("-")[0] for x in out[-1])["code"] == 2
        return out

    assert run(20) == run(20, resume_at=11)


def test_the_recipe_key_reaches_the_mixer_and_a_floor_too_big_names_it(recipe_copy):
    from rl.config.recipe import RecipeError, load_recipe, validate_recipe
    from rl.driver.loop import make_mixer

    path = recipe_copy("joint_rl.yaml", edit=lambda d: d["mixer"].update({"min_groups_per_domain": 2}))
    cfg = load_recipe(path, ["model.path=embedded:tiny"])
    validate_recipe(cfg)
    assert cfg.mixer.min_groups_per_domain == 2 and make_mixer(cfg, floor_sources()).min_groups_per_domain == 2
    assert load_recipe(recipe_copy("joint_rl.yaml", filename="d.yaml")).mixer.min_groups_per_domain == 0
    with pytest.raises(RecipeError, match=r"mixer\.min_groups_per_domain: 3 prompts for each of 3 domains .* is 9"):
        validate_recipe(load_recipe(path, ["model.path=embedded:tiny", "mixer.min_groups_per_domain=3"]))
    with pytest.raises(RecipeError, match=r"mixer\.min_groups_per_domain: must be >= 0"):
        load_recipe(path, ["mixer.min_groups_per_domain=-1"])


# ---------------------------------------------------------------------------- spread_by


def templated(n_templates: int = 12, per: int = 4, seed: int = 0) -> list[Source]:
    """One code file of ``n_templates`` templates x ``per`` tasks, lengths spread so that templates share strata."""
    rnd = random.Random(seed)
    tasks = [
        Task(
            id=f"code-t{t}-{i}",
            domain="code",
            messages=(Message("user", f"q{t}-{i}"),),
            meta={"template": f"t{t}", "est_len": rnd.randint(50, 300)},
        )
        for t in range(n_templates)
        for i in range(per)
    ]
    return [Source("code", "code", tasks)]


def template_counts(draws: list[Task]) -> collections.Counter:
    return collections.Counter(t.meta["template"] for t in draws)


def test_spread_draws_every_template_once_before_any_twice_across_strata():
    """12 templates x 4 tasks, 2 length strata, 2 prompts a step: after 6 steps every template was drawn exactly
    once, after 12 exactly twice, in every seed; a plain shuffle leaves templates undrawn and draws others thrice."""
    plain_missed = 0
    for seed in range(5):
        m = TaskMixer(templated(seed=seed), 2, seed, strata=2, spread_by="template")
        draws = [t for s in range(1, 7) for t in m.sample(s)]
        assert set(template_counts(draws).values()) == {1}, "each of the 12 templates once in the first 12 draws"
        draws += [t for s in range(7, 13) for t in m.sample(s)]
        assert set(template_counts(draws).values()) == {2}
        assert len({t.id for t in draws}) == 24, "still each task once per pass: no task twice"
        plain = TaskMixer(templated(seed=seed), 2, seed, strata=2)
        plain_missed += 12 - len(template_counts([t for s in range(1, 7) for t in plain.sample(s)]))
    assert plain_missed > 0, "the plain shuffle missed some template in some seed (what spread_by is for)"


def test_spread_keeps_the_strata_counts_and_tasks_without_the_key_are_their_own_value():
    srcs = templated()
    srcs[0].tasks += [mk("code", i, 100 + i, "bare") for i in range(3)]  # no template: each its own value
    a = TaskMixer(srcs, 3, 1, strata=3, spread_by="template")
    b = TaskMixer(srcs, 3, 1, strata=3)
    for s in range(1, 6):
        a.sample(s)
        b.sample(s)
        assert {k: v for k, v in a.last_counts.items() if "stratum" in k} == {
            k: v for k, v in b.last_counts.items() if "stratum" in k
        }, "the spread reorders within a stratum; the counts per stratum are the mixer's"
    m = TaskMixer(srcs, 3, 2, spread_by="template")
    draws = [t for s in range(1, 6) for t in m.sample(s)]
    values = collections.Counter(t.meta.get("template", t.id) for t in draws)
    assert max(values.values()) == 1, "15 draws over 12 templates + 3 bare tasks: each value once"


def test_spread_resumes_exactly_and_is_off_by_default():
    kw = dict(strata=2, spread_by="template", curriculum_window=2, curriculum_weight=0.5)
    assert_resumes_exactly(
        TaskMixer(templated(), 3, 4, **kw), lambda: TaskMixer(templated(), 3, 4, **kw), range(1, 5), range(5, 12)
    )
    # a checkpoint written before spread_by existed (no "spread" entry) loads: nothing drawn yet
    old = {k: v for k, v in TaskMixer(templated(), 3, 4, strata=2).state_dict().items() if k != "spread"}
    TaskMixer(templated(), 3, 4, strata=2).load_state_dict(old)
    off = TaskMixer(templated(), 3, 4, strata=2)
    same = TaskMixer(templated(), 3, 4, strata=2, spread_by="")
    assert [[t.id for t in off.sample(s)] for s in range(1, 9)] == [[t.id for t in same.sample(s)] for s in range(1, 9)]


def test_spread_by_a_key_no_task_has_is_refused_naming_it(recipe_copy):
    from rl.config.recipe import load_recipe
    from rl.driver.loop import make_mixer

    with pytest.raises(ValueError, match=r"mixer\.spread_by: no training task has 'tmpl' in its meta"):
        TaskMixer(templated(), 2, 0, spread_by="tmpl")
    cfg = load_recipe(
        recipe_copy("joint_rl.yaml"),
        ["model.path=embedded:tiny", "mixer.spread_by=template", "mixer.domain_weights={}"],
    )
    assert make_mixer(cfg, templated()).spread_by == "template"
