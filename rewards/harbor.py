"""Reward for the ``harbor`` domain: the task's verifier result.

:class:`envs.harbor.env.HarborEnv` runs each episode's verifier (``tests/test.sh``, out of the
agent's reach, see :mod:`envs.harbor.verifier`) when the episode ends and reports the reward
it wrote as ``info["reward"]``, which the rollout records as ``Trajectory.env_reward``. A
verifier that crashed, timed out or wrote no valid reward is already 0.0 there.
"""

from __future__ import annotations

from envs.types import Trajectory

__all__ = ["HarborVerifierReward"]


class HarborVerifierReward:
    """``traj.env_reward`` (the verifier's reward, in [0, 1]) for Harbor tasks.

    ``None`` ("does not apply", the sample is left unscored) when the env reported no reward:
    the episode ended before the verifier ran (aborted, or a harness failure), or the task is
    not a Harbor task (no ``meta["harbor"]``).
    """

    name = "harbor_verifier"
    domains = ("harbor",)

    def __call__(self, traj: Trajectory) -> float | None:
        if not traj.task.meta.get("harbor") or traj.env_reward is None:
            return None
        return float(traj.env_reward)
