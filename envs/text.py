"""A generic single-turn env for text answers: the policy answers once and the episode ends.

Any domain whose tasks are a conversation and whose answer is checked by a reward (a number,
a word, a label, an expression) needs no env class of its own: serve it with
``envs.text.TextAnswerEnv`` and write one reward class that reads the answer from
``traj.completion`` and what it should be from the task (usually ``task.meta``)::

    rollout:
      envs:
        - {domain: arith, cls: envs.text.TextAnswerEnv}
    rewards:
      - {cls: my_rewards.ArithReward, domains: [arith]}

The env never scores (no ``info["reward"]``) and shows the policy nothing after its answer, so the
reward classes alone decide the score. Nothing runs in a sandbox: the answer is only text.
"""

from __future__ import annotations

from typing import Any

from envs.types import Message, Task

__all__ = ["TextAnswerEnv"]


class TextAnswerEnv:
    """One turn: ``reset`` returns the task's messages, the first ``step`` ends the episode.

    ``max_answer_chars`` (0 = no limit): an answer longer than this ends the episode as
    ``truncated`` instead of ``terminated`` (``info["over_length"]`` is True), for rewards or
    reports that tell a cut answer from a finished one; the model's token limit
    (``rollout.max_new_tokens``) already bounds every answer.
    """

    def __init__(self, max_answer_chars: int = 0) -> None:
        if not isinstance(max_answer_chars, int) or isinstance(max_answer_chars, bool) or max_answer_chars < 0:
            raise ValueError(f"max_answer_chars must be an int >= 0 (0 = no limit), got {max_answer_chars!r}")
        self.max_answer_chars = max_answer_chars
        self._done = True

    def reset(self, task: Task) -> list[Message]:
        """Start an episode: the conversation before the policy's answer is the task's messages."""
        if not task.messages:
            raise ValueError(f"task {task.id!r} has no messages")
        self._done = False
        return list(task.messages)

    def step(self, action: str) -> tuple[list[Message], bool, bool, dict[str, Any]]:
        """Take the answer; the episode ends (no observation follows)."""
        if self._done:
            raise RuntimeError("step() before reset() or after the episode ended; call reset()")
        self._done = True
        over = bool(self.max_answer_chars) and len(action) > self.max_answer_chars
        return [], not over, over, {"over_length": over}

    def close(self) -> None:
        """Nothing to release; idempotent."""
        self._done = True
