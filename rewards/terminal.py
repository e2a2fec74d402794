"""Reward for the ``terminal`` domain: the env's check result.

:class:`envs.terminal.TerminalEnv` scores each episode itself: when the episode ends it
runs the task's check in a fresh sandbox over the episode's work dir and reports the
result as ``info["reward"]``, which the rollout records as ``Trajectory.env_reward``
(see :mod:`envs.terminal` for the semantics: exit 0 -> 1.0, a last stdout line in
[0, 1] -> partial credit, else 0.0). This reward passes that value on.
"""

from __future__ import annotations

from envs.types import Trajectory

__all__ = ["TerminalCheckReward"]


class TerminalCheckReward:
    """``traj.env_reward`` (the terminal env's check result, in [0, 1]) for terminal tasks.

    Returns ``None`` when the env reported no reward, i.e. the episode ended before the
    check ran (it was cut by the rollout's token, turn or context limit before the env
    ended it, or it aborted). ``None`` means "does not apply"; when no reward function
    scores a sample, the reward service records a ``reward_error`` for it and the trainer
    drops it. That is intended: an unchecked episode is never silently scored 0.
    Also ``None`` for a task without a terminal spec.
    """

    name = "terminal_check"
    domains = ("terminal",)

    def __call__(self, traj: Trajectory) -> float | None:
        if traj.task.terminal is None or traj.env_reward is None:
            return None
        return float(traj.env_reward)
