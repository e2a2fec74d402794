"""The reward-function protocol: what a reward class provides (duck-typed, no base class).

A reward function is an object with::

    name: str                      # metric name: reward/<domain>/<name>/mean
    domains: tuple[str, ...]       # the task domains it scores; ("*",) = every domain
    def __call__(self, traj) -> float | None   # None: "does not apply to this sample"

and, optionally, one of two faster variants, which the scorer prefers when present:

* ``score_batch(self, trajs) -> list[float | None]``: one call for all the trajectories
  of a scoring call that the function applies to (by domain), returning one value per
  trajectory, in order. One call gets one per-call timeout. A wrong number of values,
  or an exception, gives every sample of the batch a recorded error.
* ``async def acall(self, traj) -> float | None``: awaited concurrently for the
  trajectories of a scoring call (``asyncio.gather``), each with the per-call timeout;
  at most ``concurrency`` (an optional int attribute, default
  :data:`DEFAULT_CONCURRENCY`) calls are in flight at once. For I/O-bound rewards
  (LLM judges, remote verifiers).

Precedence when a class has several: ``score_batch``, then ``acall``, then ``__call__``.
``__call__`` is required even then (``jointrl validate`` checks for it, and it is the
plain way to use the class in a notebook or a test).

Optional attributes:

* ``shaping: bool`` (default False): a shaping term (e.g. a length penalty) adds to the
  score but does not by itself make a sample "scored". A sample is scored only when at
  least one non-shaping function with a non-zero weight returns a number; otherwise
  the sample gets a recorded ``reward_error`` and is left out of the update, so that a
  penalty alone never stands in for a missing reward.
* ``concurrency: int``: the most ``acall`` coroutines in flight at once (see above).

A plain function works too: ``def brevity(traj, max_chars=200) -> float | None`` named in a
recipe's ``rewards[].cls`` is wrapped by :func:`build_reward` (its name is the metric name, the
recipe's ``kwargs`` are passed on every call, ``rewards[].domains`` says what it scores; a
``domains`` or ``shaping`` attribute set on the function is read like a class's).

Values must be finite real numbers (``bool`` is not a number here); anything else, an
exception or a timeout gives the sample a recorded ``reward_error`` and no reward --
never a silent 0.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Protocol, runtime_checkable

from envs.types import Trajectory

__all__ = [
    "RewardFn",
    "BatchedRewardFn",
    "AsyncRewardFn",
    "ALL_DOMAINS",
    "DEFAULT_CONCURRENCY",
    "applies_to",
    "call_mode",
    "build_reward",
    "check_reward_kwargs",
    "FunctionReward",
]

ALL_DOMAINS = "*"  # a `domains` entry that matches every domain
DEFAULT_CONCURRENCY = 32  # acall coroutines in flight per function, unless the class says otherwise


@runtime_checkable
class RewardFn(Protocol):
    """A reward function: ``name``, ``domains`` and ``__call__(traj) -> float | None``."""

    name: str
    domains: tuple[str, ...]

    def __call__(self, traj: Trajectory) -> float | None:
        """The sample's score, or None when this function does not apply to it."""
        ...


@runtime_checkable
class BatchedRewardFn(RewardFn, Protocol):
    """A reward function that can also score many trajectories in one call."""

    def score_batch(self, trajs: list[Trajectory]) -> list[float | None]:
        """One value (or None) per trajectory, in order."""
        ...


@runtime_checkable
class AsyncRewardFn(RewardFn, Protocol):
    """A reward function with a coroutine variant, awaited concurrently by the scorer."""

    async def acall(self, traj: Trajectory) -> float | None:
        """Like ``__call__``, as a coroutine."""
        ...


def applies_to(domains: Any, domain: str) -> bool:
    """Whether a function declared for ``domains`` scores a sample of ``domain`` (``"*"`` matches all)."""
    return domain in domains or ALL_DOMAINS in domains


def call_mode(fn: Any) -> str:
    """How the scorer calls ``fn``: ``"batch"``, ``"async"`` or ``"call"`` (see the module docstring)."""
    if callable(getattr(fn, "score_batch", None)):
        return "batch"
    if callable(getattr(fn, "acall", None)):
        return "async"
    return "call"


class FunctionReward:
    """A plain function as a reward function: ``fn(traj, **kwargs)`` with the recipe's ``kwargs``.

    ``name`` is the function's name; ``domains`` and ``shaping`` are read from attributes set on the
    function (``fn.domains = ("arith",)``), else the recipe's ``rewards[].domains`` applies.
    """

    def __init__(self, fn: Any, kwargs: dict[str, Any]) -> None:
        self.fn, self.kwargs = fn, dict(kwargs)
        self.name = str(getattr(fn, "name", "") or getattr(fn, "__name__", "") or "reward")
        self.domains = tuple(getattr(fn, "domains", ()) or ())
        self.shaping = bool(getattr(fn, "shaping", False))

    def __call__(self, traj: Trajectory) -> float | None:
        """The function's value for ``traj``."""
        return self.fn(traj, **self.kwargs)


def _is_plain_function(obj: Any) -> bool:
    return inspect.isfunction(obj) or inspect.isbuiltin(obj) or isinstance(obj, functools.partial)


def check_reward_kwargs(obj: Any, kwargs: dict[str, Any]) -> None:
    """Raise ``TypeError`` saying why ``kwargs`` do not fit ``obj`` (a reward class's constructor, or a
    plain function called as ``fn(traj, **kwargs)``); an async function is refused (use a class with
    ``acall``). Objects without a signature pass (checked when built)."""
    if _is_plain_function(obj) and inspect.iscoroutinefunction(obj):
        raise TypeError("an async function cannot be a reward: write a class with `async def acall(self, traj)`")
    try:
        sig = inspect.signature(obj)
    except ValueError:
        return
    if _is_plain_function(obj):
        sig.bind(None, **kwargs)  # the trajectory comes first
    else:
        sig.bind(**kwargs)


def build_reward(obj: Any, kwargs: dict[str, Any]) -> Any:
    """The reward function that a recipe's ``rewards[].cls`` names: a class is constructed with
    ``kwargs``; a plain function is wrapped in :class:`FunctionReward` with them."""
    if _is_plain_function(obj):
        check_reward_kwargs(obj, kwargs)
        return FunctionReward(obj, kwargs)
    return obj(**kwargs)
