"""The prepare pass: what a step's updates read per sample, computed once, without gradients, before the first.

It runs when the step needs it (``Learner.needs_prepare``: several updates per batch, a critic,
``algo.kl.in_reward``, a policy loss that needs ``proximal_logprobs``, decoupled PPO's proximal policy, or
``learner.routing_replay: r2``): per micro-batch the policy's log-probs (the ratio's ``old``, fixed over the step's
updates) and on an MoE each token's experts (what r2 forces in the updates; r3 forces the engine's here too; the
step's ``moe/`` metrics), the reference's log-probs (with a reference), the critic's values (with one); then, when the estimator
computes its advantages in the learner (``Estimator.learner_advantages``: a critic or a KL penalty in the reward),
those advantages and the value targets over the whole batch. A ``Prepared`` record holds them per sample, flat
over its masked tokens. Without a prepare pass the ratio's old log-probs are the policy's own, detached.

Also here: the engine's log-probs of a micro-batch's policy tokens and the ``rollout/logprob_diff`` and
per-domain ``async/mismatch_kl`` they give against the learner's. The pass runs the learner's models through
its own methods (``Learner._forward``,
``Learner._reference``), so that a bench wrapping them sees these calls too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from rl.algos.batch import Batch, Sample
from rl.algos.losses import LOG_RATIO_CLAMP, kl
from rl.trainer.metrics import Sums

__all__ = ["Prepared", "run", "engine_logprobs", "logprob_diff"]


@dataclass
class Prepared:
    """Per sample (keyed by ``id(sample)``), flat over its masked tokens: ``old`` (the policy's log-probs before the
    step's updates), ``ref`` (the reference's), ``values`` (the critic's), ``adv`` and ``returns`` (the
    estimator's learner-side advantages and value targets), ``routing`` (MoE: the experts the policy's pass
    selected, ``(len(input_ids), layers, top_k)``: what ``learner.routing_replay: r2`` forces in the updates).
    An empty dict: not computed in this step."""

    old: dict[int, torch.Tensor] = field(default_factory=dict)
    ref: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    adv: dict[int, torch.Tensor] = field(default_factory=dict)
    returns: dict[int, torch.Tensor] = field(default_factory=dict)
    routing: dict[int, torch.Tensor] = field(default_factory=dict)

    def cat(self, name: str, mb: list[Sample]) -> torch.Tensor:
        """Field ``name`` of the samples of ``mb`` concatenated: row-major (sample, masked position) order."""
        store = getattr(self, name)
        return torch.cat([store[id(s)] for s in mb])

    def put(self, name: str, flat: torch.Tensor, mb: list[Sample]) -> None:
        """Split ``flat`` (row-major over ``mb``'s masked tokens) into field ``name``, per sample."""
        store = getattr(self, name)
        for s, piece in zip(mb, torch.split(flat.detach(), [s.num_tokens for s in mb])):
            store[id(s)] = piece

    def lists(self, samples: list[Sample]) -> dict[str, list[list[float]]]:
        """The computed fields as lists per sample of ``samples`` (for inspection and tests)."""
        out = {}
        for f in fields(self):
            store = getattr(self, f.name)
            if store and f.name != "routing":
                out[f.name] = [store[id(s)].tolist() for s in samples]
        return out


@torch.no_grad()
def run(lrn: Any, batch: Batch, sums: Sums, coef: float) -> Prepared:
    """The prepare pass of learner ``lrn`` over ``batch`` (``coef``: the KL coefficient of a KL in the reward);
    ``rollout/logprob_diff`` into ``sums``."""
    prep = Prepared()
    micros = lrn.micro_batches(batch.samples)
    for _ in range(lrn.lock.count(len(micros)) - len(micros)):  # a sharded rank with fewer: dummy calls
        with lrn._autocast():
            lrn._forward(lrn.model, [])
            if lrn.has_ref:
                with lrn._reference() as ref:
                    lrn._forward(ref, [])
    for micro in micros:
        with lrn._autocast():
            out = lrn._forward(lrn.model, micro, routing=lrn.forced_routing(micro, None), record=lrn.moe)
        prep.put("old", out.logp, micro)
        if out.routing is not None:
            lrn.routing_stats.add(micro, out.routing)
            prep.routing.update((id(s), r) for s, r in zip(micro, out.routing))
        if lrn.value_head is not None:
            prep.put("values", lrn.fwd.values(lrn.value_head, out.hidden), micro)
        old = out.logp
        del out
        if lrn.has_ref:
            with lrn._autocast(), lrn._reference() as ref:
                prep.put("ref", lrn.fwd.logprobs(ref, micro)[0], micro)
        if lrn.critic is not None:
            with lrn._autocast():
                ch, _, _ = lrn.fwd.hidden(lrn.critic.trunk, micro)
            prep.put("values", lrn.fwd.values(lrn.critic.head, ch), micro)
        logprob_diff(old, micro, sums)
    if lrn.est.learner_advantages(lrn.algo):
        _advantages(lrn, batch.samples, prep, coef)
    return prep


def _advantages(lrn: Any, samples: list[Sample], prep: Prepared, coef: float) -> None:
    """The estimator's learner-side advantages (and PPO's returns) into ``prep.adv`` / ``prep.returns``: on the
    batch's ``[B, T]`` grid, from the rewards, the per-token KL penalty (``algo.kl.in_reward``) and the values."""
    a, dev = lrn.algo, lrn.device
    B, T = len(samples), max((len(s.loss_mask) for s in samples), default=0)
    mask = torch.zeros(B, T, dtype=torch.bool, device=dev)
    for i, s in enumerate(samples):
        mask[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.bool, device=dev)

    def grid(store: dict[int, torch.Tensor]) -> torch.Tensor:
        g = torch.zeros(B, T, dtype=torch.float32, device=dev)
        for i, s in enumerate(samples):
            g[i, mask[i]] = store[id(s)].float()
        return g

    scores = torch.tensor([s.reward for s in samples], dtype=torch.float32, device=dev)
    pen = None
    if a.kl.in_reward:
        pen = -coef * torch.where(mask, kl(grid(prep.old), grid(prep.ref), a.kl.kind), 0.0)
    gids = torch.tensor([s.group_id for s in samples], dtype=torch.long, device=dev)
    values = grid(prep.values) if lrn.est.needs_critic else None
    adv, returns = lrn.est.token_advantages(scores, gids, mask, pen, values, reduce_sum=lrn._reduce)
    for i, s in enumerate(samples):
        prep.adv[id(s)] = adv[i][mask[i]].float()
        if returns is not None:
            prep.returns[id(s)] = returns[i][mask[i]].float()


def engine_logprobs(mb: list[Sample], device: torch.device | str) -> torch.Tensor:
    """The engine's log-probs of the policy tokens of ``mb``, flat row-major over (sample, masked position)."""
    return torch.tensor(
        [lp for s in mb for lp, m in zip(s.rollout_logprobs, s.loss_mask) if m], dtype=torch.float32, device=device
    )


def logprob_diff(logp_flat: torch.Tensor, mb: list[Sample], sums: Sums) -> None:
    """Over ``mb``'s policy tokens, the learner's log-probs before the update against the engine's, into ``sums``:
    |learner - engine| summed (``rollout/logprob_diff``) and, per domain, the k3 estimate of KL(engine ||
    learner) on the tokens the engine sampled, ``exp(d) - 1 - d`` with ``d = learner - engine`` (>= 0 per token,
    ``async/mismatch_kl``): the mismatch of the behaviour policy (stale weights, engine numerics) that the
    off-policy corrections act on."""
    engine = engine_logprobs(mb, logp_flat.device)
    # logp_flat is row-major over (sample, masked position), the same order as this flattening.
    d = logp_flat.detach().float() - engine
    sums.logprob_diff += float(d.abs().sum())
    sums.logprob_diff_tokens += float(engine.numel())
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    counts = [s.num_tokens for s in mb]
    owner = torch.repeat_interleave(torch.arange(len(mb), device=d.device), torch.tensor(counts, device=d.device))
    per_sample = torch.zeros(len(mb), dtype=d.dtype, device=d.device).index_add_(0, owner, torch.expm1(d) - d)
    for s, k3, n in zip(mb, per_sample.tolist(), counts):  # one device sync for the micro-batch
        sums.add_mismatch(s.domain, k3, float(n))
