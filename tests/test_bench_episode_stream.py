"""bench/episode_stream.py's task draw: the recipe's domain shares of ``--groups`` tasks, each a group."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench.episode_stream import TurnsOnly, draw
from rl.config.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def test_draw_follows_the_recipe_shares_and_repeats_each_task_for_its_group():
    cfg = load_recipe(RECIPES / "joint_rl.yaml")  # tool_call 0.35, code 0.25, terminal 0.4; group 4
    tasks = draw(cfg, 8, seed=0)
    groups = [tasks[i : i + 4] for i in range(0, len(tasks), 4)]
    assert len(tasks) == 32 and all(len({t.id for t in g}) == 1 for g in groups)
    assert Counter(g[0].domain for g in groups) == {"tool_call": 3, "code": 2, "terminal": 3}
    assert [t.id for t in draw(cfg, 8, seed=0)] == [t.id for t in tasks], "same seed, same tasks"
    assert [t.id for t in draw(cfg, 8, seed=1)] != [t.id for t in tasks]


def test_turns_only_hides_the_streaming_methods():
    class Engine:
        def generate(self, *a, **k):
            return ["sampled"]

        def submit(self, *a):  # pragma: no cover - must not be reachable
            raise AssertionError

    wrapped = TurnsOnly(Engine())
    assert wrapped.generate([[1]], None) == ["sampled"] and not hasattr(wrapped, "submit")
