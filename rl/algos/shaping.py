"""Reward shaping before the estimator: per-domain reward normalization (``algo.reward_norm``).

One stage between scoring and the advantage estimator (``rl.algos.estimators``): with
``mode: domain`` each scalar reward ``r`` of domain ``d`` becomes

    r' = (r - mu_d) / (sigma_d + eps)

with ``mu_d``, ``sigma_d`` the domain's running mean and std (Welford over every reward seen,
or an EMA), updated with the step's rewards first.

A warm-up prior (``prior_samples`` > 0, ``algo.reward_norm.prior_samples``): ``sigma_d`` starts
from ``prior_std`` as if the domain had already seen that many rewards of that spread, and its
own rewards outweigh the prior as they come in. Welford:
``sigma_d^2 = (M2_d + n0 * prior_std^2) / (n_d - 1 + n0)``; EMA: ``w * var_d + (1 - w) *
prior_std^2`` with ``w = n_d / (n_d + n0)``. Without it a domain's scale in the first steps is
the spread of one or two small batches: a domain drawn twice a step at a low pass rate can
have a std of 0 after its first batch, 0.25 after its second (one success in 16), 0.5 after
a lucky one, so the same reward difference is worth 2x to 4x more or less from one step to
the next exactly when the policy moves most. The mean is not shrunk: the group baseline of
Dr.GRPO removes it, and GRPO's z-score ignores both. The estimator then runs on ``r'``: with
Dr.GRPO that is ``r' - mean_g(r') = (r - mean_g) / (sigma_d + eps)``, the group baseline with the
domain's scale, so a domain whose rewards are 10x larger does not get 10x the gradient, without
GRPO's per-group std (which inflates near-solved and near-impossible groups); with GRPO the
group z-score is unchanged by it. Equal rewards of one domain stay equal after shaping, so a
group whose rewards are all equal still gets an advantage of exactly 0.

The statistics are in ``state_dict()`` (checkpointed with the run). This module does not
compute advantages, run rollouts or touch models.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from envs.types import Trajectory

__all__ = ["RewardNormalizer", "shape_step", "MODES"]

MODES = ("none", "domain")


class RewardNormalizer:
    """Running per-domain reward statistics and the shaped rewards (see module doc)."""

    def __init__(
        self,
        mode: str = "none",
        stat: str = "welford",
        ema: float = 0.1,
        eps: float = 1e-6,
        prior_samples: float = 0.0,
        prior_std: float = 0.5,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown normalization {mode!r}; choose one of {', '.join(MODES)}")
        if stat not in ("welford", "ema"):
            raise ValueError(f"unknown statistic {stat!r}; choose welford or ema")
        if prior_samples < 0 or prior_std <= 0:
            raise ValueError(f"need prior_samples >= 0 and prior_std > 0, got {prior_samples}, {prior_std}")
        self.mode, self.stat, self.ema, self.eps = mode, stat, ema, eps
        self.prior_samples, self.prior_std = float(prior_samples), float(prior_std)
        self.n: dict[str, float] = {}
        self.mean: dict[str, float] = {}
        self.m2: dict[str, float] = {}  # Welford: sum of squared deviations; EMA: the variance

    def update(self, domain: str, values: list[float]) -> None:
        for x in values:
            n = self.n.get(domain, 0.0)
            mu = self.mean.get(domain, 0.0)
            if self.stat == "welford" or n == 0:
                n += 1
                d = x - mu
                mu += d / n
                self.m2[domain] = self.m2.get(domain, 0.0) + d * (x - mu) if self.stat == "welford" else 0.0
            else:
                d = x - mu
                mu += self.ema * d
                self.m2[domain] = (1 - self.ema) * (self.m2.get(domain, 0.0) + self.ema * d * d)
                n += 1
            self.n[domain], self.mean[domain] = n, mu

    def std(self, domain: str) -> float:
        n = self.n.get(domain, 0.0)
        n0, prior = self.prior_samples, self.prior_std**2
        if n0 > 0:  # the warm-up prior (module doc)
            m2 = self.m2.get(domain, 0.0)
            if self.stat == "welford":
                var = (m2 + n0 * prior) / (max(n - 1, 0.0) + n0)
            else:
                var = (n * m2 + n0 * prior) / (n + n0)
            return math.sqrt(max(var, 0.0))
        if n < 2:
            return 1.0  # no spread known yet: leave the scale alone
        var = self.m2[domain] / (n - 1) if self.stat == "welford" else self.m2[domain]
        return math.sqrt(max(var, 0.0))

    def shape(self, rewards: list[float], domains: list[str]) -> torch.Tensor | None:
        """Update the statistics with this batch, then return the shaped rewards [B] (float64;
        None for mode ``none``)."""
        by_domain: dict[str, list[float]] = defaultdict(list)
        for r, d in zip(rewards, domains):
            by_domain[d].append(r)
        for d, vs in by_domain.items():
            self.update(d, vs)
        if self.mode == "none":
            return None
        r = torch.tensor(rewards, dtype=torch.float64)
        mu = torch.tensor([self.mean[d] for d in domains], dtype=torch.float64)
        sd = torch.tensor([self.std(d) for d in domains], dtype=torch.float64)
        return (r - mu) / (sd + self.eps)

    def metrics(self) -> dict[str, float]:
        return {f"reward/{d}/running_mean": self.mean[d] for d in self.mean} | {
            f"reward/{d}/running_std": self.std(d) for d in self.mean
        }

    def state_dict(self) -> dict[str, Any]:
        return {"n": dict(self.n), "mean": dict(self.mean), "m2": dict(self.m2)}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.n, self.mean, self.m2 = dict(s["n"]), dict(s["mean"]), dict(s["m2"])


def shape_step(normalizer: RewardNormalizer, trajs: list[Trajectory]) -> tuple[list[float] | None, dict[str, float]]:
    """Shaped rewards for a step's trajectories (aligned with ``trajs``; errored samples get 0 and are
    excluded later; None with mode ``none``) and the step's per-domain reward metrics:
    ``reward/<d>/raw_mean``, ``reward/<d>/raw_std``, ``reward/<d>/norm_mean`` (mean of the
    domain-standardized rewards), and the running statistics.
    """
    scored = [t for t in trajs if t.reward is not None]
    shaped = (
        normalizer.shape(
            [float(t.reward) for t in scored],  # type: ignore[arg-type]
            [t.task.domain for t in scored],
        )
        if scored
        else None
    )
    m: dict[str, float] = {}
    by: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(scored):
        by[t.task.domain].append(i)
    for d, idx in sorted(by.items()):
        r = torch.tensor([float(scored[i].reward) for i in idx], dtype=torch.float64)  # type: ignore[arg-type]
        m[f"reward/{d}/raw_mean"] = float(r.mean())
        m[f"reward/{d}/raw_std"] = float(r.std(unbiased=False))
        m[f"reward/{d}/norm_mean"] = float(((r - normalizer.mean[d]) / (normalizer.std(d) + normalizer.eps)).mean())
    m |= normalizer.metrics()
    if shaped is None:
        return None, m
    pos = {id(t): float(x) for t, x in zip(scored, shaped.tolist())}
    return [pos.get(id(t), 0.0) for t in trajs], m
