"""The mixer's per-domain floor on prompts per step (``mixer.min_groups_per_domain``)."""

from __future__ import annotations

import collections
import json
import random

import pytest

from envs.types import Message, Task, Trajectory
from rl.data.mixer import AdaptiveTaskMixer, Source, TaskMixer

DOMAINS = ("code", "terminal", "tool_call")


def mk(domain: str, i: int) -> Task:
    return Task(id=f"{domain}-{i}", domain=domain, messages=(Message("user", f"q{i}"),))


def sources(n: int = 30) -> list[Source]:
    return [Source(d, d, [mk(d, i) for i in range(n)]) for d in DOMAINS]


def traj(t: Task, reward: float, group: int) -> Trajectory:
    return Trajectory(
        task=t,
        group_id=group,
        prompt_ids=[1],
        response_ids=[5] * 8,
        loss_mask=[1] * 8,
        logprobs=[-1.0] * 8,
        messages=[],
        terminated=True,
        truncated=False,
        finish_reason="stop",
        reward=reward,
    )


WEIGHTS = {"code": 0.05, "terminal": 0.05, "tool_call": 0.9}


def test_the_floor_holds_in_every_draw_and_the_rest_follows_the_weights():
    m = TaskMixer(sources(), per_step=8, seed=0, domain_weights=WEIGHTS, min_groups_per_domain=2)
    totals: collections.Counter = collections.Counter()
    for step in range(1, 101):
        c = collections.Counter(t.domain for t in m.sample(step))
        assert sum(c.values()) == 8 and min(c[d] for d in DOMAINS) >= 2, (step, c)
        assert {d: m.last_counts[f"mixer/{d}/count"] for d in DOMAINS} == {d: float(c[d]) for d in DOMAINS}
        totals.update(c)
    # 2 each by the floor; the other 2 x 100 prompts by 0.05 / 0.05 / 0.9 (cumulative targets: exact at 100 steps)
    assert dict(totals) == {"code": 200 + 10, "terminal": 200 + 10, "tool_call": 200 + 180}


def test_without_the_floor_a_small_domain_misses_steps():
    m = TaskMixer(sources(), per_step=8, seed=0, domain_weights=WEIGHTS)
    per_step = [collections.Counter(t.domain for t in m.sample(s))["code"] for s in range(1, 41)]
    assert per_step.count(0) == 24 and per_step.count(1) == 16  # 0.4 prompts a step: 16 of 40 steps draw one


def test_floor_zero_draws_exactly_what_the_mixer_drew_before():
    kw = dict(domain_weights={"code": 0.25, "terminal": 0.4, "tool_call": 0.35}, strata=2)
    a = TaskMixer(sources(), 8, 5, **kw)
    b = TaskMixer(sources(), 8, 5, **kw, min_groups_per_domain=0)
    assert [[t.id for t in a.sample(s)] for s in range(1, 30)] == [[t.id for t in b.sample(s)] for s in range(1, 30)]


def test_a_domain_of_weight_zero_gets_no_floor():
    m = TaskMixer(sources(), 6, 0, domain_weights={"code": 1.0, "terminal": 1.0}, min_groups_per_domain=3)
    for s in range(1, 11):
        c = collections.Counter(t.domain for t in m.sample(s))
        assert c == {"code": 3, "terminal": 3}


def test_a_floor_the_step_cannot_hold_is_refused():
    with pytest.raises(
        ValueError, match=r"min_groups_per_domain 3 for 3 domains needs 9 prompts per step; per_step is 8"
    ):
        TaskMixer(sources(), 8, 0, min_groups_per_domain=3)
    with pytest.raises(ValueError, match="min_groups_per_domain -1"):
        TaskMixer(sources(), 8, 0, min_groups_per_domain=-1)


def test_the_floor_holds_under_adaptive_weights_and_resumes_exactly():
    def run(steps: int, resume_at: int | None = None) -> list[list[str]]:
        kw = dict(adaptive={"floor": 0.02, "ceiling": 0.96, "rate": 1.0}, min_groups_per_domain=2)
        m = AdaptiveTaskMixer(sources(), per_step=8, seed=3, **kw)
        rng, out = random.Random(0), []
        for step in range(1, steps + 1):
            if step == resume_at:
                state = json.loads(json.dumps(m.state_dict()))
                m = AdaptiveTaskMixer(sources(), per_step=8, seed=3, **kw)
                m.load_state_dict(state)
            tasks = m.sample(step)
            c = collections.Counter(t.domain for t in tasks)
            assert len(tasks) == 8 and min(c[d] for d in DOMAINS) >= 2, (step, c)
            out.append([t.id for t in tasks])
            # only tool calls vary: the others' adaptive weights fall to their floor, their prompts to 2
            m.update([traj(t, rng.random() if t.domain == "tool_call" else 0.0, g) for g, t in enumerate(tasks)])
        assert m.domain_weights["code"] < 0.1 and collections.Counter(x.split("-")[0] for x in out[-1])["code"] == 2
        return out

    assert run(20) == run(20, resume_at=11)


def test_the_recipe_key_reaches_the_mixer_and_a_floor_too_big_names_it(recipe_copy):
    from rl.config.recipe import RecipeError, load_recipe, validate_recipe
    from rl.driver.loop import make_mixer

    path = recipe_copy("joint_rl.yaml", edit=lambda d: d["mixer"].update({"min_groups_per_domain": 2}))
    cfg = load_recipe(path, ["model.path=embedded:tiny"])
    validate_recipe(cfg)
    assert cfg.mixer.min_groups_per_domain == 2 and make_mixer(cfg, sources()).min_groups_per_domain == 2
    assert load_recipe(recipe_copy("joint_rl.yaml", filename="d.yaml")).mixer.min_groups_per_domain == 0
    with pytest.raises(RecipeError, match=r"mixer\.min_groups_per_domain: 3 prompts for each of 3 domains .* is 9"):
        validate_recipe(load_recipe(path, ["model.path=embedded:tiny", "mixer.min_groups_per_domain=3"]))
    with pytest.raises(RecipeError, match=r"mixer\.min_groups_per_domain: must be >= 0"):
        load_recipe(path, ["mixer.min_groups_per_domain=-1"])
