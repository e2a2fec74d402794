"""From scored trajectories to a training batch, and the rollout metrics of a step. Pure.

``build_batch`` drops samples whose reward errored (they are counted, never scored 0) and
keeps each sample's tokens ragged (the learner pads per micro-batch). Every sample carries
its scalar reward and group id; where the advantage depends on rewards alone it is computed
here, over the whole batch:

* ``grpo`` / ``dr_grpo`` / ``rloo``: outcome advantages per group (``group_normalized``);
* ``reinforce_pp``: the batch-normalised outcome (``reinforce_pp`` without token rewards).

Where it needs the learner's models it is left at 0 here and computed by the learner:
``ppo`` (GAE on the critic's values) and any algorithm with ``algo.kl_in_reward`` (the
per-token KL penalty needs the reference model's log-probs).

With ``algo.zero_variance: drop``, groups whose rewards are all equal leave the batch
entirely. Samples whose advantage is exactly 0 carry no gradient when there is neither a KL
term nor an entropy bonus: they are then moved to ``Batch.skipped`` (no forward/backward),
while the loss denominators (``num_tokens``, ``num_seqs``, and the learner's per-minibatch
counts) still count them, so the update equals the one over the full batch.

No tensors are padded here and nothing touches a model.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from envs.sandbox.events import EVENTS
from envs.types import Trajectory
from rl.algos.advantages import group_normalized, reinforce_pp
from rl.config.recipe import AlgoConfig

GROUP_ALGOS = ("grpo", "dr_grpo", "rloo")


@dataclass
class Sample:
    """One training sequence: ``prompt_len`` prompt tokens, then response tokens."""

    input_ids: list[int]
    prompt_len: int
    loss_mask: list[int]  # over the response tokens
    rollout_logprobs: list[float]  # engine logprobs over the response tokens (0 on env tokens)
    advantage: float  # per-sequence advantage where computed in build_batch (else 0, see learner_advantages)
    domain: str
    reward: float = 0.0  # the scalar (outcome) reward
    group_id: int = 0  # samples of one prompt share it (GRPO groups; kept whole on one data-parallel shard)
    uid: int = 0  # position in the step's batch: a stable order for minibatch shuffles (skipping changes nothing)

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


def learner_advantages(algo: AlgoConfig) -> bool:
    """Whether the learner (not ``build_batch``) computes the advantages under ``algo``."""
    return algo.name == "ppo" or algo.kl_in_reward


def build_batch(trajs: list[Trajectory], algo: AlgoConfig, advantages: list[float] | None = None,
                seq_level_domains: tuple[str, ...] = ()) -> tuple[Batch, dict[str, float]]:
    """Advantages and samples for ``trajs`` under ``algo``; returns (batch, stats).

    ``advantages`` (one per trajectory, e.g. from per-domain normalization in ``rl.data.mixer``)
    replace the algorithm's outcome advantages; only for outcome-advantage algorithms.

    ``seq_level_domains``: samples of these domains weigh per sequence, not per token:
    their advantage is scaled by ``mean policy tokens per sample / own policy tokens``, so
    under token-mean aggregation a long trajectory counts as much as a short one (the
    clipped objective is linear in a positive advantage scale, so this is exact; the KL
    term is not rescaled).
    """
    if advantages is not None:
        if len(advantages) != len(trajs):
            raise ValueError(f"{len(advantages)} advantages for {len(trajs)} trajectories")
        if learner_advantages(algo):
            raise ValueError(f"algo {algo.name!r} computes its advantages in the learner; none can be given")
        given = {id(t): a for t, a in zip(trajs, advantages)}
    ok = [t for t in trajs if t.reward is not None and t.num_policy_tokens > 0]
    stats: dict[str, float] = {"batch/excluded": float(len(trajs) - len(ok))}
    if not ok:
        return Batch([], 0, 0), stats
    if algo.name == "rloo":
        # RLOO needs >= 2 members; a group left with one (its siblings errored) has no baseline.
        sizes: dict[int, int] = defaultdict(int)
        for t in ok:
            sizes[t.group_id] += 1
        sel = [t for t in ok if sizes[t.group_id] >= 2]
        stats["batch/excluded"] += len(ok) - len(sel)
        ok = sel
        if not ok:
            return Batch([], 0, 0), stats

    groups: dict[int, list[float]] = defaultdict(list)
    for t in ok:
        groups[t.group_id].append(float(t.reward))
    constant = {g for g, v in groups.items() if max(v) == min(v)}
    stats["groups/zero_variance_fraction"] = len(constant) / len(groups)
    if algo.zero_variance == "drop":
        ok = [t for t in ok if t.group_id not in constant]  # no reward signal: out of the update and the denominators
        if not ok:
            stats["batch/samples"] = 0.0
            return Batch([], 0, 0), stats

    scores = torch.tensor([float(t.reward) for t in ok], dtype=torch.float64)
    if learner_advantages(algo):
        adv = torch.zeros_like(scores)
    elif advantages is not None:
        adv = torch.tensor([given[id(t)] for t in ok], dtype=torch.float64)
    elif algo.name in GROUP_ALGOS:
        gids = torch.tensor([t.group_id for t in ok], dtype=torch.long)
        adv = group_normalized(scores, gids, std_normalize=algo.name == "grpo", leave_one_out=algo.name == "rloo")
    elif algo.name == "reinforce_pp":
        adv = reinforce_pp(scores, torch.ones(len(ok), 1, dtype=torch.bool))[:, 0]
    else:
        raise ValueError(f"algo.name: unknown algorithm {algo.name!r}")
    # Exactly no gradient: skip the compute, keep it in the denominators.
    if seq_level_domains and not learner_advantages(algo):
        mean_tokens = sum(t.num_policy_tokens for t in ok) / len(ok)
        scale = torch.tensor([mean_tokens / t.num_policy_tokens if t.task.domain in seq_level_domains else 1.0
                              for t in ok], dtype=torch.float64)
        adv = adv * scale
    can_skip = not learner_advantages(algo) and algo.kl_coef == 0.0 and algo.entropy_coef == 0.0
    samples, skipped = [], []
    for uid, (t, a) in enumerate(zip(ok, adv.tolist())):
        s = Sample(input_ids=list(t.prompt_ids) + list(t.response_ids), prompt_len=len(t.prompt_ids),
                   loss_mask=list(t.loss_mask), rollout_logprobs=list(t.logprobs), advantage=float(a),
                   domain=t.task.domain, reward=float(t.reward), group_id=t.group_id, uid=uid)
        (skipped if can_skip and a == 0.0 else samples).append(s)
    stats["batch/samples"] = float(len(samples))
    if not learner_advantages(algo):
        stats["adv/abs_mean"] = float(adv.abs().mean())
    return Batch(samples, num_tokens=sum(t.num_policy_tokens for t in ok), num_seqs=len(ok), skipped=skipped), stats


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
