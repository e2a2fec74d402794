"""The step plan: what one learner step computes, in which order, under which loss denominators.

``Plan.of(batch, ...)`` counts the batch over every data-parallel rank (and checks the counts the
minibatches rely on); ``Plan.minibatches`` gives an epoch's minibatches (``algo.update.minibatches``
parts of a random permutation, the batch in order for a single update); ``Plan.denominators`` the loss
denominators (tokens, sequences) of a minibatch: the batch's with one minibatch, else the minibatch's
summed over the ranks; ``micro_batches`` splits the samples a minibatch computes into micro-batches of
at most ``learner.micro_batch_tokens`` computed tokens, the samples of one prompt together (their prompt
is computed once). Skipped zero-advantage samples are members of the minibatches (they count in the
denominators) but are never computed. No model, no loss: the learner runs the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rl.algos.batch import Batch, Sample
from rl.trainer.packing import prompt_groups

__all__ = ["Plan", "micro_batches"]

Reduce = Callable[[list[float]], list[float]]  # values summed over the data-parallel ranks


@dataclass
class Plan:
    """One step over ``batch``: ``members`` (computed and skipped samples, in ``uid`` order, the order minibatch
    shuffles permute), ``computed`` (samples computed over every rank; 0: nothing to do), ``epochs`` x
    ``minibatches`` optimizer steps."""

    batch: Batch
    members: list[Sample]
    computed: int
    epochs: int
    minibatches: int
    reduce: Reduce
    computed_ids: frozenset[int] = frozenset()  # ``id`` of each sample this rank computes

    @classmethod
    def of(cls, batch: Batch, epochs: int, minibatches: int, reduce: Reduce) -> "Plan":
        """The plan of ``batch``; with several minibatches the batch's denominators must count exactly its
        samples and skipped samples over every rank (each minibatch's are recounted from them)."""
        members = sorted(batch.samples + batch.skipped, key=lambda s: s.uid)
        computed, m_tokens, m_seqs = reduce(
            [len(batch.samples), sum(s.num_tokens for s in members), sum(1 for s in members if s.num_tokens > 0)]
        )
        if minibatches > 1 and computed and (m_tokens, m_seqs) != (batch.num_tokens, batch.num_seqs):
            raise ValueError(
                f"batch.num_tokens/num_seqs ({batch.num_tokens}, {batch.num_seqs}) do not count exactly its "
                f"samples and skipped samples ({m_tokens:g}, {m_seqs:g}); algo.minibatches > 1 needs them "
                "to (build_batch's batches do)"
            )
        return cls(batch, members, int(computed), epochs, minibatches, reduce, frozenset(map(id, batch.samples)))

    @property
    def updates(self) -> int:
        """Optimizer steps planned (1 for nothing computed: the metrics' divisor)."""
        return self.epochs * self.minibatches if self.computed else 1

    def epoch(self, gen: torch.Generator) -> list[list[Sample]]:
        """One epoch's minibatches: ``minibatches`` parts of a permutation drawn from ``gen`` (the members in order
        when the step makes a single update)."""
        if self.epochs * self.minibatches == 1:
            return [self.members]
        perm = torch.randperm(len(self.members), generator=gen)
        return [[self.members[i] for i in part.tolist()] for part in torch.tensor_split(perm, self.minibatches)]

    def denominators(self, mb: list[Sample]) -> tuple[float, float]:
        """The loss denominators (tokens, sequences) of minibatch ``mb``: the batch's with one minibatch, else
        the minibatch's over every rank (the sum of the ranks' local counts)."""
        if self.minibatches == 1:
            return self.batch.num_tokens, self.batch.num_seqs
        nt, ns = self.reduce([sum(s.num_tokens for s in mb), sum(1 for s in mb if s.num_tokens > 0)])
        return nt, ns

    def computed_of(self, mb: list[Sample]) -> list[Sample]:
        """The samples of ``mb`` this rank computes (not the skipped ones)."""
        return [s for s in mb if id(s) in self.computed_ids]


def micro_batches(
    samples: list[Sample], budget: int, cost: Callable[[list[Sample]], int], share_prompt: bool
) -> list[list[Sample]]:
    """``samples`` split into micro-batches of at most ``budget`` computed tokens (``cost`` of a list of samples).

    With ``share_prompt`` the samples of one prompt stay together (their prompt is computed once and costs its
    length once); a group too large for the budget is split, each part running the prompt once. A unit larger
    than the budget on its own is a micro-batch of its own.
    """
    ordered = sorted(samples, key=lambda s: len(s.input_ids))
    groups = [[ordered[i] for i in g] for g in prompt_groups(ordered)] if share_prompt else [[s] for s in ordered]
    units: list[list[Sample]] = []
    for group in groups:
        chunk: list[Sample] = []
        for s in group:
            if chunk and cost(chunk + [s]) > budget:
                units.append(chunk)
                chunk = []
            chunk.append(s)
        units.append(chunk)
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    cur_cost = 0
    for unit in units:
        c = cost(unit)
        if cur and cur_cost + c > budget:
            out.append(cur)
            cur, cur_cost = [], 0
        cur.extend(unit)
        cur_cost += c
    if cur:
        out.append(cur)
    return out
