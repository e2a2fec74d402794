"""From scored trajectories to a training batch, and the rollout metrics of a step. Pure.

``build_batch`` drops samples without a reward, before the estimator: a reward that errored, and a
harness failure (an env call of the episode raised: the rollout's ``reward_error`` "harness: ...",
left unscored by the reward service; dropped even if a reward came with it). They are counted
(``batch/excluded``), never scored 0: a dropped sample moves no group's baseline (a GRPO group's mean
and std are its other members'; an RLOO group left with one member leaves too), counts in no loss
denominator and costs no forward pass, so the batch trains as if the episode had not run. Each
sample's tokens stay ragged (the learner pads per micro-batch). Every sample carries
its scalar reward and group id. Where the advantage depends on rewards alone, the estimator
(``rl.algos.estimators``, chosen by ``algo.name``) computes it here, over the whole batch,
from the rewards (or the shaped rewards of ``rl.algos.shaping``, when given). Where it needs
the learner's models (``Estimator.learner_advantages``: a critic, or ``algo.kl.in_reward``)
it is left at 0 here and computed by the learner.

With ``algo.update.zero_variance: drop``, groups whose rewards are all equal leave the batch
entirely. Samples whose advantage is exactly 0 carry no gradient when there is no KL term, no
entropy bonus, no auxiliary loss and the policy loss says so (``PolicyLoss.no_gradient_at_zero_advantage``):
they are then moved to ``Batch.skipped`` (no forward/backward),
while the loss denominators (``num_tokens``, ``num_seqs``, and the learner's per-minibatch
counts) still count them, so the update equals the one over the full batch.

No tensors are padded here and nothing touches a model.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from envs.sandbox.events import EVENTS
from envs.types import Trajectory
from rl.algos.estimators import Estimator, get_estimator
from rl.algos.policy_losses import get_policy_loss
from rl.config.recipe import AlgoConfig


@dataclass
class Sample:
    """One training sequence: ``prompt_len`` prompt tokens, then response tokens."""

    input_ids: list[int]
    prompt_len: int
    loss_mask: list[int]  # over the response tokens
    rollout_logprobs: list[float]  # engine logprobs over the response tokens (0 on env tokens)
    advantage: float  # per-sequence advantage where computed in build_batch (else 0: the learner computes it)
    domain: str
    reward: float = 0.0  # the scalar (outcome) reward, shaped when a shaping stage ran
    group_id: int = 0  # samples of one prompt share it (GRPO groups; kept whole on one data-parallel shard)
    uid: int = 0  # position in the step's batch: a stable order for minibatch shuffles (skipping changes nothing)
    # the engine's experts per token of input_ids, (len(input_ids), layers, top_k) small ints (MoE R3), or None
    routing: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Policy (masked) tokens."""
        return int(sum(self.loss_mask))


@dataclass
class Batch:
    samples: list[Sample]  # the samples the learner runs forward/backward on
    num_tokens: int  # masked (policy) tokens over every sample the loss is averaged over (the whole batch)
    num_seqs: int  # sequences with at least one policy token, likewise
    skipped: list[Sample] = field(default_factory=list)  # zero-advantage samples counted but not computed
    # the whole batch's domains, sorted: the same on every data-parallel shard (per-domain learner metrics)
    domains: tuple[str, ...] = ()


def _usable(
    trajs: list[Trajectory], est: Estimator, stats: dict[str, float], routing_required: bool = False
) -> list[Trajectory]:
    """Scored trajectories with policy tokens, in groups big enough for the estimator's baseline
    (RLOO: a group left with one member, its siblings errored, has none). A trajectory with a ``reward_error``
    (a harness failure, an errored reward) is no training sample even if a reward came with it. With
    ``routing_required`` (R3) a trajectory whose engine routing is missing or does not cover its tokens
    is dropped the same way and counted in ``moe/dropped_no_routing``."""
    ok = [t for t in trajs if t.reward is not None and t.reward_error is None and t.num_policy_tokens > 0]
    if routing_required:
        covered = [t for t in ok if _routing(t) is not None]
        stats["moe/dropped_no_routing"] = float(len(ok) - len(covered))
        ok = covered
    if est.min_group_size > 1:
        sizes: dict[int, int] = defaultdict(int)
        for t in ok:
            sizes[t.group_id] += 1
        ok = [t for t in ok if sizes[t.group_id] >= est.min_group_size]
    stats["batch/excluded"] = float(len(trajs) - len(ok))
    return ok


def build_batch(
    trajs: list[Trajectory],
    algo: AlgoConfig,
    rewards: list[float] | None = None,
    seq_level_domains: tuple[str, ...] = (),
    routing_required: bool = False,
) -> tuple[Batch, dict[str, float]]:
    """Advantages and samples for ``trajs`` under ``algo``; returns (batch, stats).

    ``rewards`` (one per trajectory, e.g. the shaped rewards of ``rl.algos.shaping.shape_step``)
    replace the trajectories' rewards as the estimator's input; only for estimators whose
    advantages come from rewards alone.

    ``seq_level_domains``: samples of these domains weigh per sequence, not per token:
    their advantage is scaled by ``mean policy tokens per sample / own policy tokens``, so
    under token-mean aggregation a long trajectory counts as much as a short one (the
    clipped objective is linear in a positive advantage scale, so this is exact; the KL
    term is not rescaled). Only for outcome advantages (``validate_recipe`` refuses the rest).

    ``routing_required`` (``learner.routing_replay: r3``, which forces the engine's experts): a trajectory
    without engine routing for every token the engine ran leaves before the estimator, like a harness failure
    (its group's baseline is its other members'), counted in ``moe/dropped_no_routing``.
    """
    est = get_estimator(algo)
    in_learner = est.learner_advantages(algo)
    _check_inputs(trajs, algo, rewards, seq_level_domains, in_learner)
    given = {id(t): r for t, r in zip(trajs, rewards)} if rewards is not None else None
    stats: dict[str, float] = {}
    ok = _usable(trajs, est, stats, routing_required)
    if not ok:
        return Batch([], 0, 0), stats
    ok = _zero_variance(ok, algo, stats)
    if not ok:
        stats["batch/samples"] = 0.0
        return Batch([], 0, 0), stats
    scores = torch.tensor([given[id(t)] if given else float(t.reward) for t in ok], dtype=torch.float64)
    if in_learner:
        adv = torch.zeros_like(scores)
    else:
        adv = est.outcome(scores, torch.tensor([t.group_id for t in ok], dtype=torch.long)).to(torch.float64)
    if seq_level_domains:
        adv = adv * _seq_level_scale(ok, seq_level_domains)
    # Exactly no gradient: skip the compute, keep it in the denominators.
    samples, skipped = _samples(ok, adv, scores, _can_skip(algo, in_learner))
    stats["batch/samples"] = float(len(samples))
    if not in_learner:
        stats |= _advantage_stats(ok, adv)
    domains = tuple(sorted({t.task.domain for t in ok}))
    n_tok = sum(t.num_policy_tokens for t in ok)
    return Batch(samples, num_tokens=n_tok, num_seqs=len(ok), skipped=skipped, domains=domains), stats


def _check_inputs(
    trajs: list[Trajectory],
    algo: AlgoConfig,
    rewards: list[float] | None,
    seq_level_domains: tuple[str, ...],
    in_learner: bool,
) -> None:
    """Shaped rewards and per-sequence weighting need advantages computed here (from rewards), not in the learner."""
    if rewards is not None:
        if len(rewards) != len(trajs):
            raise ValueError(f"{len(rewards)} rewards for {len(trajs)} trajectories")
        if in_learner:
            raise ValueError(
                f"algo {algo.name!r} computes its advantages in the learner; no shaped rewards can be given"
            )
    if seq_level_domains and in_learner:
        raise ValueError(f"seq_level_domains rescales outcome advantages; {algo.name!r} computes them in the learner")


def _zero_variance(ok: list[Trajectory], algo: AlgoConfig, stats: dict[str, float]) -> list[Trajectory]:
    """``groups/zero_variance_fraction``; with ``algo.update.zero_variance: drop`` the groups whose members all
    got the same reward are left out."""
    groups: dict[int, list[float]] = defaultdict(list)
    for t in ok:
        groups[t.group_id].append(float(t.reward))
    constant = {g for g, v in groups.items() if max(v) == min(v)}
    stats["groups/zero_variance_fraction"] = len(constant) / len(groups)
    if algo.update.zero_variance == "drop":
        return [t for t in ok if t.group_id not in constant]  # no reward signal: out of the update and denominators
    return ok


def _can_skip(algo: AlgoConfig, in_learner: bool) -> bool:
    """Whether a sample whose advantage is exactly 0 has exactly no gradient: advantages from the rewards, no
    KL term, no entropy bonus, no auxiliary loss (each puts a gradient on every sample), and a policy loss
    whose every term is proportional to the advantage (``PolicyLoss.no_gradient_at_zero_advantage``)."""
    if in_learner or algo.kl.coef or algo.loss.entropy_coef or algo.loss.aux_coef:
        return False
    return get_policy_loss(algo.loss).no_gradient_at_zero_advantage


def _seq_level_scale(ok: list[Trajectory], seq_level_domains: tuple[str, ...]) -> torch.Tensor:
    """Per-sample advantage scale: ``mean policy tokens / own policy tokens`` for ``seq_level_domains``, else 1."""
    mean_tokens = sum(t.num_policy_tokens for t in ok) / len(ok)
    return torch.tensor(
        [mean_tokens / t.num_policy_tokens if t.task.domain in seq_level_domains else 1.0 for t in ok],
        dtype=torch.float64,
    )


def _samples(
    ok: list[Trajectory], adv: torch.Tensor, scores: torch.Tensor, can_skip: bool
) -> tuple[list[Sample], list[Sample]]:
    """The learner's samples, and those skipped (zero advantage where that means exactly no gradient)."""
    samples, skipped = [], []
    for uid, (t, a, r) in enumerate(zip(ok, adv.tolist(), scores.tolist())):
        s = Sample(
            input_ids=list(t.prompt_ids) + list(t.response_ids),
            prompt_len=len(t.prompt_ids),
            loss_mask=list(t.loss_mask),
            rollout_logprobs=list(t.logprobs),
            advantage=float(a),
            domain=t.task.domain,
            reward=float(r),
            group_id=t.group_id,
            uid=uid,
            routing=_routing(t),
        )
        (skipped if can_skip and a == 0.0 else samples).append(s)
    return samples, skipped


def _routing(t: Trajectory) -> torch.Tensor | None:
    """The trajectory's engine routing as ``Sample.routing``: one row per token of prompt + response, the rows the
    engine never ran (the last token) holding the default experts ``0..top_k-1``; None without routing or with
    routing that does not cover the tokens the engine ran (``n - 1`` or ``n`` rows of ``(layers, top_k)``)."""
    if t.routing is None:
        return None
    r = torch.from_numpy(np.ascontiguousarray(t.routing))
    n = len(t.prompt_ids) + len(t.response_ids)
    if r.dim() != 3 or not n - 1 <= r.shape[0] <= n:
        return None
    k = r.shape[2]
    rest = torch.arange(k, dtype=r.dtype).expand(n - r.shape[0], r.shape[1], k)
    return torch.cat([r, rest])


def _advantage_stats(ok: list[Trajectory], adv: torch.Tensor) -> dict[str, float]:
    """``adv/abs_mean`` over the batch, ``adv/<domain>/mean|std`` per domain."""
    m = {"adv/abs_mean": float(adv.abs().mean())}
    by: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(ok):
        by[t.task.domain].append(i)
    for d, idx in sorted(by.items()):
        a = adv[idx]
        m[f"adv/{d}/mean"], m[f"adv/{d}/std"] = float(a.mean()), float(a.std(unbiased=False))
    return m


def _sandbox_counters(domain: str, trajs: list[Trajectory]) -> dict[str, float]:
    """``sandbox/<domain>/<event>``: how often the step's episodes hit each sandbox event
    (timeouts, limits, seccomp kills, harness errors; :data:`envs.sandbox.events.EVENTS`),
    for domains whose env reports them; every known event is present, zeros included."""
    reported = [t.sandbox_events for t in trajs if t.sandbox_events is not None]
    if not reported:
        return {}
    counts = dict.fromkeys(EVENTS, 0)
    for evs in reported:
        for ev in evs:
            counts[ev] = counts.get(ev, 0) + 1
    return {f"sandbox/{domain}/{ev}": float(n) for ev, n in counts.items()}


def rollout_metrics(trajs: list[Trajectory], prefix: str = "") -> dict[str, float]:
    """Reward and rollout metrics of a step: ``reward/mean``, ``reward/<domain>/mean``,
    ``reward/<domain>/<fn>/mean``, ``rollout/tokens``, ``rollout/response_len/mean``, ...

    Means are over samples whose reward did not error; ``faults/reward_errors`` counts the others (excluded from the update).
    ``prefix`` (e.g. ``"eval/"``) is prepended to every key.
    """
    m: dict[str, float] = {}
    scored = [t for t in trajs if t.reward is not None]
    m["faults/reward_errors"] = float(len(trajs) - len(scored))
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
        m.update(_sandbox_counters(d, ts))
    n = max(len(trajs), 1)
    m["rollout/tokens"] = float(sum(t.num_policy_tokens for t in trajs))
    m["rollout/response_len/mean"] = m["rollout/tokens"] / n
    m["rollout/truncated_fraction"] = sum(t.truncated for t in trajs) / n
    m["rollout/turns/mean"] = sum(t.num_turns for t in trajs) / n
    return {prefix + k: v for k, v in m.items()}
