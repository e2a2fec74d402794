"""Scoring trajectories with user reward classes, in-process or on a pool of Ray actors.

A reward function is any object with ``name`` (str), ``domains`` (the domains it scores)
and ``__call__(trajectory) -> float | None`` (None: "does not apply to this sample").
No base class. Classes are named by dotted path and constructed in the process that
scores (``RewardScorer``), so user code is imported where it runs.

The final score is the weighted sum of the applicable functions. A function that raises
or returns NaN, inf or a non-number gives the sample a recorded ``reward_error`` and no
reward (never a silent 0); the trainer excludes such samples. ``RewardService`` spreads
trajectories over actors, with a per-call timeout, and replaces a worker that crashed or
hung, retrying its share once on the fresh worker.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from envs.base import resolve
from envs.types import Trajectory


@dataclass(frozen=True)
class RewardFnSpec:
    """One reward function of a recipe: dotted class path, weight, domains ([] = the class's own), kwargs."""

    cls: str
    weight: float = 1.0
    domains: tuple[str, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


class RewardScorer:
    """Constructs the reward classes of ``specs`` and scores trajectories with them."""

    def __init__(self, specs: list[RewardFnSpec]) -> None:
        self.fns: list[tuple[str, Any, float, frozenset[str]]] = []
        seen: dict[str, int] = {}
        for spec in specs:
            obj = resolve(spec.cls)(**spec.kwargs)
            name = str(getattr(obj, "name", "") or spec.cls.rsplit(".", 1)[-1])
            base, k = name, 1
            while name in seen:  # the same class twice (e.g. different kwargs): keep metric names apart
                k += 1
                name = f"{base}_{k}"
            seen[name] = 1
            domains = frozenset(spec.domains or getattr(obj, "domains", ()) or ())
            self.fns.append((name, obj, float(spec.weight), domains))

    @property
    def names(self) -> list[str]:
        return [n for n, *_ in self.fns]

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        return [self._score_one(t) for t in trajs]

    def _score_one(self, traj: Trajectory) -> Trajectory:
        scores: dict[str, float | None] = {}
        total, applies, error = 0.0, False, None
        for name, fn, weight, domains in self.fns:
            if traj.task.domain not in domains:
                continue
            try:
                value = fn(traj)
            except Exception as e:  # noqa: BLE001 - a user's reward bug is recorded, not fatal
                error = f"{name} raised {type(e).__name__}: {e}"
                break
            if value is None:
                scores[name] = None
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
                error = f"{name} returned {value!r}, not a finite number"
                break
            scores[name] = float(value)
            total += weight * float(value)
            applies = True
        if error is None and not applies:
            error = f"no reward function scored this {traj.task.domain!r} sample"
        return dataclasses.replace(traj, scores=scores, reward=None if error else total, reward_error=error)


class RewardService:
    """A pool of ``RewardScorer`` Ray actors. Requires ``ray.init`` to have run."""

    def __init__(self, specs: list[RewardFnSpec], workers: int = 1, timeout_s: float = 60.0, num_cpus: float = 0.1) -> None:
        import ray

        self.specs, self.timeout_s = list(specs), timeout_s
        self._actor = ray.remote(num_cpus=num_cpus, max_restarts=0)(RewardScorer)
        self.workers = [self._actor.remote(self.specs) for _ in range(workers)]
        ray.get([w.__ray_ready__.remote() for w in self.workers])  # constructor errors surface here
        self.restarts = 0

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        import ray

        n = len(self.workers)
        shards = [list(range(i, len(trajs), n)) for i in range(n)]
        refs = {i: self.workers[i].score.remote([trajs[j] for j in shard]) for i, shard in enumerate(shards) if shard}
        out: list[Trajectory] = list(trajs)
        for i, ref in refs.items():
            part = self._get_or_retry(i, ref, [trajs[j] for j in shards[i]])
            for j, t in zip(shards[i], part):
                out[j] = t
        return out

    def _get_or_retry(self, i: int, ref: Any, chunk: list[Trajectory]) -> list[Trajectory]:
        import ray

        err = ""
        for attempt in range(2):
            try:
                return ray.get(ref, timeout=self.timeout_s)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as e:
                err = (f"reward worker timed out after {self.timeout_s:.0f}s" if isinstance(e, ray.exceptions.GetTimeoutError)
                       else f"reward worker died ({type(e).__name__})")
                self._replace(i)
                if attempt == 0:
                    # The fresh worker's start-up must not eat the retry's time limit.
                    ray.get(self.workers[i].__ray_ready__.remote())
                    ref = self.workers[i].score.remote(chunk)
        return [dataclasses.replace(t, reward=None, reward_error=err) for t in chunk]

    def _replace(self, i: int) -> None:
        import ray

        ray.kill(self.workers[i])
        self.workers[i] = self._actor.remote(self.specs)
        self.restarts += 1

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
