"""The adaptive domain-mixing mode: weights follow a synthetic learning signal, respect
floors and ceilings, start from measured difficulty, and resume exactly."""

from __future__ import annotations

import collections
import json
import random

import pytest

from envs.types import Message, Task, Trajectory
from rl.data.mixer import (
    AdaptiveConfig,
    AdaptiveDomainWeights,
    AdaptiveTaskMixer,
    Source,
    TaskMixer,
    difficulty_priors,
    domain_signal,
    project_weights,
)

DOMAINS = ("code", "terminal", "tool_call")


def mk(domain: str, i: int, **meta) -> Task:
    return Task(id=f"{domain}-{i}", domain=domain, messages=(Message("user", f"q{i}"),), meta=meta)


def sources(n: int = 20, **meta) -> list[Source]:
    return [Source(d, d, [mk(d, i, **meta) for i in range(n)]) for d in DOMAINS]


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


def rollouts(tasks: list[Task], reward_of, rng: random.Random, group_size: int = 4) -> list[Trajectory]:
    """``group_size`` samples per task; ``reward_of(domain, rng)`` draws one reward."""
    return [traj(t, reward_of(t.domain, rng), g) for g, t in enumerate(tasks) for _ in range(group_size)]


def test_domain_signal_counts_groups_with_variance():
    a, b = mk("code", 0), mk("terminal", 0)
    trajs = [traj(a, 1.0, 0), traj(a, 0.0, 0), traj(a, 1.0, 1), traj(a, 1.0, 1), traj(b, 0.0, 2), traj(b, 0.0, 2)]
    trajs.append(traj(b, 0.5, 3))  # a lone sample: no variance
    unscored = traj(b, 1.0, 4)
    trajs.append(Trajectory(**{**unscored.__dict__, "reward": None}))
    sig = domain_signal(trajs)
    assert sig["code"] == (0.5, 0.75)
    assert sig["terminal"][0] == 0.0 and sig["terminal"][1] == pytest.approx(0.5 / 3)


def test_project_weights_respects_bounds_and_proportions():
    floor = {"a": 0.1, "b": 0.1, "c": 0.1}
    ceiling = {"a": 0.6, "b": 1.0, "c": 1.0}
    w = project_weights({"a": 10.0, "b": 1.0, "c": 0.0}, floor, ceiling)
    assert sum(w.values()) == pytest.approx(1.0)
    assert w["a"] == pytest.approx(0.6) and w["c"] == pytest.approx(0.1) and w["b"] == pytest.approx(0.3)
    assert project_weights({"a": 0, "b": 0, "c": 0}, floor, ceiling) == pytest.approx(
        {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}
    )
    with pytest.raises(ValueError, match="infeasible"):
        project_weights({"a": 1, "b": 1}, {"a": 0.6, "b": 0.6}, {"a": 1, "b": 1})
    rng = random.Random(0)
    for _ in range(200):
        raw = {d: rng.choice([0.0, rng.random(), 10 * rng.random()]) for d in "abc"}
        fl = {d: rng.uniform(0, 0.3) for d in "abc"}
        ce = {d: rng.uniform(0.4, 1.0) for d in "abc"}
        w = project_weights(raw, fl, ce)
        assert sum(w.values()) == pytest.approx(1.0)
        assert all(fl[d] - 1e-9 <= w[d] <= ce[d] + 1e-9 for d in "abc"), (raw, fl, ce, w)


def test_no_variance_domain_falls_to_its_floor_and_a_learning_one_gains():
    cfg = AdaptiveConfig(floor={"code": 0.1, "terminal": 0.05, "tool_call": 0.1}, ceiling=0.9, rate=0.3)
    w = AdaptiveDomainWeights({d: 1.0 for d in DOMAINS}, cfg)
    history = []
    for step in range(40):
        # terminal never varies and never moves; code varies; tool_call starts learning at step 20.
        tool = (0.0, 0.0) if step < 20 else (0.8, min(1.0, 0.05 * (step - 19)))
        history.append(w.update({"code": (0.5, 0.3), "terminal": (0.0, 0.0), "tool_call": tool}))
    assert history[19]["terminal"] == pytest.approx(0.05, abs=1e-3)  # down to its floor...
    assert history[-1]["terminal"] == pytest.approx(0.05, abs=1e-3)  # ...and it stays there
    assert history[19]["tool_call"] == pytest.approx(0.1, abs=0.01)  # no signal yet: near its floor
    assert history[-1]["tool_call"] > history[19]["tool_call"] + 0.3  # learning: it gains
    assert history[-1]["tool_call"] > history[-1]["code"]  # variance + trend beat variance alone
    for h in history:
        assert sum(h.values()) == pytest.approx(1.0)
        assert all(cfg.bounds(list(DOMAINS))[0][d] - 1e-9 <= h[d] <= 0.9 + 1e-9 for d in DOMAINS)
    # Smoothed: no jump larger than `rate` of the distance between two points in the simplex.
    steps = [max(abs(a[d] - b[d]) for d in DOMAINS) for a, b in zip(history, history[1:])]
    assert max(steps) <= 0.3 + 1e-9


def test_ceiling_caps_a_domain_that_has_all_the_signal():
    w = AdaptiveDomainWeights({d: 1.0 for d in DOMAINS}, AdaptiveConfig(floor=0.1, ceiling=0.5, rate=1.0))
    for _ in range(5):
        out = w.update({"code": (1.0, 0.5), "terminal": (0.0, 0.0), "tool_call": (0.0, 0.0)})
    assert out["code"] == pytest.approx(0.5) and out["terminal"] == pytest.approx(0.25)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"mixer\.adaptive\.bogus"):
        AdaptiveConfig.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match=r"mixer\.adaptive\.rate"):
        AdaptiveConfig.from_dict({"rate": 0})
    with pytest.raises(ValueError, match=r"mixer\.adaptive\.floor"):
        AdaptiveConfig.from_dict({"floor": 2})
    with pytest.raises(ValueError, match="infeasible"):
        AdaptiveTaskMixer(sources(), 6, adaptive={"floor": 0.5})
    with pytest.raises(ValueError, match="domains without tasks"):
        AdaptiveTaskMixer(sources(), 6, adaptive={"ceiling": {"math": 0.5}})


def _reward_of(step: int):
    def reward_of(domain: str, rng: random.Random) -> float:
        if domain == "terminal":
            return 0.0  # never any variance
        if domain == "code":
            return float(rng.random() < 0.5)
        return float(rng.random() < min(0.9, 0.05 * step))  # tool_call starts learning

    return reward_of


def test_mixer_draws_follow_the_weights_and_log_them():
    m = AdaptiveTaskMixer(sources(), per_step=12, seed=3, adaptive={"floor": 0.1, "ceiling": 0.8, "rate": 0.5})
    rng = random.Random(0)
    counts = []
    for step in range(1, 31):
        tasks = m.sample(step)
        assert len(tasks) == 12
        c = collections.Counter(t.domain for t in tasks)
        for d in DOMAINS:
            share = 12 * m.last_counts[f"mixer/{d}/weight"]
            assert abs(c[d] - share) < 2.0, (step, d, c[d], share)  # within one of the (moving) share, plus drift
        counts.append(c)
        m.update(rollouts(tasks, _reward_of(step), rng))
    assert counts[-1]["terminal"] <= 2 and m.domain_weights["terminal"] == pytest.approx(0.1, abs=0.02)
    assert sum(c["tool_call"] for c in counts[-5:]) > sum(c["tool_call"] for c in counts[:5])
    assert {f"mixer/{d}/{k}" for d in DOMAINS for k in ("weight", "signal", "trend")} <= set(m.last_counts)


def test_resume_is_exact():
    def run(steps: int, resume_at: int | None = None) -> list[list[str]]:
        m = AdaptiveTaskMixer(
            sources(), per_step=9, seed=7, adaptive={"floor": 0.05}, curriculum_window=2, curriculum_weight=0.5
        )
        rng = random.Random(1)
        drawn = []
        for step in range(1, steps + 1):
            if resume_at is not None and step == resume_at:
                state = json.loads(json.dumps(m.state_dict()))  # checkpoints store JSON-like data
                rng_state = rng.getstate()
                m = AdaptiveTaskMixer(
                    sources(), per_step=9, seed=7, adaptive={"floor": 0.05}, curriculum_window=2, curriculum_weight=0.5
                )
                m.load_state_dict(state)
                rng.setstate(rng_state)
            tasks = m.sample(step)
            drawn.append([t.id for t in tasks] + [f"{m.domain_weights[d]:.12f}" for d in DOMAINS])
            m.update(rollouts(tasks, _reward_of(step), rng))
        return drawn

    assert run(16) == run(16, resume_at=9)


def test_resume_across_a_mode_change_is_refused():
    state = TaskMixer(sources(), 6).state_dict()
    with pytest.raises(ValueError, match="not adaptive"):
        AdaptiveTaskMixer(sources(), 6).load_state_dict(state)
    with pytest.raises(ValueError, match="was adaptive"):
        TaskMixer(sources(), 6).load_state_dict(AdaptiveTaskMixer(sources(), 6).state_dict())


def test_fixed_mode_is_unchanged_by_the_adaptive_code():
    # Same seed, same draws as before: the fixed mixer never looks at rewards for its weights.
    m = TaskMixer(sources(), per_step=6, seed=2, domain_weights={"code": 1, "terminal": 1, "tool_call": 1})
    for step in range(1, 6):
        m.update(rollouts(m.sample(step), _reward_of(step), random.Random(step)))
    assert m.domain_weights == {"code": 1.0, "terminal": 1.0, "tool_call": 1.0}


def test_measured_difficulty_seeds_the_signal_and_the_curriculum():
    srcs = [
        Source("code", "code", [mk("code", i, base_pass_rate=r) for i, r in enumerate([0.0, 0.25, 0.5, 1.0])]),
        Source("terminal", "terminal", [mk("terminal", i, base_pass_rate=0.0) for i in range(4)]),
        Source("tool_call", "tool_call", [mk("tool_call", i) for i in range(4)]),
    ]
    assert difficulty_priors(srcs) == {"code": 0.5, "terminal": 0.0}
    m = AdaptiveTaskMixer(srcs, 6, curriculum_window=3, adaptive={"initial_signal": 0.4})
    assert m.adaptive.signal == {"code": 0.5, "terminal": 0.0, "tool_call": 0.4}
    assert [m._no_signal(f"code-{i}") for i in range(4)] == [True, False, False, True]
    assert all(m._no_signal(f"terminal-{i}") for i in range(4))
    assert not any(m._no_signal(f"tool_call-{i}") for i in range(4))  # unmeasured: nothing known
    # With the curriculum fully on (weight 0), the measured no-signal code tasks sit out while others remain.
    m = TaskMixer([srcs[0]], per_step=2, seed=0, curriculum_window=3, curriculum_weight=0.0)
    drawn = collections.Counter(t.id for step in range(1, 21) for t in m.sample(step))
    assert drawn["code-1"] + drawn["code-2"] > drawn["code-0"] + drawn["code-3"]


@pytest.mark.parametrize(
    "mixer, expected",
    [
        ({"mode": "dynamic"}, "mixer.mode: "),
        ({"mode": "fixed", "adaptive": {"rate": 0.5}}, "mixer.adaptive: "),
        ({"mode": "adaptive", "adaptive": {"rate": 2}}, "mixer.adaptive.rate: "),
        # mixer.adaptive is a typed section: an unknown key reads as in every other section.
        (
            {"mode": "adaptive", "adaptive": {"bogus": 1}},
            "unknown recipe key 'mixer.adaptive.bogus'; valid keys here: floor",
        ),
        ({"mode": "adaptive", "adaptive": {"floor": 0.6}}, "mixer.adaptive: "),
        (
            {"mode": "adaptive", "adaptive": {"floor": {"code": 1.5}}},
            "mixer.adaptive.floor.code: must be a number in [0, 1]",
        ),
        (
            {"mode": "adaptive", "adaptive": {"ceiling": "high"}},
            "mixer.adaptive.ceiling: expected a number or a mapping",
        ),
        ({"mode": "adaptive", "adaptive": {"trend_coef": -1}}, "mixer.adaptive.trend_coef: must be >= 0"),
    ],
)
def test_recipe_errors_name_the_mixer_key(recipe_copy, mixer, expected):
    import re

    from rl.config.recipe import RecipeError, load_recipe, validate_recipe

    path = recipe_copy("joint_rl.yaml", edit=lambda d: d["mixer"].update(mixer))
    with pytest.raises(RecipeError, match=re.escape(expected)) as e:
        validate_recipe(load_recipe(path, ["model.path=embedded:tiny"]))
    assert re.match(rf"{re.escape(str(path))}:\d+: ", str(e.value)), "the error names the recipe's line"


def test_adaptive_settings_are_typed_fields_of_the_recipe(recipe_copy):
    """Each setting is a field of its own: built with its type, printed by ``validate --print``, and
    listed in the generated reference."""
    from rl.config.docgen import recipe_reference
    from rl.config.recipe import load_recipe, recipe_to_dict

    path = recipe_copy(
        "joint_rl.yaml",
        edit=lambda d: d["mixer"].update({"mode": "adaptive", "adaptive": {"floor": {"code": 0.2}, "rate": 1}}),
    )
    a = load_recipe(path, ["model.path=embedded:tiny"]).mixer.adaptive
    assert isinstance(a, AdaptiveConfig) and a.floor == {"code": 0.2} and a.rate == 1.0 and a.ceiling == 1.0
    printed = recipe_to_dict(load_recipe(path, ["model.path=embedded:tiny"]))["mixer"]["adaptive"]
    assert printed == {
        "floor": {"code": 0.2},
        "ceiling": 1.0,
        "rate": 1.0,
        "signal_ema": 0.5,
        "trend_fast": 0.5,
        "trend_slow": 0.1,
        "trend_coef": 2.0,
        "initial_signal": 0.5,
    }
    ref = recipe_reference()
    for key in printed:
        assert f"| `mixer.adaptive.{key}` |" in ref, key


def test_recipe_builds_the_adaptive_mixer(recipe_copy):
    from rl.config.recipe import load_recipe, validate_recipe
    from rl.driver.loop import make_mixer

    path = recipe_copy(
        "joint_rl.yaml",
        edit=lambda d: d["mixer"].update({"mode": "adaptive", "adaptive": {"floor": 0.1, "ceiling": 0.6}}),
    )
    cfg = load_recipe(path, ["model.path=embedded:tiny"])
    validate_recipe(cfg)
    m = make_mixer(cfg, sources())
    assert isinstance(m, AdaptiveTaskMixer) and m.adaptive.floor == {d: 0.1 for d in DOMAINS}
    assert type(make_mixer(load_recipe(recipe_copy("joint_rl.yaml", filename="f.yaml")), sources())) is TaskMixer
