"""The in-process runtime (``rl.driver.runtime.Runtime``): no Ray, no actors, every part in the driver's process.

One ``rollout.pool.RolloutWorker`` on an in-process engine (``engine="hf"``: Transformers on
the model, ``rollout.hf_engine.HFEngine``; ``engine="vllm"``: an in-process ``VLLMEngine``), an
in-process ``rewards.service.RewardScorer`` and, unless ``learner=False`` (``jointrl eval``),
an in-process ``rl.trainer.learner.Learner`` (one rank). Weights reach the engine through the
same safetensors export as on Ray (or, with ``learner.lora.transfer: adapter``, the same adapter
folder: both engines serve it). It runs the whole loop in seconds on the tiny model (fast
tests); it has no process boundary, so nothing to restart: an exception in a part ends the call.
It does not place, shard or parallelize anything.
"""

from __future__ import annotations

import shutil
import weakref
from pathlib import Path
from typing import Any, Callable

from envs.types import Sampling, Task, Trajectory
from rewards.service import RewardScorer, reward_specs
from rl.algos.batch import Batch
from rl.config.recipe import Recipe
from rl.driver.logger import STARTUP
from rl.driver.runtime import LengthEstimate, learner_settings
from rl.trainer.moe import check_replay_engine, engine_routing_kwargs
from rl.trainer.shm import make_shm_dir
from rollout.hf_engine import make_engine
from rollout.pool import RolloutWorker
from rollout.weights import FileWeights


class LocalRuntime:
    """Everything in this process. ``engine``: ``hf`` | ``vllm``; ``learner=False``: generate and score only;
    ``scorer``: a reward scorer already built (``jointrl eval`` checks the rewards before any engine starts)."""

    def __init__(
        self,
        cfg: Recipe,
        model_path: str,
        out: Path | None = None,
        verbose: bool = False,
        *,
        engine: str = "hf",
        learner: bool = True,
        scorer: RewardScorer | None = None,
    ) -> None:
        self.cfg, self.model_path, self.engine_kind, self.with_learner = cfg, model_path, engine, learner
        self.worker: RolloutWorker | None = None
        self.scorer: RewardScorer | None = scorer  # None: built from the recipe's rewards at start
        self.learner: Any = None
        self.shm_dir = ""
        self._shm_cleanup: weakref.finalize | None = None

    def start(self, length_estimate: LengthEstimate | None = None) -> None:
        """Build the engine, envs, reward functions and learner (``length_estimate``: unused, one engine)."""
        import torch

        from rl.trainer.precision import resolve_logged

        if self.with_learner and self.cfg.learner.weight_sync == "ipc":
            raise ValueError(
                "learner.weight_sync: ipc maps learner and engine GPU buffers across Ray actors on a shared GPU "
                "(cluster.placement colocated); the in-process runtime (train --local, eval) syncs through the file"
            )
        if self.with_learner and self.cfg.learner.weight_sync == "collective":
            raise ValueError(
                "learner.weight_sync: collective broadcasts into vLLM engine workers through a process group; the "
                f"in-process runtime's {self.engine_kind} engine cannot join one: use weight_sync file with --local"
            )

        if self.with_learner:  # r3 needs an engine that reports routing (vLLM: on a GPU only)
            device = "gpu" if torch.cuda.is_available() else "cpu"
            check_replay_engine(self.cfg.learner, self.engine_kind, device, self.cfg.rollout.engine_kwargs)
        # `auto` precisions made concrete: one timing for the learner and the engine, printed once
        self.cfg = cfg = resolve_logged(self.cfg, "gpu" if torch.cuda.is_available() else "cpu")
        r = cfg.rollout
        kwargs: dict[str, Any] = dict(dtype=cfg.model.engine_dtype, seed=cfg.run.seed, max_model_len=r.max_model_len)
        if self.engine_kind == "vllm":
            kwargs |= dict(
                kv_cache_gib=r.kv_cache_gib,
                gpu_memory_utilization=r.gpu_memory_utilization,
                engine_kwargs=dict(r.engine_kwargs) | (engine_routing_kwargs(cfg.learner) if self.with_learner else {}),
                lora_rank=cfg.learner.lora.engine_rank,
            )
        STARTUP.phase(f"engine: loading the model in this process ({self.engine_kind})")
        engine = make_engine(self.engine_kind, self.model_path, **kwargs)
        self.worker = RolloutWorker(
            self.model_path,
            [(e.domain, e.cls, dict(e.kwargs)) for e in r.envs],
            engine=engine,
            stops=r.stops(),
            env_workers=r.env_workers,
            tools_in_prompt=r.tools_in_prompt,
            partial_rollouts=r.partial_rollouts,
        )
        if self.scorer is None:
            STARTUP.phase("rewards: building the reward functions")
            specs = reward_specs(cfg.rewards)
            self.scorer = RewardScorer(specs, timeout_s=cfg.reward_service.timeout_s)
        if self.with_learner:
            self.shm_dir = make_shm_dir("jointrl-local-")  # also removes what killed runs left there
            # Removed by stop(), or when this runtime is collected or the interpreter exits without a stop()
            # (a caller that forgot it, an exception between start and stop): /dev/shm is memory, not disk.
            self._shm_cleanup = weakref.finalize(self, shutil.rmtree, self.shm_dir, True)
            STARTUP.phase("learner: loading the model")
            self.learner = self._make_learner()

    def _make_learner(self) -> Any:
        from rl.trainer.learner import Learner

        cfg = self.cfg
        return Learner(self.model_path, cfg.model, cfg.algo, shm_dir=self.shm_dir, **learner_settings(cfg))

    def generate(
        self, tasks: list[Task], group_ids: list[int], seeds: list[int], sampling: Sampling
    ) -> list[Trajectory]:
        return self._worker().generate(tasks, group_ids, seeds, sampling)

    def update_in_flight(self, sync: Callable[[], None] | None = None, version: int | None = None) -> None:
        """Partial rollouts (``rollout.partial_rollouts``): new weights while ``generate`` runs on another thread.
        The engine is interrupted (its unfinished turns keep their tokens; env calls go on), ``sync()`` loads the
        weights (default ``sync_weights``), then the turns resume on them as policy ``version`` (None: the engine's
        count of weight loads); resumed even when ``sync`` raises. An engine that does not stop within
        ``faults.engine_call_s`` raises. The one-step-off stream's wiring, in ``EpisodeStream.weights_updated``
        instead of waiting for the generation: ``self.pool.update_in_flight(self._push, self.learner_version)``."""
        worker = self._worker()
        worker.interrupt(self.cfg.faults.engine_call_s)
        try:
            (sync or self.sync_weights)()
        finally:
            worker.resume(version)

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        assert self.scorer is not None, "start() first"
        return self.scorer.score(trajs)

    def train_step(self, batch: Batch) -> dict[str, float]:
        return self._learner().step(batch)

    def sync_weights(self) -> None:
        """Merged weights into the engine, or only the LoRA adapter (``learner.lora.transfer: adapter``)."""
        if self.cfg.learner.lora.engine_rank > 0:
            update = FileWeights(self._learner().export_adapter(), adapter=True)
        else:
            update = FileWeights(self._learner().export_weights(self.cfg.model.engine_dtype))
        self._worker().receive(update)  # the file transport: the engine reads the learner's shared memory

    def save(self, path: str, wait: bool = True, export: bool = False) -> None:
        from rl.driver.runtime import export_dtype

        self._learner().save_checkpoint(path, wait, export_dtype(self.cfg.model.engine_dtype) if export else None)

    def restore(self, path: str) -> None:
        self._learner().load_checkpoint(path)
        self.sync_weights()

    def restart_learners(self, path: str) -> None:
        """A new in-process learner holding checkpoint ``path`` (the loop's recovery; the in-process learner
        itself never fails that way, but a caller's stand-in may), its weights synced into the engine."""
        self._learner()
        self.learner = self._make_learner()
        self.restore(path)

    def metrics(self, *, rollout: bool = True) -> dict[str, float]:
        """Per reward function: latency and errors since the last call (no restarts: nothing to restart)."""
        return self.scorer.metrics() if self.scorer is not None else {}

    def stop(self) -> None:
        try:
            if self.worker is not None:
                self.worker.shutdown()
            if self.learner is not None:
                self.learner.shutdown()
        finally:
            self.worker = self.learner = None
            if self._shm_cleanup is not None:
                self._shm_cleanup()  # removes shm_dir once; a second stop() is a no-op

    def _worker(self) -> RolloutWorker:
        if self.worker is None:
            raise RuntimeError("LocalRuntime: start() first")
        return self.worker

    def _learner(self) -> Any:
        if self.learner is None:
            raise RuntimeError("LocalRuntime: no learner (learner=False, or start() not called)")
        return self.learner
