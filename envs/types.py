"""Typed records that cross process and Ray boundaries: tasks, messages, trajectories.

This is the bottom of the import graph: it imports nothing from jointrl. Every other
package (``rollout``, ``rewards``, ``rl``) exchanges these dataclasses and nothing else
(no dict bags between actors). It holds no logic beyond small derived properties.

Domains shipped with jointrl are ``"code"``, ``"terminal"`` and ``"tool_call"``; a user
env may define its own domain name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Message:
    """One chat message. ``role`` is ``system``, ``user``, ``assistant`` or ``tool``."""

    role: str
    content: str
    name: str | None = None  # the tool's name, for role == "tool"


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: function name and JSON arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ExpectedCall:
    """A ground-truth call in BFCL style: each parameter maps to its allowed values.

    An optional parameter that may be omitted lists ``""`` among its allowed values.
    """

    name: str
    allowed: dict[str, list[Any]]


@dataclass(frozen=True)
class FollowUp:
    """A later request of a ``"calls"``-mode task: after the policy's previous turn the env appends
    ``request`` as a user message, and the next assistant turn is pre-started with ``prefill``; that turn's
    right calls are ``expected`` (as :attr:`ToolCallSpec.expected` is the first turn's)."""

    request: str
    expected: tuple[ExpectedCall, ...]
    prefill: str = ""


@dataclass(frozen=True)
class ToolCallSpec:
    """What a tool-call task needs beyond its messages.

    ``tools`` are function schemas ``{"name", "description", "parameters": <JSON Schema>}``.
    ``expected`` are the calls a correct answer makes (order-insensitive).
    ``mode``: ``"calls"`` (single turn, scored by matching ``expected``) or ``"answer"``
    (multi-turn: calls are executed by simulated tools until the policy answers without a
    call; scored by matching the final answer against ``answer``, the acceptable answers).
    ``state`` is per-task data the simulated tools read (e.g. a user database);
    ``parallel`` (informational) marks tasks that want several calls in one turn.
    ``followups`` (``"calls"`` mode only): further requests, one a turn, each with its own right calls
    (a session of several requests; scored turn by turn).
    """

    tools: tuple[dict[str, Any], ...]
    expected: tuple[ExpectedCall, ...]
    mode: str = "calls"
    answer: tuple[str, ...] = ()
    state: dict[str, Any] = field(default_factory=dict)
    parallel: bool = False
    followups: tuple[FollowUp, ...] = ()


@dataclass(frozen=True)
class CodeSpec:
    """What a code task needs beyond its messages.

    ``tests`` is Python test code run against the solution. With ``style == "humaneval"``
    it defines ``check(candidate)`` and is called as ``check(<entry_point>)``; with
    ``style == "assert"`` it is plain code (asserts) that uses ``entry_point`` directly.
    ``prompt_code`` is the code a raw continuation completes (HumanEval's ``prompt``);
    ``solution`` is a reference solution (complete code), used to verify the task.

    ``tests`` are the HIDDEN tests: the reward is computed on them alone, and feedback on
    them carries no value (which test failed, by index, and the exception type).
    ``public_tests`` (same style rules, assert style only) are the tests the prompt shows
    (its example): run for feedback, which may quote their got / expected values, and never
    scored. A task with no public tests (HumanEval-style, or files written before the split)
    is scored on all its tests with value-free feedback. A task whose ``tests`` is empty has
    no hidden tests: it is scored on its public tests, and recipes refuse it
    (``jointrl validate`` names the task and ``code.tests``).
    """

    tests: str
    entry_point: str
    prompt_code: str = ""
    style: str = "assert"
    solution: str = ""
    timeout_s: float = 10.0
    public_tests: str = ""


@dataclass(frozen=True)
class TerminalSpec:
    """What a terminal task needs beyond its messages.

    ``setup`` (bash) builds the initial state in the work dir; ``check`` (bash) runs after
    the episode in the same work dir: exit 0 passes, or a float printed on its last stdout
    line is the reward. ``solution`` is a reference solution (bash) that must pass.
    """

    setup: str
    check: str
    solution: str = ""
    time_limit_s: float = 60.0


@dataclass(frozen=True)
class Task:
    """One prompt of one domain.

    ``messages`` is the conversation before the policy's first turn. ``prefill`` is text
    the assistant turn is pre-started with (it is part of the prompt, not of the
    policy's tokens, and is prepended to the first assistant message's content).
    ``meta`` holds free-form JSON metadata (source file, difficulty, length prior...).
    """

    id: str
    domain: str
    messages: tuple[Message, ...]
    prefill: str = ""
    tool_call: ToolCallSpec | None = None
    code: CodeSpec | None = None
    terminal: TerminalSpec | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Trajectory:
    """One episode of one task, token-in-token-out, plus its scores once rewarded.

    ``response_ids`` are all tokens after ``prompt_ids``: the policy's tokens exactly as
    the engine produced them, and (multi-turn) environment tokens in between.
    ``loss_mask[i]`` is 1 where ``response_ids[i]`` came from the policy.
    ``logprobs[i]`` is the engine's logprob of that token (0.0 on env tokens).
    ``routing`` (a mixture-of-experts model, from an engine that reports it): the experts each token of
    ``prompt_ids + response_ids`` was routed to, ``(tokens, layers, top_k)`` small integers, row t for token t,
    each row from the turn whose generation first ran that token (the last token, never run, has none);
    None where any turn's generation came without it.
    ``token_versions[i]``: the policy version (weight loads the engine had received, ``rollout.partial``) of the
    weights that sampled ``response_ids[i]``, -1 on env tokens; a turn interrupted by a weight update and resumed
    (partial rollouts) holds two versions. None where any turn's generation came without versions.
    ``terminated`` (the episode reached a natural end) and ``truncated`` (cut by a
    token or turn limit) are kept apart; both may be False only for an aborted episode.
    """

    task: Task
    group_id: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    messages: list[Message]
    terminated: bool
    truncated: bool
    finish_reason: str
    num_turns: int = 1
    env_reward: float | None = None
    scores: dict[str, float | None] = field(default_factory=dict)
    reward: float | None = None
    # The part of ``reward`` that shaping terms added (weight x value summed, e.g. a length penalty):
    # ``reward - reward_shaping`` is the task's own score, what a held-out evaluation compares.
    reward_shaping: float = 0.0
    reward_error: str | None = None
    # Sandbox events the env reported (envs.sandbox.events: "timeout", "storage", "seccomp"...),
    # one entry per occurrence; None when the env reports none (not sandboxed).
    sandbox_events: list[str] | None = None
    # The prompt as the policy read it: the chat template's text of the task's messages, system
    # message and tool schemas included (without the prefill, which ``completion`` shows). "" when
    # not rendered (recorded completions scored by ``jointrl score``).
    prompt: str = ""
    routing: np.ndarray | None = None
    token_versions: list[int] | None = None
    # Policy turns whose generation ended at the token limit (``rollout.max_new_tokens``) rather than at a
    # stop string or EOS: a cut turn's action is unfinished, whatever the episode's last turn did. None where
    # not recorded (recorded completions scored by ``jointrl score``).
    cut_turns: int | None = None

    @property
    def oldest_version(self) -> int | None:
        """The policy version of the oldest weights that sampled a token of this episode (its staleness is
        measured from it); None without versions or policy tokens."""
        own = [v for v in self.token_versions or () if v >= 0]
        return min(own) if own else None

    @property
    def newest_version(self) -> int | None:
        own = [v for v in self.token_versions or () if v >= 0]
        return max(own) if own else None

    @property
    def assistant_turns(self) -> list[str]:
        """The text of each assistant turn the episode produced, in order (the first with its prefill)."""
        return [m.content for m in self.messages[len(self.task.messages) :] if m.role == "assistant"]

    @property
    def completion(self) -> str:
        """All assistant text the episode produced (prefill included), turns joined by newlines."""
        return "\n".join(self.assistant_turns)

    @property
    def task_reward(self) -> float | None:
        """The task's own score: ``reward`` less what shaping terms added (None when unscored). Whether a sample
        passes is read from it, so that a length penalty never turns a solved task into a failed one. Without
        shaping it is ``reward`` itself; with it, the difference rounded to 12 decimals, so that float rounding
        in ``(own + shaping) - shaping`` cannot put a task a hair under a pass threshold."""
        if self.reward is None or self.reward_shaping == 0.0:
            return self.reward
        return round(self.reward - self.reward_shaping, 12)

    def passes(self, threshold: float) -> bool:
        """Whether the task's own score (:attr:`task_reward`) reaches ``threshold``; an unscored sample does not pass."""
        own = self.task_reward
        return own is not None and own >= threshold

    @property
    def num_policy_tokens(self) -> int:
        return int(sum(self.loss_mask))


@dataclass(frozen=True)
class Sampling:
    """Sampling settings for one generation call. ``temperature == 0`` is greedy."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 1
    max_model_len: int = 2048


@dataclass(frozen=True)
class Generation:
    """One engine completion: the exact token ids sampled, their logprobs, and why it stopped.

    ``routing``: on a mixture-of-experts model, from an engine that reports it (``rollout.hf_engine``), the
    experts each token was routed to, ``(tokens, layers, top_k)`` small integers (``rollout.routing``): one row
    per token the engine ran through the model, the prompt's then each generated token's but the last (the
    last is sampled, never fed back). None for a dense model or an engine that does not report routing.
    ``versions[i]``: the policy version of the weights that sampled ``token_ids[i]`` (``rollout.partial``); None
    from an engine that does not report it. ``finish_reason`` "interrupted": a request stopped at a weight update,
    its tokens so far (``rollout.partial.INTERRUPTED``)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS or stop string) | "length" | "interrupted"
    routing: np.ndarray | None = None
    versions: list[int] | None = None
