"""Simulated tool latency for the tool-call env: a seeded, long-tailed sleep per tool call.

Real tools and sandboxes answer in a long-tailed time; the simulated tools of :mod:`envs.toolcall_tools` answer
at once. ``ToolCallEnv(tool_latency={...})`` (a bench and test option, off by default) sleeps before each call it
runs or dispatches a lognormal time: ``median_s * exp(sigma * z)`` with ``z`` standard normal, capped at
``cap_s``. ``z`` is a pure function of ``(seed, task id, episode seed, turn, call index)`` (a blake2b hash mapped
through the normal quantile function), so a run is reproducible and two runs of the same recipe and seed (the
arms of ``bench/async_bench.py``) see the same latency for the same sample's same call, whatever thread or order
it runs in. The episode seed reaches the env through its optional ``seed_episode`` (``rollout.episode``).

The sleep is on the env call's thread: with ``rollout.env_workers`` above the episodes in flight, other
episodes keep generating while one waits (``rollout.episode`` runs env calls on worker threads).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

__all__ = ["ToolLatency"]

_NORMAL = NormalDist()


@dataclass(frozen=True)
class ToolLatency:
    """A lognormal tool latency: median ``median_s`` seconds, log-space spread ``sigma``, at most ``cap_s``;
    ``seed`` picks the draws (see the module docstring)."""

    median_s: float = 0.5
    sigma: float = 1.0
    cap_s: float = 20.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("median_s", "sigma", "cap_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"tool_latency.{name} must be a finite number >= 0, got {v!r}")
        if self.median_s > self.cap_s:
            raise ValueError(f"tool_latency.median_s ({self.median_s}) is above tool_latency.cap_s ({self.cap_s})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"tool_latency.seed must be an integer, got {self.seed!r}")

    @classmethod
    def from_option(cls, option: Mapping[str, Any]) -> ToolLatency:
        """From the env option's mapping; an unknown key is an error naming it and the known ones."""
        if not isinstance(option, Mapping):
            raise ValueError(f"tool_latency must be a mapping (median_s, sigma, cap_s, seed), got {option!r}")
        known = ("median_s", "sigma", "cap_s", "seed")
        unknown = sorted(set(option) - set(known))
        if unknown:
            raise ValueError(f"tool_latency: unknown key(s) {unknown}; known: {list(known)}")
        return cls(**dict(option))

    def draw(self, task_id: str, episode_seed: int, turn: int, call: int) -> float:
        """The latency in seconds of call ``call`` (0-based) of turn ``turn`` (1-based) of the episode with seed
        ``episode_seed`` on task ``task_id``: the same key always gives the same time."""
        key = f"{self.seed}\x1f{task_id}\x1f{episode_seed}\x1f{turn}\x1f{call}".encode()
        h = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
        u = (h + 0.5) / 2.0**64  # in (0, 1): the quantile function is finite there
        return min(self.median_s * math.exp(self.sigma * _NORMAL.inv_cdf(u)), self.cap_s)
