"""Which tasks each step trains on.

``TaskSampler`` walks seeded shuffled epochs over the training tasks. The draw of a step
is a pure function of (seed, step), so a resumed run draws exactly what the
uninterrupted run would have. Domain weights, per-domain normalization and length strata
are not here yet.
"""

from __future__ import annotations

import random

from envs.types import Task


class TaskSampler:
    def __init__(self, tasks: list[Task], per_step: int, seed: int) -> None:
        if not tasks:
            raise ValueError("no training tasks")
        self.tasks, self.per_step, self.seed = list(tasks), per_step, seed
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            order = list(range(len(self.tasks)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._perms = {epoch: order}  # only the current epoch is needed
        return self._perms[epoch]

    def sample(self, step: int) -> list[Task]:
        """The tasks of ``step`` (1-based): the next ``per_step`` of the shuffled stream."""
        n = len(self.tasks)
        start = (step - 1) * self.per_step
        return [self.tasks[self._perm(i // n)[i % n]] for i in range(start, start + self.per_step)]
