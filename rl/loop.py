"""The training loop on the driver. ``train`` reads top to bottom as the table of contents.

Actors: N rollout workers (vLLM + envs), one learner, a reward pool. The driver draws
tasks, moves typed records between actors, logs, evaluates and checkpoints. Engines are
shut down on every exit path (normal end, exception, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from envs.io import TaskFormatError, load_tasks
from envs.types import Sampling, Task, Trajectory
from rewards.service import RewardFnSpec, RewardService
from rl.batch import build_batch, rollout_metrics
from rl.config import Recipe, recipe_to_dict, resolve_output_dir, resolve_path
from rl.logger import RunLogger
from rl.mixer import TaskSampler
from rl.models import resolve_model
from rollout.pool import RolloutPool


def train(cfg: Recipe, *, verbose: bool = False, progress: bool = True) -> Path:
    """Run the recipe; return the output dir. Raises on failure after shutting everything down."""
    out = prepare_output_dir(cfg)
    model_path = resolve_model(cfg.model.path, Path(cfg.source).parent if cfg.source else None)
    train_tasks, eval_tasks = load_task_sets(cfg)
    sampler = TaskSampler(train_tasks, cfg.rollout.prompts_per_step, cfg.run.seed)
    r = cfg.rollout
    sampling = Sampling(r.max_new_tokens, r.temperature, r.top_p, r.max_turns, r.max_model_len)
    greedy = Sampling(r.max_new_tokens, 0.0, 1.0, r.max_turns, r.max_model_len)
    actors = Actors(cfg, model_path, out, verbose)
    logger = None
    try:
        actors.start()
        logger = RunLogger(out, recipe_to_dict(cfg), mode=cfg.wandb.mode, project=cfg.wandb.project,
                           entity=cfg.wandb.entity, run_name=cfg.wandb.run_name, tags=cfg.wandb.tags)
        logger.log(0, evaluate(actors, logger, eval_tasks, greedy, 0, cfg))
        for step in range(1, cfg.train.steps + 1):
            t0 = time.perf_counter()
            tasks, groups, seeds = expand(sampler.sample(step), r.group_size, cfg.run.seed, step)  # 1. draw tasks
            trajs = actors.pool.generate(tasks, groups, seeds, sampling)                          # 2. episodes
            t1 = time.perf_counter()
            trajs = actors.rewards.score(trajs)                                                    # 3. rewards
            t2 = time.perf_counter()
            batch, batch_stats = build_batch(trajs, cfg.algo)                                      # 4. advantages
            metrics = actors.learner_step(batch)                                                   # 5. update
            t3 = time.perf_counter()
            actors.sync_weights()                                                                  # 6. weight sync
            t4 = time.perf_counter()
            metrics |= batch_stats | rollout_metrics(trajs) | {
                "timing/rollout_s": t1 - t0, "timing/reward_s": t2 - t1, "timing/learner_s": t3 - t2,
                "timing/sync_s": t4 - t3, "timing/step_s": t4 - t0}
            if cfg.run.rollouts_every and step % cfg.run.rollouts_every == 0:
                logger.rollouts(step, "train", trajs)
            if step == cfg.train.steps or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
                metrics |= evaluate(actors, logger, eval_tasks, greedy, step, cfg)                # 7. held-out eval
            logger.log(step, metrics)                                                              # 8. log
            if step == cfg.train.steps or (cfg.run.save_every and step % cfg.run.save_every == 0):
                actors.checkpoint(out, step, cfg.run.keep_checkpoints)                             # 9. checkpoint
            if progress:
                print(progress_line(step, cfg.train.steps, metrics), file=sys.stderr, flush=True)
        (out / "DONE").write_text(json.dumps({"steps": cfg.train.steps}) + "\n")
    finally:
        if logger is not None:
            logger.close()
        actors.stop()
    return out


def expand(tasks: list[Task], group_size: int, seed: int, step: int) -> tuple[list[Task], list[int], list[int]]:
    """Each task ``group_size`` times, with its group id and a per-sample sampling seed."""
    out_t, out_g, out_s = [], [], []
    for g, t in enumerate(tasks):
        for k in range(group_size):
            out_t.append(t)
            out_g.append(g)
            out_s.append((seed * 1_000_003 + step * 10_007 + g * group_size + k) % (2**31))
    return out_t, out_g, out_s


def evaluate(actors: Actors, logger: RunLogger, tasks: list[Task], greedy: Sampling, step: int, cfg: Recipe) -> dict[str, float]:
    """Greedy held-out evaluation: ``eval/reward/mean``, ``eval/reward/<domain>/mean``, ..."""
    if not tasks:
        return {}
    t0 = time.perf_counter()
    trajs = actors.pool.generate(tasks, list(range(len(tasks))), [0] * len(tasks), greedy)
    trajs = actors.rewards.score(trajs)
    logger.rollouts(step, "eval", trajs)
    m = rollout_metrics(trajs, prefix="eval/")
    m["timing/eval_s"] = time.perf_counter() - t0
    return m


def progress_line(step: int, steps: int, m: dict[str, float]) -> str:
    parts = [f"step {step}/{steps}", f"reward {m.get('reward/mean', float('nan')):.3f}"]
    if "kl/mean" in m:
        parts.append(f"kl {m['kl/mean']:.4f}")
    if "eval/reward/mean" in m:
        parts.append(f"eval {m['eval/reward/mean']:.3f}")
    parts.append(f"{m['timing/step_s']:.1f}s/step")
    return "  ".join(parts)


def prepare_output_dir(cfg: Recipe) -> Path:
    out = resolve_output_dir(cfg)
    if (out / "metrics.jsonl").exists():
        if not cfg.run.overwrite:
            raise FileExistsError(f"{out} already holds a run; choose another run.output_dir or set run.overwrite=true")
        for name in ("metrics.jsonl", "rollouts.jsonl", "DONE"):
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.resolved.yaml").write_text(_yaml(recipe_to_dict(cfg)))
    return out


def _yaml(d: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(d, sort_keys=False)


def load_task_sets(cfg: Recipe) -> tuple[list[Task], list[Task]]:
    domains = {e.domain for e in cfg.rollout.envs}
    sets = []
    for files in (cfg.data.train_files, cfg.data.eval_files):
        tasks: list[Task] = []
        for f in files:
            path = resolve_path(cfg, f)
            for t in load_tasks(path):
                if t.domain not in domains:
                    raise TaskFormatError(f"{path}: task {t.id!r} has domain {t.domain!r}, but rollout.envs serves only "
                                     f"{sorted(domains)}")
                tasks.append(t)
        sets.append(tasks)
    train, ev = sets
    if cfg.data.eval_limit:
        ev = ev[: cfg.data.eval_limit]
    return train, ev


class Actors:
    """The run's Ray actors, their start-up and their shutdown.

    Learners: ``algo.learner_workers`` data-parallel ``Learner`` actors (``rl.distributed.LearnerGroup``);
    ``learner`` is rank 0's handle (weights export, log-probs, checkpoints).
    """

    def __init__(self, cfg: Recipe, model_path: str, out: Path, verbose: bool) -> None:
        self.cfg, self.model_path, self.out, self.verbose = cfg, model_path, out, verbose
        self.pool: Any = None
        self.rewards: Any = None
        self.learners: Any = None
        self.learner: Any = None
        self._own_ray = False
        self._old_term: Any = None
        self.shm_dir = ""

    def start(self) -> None:
        import ray

        from rl.distributed import LearnerGroup

        cfg, r = self.cfg, self.cfg.rollout
        # SIGTERM becomes an exception so that `finally` shuts the engines down.
        self._old_term = signal.signal(signal.SIGTERM, _raise_on_term)
        address = cfg.run.ray_address or os.environ.get("RAY_ADDRESS") or None
        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            cpus = os.cpu_count() or 2
            ray.init(address=address, num_cpus=None if address else max(cpus, 2 + r.num_engines),
                     include_dashboard=False, log_to_driver=self.verbose, logging_level="INFO" if self.verbose else "WARNING",
                     runtime_env={"env_vars": _actor_env(self.verbose)})
            self._own_ray = True
        from rl.models import cache_dir  # noqa: F401 - the actors resolve the same cache through the env

        gpu = _has_gpu()
        # Weights travel through shared memory; the driver owns the folder so that it goes
        # away on every exit path, even when the learner is busy or dead.
        self.shm_dir = tempfile.mkdtemp(prefix="jointrl-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.learners = LearnerGroup(cfg.algo.learner_workers, self.model_path, cfg.model, cfg.algo, seed=cfg.run.seed,
                                     threads=cfg.run.threads, shm_dir=self.shm_dir, total_steps=cfg.train.steps,
                                     num_cpus=1, num_gpus=1 if gpu else 0)
        self.learner = self.learners.actors[0]
        self.pool = RolloutPool(r.num_engines, self.model_path, [(e.domain, e.cls, dict(e.kwargs)) for e in r.envs],
                                num_cpus=0.5, num_gpus=1 if gpu else 0, dtype=cfg.model.engine_dtype, seed=cfg.run.seed,
                                max_model_len=r.max_model_len, kv_cache_gib=r.kv_cache_gib,
                                gpu_memory_utilization=r.gpu_memory_utilization)
        specs = [RewardFnSpec(s.cls, s.weight, tuple(s.domains), dict(s.kwargs)) for s in cfg.rewards]
        self.rewards = RewardService(specs, workers=cfg.reward_service.workers, timeout_s=cfg.reward_service.timeout_s)
        self.learners.ready()

    def learner_step(self, batch: Any) -> dict[str, float]:
        """One learner step: the batch sharded over the learners, metrics of the whole batch."""
        return self.learners.step(batch)

    def sync_weights(self) -> None:
        import ray

        path = ray.get(self.learner.export_weights.remote(self.cfg.model.engine_dtype))
        self.pool.sync_weights(path)

    def checkpoint(self, out: Path, step: int, keep: int) -> None:
        """Atomically write ``checkpoints/step_NNNNNN`` (temp dir + rename); keep the newest ``keep``."""
        import ray

        ck = out / "checkpoints"
        ck.mkdir(exist_ok=True)
        final, tmp = ck / f"step_{step:06d}", ck / f".step_{step:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        ray.get(self.learner.save_checkpoint.remote(str(tmp)))
        (tmp / "step.json").write_text(json.dumps({"step": step}) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        done = sorted(p for p in ck.iterdir() if p.name.startswith("step_"))
        for old in done[: max(len(done) - max(keep, 1), 0)]:
            shutil.rmtree(old, ignore_errors=True)

    def stop(self) -> None:
        import ray

        try:
            if self.pool is not None:
                self.pool.shutdown()
            if self.rewards is not None:
                self.rewards.shutdown()
            if self.learners is not None:
                self.learners.kill()
        finally:
            if self.shm_dir:
                shutil.rmtree(self.shm_dir, ignore_errors=True)
            if self._own_ray and ray.is_initialized():
                ray.shutdown()
            if self._old_term is not None:
                signal.signal(signal.SIGTERM, self._old_term)


def _raise_on_term(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def _actor_env(verbose: bool) -> dict[str, str]:
    """Env vars every actor process needs (Ray sets OMP_NUM_THREADS=1 for fractional-CPU actors)."""
    env = {
        "OMP_NUM_THREADS": str(os.cpu_count() or 1),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # needed to run our reload function in vLLM workers
        "JOINTRL_CACHE": os.environ.get("JOINTRL_CACHE", ""),
        # User reward/env modules importable on the driver must import in the actors too.
        "PYTHONPATH": os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), *sys.path] if p and os.path.isdir(p)),
        "PYTHONWARNINGS": "ignore",
    }
    if verbose:
        env["JOINTRL_VERBOSE"] = "1"
    return {k: v for k, v in env.items() if v}
