"""The reward workers as Ray actors: ``RewardService`` over ``rewards.service.RewardScorer``.

Trajectories are spread over N workers, whole groups (the samples of one task) to one worker, largest group
first (``rollout.balance.longest_first``). A worker whose reward call timed out (its stuck thread lives on) is
replaced after the call and the timed-out samples are retried once on the fresh worker. A worker that crashed,
or that stopped making progress altogether (a call that holds the GIL, e.g. a runaway regex, cannot be timed
out from inside the process), is killed and replaced, and its share is retried once on the fresh worker; if
that fails too, the share gets a recorded error (never a silent 0).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from envs.types import Trajectory
from rewards.service import RewardFnSpec, RewardScorer, ScoreResult, StatsTable, add_stats, fn_metrics
from rl.driver.actors.group import ActorGroup, GroupOwner, ray_factory
from rollout.balance import longest_first

__all__ = ["RewardService"]

_STUCK = "a reward call timed out and its thread could not be stopped"


class RewardService(GroupOwner):
    """A pool of ``RewardScorer`` Ray actors. Requires ``ray.init`` to have run.

    ``timeout_s`` is the per-call limit (see the module docstring); ``workers`` actors,
    ``num_cpus`` Ray CPUs each, or ``actor_options`` (one dict of Ray actor options per
    worker, e.g. a placement-group bundle from ``rl.driver.actors.placement``; a replaced worker gets its
    predecessor's). Spawning, replacing and counting restarts are ``rl.driver.actors.group.ActorGroup``'s.
    """

    def __init__(
        self,
        specs: list[RewardFnSpec],
        workers: int = 1,
        timeout_s: float = 60.0,
        num_cpus: float = 0.1,
        actor_options: list[dict[str, Any]] | None = None,
    ) -> None:
        import ray

        self.specs, self.timeout_s = list(specs), float(timeout_s)
        # Two concurrent methods: a scoring call, and the liveness probe (stalled_s) beside it.
        factory = ray_factory(
            RewardScorer,
            {"num_cpus": num_cpus, "max_restarts": 0, "max_concurrency": 2},
            (self.specs,),
            lambda i: {"timeout_s": self.timeout_s},
        )
        self.group = ActorGroup(
            workers, factory, metric="reward/service/restarts", options=actor_options, what="reward workers"
        )
        ray.get([w.__ray_ready__.remote() for w in self.workers])  # constructor errors surface here
        self._fresh: set[int] = set()  # replaced workers not yet known to be up
        self._worker_errors = 0
        self._stats: StatsTable = {}
        # A worker is hung when it made no progress for timeout_s + grace (its own timeouts did not fire).
        self.grace_s = max(2.0, 0.25 * self.timeout_s)

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """Score ``trajs`` (same order out). Each group (same ``group_id``: the samples of one task)
        goes whole to one worker, so a ``score_batch`` call always sees complete groups."""
        trajs = list(trajs)
        groups: dict[int, list[int]] = {}
        for j, t in enumerate(trajs):
            groups.setdefault(t.group_id, []).append(j)
        members = list(groups.values())  # in order of first appearance: ties go to the earlier group
        shards = [
            sorted(j for g in plan for j in members[g])
            for plan in longest_first([len(m) for m in members], len(self.workers))
        ]
        out: list[Trajectory] = list(trajs)
        jobs = {i: [trajs[j] for j in shard] for i, shard in enumerate(shards) if shard}
        for i, part in self._run(jobs).items():
            for j, t in zip(shards[i], part):
                out[j] = t
        return out

    def take_stats(self) -> StatsTable:
        """Per (domain, fn): the counts since the last take (then reset)."""
        stats, self._stats = self._stats, {}
        return stats

    def metrics(self) -> dict[str, float]:
        """Per-function latency and errors, restarts and worker errors since the last call (then reset)."""
        m = fn_metrics(self.take_stats()) | self.group.metrics()
        m["reward/service/worker_errors"] = float(self._worker_errors)
        self._worker_errors = 0
        return m

    # ------------------------------------------------------------------ internals

    def _run(self, jobs: dict[int, list[Trajectory]]) -> dict[int, list[Trajectory]]:
        """Score each worker's chunk; retry once (on a fresh worker) what a crash, hang or timeout cost."""
        self._await_fresh()  # a replacement's start-up must not count as "no progress"
        first = self._wait_all({i: (self.workers[i].score_with_stats.remote(c), c) for i, c in jobs.items()})
        results: dict[int, list[Trajectory]] = {}
        retry: dict[int, list[int]] = {}  # worker -> positions in its chunk to score again
        for i, res in first.items():
            if isinstance(res, str):  # the worker died or hung: why
                self._replace(i, res)
                retry[i] = list(range(len(jobs[i])))
                results[i] = list(jobs[i])
                continue
            add_stats(self._stats, res.fn)
            results[i] = list(res.trajs)
            if res.stuck:
                self._replace(i, _STUCK)  # frees the thread stuck in the timed-out call
            retry[i] = list(res.timed_out)  # timed-out samples get a second try
        retry = {i: pos for i, pos in retry.items() if pos}
        if not retry:
            return results
        self._await_fresh()
        second = self._wait_all(
            {
                i: (self.workers[i].score_with_stats.remote([jobs[i][p] for p in pos]), [jobs[i][p] for p in pos])
                for i, pos in retry.items()
            }
        )
        for i, res in second.items():
            if isinstance(res, str):
                self._replace(i, res)
                self._worker_errors += len(retry[i])
                again = [dataclasses.replace(jobs[i][p], scores={}, reward=None, reward_error=res) for p in retry[i]]
            else:
                add_stats(self._stats, res.fn)
                again = list(res.trajs)
                if res.stuck:
                    self._replace(i, _STUCK)
            for p, t in zip(retry[i], again):
                results[i][p] = t
        return results

    def _wait_all(self, calls: dict[int, tuple[Any, list[Trajectory]]]) -> dict[int, ScoreResult | str]:
        """Wait for each worker's call: its result, or why not (a string) when the worker died or stopped making
        progress."""
        import ray

        pending = {ref: i for i, (ref, _) in calls.items()}
        done: dict[int, ScoreResult | str] = {}
        last_ok = {i: time.monotonic() for i in calls}
        probes: dict[Any, int] = {}  # liveness probe ref -> worker
        limit = self.timeout_s + self.grace_s
        poll = min(1.0, max(0.05, self.timeout_s / 4))
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=poll)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    done[i] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    done[i] = f"reward worker died ({type(e).__name__})"
            if not pending:
                break
            # Liveness probes, all at once: a worker answers unless a call holds its GIL (or it died).
            # One outstanding probe per worker: an unanswered one is waited for again, not stacked.
            now = time.monotonic()
            for i in pending.values():
                if i not in probes.values():
                    probes[self.workers[i].stalled_s.remote()] = i
            answered, _ = ray.wait(list(probes), num_returns=len(probes), timeout=poll)
            for p in answered:
                i = probes.pop(p)
                try:
                    if ray.get(p) <= limit:
                        last_ok[i] = now
                except ray.exceptions.RayActorError:
                    last_ok[i] = now  # dead, not hung: the scoring ref reports the death
            for ref, i in list(pending.items()):
                if time.monotonic() - last_ok[i] > limit:
                    pending.pop(ref)
                    done[i] = (
                        f"reward worker timed out after {self.timeout_s:g}s (no progress; "
                        "a reward call could not be interrupted)"
                    )
        return done

    def _replace(self, i: int, why: str) -> None:
        self.group.replace(i, why)
        self._fresh.add(i)

    def _await_fresh(self) -> None:
        import ray

        if self._fresh:
            ray.get([self.workers[i].__ray_ready__.remote() for i in sorted(self._fresh)])
            self._fresh.clear()

    def shutdown(self) -> None:
        self.group.kill_all()
