"""The runtime interface: everything ``rl.driver.loop.train`` asks of the processes that do the work.

Two implementations: ``rl.driver.ray_runtime.RayRuntime`` (Ray actors: vLLM rollout workers,
a reward service, data-parallel learners, placed per ``cluster``; their wrappers are the edge package
``rl.driver.actors``, the only one that imports Ray) and
``rl.driver.local_runtime.LocalRuntime`` (everything in the driver's process: one rollout
worker on an in-process engine, an in-process reward scorer, an in-process learner), used by
fast tests and by ``jointrl eval``. The loop, the episode stream, checkpoints and evaluation
only see this interface; they never import Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from envs.types import Sampling, Task, Trajectory
from rl.algos.batch import Batch

LengthEstimate = Callable[[Task], "float | None"]


@dataclass(frozen=True)
class Deadlines:
    """How long the driver waits for a learner call (the recipe's ``faults`` section; the key is named in
    the message of a missed one), and each collective's timeout inside the learners."""

    step_s: float = 3600.0  # faults.learner_step_s: one step
    io_s: float = 1800.0  # faults.learner_io_s: export, save, load, log-probs, start
    collective_s: float = 1800.0  # faults.collective_s


class LearnerFailure(RuntimeError):
    """A learner rank died, lost its peers, or a learner call missed its deadline: the group is unusable and
    must be restarted (``Runtime.restart_learners``) or the run ends. ``rank``: the
    rank that died or did not answer; ``stacks``: where the learners' stacks were dumped (if they were).
    Part of the interface (raised by ``rl.driver.actors.learners.LearnerGroup``), so that the loop catches it
    without importing the Ray edge."""

    def __init__(self, rank: int, what: str, why: str) -> None:
        super().__init__(f"learner rank {rank} {why} (during {what})")
        self.rank, self.what, self.why = rank, what, why
        self.stacks: str | None = None


def export_dtype(engine_dtype: str) -> str:
    """The dtype of a run's HF export (a checkpoint's ``model/``): the engines' (``model.engine_dtype``), what
    vLLM serves; ``auto`` not made concrete by then is bfloat16, as the engines resolve it on a GPU."""
    return engine_dtype if engine_dtype in ("float32", "bfloat16", "float16") else "bfloat16"


def learner_settings(cfg: Any) -> dict[str, Any]:
    """The recipe's settings every learner rank is built with, as keyword arguments of ``Learner`` and
    ``LearnerGroup``: one place for both runtimes, so a new learner setting reaches both."""
    return {
        "seed": cfg.run.seed,
        "threads": cfg.run.threads,
        "total_steps": cfg.train.steps,
        "learner": cfg.learner,
        "temperature": cfg.rollout.temperature,
    }


class Runtime(Protocol):
    """Generate, score, train step, sync, save, restore, restart learners, metrics; ``start`` before, ``stop``
    after (always)."""

    def start(self, length_estimate: LengthEstimate | None = None) -> None:
        """Start the workers. ``length_estimate(task)``: estimated trajectory tokens (balances engines)."""

    def generate(
        self, tasks: list[Task], group_ids: list[int], seeds: list[int], sampling: Sampling
    ) -> list[Trajectory]:
        """One episode per task (in order), sampled with its seed; dead engines are replaced, prompts re-issued."""

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """The trajectories with their rewards (``reward``, ``scores``, ``reward_error``)."""

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One learner step on ``batch``; the learner's metrics."""

    def sync_weights(self) -> None:
        """Push the learner's current weights into every engine."""

    def update_in_flight(self, sync: Callable[[], None] | None = None, version: int | None = None) -> None:
        """Partial rollouts (``rollout.partial_rollouts``, docs/partial-rollouts.md): new weights while ``generate``
        runs on another thread: interrupt every engine (unfinished turns keep their tokens), ``sync()`` (default
        ``sync_weights``), resume the turns on the new weights as policy ``version``."""

    def save(self, path: str, wait: bool = True, export: bool = False) -> None:
        """Write the learner's state (model, optimizer, schedules, RNG) into the new folder ``path``; ``wait=False``:
        return while the sharded state is written (``dcp/.complete`` appears when done; rl.trainer.checkpoint);
        ``export``: also ``model/``, the policy as an HF folder in the engines' dtype (``model.engine_dtype``)."""

    def restore(self, path: str) -> None:
        """Load the learner's state written by ``save``, then sync it into the engines."""

    def restart_learners(self, path: str) -> None:
        """Replace the learner(s) after a :class:`LearnerFailure` with new ones holding
        checkpoint ``path``, and sync their weights into the engines."""

    def metrics(self, *, rollout: bool = True) -> dict[str, float]:
        """Fault and reward-function metrics since the last call (then reset); ``rollout=False``: the
        reward side only (held-out eval), the rollout restarts wait for the next call."""

    def stop(self) -> None:
        """Shut every worker down (idempotent; runs on every exit path)."""
