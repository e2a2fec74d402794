"""A group of N actors of one class: each spawned with its own options, replaced by index, restarts counted.

The rollout workers (:class:`rl.driver.actors.rollout.RolloutPool`), the reward workers
(:class:`rl.driver.actors.rewards.RewardService`) and the learners
(:class:`rl.driver.actors.learners.LearnerGroup`) each hold one :class:`ActorGroup`.

What it does: spawn actor ``i`` through a factory with actor ``i``'s options (e.g. its
placement-group bundle), kill one and spawn its replacement with the same options, count the
replacements, report them as one metric since the last report, and kill them all at the end.
What it does not: decide when an actor is dead (each group has its own check: the rollout
pool's health probe and deadlines, the reward service's progress probe; :func:`actor_died`
is the part they share), re-issue the dead actor's work, or shut actors down gracefully.
The group runs on any factory (tests drive it without Ray); :func:`ray_factory` makes the
factory of a Ray actor class.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

__all__ = ["ActorGroup", "GroupOwner", "Factory", "actor_died", "kill_ray_actor", "ray_factory"]

Factory = Callable[[int, dict[str, Any]], Any]  # (index, options) -> actor handle


class ActorGroup:
    """``n`` actors made by ``factory(i, options[i])``; ``replace(i)`` makes actor ``i`` anew with the same options.

    ``options``: one dict per actor (None: ``{}`` each); a wrong count is a ``ValueError`` naming
    ``what`` (e.g. ``"rollout workers"``). ``metric``: the key :meth:`metrics` reports the
    replacements under. ``kill(handle)``: how an actor is stopped (default: ``ray.kill``); its
    errors are ignored, since the actor being killed is usually dead already. If spawning one of
    the first ``n`` fails, those already spawned are killed before the error propagates.
    """

    def __init__(
        self,
        n: int,
        factory: Factory,
        *,
        metric: str,
        options: list[dict[str, Any]] | None = None,
        kill: Callable[[Any], None] | None = None,
        what: str = "actors",
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{what}: need at least 1, got {n!r}")
        if options is not None and len(options) != n:
            raise ValueError(f"{len(options)} actor_options for {n} {what}")
        self.options = [dict(o) for o in options] if options is not None else [{} for _ in range(n)]
        self.metric, self.what = metric, what
        self._factory, self._kill = factory, kill or kill_ray_actor
        self.restarts = 0
        self.failures: list[tuple[int, str]] = []  # (index, why) of every replacement, oldest first
        self._restarts_logged = 0
        self.actors: list[Any] = []
        try:
            for i in range(n):
                self.actors.append(factory(i, self.options[i]))
        except BaseException:
            self.kill_all()
            raise

    def __len__(self) -> int:
        return len(self.actors)

    def __getitem__(self, i: int) -> Any:
        return self.actors[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.actors)

    def retire(self, i: int, why: str = "") -> None:
        """Kill actor ``i`` (whatever is left of it) and record ``why``; :meth:`respawn` starts its successor.
        Split from :meth:`replace` for groups that clean up after the dead actor in between."""
        self.failures.append((i, why))
        self._quiet_kill(self.actors[i])

    def respawn(self, i: int) -> Any:
        """Spawn actor ``i`` anew with its options; counts one restart. Returns the new handle."""
        self.actors[i] = self._factory(i, self.options[i])
        self.restarts += 1
        return self.actors[i]

    def replace(self, i: int, why: str = "") -> Any:
        """:meth:`retire` then :meth:`respawn`: the new handle of actor ``i``."""
        self.retire(i, why)
        return self.respawn(i)

    def metrics(self) -> dict[str, float]:
        """``{metric: replacements since the last call}`` (then reset)."""
        m = {self.metric: float(self.restarts - self._restarts_logged)}
        self._restarts_logged = self.restarts
        return m

    def kill_all(self) -> None:
        """Kill every actor; the group is empty afterwards (falsy ``len``)."""
        for a in self.actors:
            self._quiet_kill(a)
        self.actors = []

    def _quiet_kill(self, actor: Any) -> None:
        try:
            self._kill(actor)
        except Exception:  # noqa: BLE001 - already gone, or its node is
            pass


class GroupOwner:
    """What an owner of one :class:`ActorGroup` (``self.group``) shows of it: its actor handles,
    restarts and failures. The rollout pool and the reward service both inherit it, so the
    three read-only views are written once."""

    group: ActorGroup

    @property
    def workers(self) -> list[Any]:
        """The actor handles, by index (empty after shutdown)."""
        return self.group.actors

    @property
    def restarts(self) -> int:
        """Replacements so far (what counts as one is the owner's: crashed, hung, stuck in a call)."""
        return self.group.restarts

    @property
    def failures(self) -> list[tuple[int, str]]:
        """(worker, why) of every replacement, oldest first."""
        return self.group.failures


def ray_factory(
    cls: type,
    remote_options: dict[str, Any],
    args: tuple[Any, ...] = (),
    kwargs: Callable[[int], dict[str, Any]] | None = None,
) -> Factory:
    """The factory of Ray actors of ``cls``: ``ray.remote(**remote_options)(cls)``, then per actor
    ``.options(**options).remote(*args, **kwargs(i))`` (the per-actor options override the class's)."""
    import ray

    remote = ray.remote(**remote_options)(cls) if remote_options else ray.remote(cls)

    def make(i: int, options: dict[str, Any]) -> Any:
        return remote.options(**options).remote(*args, **(kwargs(i) if kwargs is not None else {}))

    return make


def kill_ray_actor(actor: Any) -> None:
    import ray

    ray.kill(actor)


def actor_died(e: BaseException) -> bool:
    """True when ``e`` says a Ray actor's process is gone (dead, or unreachable), not that its method raised."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return isinstance(e, (RayActorError, ActorDiedError, ActorUnavailableError))
