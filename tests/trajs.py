"""Trajectory records for tests that score or summarize without generating: one prompt token, one
response token, finished by ``stop``. Only the fields a test names differ between them."""

from __future__ import annotations

from envs.types import Message, Task, Trajectory


def finished(task: Task, messages: list[Message], **fields) -> Trajectory:
    """A terminated trajectory of ``task`` whose conversation is ``messages``; ``fields`` set the rest
    (``reward``, ``env_reward``, ``num_turns``, ``sandbox_events``, ...)."""
    return Trajectory(
        task=task,
        group_id=0,
        prompt_ids=[1],
        response_ids=[2],
        loss_mask=[1],
        logprobs=[0.0],
        messages=list(messages),
        terminated=True,
        truncated=False,
        finish_reason="stop",
        **fields,
    )


def answered(task: Task, text: str, **fields) -> Trajectory:
    """``finished`` with the task's prompt followed by one assistant turn ``text``."""
    return finished(task, [*task.messages, Message("assistant", text)], **fields)
