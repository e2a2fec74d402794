"""Estimators as registered objects (rl/algos/estimators.py): declarations, the registry, a user's
own estimator by dotted path, and what build_batch and the recipe checks ask of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from envs.types import Message, Task, Trajectory
from rl.algos.batch import build_batch
from rl.algos.estimators import ESTIMATORS, PPO, EstimatorError, ReinforcePP, estimator_class, get_estimator
from rl.config.recipe import AlgoConfig, KLConfig, RecipeError, load_recipe, validate_recipe


def test_builtin_estimators_declare_their_needs() -> None:
    assert list(ESTIMATORS) == ["grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo"]
    needs = {n: (c.needs_critic, c.sections, c.default_agg, c.min_group_size) for n, c in ESTIMATORS.items()}
    assert needs == {
        "grpo": (False, (), "token-mean", 1),
        "dr_grpo": (False, (), "seq-mean-token-sum-norm", 1),
        "rloo": (False, (), "token-mean", 2),
        "reinforce_pp": (False, ("returns",), "token-mean", 1),
        "ppo": (True, ("critic", "returns"), "token-mean", 1),
    }
    assert get_estimator(AlgoConfig(name="ppo")).learner_advantages()
    assert not get_estimator(AlgoConfig(name="grpo")).learner_advantages()
    assert get_estimator(AlgoConfig(name="grpo", kl=KLConfig(coef=0.1, in_reward=True))).learner_advantages()
    assert get_estimator(AlgoConfig(name="grpo", kl=KLConfig(coef=0.1))).needs_reference()
    assert not get_estimator(AlgoConfig(name="ppo")).needs_reference()
    with pytest.raises(EstimatorError, match="unknown algorithm 'a2c'; choose one of grpo, dr_grpo"):
        estimator_class("a2c")
    with pytest.raises(NotImplementedError):
        PPO(AlgoConfig(name="ppo")).outcome(torch.zeros(2), torch.zeros(2, dtype=torch.long))


def test_reinforce_pp_outcome_is_the_batch_baseline() -> None:
    adv = ReinforcePP(AlgoConfig(name="reinforce_pp")).outcome(
        torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64), torch.tensor([0, 0, 1, 1])
    )
    assert adv.tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)  # (r - 0.5) / 0.5


REPO = Path(__file__).resolve().parents[1]


def _doc_example() -> tuple[str, dict]:
    """The python and yaml blocks of docs/algorithms.md's "Your own estimator"."""
    text = (REPO / "docs" / "algorithms.md").read_text().split("## Your own estimator", 1)[1]
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    recipe = yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])
    return code + "\n\nclass NotOne:\n    pass\n", recipe


def _trajs(rewards: list[float]) -> list[Trajectory]:
    task = Task(id="t", domain="tool_call", messages=(Message("user", "q"),))
    return [
        Trajectory(
            task=task,
            group_id=0,
            prompt_ids=[1],
            response_ids=[5, 6],
            loss_mask=[1, 1],
            logprobs=[-1.0] * 2,
            messages=[],
            terminated=True,
            truncated=False,
            finish_reason="stop",
            reward=r,
        )
        for r in rewards
    ]


def test_user_estimator_by_dotted_path(recipe_copy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, snippet = _doc_example()
    (tmp_path / "my_estimators.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = recipe_copy("tiny.yaml")
    a = snippet["algo"]
    cfg = load_recipe(recipe, [f"algo.name={a['name']}", f"algo.kwargs={a['kwargs']}", "algo.loss.agg=auto"])
    validate_recipe(cfg)
    assert cfg.algo.loss.agg == "token-mean"  # the base class's default, resolved from `auto`
    batch, _ = build_batch(_trajs([0.0, 1.0, 3.0]), cfg.algo)
    assert [s.advantage for s in batch.samples] == [-2.0, 0.0, 4.0]  # median 1, scale 2
    for overrides, words in (
        (["algo.name=my_estimators.NotOne"], "is not a subclass of rl.algos.estimators.Estimator"),
        (["algo.name=my_estimators.Nope"], "cannot import 'my_estimators.Nope'"),
        (["algo.name=my_estimators.MedianBaseline", "algo.kwargs={bogus: 1}"], "algo.kwargs do not match"),
    ):
        with pytest.raises(RecipeError) as e:
            validate_recipe(load_recipe(recipe, overrides))
        key = "algo.kwargs" if "kwargs" in words else "algo.name"
        assert f": {key}: " in str(e.value) and words in str(e.value), str(e.value)
    # algo.kwargs exist only in the arm of an estimator named by dotted path: with grpo, an unknown key.
    with pytest.raises(RecipeError) as e:
        load_recipe(recipe, ["algo.kwargs={scale: 2.0}"])
    assert (
        "unknown recipe key 'algo.kwargs' (algo.name grpo has no kwargs: it is a setting of an estimator named by dotted path)"
        in str(e.value)
    )


def test_no_module_compares_algorithm_names() -> None:
    # The estimator object answers what an algorithm needs; a name literal elsewhere would be a comparison.
    names = [f'"{n}"' for n in ESTIMATORS] + [f"'{n}'" for n in ESTIMATORS]
    offenders = []
    for root in ("rl", "rollout", "rewards", "envs"):
        for path in (REPO / root).rglob("*.py"):
            if path.name == "estimators.py":
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if any(n in line for n in names) and "__all__" not in line:
                    offenders.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    # The recipe's algo union names them: each in the tag line of its arm, and the default name.
    assert [o for o in offenders if not o.startswith("rl/config/algo.py")] == [], offenders
    tags = [o for o in offenders if 'name: Literal["' in o]
    assert all(sum(f'"{n}"' in t for t in tags) == 1 for n in ESTIMATORS) and len(offenders) == len(tags) + 1, offenders
