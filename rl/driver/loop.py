"""The training loop on the driver. ``train`` reads top to bottom as the table of contents.

The loop runs against a runtime (``rl.driver.runtime.Runtime``: generate, score, train step,
sync, save, restore, metrics): the Ray one (``rl.driver.ray_runtime.RayRuntime``: vLLM rollout
workers, a reward service and learners as actors, placed per ``cluster``) or the in-process
one (``rl.driver.local_runtime.LocalRuntime``, fast tests). The driver draws tasks, moves typed
records between the runtime's parts, logs, evaluates and checkpoints (``rl.driver.checkpoints``).
Episodes come from ``rl.driver.stream.EpisodeStream``: generated on demand, or one step ahead
while the learner trains (``rollout.async_steps=1``). The runtime is stopped on every exit
path (normal end, exception, Ctrl-C, SIGTERM); faults the run survives are counted
(``faults/...``), those it cannot end it with one message (docs/reliability.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from envs.io import TaskFormatError, load_tasks
from envs.types import Sampling, Task, Trajectory
from rl.algos.batch import build_batch, rollout_metrics
from rl.algos.shaping import RewardNormalizer, shape_step
from rl.config.recipe import Recipe, recipe_to_dict, resolve_path
from rl.data.mixer import AdaptiveTaskMixer, Source, TaskMixer, sources_by_domain
from rl.driver.checkpoints import RunAborted, latest_checkpoint, prepare_output_dir, read_checkpoint, write_checkpoint
from rl.driver.logger import STARTUP, ProgressBar, RunLogger
from rl.driver.recovery import BadStepGuard
from rl.driver.runtime import Runtime
from rl.driver.stream import EpisodeStream
from rl.data.hub_data import recipe_datasets
from rl.trainer.hub import resolve_model
from rl.trainer.lora import check_targets

__all__ = [
    "RunAborted",
    "BadStepGuard",
    "latest_checkpoint",
    "prepare_output_dir",
    "train",
    "expand",
    "load_task_sets",
    "make_mixer",
    "make_normalizer",
    "evaluate",
    "checkpoint",
    "restore",
]

RuntimeFactory = Callable[[Recipe, str, Path, bool], Runtime]


def train(
    cfg: Recipe,
    *,
    verbose: bool = False,
    progress: bool = True,
    runtime: RuntimeFactory | None = None,
    started: float | None = None,
) -> Path:
    """Run the recipe; return the output dir. Raises on failure after shutting everything down.

    ``runtime(cfg, model_path, out, verbose)`` builds the runtime (default: ``RayRuntime``).
    ``started``: when the command started (Unix time; default now): the start-up lines (printed with
    ``progress``) and the end summary's wall time count from it.
    """
    STARTUP.start(started, enabled=progress)
    out, resume_from = prepare_output_dir(cfg)
    STARTUP.phase(f"model {cfg.model.path}")
    model_path = prepare_model(cfg)
    STARTUP.phase("task files and datasets")
    train_sources, eval_tasks = load_task_sets(cfg)
    mixer, normalizer = make_mixer(cfg, train_sources), make_normalizer(cfg)
    sampling, greedy = make_sampling(cfg)
    rt = (runtime or _ray_runtime)(cfg, model_path, out, verbose)
    run = RunParts(cfg, out, rt, mixer, normalizer, eval_tasks, greedy)
    try:
        first = start_run(run, train_sources, sampling, resume_from, progress)
        STARTUP.phase(
            f"ready: step {first} of {cfg.train.steps}" + (f" (resumed from {resume_from.name})" if resume_from else "")
        )
        if first == 1 and cfg.train.eval_at_start:
            if eval_tasks:
                STARTUP.phase(f"baseline evaluation of {len(eval_tasks)} held-out tasks")
            run.logger.log(0, run_eval(run, 0))  # 0. baseline eval
        for step in range(first, cfg.train.steps + 1):
            trajs, metrics = train_step(run, step)  # 1-6. draw, generate, score, shape, update, sync
            if _due(step, cfg.run.rollouts_every):
                run.logger.rollouts(step, "train", trajs)
            if step == cfg.train.steps or _due(step, cfg.train.eval_every):
                run.episodes.quiesce()  # the newest weights in idle engines
                metrics |= run_eval(run, step)  # 7. held-out eval
            run.logger.log(step, metrics)  # 8. log
            run.guard.check(step, metrics)  # stop after train.max_bad_steps skipped updates
            if step == cfg.train.steps or _due(step, cfg.run.save_every):
                checkpoint(rt, out, step, cfg.run.keep_checkpoints, mixer, normalizer, run.episodes)  # 9. checkpoint
            if run.bar is not None:
                run.bar.update(step, metrics)
        finish_run(run)
    finally:
        stop_run(run)
    return out


@dataclass
class RunParts:
    """What one run holds while it trains; ``stop_run`` closes the parts that were started."""

    cfg: Recipe
    out: Path
    rt: Runtime
    mixer: TaskMixer
    normalizer: RewardNormalizer
    eval_tasks: list[Task]
    greedy: Sampling
    episodes: EpisodeStream | None = None
    logger: RunLogger | None = None
    bar: ProgressBar | None = None
    guard: BadStepGuard | None = None


def prepare_model(cfg: Recipe) -> str:
    """The model's local path (a Hub id is downloaded); LoRA target modules checked before any actor starts."""
    model_path = resolve_model(cfg.model.path, Path(cfg.source).parent if cfg.source else None, cfg.model.revision)
    check_targets(model_path, cfg.learner.lora, "learner.lora.target_modules")
    return model_path


def make_sampling(cfg: Recipe) -> tuple[Sampling, Sampling]:
    """Training sampling (``rollout.temperature``, ``top_p``) and greedy sampling for eval, same lengths."""
    r = cfg.rollout
    sampling = Sampling(r.max_new_tokens, r.temperature, r.top_p, r.max_turns, r.max_model_len)
    greedy = Sampling(r.max_new_tokens, 0.0, 1.0, r.max_turns, r.max_model_len)
    return sampling, greedy


def start_run(
    run: RunParts, sources: list[Source], sampling: Sampling, resume_from: Path | None, progress: bool
) -> int:
    """Start the runtime, the episode stream, the logger, progress bar and bad-step guard; restore
    ``resume_from`` if given. Returns the first step to train."""
    cfg, mixer = run.cfg, run.mixer
    run.rt.start(length_estimate=lambda t: s.est_len if (s := mixer.stats.get(t.id)) else None)
    run.episodes = make_episode_stream(cfg, run.rt, mixer, sources, sampling)
    first = restore(run.rt, resume_from, mixer, run.normalizer, run.episodes) + 1 if resume_from else 1
    w = cfg.wandb
    run.logger = RunLogger(
        run.out,
        recipe_to_dict(cfg),
        mode=w.mode,
        project=w.project,
        entity=w.entity,
        run_name=w.run_name,
        tags=w.tags,
        table_every=w.table_every,
        last_step=cfg.train.steps,
    )
    run.bar = ProgressBar(cfg.train.steps) if progress else None
    run.guard = BadStepGuard(cfg.train.max_bad_steps, run.out)
    return first


def train_step(run: RunParts, step: int) -> tuple[list[Trajectory], dict[str, float]]:
    """One step's episodes, rewards, shaping, update and weight sync; returns the episodes and the step's metrics."""
    rt, mixer, cfg = run.rt, run.mixer, run.cfg
    t0 = time.perf_counter()
    trajs = run.episodes.take(step)  # 1-2. draw tasks, run episodes (async: during step-1)
    t1 = time.perf_counter()
    trajs = rt.score(trajs)  # 3. rewards
    t2 = time.perf_counter()
    mixer.update(trajs)
    shaped, norm_metrics = shape_step(run.normalizer, trajs)  # 4. reward shaping (per-domain norm)
    batch, batch_stats = build_batch(trajs, cfg.algo, shaped, tuple(cfg.mixer.seq_level_domains))
    metrics = rt.train_step(batch)  # 5. update
    t3 = time.perf_counter()
    run.episodes.weights_updated()  # 6. weight sync (async: once the engines are idle)
    t4 = time.perf_counter()
    metrics |= (
        batch_stats
        | norm_metrics
        | mixer.last_counts
        | rollout_metrics(trajs)
        | rt.metrics()
        | {"timing/reward_s": t2 - t1, "timing/learner_s": t3 - t2, "timing/step_s": t4 - t0}
        | run.episodes.metrics()
    )
    return trajs, metrics


def run_eval(run: RunParts, step: int) -> dict[str, float]:
    return evaluate(run.rt, run.logger, run.eval_tasks, run.greedy, step)


def _due(step: int, every: int) -> bool:
    """Whether an every-``every``-steps action (0: never) falls on ``step``."""
    return bool(every) and step % every == 0


def finish_run(run: RunParts) -> None:
    """After the last step: the ``DONE`` marker, then the progress line ended and the run's summary printed."""
    (run.out / "DONE").write_text(json.dumps({"steps": run.cfg.train.steps}) + "\n")
    if run.bar is not None:
        run.bar.close()
        print(run.logger.summary(), flush=True)


def stop_run(run: RunParts) -> None:
    """Close what ``start_run`` opened, on every exit path (normal end, exception, Ctrl-C, SIGTERM)."""
    if run.bar is not None:
        run.bar.close()  # idempotent: ends the progress line on every exit path
    if run.logger is not None:
        run.logger.close()
    run.rt.stop()
    if run.episodes is not None:
        run.episodes.close()  # after the runtime: an in-flight generation ends when its engine does


def _ray_runtime(cfg: Recipe, model_path: str, out: Path, verbose: bool) -> Runtime:
    from rl.driver.ray_runtime import RayRuntime

    return RayRuntime(cfg, model_path, out, verbose)


def make_episode_stream(
    cfg: Recipe, rt: Runtime, mixer: TaskMixer, sources: list[Source], sampling: Sampling
) -> EpisodeStream:
    """Each step's episodes (``rollout.async_steps``: synchronous or one step ahead): the mixer's draw,
    each task ``rollout.group_size`` times with its seeds, through the runtime."""
    r, seed = cfg.rollout, cfg.run.seed
    by_id = {t.id: t for src in sources for t in src.tasks}

    def lookup(ids: list[str], step: int) -> tuple[list[Task], list[int], list[int]]:
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise ValueError(f"the checkpoint's in-flight tasks {missing[:5]} are not in data.train_files any more")
        return expand([by_id[i] for i in ids], r.group_size, seed, step)

    return EpisodeStream(
        rt,
        lambda step: expand(mixer.sample(step), r.group_size, seed, step),
        rt.sync_weights,
        sampling,
        r.async_steps,
        cfg.train.steps,
        lookup,
    )


def make_mixer(cfg: Recipe, sources: list[Source]) -> TaskMixer:
    mx = cfg.mixer
    cls, extra = (AdaptiveTaskMixer, {"adaptive": mx.adaptive}) if mx.mode == "adaptive" else (TaskMixer, {})
    return cls(
        sources,
        cfg.rollout.prompts_per_step,
        cfg.run.seed,
        **extra,
        domain_weights=dict(mx.domain_weights)
        or {d: float(sum(len(s.tasks) for s in sources if s.domain == d)) for d in {s.domain for s in sources}},
        strata=mx.strata,
        strata_proportions=list(mx.strata_proportions),
        length_ema=mx.length_ema,
        curriculum_window=mx.curriculum_window,
        curriculum_weight=mx.curriculum_weight,
        solved_threshold=mx.solved_threshold,
    )


def make_normalizer(cfg: Recipe) -> RewardNormalizer:
    n = cfg.algo.reward_norm
    return RewardNormalizer(n.mode, stat=n.stat, ema=n.ema)


def expand(tasks: list[Task], group_size: int, seed: int, step: int) -> tuple[list[Task], list[int], list[int]]:
    """Each task ``group_size`` times, with its group id and a per-sample sampling seed."""
    out_t, out_g, out_s = [], [], []
    for g, t in enumerate(tasks):
        for k in range(group_size):
            out_t.append(t)
            out_g.append(g)
            out_s.append((seed * 1_000_003 + step * 10_007 + g * group_size + k) % (2**31))
    return out_t, out_g, out_s


def evaluate(rt: Runtime, logger: RunLogger, tasks: list[Task], greedy: Sampling, step: int) -> dict[str, float]:
    """Greedy held-out evaluation: ``eval/reward/mean``, ``eval/reward/<domain>/mean``, ..."""
    if not tasks:
        return {}
    t0 = time.perf_counter()
    trajs = rt.score(rt.generate(tasks, list(range(len(tasks))), [0] * len(tasks), greedy))
    logger.rollouts(step, "eval", trajs)
    m = rollout_metrics(trajs, prefix="eval/")
    m |= {"eval/" + k: v for k, v in rt.metrics(rollout=False).items()}  # not counted in the next train step
    m["timing/eval_s"] = time.perf_counter() - t0
    return m


def checkpoint(
    rt: Runtime,
    out: Path,
    step: int,
    keep: int,
    mixer: TaskMixer,
    normalizer: RewardNormalizer,
    episodes: EpisodeStream | None = None,
) -> Path:
    """``checkpoints/step_NNNNNN``: the learner's state (``rt.save``) and the driver's (the mixer's draw state,
    the reward normalizer's statistics and, in async mode, the in-flight draw of the next step)."""
    return write_checkpoint(
        rt,
        out,
        step,
        keep,
        {
            "mixer": mixer.state_dict(),
            "normalizer": normalizer.state_dict(),
            "episodes": episodes.state_dict() if episodes is not None else {},
        },
    )


def restore(
    rt: Runtime, ck: Path, mixer: TaskMixer, normalizer: RewardNormalizer, episodes: EpisodeStream | None = None
) -> int:
    """Load checkpoint ``ck`` into the learner and engines (``rt.restore``), the mixer, normalizer and episode
    stream; return its step."""
    rt.restore(str(ck))
    step, state = read_checkpoint(ck)
    mixer.load_state_dict(state["mixer"])
    normalizer.load_state_dict(state["normalizer"])
    if episodes is not None:
        episodes.start_at(step)
        episodes.load_state_dict(state.get("episodes", {}))
    return step


def _check_domains(tasks: list[Task], where: str, domains: set[str]) -> None:
    for t in tasks:
        if t.domain not in domains:
            raise TaskFormatError(
                f"{where}: task {t.id!r} has domain {t.domain!r}, but rollout.envs serves only {sorted(domains)}"
            )


def load_task_sets(cfg: Recipe) -> tuple[list[Source], list[Task]]:
    """Training sources (one per file and domain, weighted by ``data.train_weights``) and held-out tasks."""
    domains = {e.domain for e in cfg.rollout.envs}
    weights = list(cfg.data.train_weights) or [1.0] * len(cfg.data.train_files)
    sources: list[Source] = []
    held: list[list[Task]] = []  # one list per eval file / eval dataset entry, in order
    for files, is_train in ((cfg.data.train_files, True), (cfg.data.eval_files, False)):
        for i, f in enumerate(files):
            path = resolve_path(cfg, f)
            tasks = load_tasks(path)
            _check_domains(tasks, str(path), domains)
            if is_train:
                sources += sources_by_domain(tasks, path.name, weights[i])
            else:
                held.append(tasks)
    for which in ("train", "eval"):  # through `datasets`, before any actor starts (rl/data/hub_data.py)
        for key, entry, tasks in recipe_datasets(cfg, which):
            _check_domains(tasks, key, domains)
            if which == "train":
                sources += sources_by_domain(tasks, f"{entry.path}:{entry.split}", entry.weight)
            else:
                held.append(tasks)
    return sources, limit_eval(held, cfg.data.eval_limit, cfg.data.eval_limit_per)


def limit_eval(held: list[list[Task]], limit: int, per: str) -> list[Task]:
    """The held-out tasks to evaluate: the first ``limit`` (0 = all) of each source (``per`` "file"), of
    each domain ("domain") or of all joined in order ("total"); the order of the sources is kept."""
    joined = [t for tasks in held for t in tasks]
    if not limit:
        return joined
    if per == "total":
        return joined[:limit]
    if per == "file":
        return [t for tasks in held for t in tasks[:limit]]
    seen: dict[str, int] = {}
    out = []
    for t in joined:
        if seen.get(t.domain, 0) < limit:
            seen[t.domain] = seen.get(t.domain, 0) + 1
            out.append(t)
    return out
