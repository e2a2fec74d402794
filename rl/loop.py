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
from rl.logger import ProgressBar, RunLogger
from rl.mixer import RewardNormalizer, Source, TaskMixer, normalize_step, sources_by_domain
from rl.models import resolve_model
from rollout.pool import RolloutPool


def train(cfg: Recipe, *, verbose: bool = False, progress: bool = True) -> Path:
    """Run the recipe; return the output dir. Raises on failure after shutting everything down."""
    out, resume_from = prepare_output_dir(cfg)
    model_path = resolve_model(cfg.model.path, Path(cfg.source).parent if cfg.source else None)
    train_sources, eval_tasks = load_task_sets(cfg)
    mixer, normalizer = make_mixer(cfg, train_sources), make_normalizer(cfg)
    r = cfg.rollout
    sampling = Sampling(r.max_new_tokens, r.temperature, r.top_p, r.max_turns, r.max_model_len)
    greedy = Sampling(r.max_new_tokens, 0.0, 1.0, r.max_turns, r.max_model_len)
    actors = Actors(cfg, model_path, out, verbose)
    logger = bar = None
    try:
        actors.start()
        first = actors.restore(resume_from, mixer, normalizer) + 1 if resume_from else 1
        logger = RunLogger(out, recipe_to_dict(cfg), mode=cfg.wandb.mode, project=cfg.wandb.project,
                           entity=cfg.wandb.entity, run_name=cfg.wandb.run_name, tags=cfg.wandb.tags,
                           table_every=cfg.wandb.table_every, last_step=cfg.train.steps)
        bar = ProgressBar(cfg.train.steps) if progress else None
        if first == 1:
            logger.log(0, evaluate(actors, logger, eval_tasks, greedy, 0))                      # 0. baseline eval
        for step in range(first, cfg.train.steps + 1):
            t0 = time.perf_counter()
            tasks, groups, seeds = expand(mixer.sample(step), r.group_size, cfg.run.seed, step)   # 1. draw tasks
            trajs = actors.pool.generate(tasks, groups, seeds, sampling)                          # 2. episodes
            t1 = time.perf_counter()
            trajs = actors.rewards.score(trajs)                                                    # 3. rewards
            t2 = time.perf_counter()
            mixer.update(trajs)
            advantages, norm_metrics = normalize_step(normalizer, trajs)                          # 4. per-domain norm
            batch, batch_stats = build_batch(trajs, cfg.algo, advantages, tuple(cfg.mixer.seq_level_domains))
            metrics = actors.learner_step(batch)                                                   # 5. update
            t3 = time.perf_counter()
            actors.sync_weights()                                                                  # 6. weight sync
            t4 = time.perf_counter()
            metrics |= batch_stats | norm_metrics | mixer.last_counts | rollout_metrics(trajs) | actors.rewards.metrics() | {
                "timing/rollout_s": t1 - t0, "timing/reward_s": t2 - t1, "timing/learner_s": t3 - t2,
                "timing/sync_s": t4 - t3, "timing/step_s": t4 - t0}
            if cfg.run.rollouts_every and step % cfg.run.rollouts_every == 0:
                logger.rollouts(step, "train", trajs)
            if step == cfg.train.steps or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
                metrics |= evaluate(actors, logger, eval_tasks, greedy, step)                     # 7. held-out eval
            logger.log(step, metrics)                                                              # 8. log
            if step == cfg.train.steps or (cfg.run.save_every and step % cfg.run.save_every == 0):
                actors.checkpoint(out, step, cfg.run.keep_checkpoints, mixer, normalizer)        # 9. checkpoint
            if bar is not None:
                bar.update(step, metrics)
        (out / "DONE").write_text(json.dumps({"steps": cfg.train.steps}) + "\n")
        if bar is not None:
            bar.close()
            print(logger.summary(), flush=True)
    finally:
        if bar is not None:
            bar.close()  # idempotent: ends the progress line on every exit path
        if logger is not None:
            logger.close()
        actors.stop()
    return out


def make_mixer(cfg: Recipe, sources: list[Source]) -> TaskMixer:
    mx = cfg.mixer
    return TaskMixer(sources, cfg.rollout.prompts_per_step, cfg.run.seed,
                     domain_weights=dict(mx.domain_weights) or {d: float(sum(len(s.tasks) for s in sources if s.domain == d))
                                                               for d in {s.domain for s in sources}},
                     strata=mx.strata, strata_proportions=list(mx.strata_proportions), length_ema=mx.length_ema,
                     curriculum_window=mx.curriculum_window, curriculum_weight=mx.curriculum_weight,
                     solved_threshold=mx.solved_threshold)


def make_normalizer(cfg: Recipe) -> RewardNormalizer:
    return RewardNormalizer(cfg.mixer.normalization, stat=cfg.mixer.norm_stat, ema=cfg.mixer.norm_ema)


def expand(tasks: list[Task], group_size: int, seed: int, step: int) -> tuple[list[Task], list[int], list[int]]:
    """Each task ``group_size`` times, with its group id and a per-sample sampling seed."""
    out_t, out_g, out_s = [], [], []
    for g, t in enumerate(tasks):
        for k in range(group_size):
            out_t.append(t)
            out_g.append(g)
            out_s.append((seed * 1_000_003 + step * 10_007 + g * group_size + k) % (2**31))
    return out_t, out_g, out_s


def evaluate(actors: Actors, logger: RunLogger, tasks: list[Task], greedy: Sampling, step: int) -> dict[str, float]:
    """Greedy held-out evaluation: ``eval/reward/mean``, ``eval/reward/<domain>/mean``, ..."""
    if not tasks:
        return {}
    t0 = time.perf_counter()
    trajs = actors.pool.generate(tasks, list(range(len(tasks))), [0] * len(tasks), greedy)
    trajs = actors.rewards.score(trajs)
    logger.rollouts(step, "eval", trajs)
    m = rollout_metrics(trajs, prefix="eval/")
    m |= {"eval/" + k: v for k, v in actors.rewards.metrics().items()}  # not counted in the next train step
    m["timing/eval_s"] = time.perf_counter() - t0
    return m


def prepare_output_dir(cfg: Recipe) -> tuple[Path, Path | None]:
    """Create the output dir; return it and the checkpoint to resume from (``run.resume=auto``).

    Resuming from step S keeps the metrics and rollouts of steps <= S and moves the lines of
    later steps (logged after the last checkpoint, and about to be redone) to
    ``*.discarded.jsonl``, so nothing computed is lost and the logs hold each step once.
    """
    out = resolve_output_dir(cfg)
    resume_from = latest_checkpoint(out) if cfg.run.resume == "auto" else None
    if resume_from is not None:
        step = json.loads((resume_from / "step.json").read_text())["step"]
        for name in ("metrics", "rollouts"):
            _split_log(out / f"{name}.jsonl", out / f"{name}.discarded.jsonl", step)
        (out / "DONE").unlink(missing_ok=True)
    elif (out / "metrics.jsonl").exists():
        if not cfg.run.overwrite:
            raise FileExistsError(f"{out} already holds a run and no checkpoint to resume from; set "
                                  "run.overwrite=true to replace it, or choose another run.output_dir")
        for name in ("metrics.jsonl", "rollouts.jsonl", "DONE"):
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.resolved.yaml").write_text(_yaml(recipe_to_dict(cfg)))
    return out, resume_from


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint (``checkpoints/step_N`` with its ``step.json``), if any."""
    ck = out / "checkpoints"
    done = sorted(p for p in ck.glob("step_*") if (p / "step.json").is_file()) if ck.is_dir() else []
    return done[-1] if done else None


def _split_log(path: Path, discarded: Path, step: int) -> None:
    if not path.exists():
        return
    keep, drop = [], []
    for line in path.read_text().splitlines():
        try:
            s = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by the crash
        (keep if s <= step else drop).append(line)
    if drop:
        with open(discarded, "a") as f:
            f.write("\n".join(drop) + "\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, path)


def _yaml(d: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(d, sort_keys=False)


def load_task_sets(cfg: Recipe) -> tuple[list[Source], list[Task]]:
    """Training sources (one per file and domain, weighted by ``data.train_weights``) and held-out tasks."""
    domains = {e.domain for e in cfg.rollout.envs}
    weights = list(cfg.data.train_weights) or [1.0] * len(cfg.data.train_files)
    sources: list[Source] = []
    held: list[Task] = []
    for files, is_train in ((cfg.data.train_files, True), (cfg.data.eval_files, False)):
        for i, f in enumerate(files):
            path = resolve_path(cfg, f)
            tasks = load_tasks(path)
            for t in tasks:
                if t.domain not in domains:
                    raise TaskFormatError(f"{path}: task {t.id!r} has domain {t.domain!r}, but rollout.envs serves "
                                          f"only {sorted(domains)}")
            if is_train:
                sources += sources_by_domain(tasks, path.name, weights[i])
            else:
                held += tasks
    if cfg.data.eval_limit:
        held = held[: cfg.data.eval_limit]
    return sources, held


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

    def checkpoint(self, out: Path, step: int, keep: int, mixer: TaskMixer, normalizer: RewardNormalizer) -> None:
        """Atomically write ``checkpoints/step_NNNNNN`` (temp dir + rename); keep the newest ``keep``.

        It holds the learner's state (model, optimizer, schedules, RNG) and the driver's
        (the mixer's draw state and the reward normalizer's statistics, ``driver.json``).
        """
        ck = out / "checkpoints"
        ck.mkdir(exist_ok=True)
        final, tmp = ck / f"step_{step:06d}", ck / f".step_{step:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.learners.save_checkpoint(str(tmp))
        (tmp / "driver.json").write_text(json.dumps({"mixer": mixer.state_dict(), "normalizer": normalizer.state_dict()}))
        (tmp / "step.json").write_text(json.dumps({"step": step}) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        done = sorted(p for p in ck.iterdir() if p.name.startswith("step_"))
        for old in done[: max(len(done) - max(keep, 1), 0)]:
            shutil.rmtree(old, ignore_errors=True)

    def restore(self, ck: Path, mixer: TaskMixer, normalizer: RewardNormalizer) -> int:
        """Load checkpoint ``ck`` into the learners, engines, mixer and normalizer; return its step."""
        self.learners.load_checkpoint(str(ck))
        self.sync_weights()
        state = json.loads((ck / "driver.json").read_text())
        mixer.load_state_dict(state["mixer"])
        normalizer.load_state_dict(state["normalizer"])
        return int(json.loads((ck / "step.json").read_text())["step"])

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
