"""From scored trajectories to a training batch, and the rollout metrics of a step. Pure.

``build_batch`` drops samples whose reward errored (they are counted, never scored 0),
computes outcome advantages per GRPO group (GRPO, Dr.GRPO or RLOO), and keeps each
sample's tokens ragged; the learner pads per micro-batch. With ``algo.zero_variance: drop``,
groups whose rewards are all equal leave the batch entirely. Samples whose advantage is
exactly 0 carry no policy gradient: when there is no KL term they are left out of the
compute, while the loss denominators (``num_tokens``, ``num_seqs``) still count them, so
the update equals the one over the full batch.

No tensors are padded here and nothing touches a model.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from envs.types import Trajectory
from rl.advantages import group_normalized
from rl.config import AlgoConfig


@dataclass
class Sample:
    """One training sequence: ``prompt_len`` prompt tokens, then response tokens."""

    input_ids: list[int]
    prompt_len: int
    loss_mask: list[int]  # over the response tokens
    rollout_logprobs: list[float]  # engine logprobs over the response tokens (0 on env tokens)
    advantage: float
    domain: str


@dataclass
class Batch:
    samples: list[Sample]
    num_tokens: int  # masked (policy) tokens over every sample the loss is averaged over
    num_seqs: int  # sequences with at least one policy token, likewise


def build_batch(trajs: list[Trajectory], algo: AlgoConfig) -> tuple[Batch, dict[str, float]]:
    """Advantages and samples for ``trajs`` under ``algo``; returns (batch, stats)."""
    ok = [t for t in trajs if t.reward is not None and t.num_policy_tokens > 0]
    stats: dict[str, float] = {"batch/excluded": float(len(trajs) - len(ok))}
    if not ok:
        return Batch([], 0, 0), stats
    scores = torch.tensor([float(t.reward) for t in ok], dtype=torch.float64)
    gids = torch.tensor([t.group_id for t in ok], dtype=torch.long)
    sizes = torch.bincount(torch.unique(gids, return_inverse=True)[1])
    if algo.name == "rloo":
        # RLOO needs >= 2 members; a group left with one (its siblings errored) has no baseline.
        keep_groups = {int(g) for g, n in zip(torch.unique(gids), sizes) if n >= 2}
        sel = [i for i, t in enumerate(ok) if t.group_id in keep_groups]
        stats["batch/excluded"] += len(ok) - len(sel)
        ok, scores, gids = [ok[i] for i in sel], scores[sel], gids[sel]
        if not ok:
            return Batch([], 0, 0), stats
    adv = group_normalized(scores, gids, std_normalize=algo.name == "grpo", leave_one_out=algo.name == "rloo")

    groups: dict[int, list[float]] = defaultdict(list)
    for t in ok:
        groups[t.group_id].append(float(t.reward))
    constant = {g for g, v in groups.items() if max(v) == min(v)}
    stats["groups/zero_variance_fraction"] = len(constant) / len(groups)
    num_seqs = len(ok)
    if algo.zero_variance == "drop":
        num_seqs -= sum(1 for t in ok if t.group_id in constant)
    samples, num_tokens = [], 0
    for t, a in zip(ok, adv.tolist()):
        if algo.zero_variance == "drop" and t.group_id in constant:
            continue  # no reward signal: left out of the update and of the loss denominators
        num_tokens += t.num_policy_tokens
        if a == 0.0 and algo.kl_coef == 0.0:
            continue  # exactly no gradient: skip the compute, keep it in the denominators
        samples.append(Sample(input_ids=list(t.prompt_ids) + list(t.response_ids), prompt_len=len(t.prompt_ids),
                              loss_mask=list(t.loss_mask), rollout_logprobs=list(t.logprobs), advantage=float(a),
                              domain=t.task.domain))
    stats["batch/samples"] = float(len(samples))
    stats["adv/abs_mean"] = float(adv.abs().mean())
    return Batch(samples, num_tokens=num_tokens, num_seqs=num_seqs), stats


def rollout_metrics(trajs: list[Trajectory], prefix: str = "") -> dict[str, float]:
    """Reward and rollout metrics of a step: ``reward/mean``, ``reward/<domain>/mean``,
    ``reward/<domain>/<fn>/mean``, ``rollout/tokens``, ``rollout/response_len/mean``, ...

    Means are over samples whose reward did not error; ``reward/errors`` counts the others.
    ``prefix`` (e.g. ``"eval/"``) is prepended to every key.
    """
    m: dict[str, float] = {}
    scored = [t for t in trajs if t.reward is not None]
    m["reward/errors"] = float(len(trajs) - len(scored))
    if scored:
        m["reward/mean"] = sum(t.reward for t in scored) / len(scored)  # type: ignore[misc]
    by_domain: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_domain[t.task.domain].append(t)
    for d, ts in sorted(by_domain.items()):
        ds = [t for t in ts if t.reward is not None]
        if ds:
            m[f"reward/{d}/mean"] = sum(t.reward for t in ds) / len(ds)  # type: ignore[misc]
        fn_vals: dict[str, list[float]] = defaultdict(list)
        for t in ds:
            for fn, v in t.scores.items():
                if v is not None:
                    fn_vals[fn].append(v)
        for fn, vs in sorted(fn_vals.items()):
            m[f"reward/{d}/{fn}/mean"] = sum(vs) / len(vs)
        m[f"rollout/{d}/response_len/mean"] = sum(t.num_policy_tokens for t in ts) / len(ts)
    n = max(len(trajs), 1)
    m["rollout/tokens"] = float(sum(t.num_policy_tokens for t in trajs))
    m["rollout/response_len/mean"] = m["rollout/tokens"] / n
    m["rollout/truncated_fraction"] = sum(t.truncated for t in trajs) / n
    m["rollout/turns/mean"] = sum(t.num_turns for t in trajs) / n
    return {prefix + k: v for k, v in m.items()}
