"""Reward shaping before the estimator (rl/algos/shaping.py): per-domain running statistics, the
shaped rewards, and what the estimators make of them (equal rewards still give exactly 0)."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from envs.types import Message, Task, Trajectory
from rl.algos.batch import build_batch
from rl.algos.estimators import DrGRPO, GRPO
from rl.algos.shaping import RewardNormalizer, shape_step
from rl.config.recipe import AlgoConfig


def _dr(rewards, groups, domains, norm):
    """Shaping then Dr.GRPO's group baseline: the old ``domain_then_group`` normalization."""
    shaped = norm.shape(rewards, domains)
    return DrGRPO(AlgoConfig(name="dr_grpo")).outcome(shaped, torch.tensor(groups))


def test_normalizer_unit_variance_per_domain() -> None:
    rng = random.Random(0)
    norm = RewardNormalizer("domain")
    for _ in range(50):
        rewards = [rng.uniform(0, 10) for _ in range(8)] + [rng.uniform(0, 1) for _ in range(8)]
        domains = ["terminal"] * 8 + ["code"] * 8
        norm.shape(rewards, domains)
    # After many batches the running statistics match the distributions (uniform: std = width / sqrt(12)).
    assert norm.std("terminal") == pytest.approx(10 / math.sqrt(12), rel=0.1)
    assert norm.std("code") == pytest.approx(1 / math.sqrt(12), rel=0.1)
    big = [rng.uniform(0, 10) for _ in range(4000)]
    small = [rng.uniform(0, 1) for _ in range(4000)]
    adv = norm.shape(big + small, ["terminal"] * 4000 + ["code"] * 4000)
    assert float(adv[:4000].std()) == pytest.approx(1.0, abs=0.05)
    assert float(adv[4000:].std()) == pytest.approx(1.0, abs=0.05)


def test_normalizer_modes_hand_values() -> None:
    rewards, groups, domains = [0.0, 2.0, 1.0, 1.0], [0, 0, 1, 1], ["a", "a", "b", "b"]
    # Domain a: values 0, 2 -> mean 1, unbiased std sqrt(2); domain b: 1, 1 -> std 0.
    adv = _dr(rewards, groups, domains, RewardNormalizer("domain", eps=0.0))
    # Group means 1 and 1 -> centered -1, 1, 0, 0; divided by sigma_a = sqrt(2) (sigma_b = 0 with eps 0: 0/0).
    assert adv[0].item() == pytest.approx(-1 / math.sqrt(2)) and adv[1].item() == pytest.approx(1 / math.sqrt(2))
    # GRPO on the shaped rewards is GRPO on the raw ones (the group z-score ignores shift and scale).
    g = GRPO(AlgoConfig()).outcome(RewardNormalizer("domain").shape(rewards, domains), torch.tensor(groups))
    assert g.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0, 0.0], abs=1e-5)
    d = RewardNormalizer("domain", eps=1e-6).shape(rewards, domains)
    assert d.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0, 0.0], abs=1e-5)
    assert RewardNormalizer("none").shape(rewards, domains) is None
    with pytest.raises(ValueError, match="unknown normalization"):
        RewardNormalizer("domain_then_group")


def test_normalization_balances_gradient_share_across_scales() -> None:
    """With terminal rewards 10x code's, Dr.GRPO-style centering gives terminal ~10x the
    advantage mass; domain shaping before Dr.GRPO gives both domains the same scale."""
    rng = random.Random(1)
    norm = RewardNormalizer("domain")
    for _ in range(20):
        rewards, groups, domains = [], [], []
        for g in range(8):
            scale, dom = (10.0, "terminal") if g % 2 else (1.0, "code")
            rewards += [scale * rng.random() for _ in range(4)]
            groups += [g] * 4
            domains += [dom] * 4
        adv = _dr(rewards, groups, domains, norm)
    r = torch.tensor(rewards)
    g = torch.tensor(groups)
    means = torch.stack([r[g == k].mean() for k in range(8)])[g]
    raw = (r - means).abs()
    is_t = torch.tensor([d == "terminal" for d in domains])
    assert raw[is_t].sum() / raw[~is_t].sum() > 5, "without normalization terminal dominates"
    ratio = float(adv.abs()[is_t].sum() / adv.abs()[~is_t].sum())
    assert 0.6 < ratio < 1.6, f"normalized share ratio {ratio}"


def test_normalizer_state_round_trip_and_ema() -> None:
    a = RewardNormalizer("domain", stat="ema", ema=0.5)
    a.update("x", [0.0, 4.0, 4.0])
    # EMA: mean 0 -> 2 -> 3; var 0 -> 0.5*(0 + 0.5*4^2) = 4 -> 0.5*(4 + 0.5*(4-2)^2) = 3
    assert a.mean["x"] == 3.0 and a.std("x") == pytest.approx(math.sqrt(3))
    b = RewardNormalizer("domain", stat="ema", ema=0.5)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.std("x") == a.std("x") and b.mean == a.mean


def _traj(domain: str, i: int, group: int, reward: float) -> Trajectory:
    task = Task(id=f"{domain}-{group}", domain=domain, messages=(Message("user", "q"),))
    return Trajectory(
        task=task,
        group_id=group,
        prompt_ids=[1, 2],
        response_ids=[5] * (3 + i),
        loss_mask=[1] * (3 + i),
        logprobs=[-1.0] * (3 + i),
        messages=[],
        terminated=True,
        truncated=False,
        finish_reason="stop",
        reward=reward,
    )


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_equal_rewards_give_exactly_zero_after_shaping_so_the_skip_fires(name: str) -> None:
    # 0.2 and 0.7 are not exact in binary: a shaping stage that computed group baselines by its own
    # sum / count left ~1e-11 residues here, so no sample was ever skipped. Shaping is elementwise:
    # equal rewards of one domain stay equal, and the estimator zeroes constant groups exactly.
    norm = RewardNormalizer("domain")
    norm.update("code", [0.0, 1.0, 0.3])  # running statistics from earlier steps
    trajs = [_traj("code", i, 0, 0.2) for i in range(3)] + [_traj("tool_call", i, 1, 0.7) for i in range(3)]
    if name != "reinforce_pp":  # (a batch baseline: only constant batches are zero)
        trajs += [_traj("code", i, 2, r) for i, r in enumerate((0.0, 1.0, 0.5))]
    shaped, metrics = shape_step(norm, trajs)
    assert shaped is not None and len(shaped) == len(trajs) and "reward/code/raw_mean" in metrics
    batch, stats = build_batch(trajs, AlgoConfig(name=name), shaped)
    zero = [s for s in batch.skipped]
    if name == "reinforce_pp":
        assert len(batch.skipped) == 0 and len(batch.samples) == 6
        return
    assert len(zero) == 6 and all(s.advantage == 0.0 for s in zero)
    assert {s.group_id for s in zero} == {0, 1} and len(batch.samples) == 3
    assert batch.num_seqs == 9  # skipped samples still count in the denominators
    assert stats["adv/code/mean"] == pytest.approx(0.0, abs=1e-12)


def test_warm_up_prior_by_hand() -> None:
    """``prior_samples`` pseudo-rewards of spread ``prior_std``: Welford (M2 + n0 p^2) / (n - 1 + n0)."""
    norm = RewardNormalizer("domain", prior_samples=4, prior_std=0.5, eps=0.0)
    assert norm.std("code") == pytest.approx(0.5)  # nothing seen: the prior
    shaped = norm.shape([0.0, 1.0], ["code", "code"])
    # mean 0.5, M2 0.5: (0.5 + 4 * 0.25) / (1 + 4) = 0.3 (without the prior: 0.5 / 1, std 0.707)
    assert norm.std("code") == pytest.approx(math.sqrt(0.3))
    assert shaped.tolist() == pytest.approx([-0.5 / math.sqrt(0.3), 0.5 / math.sqrt(0.3)])
    assert norm.metrics()["reward/code/running_std"] == pytest.approx(math.sqrt(0.3))
    # EMA: w = n / (n + n0). 0, 0, 1 with ema 0.5 -> variance 0.25 at n = 3; prior 1.0 with n0 = 2:
    # 3/5 * 0.25 + 2/5 * 1 = 0.55 (without the prior: 0.25, std 0.5)
    ema = RewardNormalizer("domain", stat="ema", ema=0.5, prior_samples=2, prior_std=1.0)
    ema.shape([0.0, 0.0, 1.0], ["t"] * 3)
    assert ema.std("t") == pytest.approx(math.sqrt(0.55))
    plain = RewardNormalizer("domain", stat="ema", ema=0.5)
    plain.shape([0.0, 0.0, 1.0], ["t"] * 3)
    assert plain.std("t") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="prior_std > 0"):
        RewardNormalizer("domain", prior_samples=2, prior_std=0.0)


def test_the_prior_keeps_a_sparse_domain_s_scale_from_swinging_with_one_batch() -> None:
    """A code-like domain, 8 rewards a step at a low pass rate: without the prior its scale goes from a
    std of 0 (all failed) to 0.25 (one success in 16); with 8 pseudo-samples of 0.5 it barely moves;
    after many rewards both find the domain's own spread."""
    batches = [[0.0] * 8, [0.0] * 7 + [1.0], [0.0] * 8, [1.0, 1.0] + [0.0] * 6]
    plain, warm = RewardNormalizer("domain"), RewardNormalizer("domain", prior_samples=8, prior_std=0.5)
    stds = {"plain": [], "warm": []}
    for b in batches:
        for name, norm in (("plain", plain), ("warm", warm)):
            norm.shape(b, ["code"] * 8)
            stds[name].append(norm.std("code"))
    # plain: M2 0 -> std 0; n 16, M2 15/16 -> var 1/16; n 24, M2 23/24 -> var 1/24; n 32, M2 3 - 9/32 -> /31
    assert stds["plain"] == pytest.approx([0.0, 0.25, math.sqrt(1 / 24), math.sqrt((3 - 9 / 32) / 31)])
    # warm: (M2 + 8 * 0.25) / (n - 1 + 8)
    assert stds["warm"] == pytest.approx(
        [
            math.sqrt(2 / 15),
            math.sqrt((15 / 16 + 2) / 23),
            math.sqrt((23 / 24 + 2) / 31),
            math.sqrt((3 - 9 / 32 + 2) / 39),
        ]
    )
    swing = {k: max(abs(math.log(b / a)) for a, b in zip(v[1:], v[2:])) for k, v in stds.items()}
    assert swing["warm"] < swing["plain"] / 2
    rng = random.Random(0)
    for _ in range(500):
        b = [float(rng.random() < 0.1) for _ in range(8)]
        plain.shape(b, ["code"] * 8)
        warm.shape(b, ["code"] * 8)
    assert warm.std("code") == pytest.approx(plain.std("code"), rel=0.01)


def test_the_prior_comes_from_the_recipe_and_an_unused_prior_std_is_refused(recipe_copy) -> None:
    from rl.config.recipe import RecipeError, load_recipe
    from rl.driver.loop import make_normalizer

    path = recipe_copy("joint_rl.yaml")
    cfg = load_recipe(path, ["algo.reward_norm.prior_samples=16", "algo.reward_norm.prior_std=0.4"])
    n = make_normalizer(cfg)
    assert (n.mode, n.prior_samples, n.prior_std) == ("domain", 16.0, 0.4)
    assert make_normalizer(load_recipe(path)).prior_samples == 0.0
    with pytest.raises(
        RecipeError, match=r"algo\.reward_norm\.prior_std: is set but algo\.reward_norm\.prior_samples is 0"
    ):
        load_recipe(path, ["algo.reward_norm.prior_std=0.3"])
