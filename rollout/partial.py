"""Partial rollouts: stopping generations in flight at a weight update, and resuming them on the new weights.

Every engine that can pause (``rollout.engine.VLLMEngine``, ``rollout.hf_engine.HFEngine``) owns a
:class:`PauseGate`. Whoever updates the weights while episodes are generating (``RolloutWorker.interrupt``,
then the weight load, then ``RolloutWorker.resume``) closes the gate: the engine stops each unfinished request
at its next token (vLLM: the request is aborted; HF: its sampling loop returns) and hands back what it had
sampled so far, token ids and log-probs, as a ``Generation`` whose ``finish_reason`` is :data:`INTERRUPTED`.
``interrupt`` returns once no engine call is using the weights. Nothing is drained: the unfinished tokens the
engine had computed but not yet reported are dropped with the request, and only reported tokens are kept.

The episode layer (``rollout.episode``) keeps the partial turn and submits it again as prompt + kept tokens with
the remaining budget (``max_new_tokens`` minus the kept tokens), the same stop strings and the same seed; the
engine blocks that request until the gate opens, so it runs on the new weights, with a KV cache recomputed under
them (not the old weights' cache, as vLLM's ``pause_generation(mode="keep")`` would resume). Env calls in flight
are not touched: an episode between turns keeps its env call running and its next turn starts on the new weights.

Every generated token carries the policy version of the weights that sampled it (``Generation.versions``,
``Trajectory.token_versions``): the gate's ``version``, which counts the weight loads the engine has received
(``loaded``) unless the caller sets it (``resume(version)``, ``set_version``).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

from envs.types import Generation

# Generation.finish_reason of a request stopped by an interrupt (its tokens so far; not a finished turn).
INTERRUPTED = "interrupted"


class PauseGate:
    """Open or closed; counts the engine calls that use the weights (``enter``/``exit``). Thread-safe.

    ``enter`` waits while the gate is closed (a new request starts on the new weights); an engine call inside
    checks ``requested`` between tokens and returns what it has once it is set. ``interrupt`` closes the gate and
    waits until no call is inside; ``resume`` opens it."""

    def __init__(self, version: int = 0) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._users = 0
        self.version = version  # the policy version of the weights the engine serves

    @property
    def requested(self) -> bool:
        """Whether an interrupt asks the calls inside to stop (read between tokens; no lock needed)."""
        return self._closed

    def enter(self) -> None:
        """Start using the engine's weights: waits while the gate is closed."""
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._users += 1

    def exit(self) -> None:
        with self._cond:
            if self._users <= 0:
                raise RuntimeError("PauseGate.exit without enter")
            self._users -= 1
            self._cond.notify_all()

    @contextmanager
    def use(self) -> Iterator[None]:
        """One engine call that uses the weights (``enter`` ... ``exit``)."""
        self.enter()
        try:
            yield
        finally:
            self.exit()

    def interrupt(self, timeout_s: float | None = None) -> None:
        """Close the gate and wait until no call uses the weights (they stop at their next token). Raises
        ``TimeoutError`` (and opens the gate again) when a call has not stopped within ``timeout_s``."""
        with self._cond:
            self._closed = True
            if not self._cond.wait_for(lambda: self._users == 0, timeout_s):
                self._closed = False
                self._cond.notify_all()
                raise TimeoutError(f"an engine call did not stop within {timeout_s:g} s of the interrupt")

    def resume(self, version: int | None = None) -> None:
        """Open the gate (``version``: the policy version of the weights now loaded; None: as counted)."""
        with self._cond:
            if version is not None:
                self.version = int(version)
            self._closed = False
            self._cond.notify_all()

    def loaded(self) -> None:
        """The engine loaded new weights: one version more."""
        self.version += 1

    def set_version(self, version: int) -> None:
        """The weights the engine serves are policy version ``version`` (a run resumed at that step)."""
        self.version = int(version)


def joined(kept: Generation | None, gen: Generation) -> Generation:
    """``gen`` (a continuation) after the tokens ``kept`` of the same turn: ids, log-probs and versions
    concatenated; finish reason and routing are the continuation's (its request ran the kept tokens again, so
    its routing covers them). None versions anywhere: the joined turn has none."""
    if kept is None:
        return gen
    versions = None if kept.versions is None or gen.versions is None else list(kept.versions) + list(gen.versions)
    return replace(
        gen,
        token_ids=list(kept.token_ids) + list(gen.token_ids),
        logprobs=list(kept.logprobs) + list(gen.logprobs),
        versions=versions,
    )


def resume_seed(seed: int | None, offset: int) -> int | None:
    """The sampling seed of a request resumed after ``offset`` kept tokens, for an engine whose sampler cannot
    skip the draws already made (vLLM): its own stream, not a replay of the first draws."""
    if seed is None or offset == 0:
        return seed
    return (int(seed) * 1_000_003 + offset) % (2**31)
