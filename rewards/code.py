"""Rewards for the ``code`` domain: hidden-test score with honest partial credit, and answer format."""

from __future__ import annotations

import ast
import logging
import math
import threading
import weakref

from envs.code import PARSE_ERRORS, code_sandboxes, extract_code, find_code_blocks, run_tests
from envs.sandbox import Sandbox
from envs.sandbox.config import SandboxConfig
from envs.types import Trajectory

__all__ = ["CodeTestsReward", "CodeFormatReward", "last_answer"]

logger = logging.getLogger("rewards")

MODES = ("fraction", "all")


def last_answer(traj: Trajectory) -> str:
    """The text of the episode's last assistant turn (prefill included on turn 1), or ``""``."""
    for m in reversed(traj.messages[len(traj.task.messages) :]):
        if m.role == "assistant":
            return m.content
    return ""


class CodeTestsReward:
    """The final answer's code scored on the task's hidden tests, in [0, 1].

    ``mode="fraction"``: honest partial credit, :attr:`envs.code.TestOutcome.score` (1.0
    when every hidden test passes, else only the passes above what a trivial answer, a
    constant or an echo of the input, passes; see :func:`envs.code.partial_credit`);
    ``mode="all"``: 1.0 iff every hidden test passes, else 0.0. Public tests (the prompt's
    example) are never scored.

    Reuse of the env's score: when ``traj.env_reward`` is set (and ``use_env_reward``), it
    is taken as the score of the LAST answer and no code runs again. That holds for
    :class:`envs.code.CodeEnv`, which reports ``info["reward"]`` = that score on every
    step (the rollout records the last reported value, and an episode's last step is its
    last answer). Pass ``use_env_reward=False`` when code tasks run under an env whose
    ``info["reward"]`` means something else.

    Otherwise the code of the last assistant turn is extracted
    (:func:`envs.code.extract_code`) and run against the tests in this reward's own
    sandboxes, one for the candidate and one for the judge that holds the tests (see
    :mod:`envs.code_verdict`; ``sandbox`` mode ``"bwrap"``, or ``"none"`` for trusted code only; created on
    first use, reused while runs end cleanly, removed when the reward object goes away), with ``timeout_s``
    overriding the task's ``timeout_s``. No code found scores 0.0. Returns ``None`` for a
    task without a code spec (``task.code``).

    No cross-talk: after a run that raised or reported any sandbox event (a timeout, a limit, a
    harness error: whatever the candidate may have left behind), the pair is closed and the next
    sample gets fresh ones, so one poisoned sample cannot fail the ones after it (in a Ray reward
    worker, for the worker's lifetime).
    """

    name = "code_tests"
    domains = ("code",)

    def __init__(
        self,
        mode: str = "fraction",
        timeout_s: float | None = None,
        sandbox: str = "bwrap",
        use_env_reward: bool = True,
        sandbox_config: SandboxConfig | dict | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if timeout_s is not None and (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, (int, float))
            or not timeout_s > 0
            or not math.isfinite(timeout_s)
        ):
            raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
        if sandbox not in ("bwrap", "none"):
            raise ValueError(f"sandbox must be 'bwrap' or 'none' (trusted code only), got {sandbox!r}")
        self.mode = mode
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self.sandbox_mode = sandbox
        self.use_env_reward = bool(use_env_reward)
        self.sandbox_config = SandboxConfig.coerce(sandbox_config)
        self._boxes: tuple[Sandbox, Sandbox] | None = None
        self._finalizers: list[weakref.finalize] = []
        self._lock = threading.Lock()

    def _score(self, fraction: float) -> float:
        if self.mode == "all":
            return 1.0 if fraction >= 1.0 - 1e-9 else 0.0
        return float(fraction)

    def __call__(self, traj: Trajectory) -> float | None:
        spec = traj.task.code
        if spec is None:
            return None
        if self.use_env_reward and traj.env_reward is not None:
            return self._score(float(traj.env_reward))
        code = extract_code(last_answer(traj), spec.prompt_code, spec.entry_point)
        if code is None:
            return 0.0
        with self._lock:  # one pair of work dirs: runs of this object never overlap
            if self._boxes is None:
                self._boxes = code_sandboxes(self.sandbox_mode, self.sandbox_config)
                self._finalizers = [weakref.finalize(self, box.close) for box in self._boxes]
            cand, judge = self._boxes
            try:
                outcome = run_tests(spec, code, cand, timeout_s=self.timeout_s, judge=judge)
            except BaseException:
                self._drop_boxes()
                raise
            if outcome.events:
                self._drop_boxes()
        return self._score(outcome.score)

    def _drop_boxes(self) -> None:
        """Close the sandbox pair now (the next call makes fresh ones); a failed close is logged, not raised."""
        finalizers, self._finalizers, self._boxes = self._finalizers, [], None
        for f in finalizers:
            try:
                f()  # runs box.close once and unregisters it
            except Exception as exc:  # noqa: BLE001 - the sample's score stands; the next one starts fresh
                logger.warning("closing a code reward sandbox failed: %s: %s", type(exc).__name__, exc)

    def close(self) -> None:
        """Remove the sandbox's work dir now (it is also removed when this object is collected)."""
        with self._lock:
            self._drop_boxes()


class CodeFormatReward:
    """1.0 if the last assistant turn holds a closed ```` ```python ```` (or untagged) fenced
    block whose code parses (``ast.parse``), else 0.0. ``None`` for a task without a code spec."""

    name = "code_format"
    domains = ("code",)

    def __call__(self, traj: Trajectory) -> float | None:
        if traj.task.code is None:
            return None
        return self.score(last_answer(traj))

    @staticmethod
    def score(text: str) -> float:
        for block in find_code_blocks(text):
            if block.is_python and block.closed and block.code.strip():
                try:
                    ast.parse(block.code)
                except PARSE_ERRORS:  # malformed, deep nesting and NUL bytes included
                    continue
                return 1.0
        return 0.0
