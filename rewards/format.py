"""Format and length rewards.

* :class:`OverlongPenalty` (``"overlong"``): DAPO's soft overlong punishment, a shaping
  term for every domain.
* :class:`CutTurnPenalty` (``"cut_turn"``): a shaping term for an episode with a turn cut by
  the generation's token limit.
* :class:`~rewards.toolcall.ToolCallFormatReward` (``"toolcall_format"``): well-formed
  tool-call turns (re-exported from :mod:`rewards.toolcall`).
* :class:`~rewards.code.CodeFormatReward` (``"code_format"``): a closed, parseable
  python code block (re-exported from :mod:`rewards.code`).
"""

from __future__ import annotations

import math

from envs.types import Trajectory
from rewards.code import CodeFormatReward
from rewards.toolcall import ToolCallFormatReward

__all__ = ["OverlongPenalty", "CutTurnPenalty", "ToolCallFormatReward", "CodeFormatReward"]


def _penalty(penalty: float) -> float:
    """``penalty`` as a float; ValueError unless it is a finite number >= 0 (a bool is not one)."""
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not math.isfinite(penalty) or penalty < 0:
        raise ValueError(f"penalty must be a finite number >= 0, got {penalty!r}")
    return float(penalty)


class OverlongPenalty:
    """DAPO's soft overlong punishment on the response's policy tokens, in [-penalty, 0].

    With ``L`` = the episode's policy tokens (``traj.num_policy_tokens``: every assistant
    turn of a multi-turn episode, environment tokens not counted)::

        0                                         if L <= max_tokens - buffer_tokens
        -penalty * (L - (max_tokens - buffer_tokens)) / buffer_tokens
                                                  if max_tokens - buffer_tokens < L <= max_tokens
        -penalty                                  if L > max_tokens

    so it falls linearly from 0 to ``-penalty`` over the last ``buffer_tokens`` before
    ``max_tokens`` (``buffer_tokens=0``: a hard step past ``max_tokens``). Applies to every
    domain (``domains = ("*",)``). It is a shaping term (``shaping=True``): it adds to
    the score but never makes a sample "scored" on its own, so a sample whose real reward
    does not apply still gets a recorded error instead of a bare penalty.

    Returns ``None`` for a trajectory without token information (an empty ``loss_mask``,
    e.g. a recorded completion scored by ``jointrl score`` without ``--tokenizer``).
    """

    name = "overlong"
    domains = ("*",)
    shaping = True

    def __init__(self, max_tokens: int, buffer_tokens: int, penalty: float = 1.0, shaping: bool = True):
        for label, v in (("max_tokens", max_tokens), ("buffer_tokens", buffer_tokens)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{label} must be an int, got {v!r}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not 0 <= buffer_tokens <= max_tokens:
            raise ValueError(f"buffer_tokens must be in [0, max_tokens={max_tokens}], got {buffer_tokens}")
        self.max_tokens = max_tokens
        self.buffer_tokens = buffer_tokens
        self.penalty = _penalty(penalty)
        self.shaping = bool(shaping)

    def __call__(self, traj: Trajectory) -> float | None:
        if not traj.loss_mask:
            return None
        return self.score_length(traj.num_policy_tokens)

    def score_length(self, n: int) -> float:
        """The penalty for a response of ``n`` policy tokens."""
        start = self.max_tokens - self.buffer_tokens
        if n <= start:
            return 0.0
        if n > self.max_tokens:
            return -self.penalty
        return -self.penalty * (n - start) / self.buffer_tokens


class CutTurnPenalty:
    """``-penalty`` for an episode in which any policy turn ended at the generation's token limit
    (``rollout.max_new_tokens``: ``traj.cut_turns > 0``), else 0.

    Why: a turn cut at the limit is an unfinished action (a code block never closed, a command half
    written) that the domain's own reward mostly scores as any other failure, 0. In a group whose
    samples all fail, the ones that stopped and the ones that rambled to the limit then tie, the group
    has no reward variance and teaches nothing, and a policy that drifts into not stopping is not pushed
    back. This term tells them apart. Unlike :class:`OverlongPenalty` it reads each turn's own ending
    (recorded by the rollout from the engine's finish reason, out of the policy's reach), not the
    episode's total length, so it is the same for a one-turn and a three-turn episode.

    Applies to every domain (``domains = ("*",)``); a shaping term (``shaping=True``): it adds to the
    score, never makes a sample scored on its own, and the part it adds is kept apart in
    ``traj.reward_shaping`` so that evaluations can read the task's own score. Returns ``None`` for a
    trajectory without the record (``cut_turns is None``: a recorded completion scored by ``jointrl score``).
    """

    name = "cut_turn"
    domains = ("*",)
    shaping = True

    def __init__(self, penalty: float = 0.5):
        self.penalty = _penalty(penalty)

    def __call__(self, traj: Trajectory) -> float | None:
        if traj.cut_turns is None:
            return None
        return -self.penalty if traj.cut_turns > 0 else 0.0
