"""The trajectory buffer of the bounded-staleness stream (``rl.driver.stream``): drawn steps, their groups'
state (queued, generating, finished) and the finished groups the learner has not trained on yet.

Each drawn step keeps its draw (tasks, group ids, seeds: ``rl.driver.loop.expand``) whole; a GRPO group is
the unit of scheduling, of staleness and of dropping, so a group is trained whole or not at all. A finished
group records the engine version that generated it; its staleness when step ``s`` trains on it is
``(s - 1) - version`` (the learner holds ``s - 1`` updates then), where ``version`` is the oldest token's
policy version when the trajectories carry per-token versions (``Trajectory.token_versions``, written by
partial rollouts) and the version of the engine that ran the group otherwise.

The buffer's checkpoint state (``state_dict``) holds, per drawn and untrained step, one task id per group
(the draw before its expansion into groups: re-expanded on resume with the same group ids and seeds) and its
finished groups' trajectories with their versions (pickled, base64: trajectories hold arrays and nested
records that JSON does not); groups generating at the checkpoint are re-issued on resume. Not thread-safe:
the stream guards it with its lock.
"""

from __future__ import annotations

import base64
import pickle
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from envs.types import Task, Trajectory

Draw = tuple[list[Task], list[int], list[int]]  # tasks, group ids, sampling seeds


def oldest_version(trajs: list[Trajectory], fallback: int) -> int:
    """The oldest policy version among a group's policy tokens: the minimum of each trajectory's per-token
    versions (``token_versions``, where partial rollouts record them; env tokens' -1 is no version), else
    ``fallback`` (the generating engine's)."""
    found = [x for t in trajs for x in (getattr(t, "token_versions", None) or ()) if x >= 0]
    return min(found) if found else fallback


@dataclass
class StepGroups:
    """One drawn step: its draw, and per group id the member positions in the draw and, once finished,
    the group's trajectories and version."""

    step: int
    draw: Draw
    members: dict[int, list[int]] = field(default_factory=dict)
    done: dict[int, tuple[list[Trajectory], int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, g in enumerate(self.draw[1]):
            self.members.setdefault(g, []).append(i)

    def complete(self) -> bool:
        return len(self.done) == len(self.members)

    def task_ids(self) -> list[str]:
        """One task id per group, in group order (the draw before its expansion)."""
        return [self.draw[0][idx[0]].id for idx in self.members.values()]


class TrajectoryBuffer:
    """Drawn steps in order (``steps``), the queue of groups not started (``queue``: (step, group id) in draw
    order) and the groups generating (``running``)."""

    def __init__(self) -> None:
        self.steps: dict[int, StepGroups] = {}
        self.queue: deque[tuple[int, int]] = deque()
        self.running: set[tuple[int, int]] = set()

    def add(self, step: int, draw: Draw, done: dict[int, tuple[list[Trajectory], int]] | None = None) -> None:
        """Step ``step``'s draw; its groups not in ``done`` (a resumed buffer's) are queued."""
        sg = StepGroups(step, draw)
        sg.done.update(done or {})
        self.steps[step] = sg
        self.queue.extend((step, g) for g in sg.members if g not in sg.done)

    def start(self, admissible: int) -> tuple[list[tuple[int, int]], Draw]:
        """Take the queued groups of steps ``<= admissible`` (a prefix of the queue: steps are in order) as one
        round: their keys and the concatenated draw of their members."""
        keys: list[tuple[int, int]] = []
        while self.queue and self.queue[0][0] <= admissible:
            keys.append(self.queue.popleft())
        tasks, groups, seeds = [], [], []
        for step, g in keys:
            draw = self.steps[step].draw
            for i in self.steps[step].members[g]:
                tasks.append(draw[0][i])
                groups.append(g)  # the step's own id: equal ids of two steps only share an engine
                seeds.append(draw[2][i])
        self.running.update(keys)
        return keys, (tasks, groups, seeds)

    def finish(self, keys: list[tuple[int, int]], trajs: list[Trajectory], version: int) -> None:
        """The round of ``keys`` generated ``trajs`` (in the round's order) with engine version ``version``."""
        pos = 0
        for step, g in keys:
            sg = self.steps[step]
            n = len(sg.members[g])
            mine = trajs[pos : pos + n]
            sg.done[g] = (mine, oldest_version(mine, version))
            pos += n
        self.running.difference_update(keys)

    def pop(self, step: int) -> StepGroups:
        return self.steps.pop(step)

    def idle(self) -> bool:
        return not self.queue and not self.running

    def clear(self) -> None:
        self.steps.clear()
        self.queue.clear()

    # ------------------------------------------------------------------ checkpoint state

    def state_dict(self) -> list[dict[str, Any]]:
        """Per drawn step: ``step``, ``task_ids`` (one per group) and ``done`` (finished groups, pickled)."""
        out = []
        for step in sorted(self.steps):
            sg = self.steps[step]
            done = base64.b64encode(pickle.dumps(sg.done)).decode("ascii") if sg.done else ""
            out.append({"step": step, "task_ids": sg.task_ids(), "done": done})
        return out


def load_done(blob: str) -> dict[int, tuple[list[Trajectory], int]]:
    """A step's finished groups as ``TrajectoryBuffer.state_dict`` wrote them."""
    return pickle.loads(base64.b64decode(blob)) if blob else {}
