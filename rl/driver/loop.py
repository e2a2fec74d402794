"""The training loop on the driver. ``train`` reads top to bottom as the table of contents.

The loop runs against a runtime (``rl.driver.runtime.Runtime``: generate, score, train step,
sync, save, restore, metrics): the Ray one (``rl.driver.ray_runtime.RayRuntime``: vLLM rollout
workers, a reward service and learners as actors, placed per ``cluster``) or the in-process
one (``rl.driver.local_runtime.LocalRuntime``, fast tests). The driver draws tasks, moves typed
records between the runtime's parts, logs, evaluates and checkpoints (``rl.driver.checkpoints``).
Episodes come from ``rl.driver.stream.EpisodeStream``: generated on demand, or streamed ahead
while the learner trains, within ``rollout.max_staleness`` learner updates. The runtime is stopped on every exit
path (normal end, exception, Ctrl-C, SIGTERM); faults the run survives are counted
(``faults/...``), those it cannot end it with one message (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from envs.io import TaskFormatError, load_tasks
from envs.types import Sampling, Task, Trajectory
from rl.algos.batch import build_batch, rollout_metrics
from rl.algos.shaping import RewardNormalizer, shape_step
from rl.config.recipe import Recipe, RecipeError, recipe_to_dict, resolve_path
from rl.data.mixer import AdaptiveTaskMixer, Source, TaskMixer, sources_by_domain
from rl.driver.harbor_start import prepare_harbor_images, say_always
from rl.driver.checkpoints import (
    RunAborted,
    finish_pending,
    latest_checkpoint,
    prepare_output_dir,
    publish_written,
    settle_pending,
    read_checkpoint,
    write_checkpoint,
)
from rl.driver.placement import PlacementError
from rl.driver.logger import STARTUP, ProgressBar, RunLogger
from rl.driver.recovery import BadStepGuard, StopSignals, write_stopped
from rl.driver.runtime import LearnerFailure, Runtime
from rl.driver.stream import EpisodeStream
from rl.data.hub_data import recipe_datasets
from rl.trainer.hub import resolve_model
from rl.trainer.lora import check_targets
from rl.trainer.moe import check_replay
from rollout.pool import EngineFailure

__all__ = [
    "RunAborted",
    "RunCrashed",
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
    ``progress``) and the end summary's wall time count from it. A signal or an error once the runtime
    is up ends with the last finished step checkpointed (where the learner's state is known) and the
    folder marked ``STOPPED`` (``stop_at``).
    """
    STARTUP.start(started, enabled=progress)
    out, resume_from = prepare_output_dir(cfg)
    STARTUP.phase(f"model {cfg.model.path}")
    model_path = prepare_model(cfg)
    STARTUP.phase("task files and datasets")
    train_sources, eval_tasks = load_task_sets(cfg)
    train_sources, eval_tasks = prepare_harbor_images(cfg, train_sources, eval_tasks)  # before any actor starts
    mixer, normalizer = make_mixer(cfg, train_sources), make_normalizer(cfg)
    sampling, greedy = make_sampling(cfg)
    rt = (runtime or _ray_runtime)(cfg, model_path, out, verbose)
    run = RunParts(cfg, out, rt, mixer, normalizer, eval_tasks, greedy)
    try:
        first = start_run(run, train_sources, sampling, resume_from, progress)
        STARTUP.phase(
            f"ready: step {first} of {cfg.train.steps}" + (f" (resumed from {resume_from.name})" if resume_from else "")
        )
        with StopSignals() as run.signals:
            run_steps(run, first)
        finish_run(run)
    except BaseException as e:
        stop_at(run, e)  # raises: e itself, or RunCrashed naming it
    finally:
        stop_run(run)
    return out


def run_steps(run: RunParts, first: int) -> None:
    """Steps ``first`` .. ``train.steps`` (``run_step``). A learner group that fails (a dead rank, a missed
    deadline: ``LearnerFailure``) is restarted from the newest checkpoint and the steps after it are replayed
    (``recover``)."""
    cfg = run.cfg
    run.finished = run.saved = first - 1
    run.snapshot = driver_state(run.mixer, run.normalizer, run.episodes)
    if first == 1 and cfg.train.eval_at_start:
        if run.eval_tasks:
            STARTUP.phase(f"baseline evaluation of {len(run.eval_tasks)} held-out tasks")
        run.logger.log(0, run_eval(run, 0))  # 0. baseline eval
    step = first
    while step <= cfg.train.steps:
        try:
            run_step(run, step)
            step += 1
        except LearnerFailure as e:
            step = recover(run, e) + 1


def run_step(run: RunParts, step: int) -> None:
    """One step: its episodes (a signal meanwhile discards the step), then its update, eval, log and
    checkpoint (a signal meanwhile waits for the step's end: ``StopSignals``)."""
    cfg = run.cfg
    run.step = step
    c = collect_step(run, step)  # 1-4. draw, generate, score, shape
    with run.signals.deferred(step):
        run.dirty = True  # the learner's state is the last finished step's no longer
        metrics = update_step(run, c)  # 5-6. update, sync
        metrics["faults/learner_restarts"] = float(run.new_restarts)
        if _due(step, cfg.run.rollouts_every):
            run.logger.rollouts(step, "train", c.trajs)
        if step == cfg.train.steps or _due(step, cfg.train.eval_every):
            run.episodes.quiesce()  # the newest weights in idle engines
            metrics |= run_eval(run, step)  # 7. held-out eval
        run.logger.log(step, metrics)  # 8. log
        run.new_restarts = 0
        run.guard.check(step, metrics)  # stop after train.max_bad_steps skipped updates
        publish_written(run.out, cfg.run.keep_checkpoints)  # a checkpoint whose write ended since the last step
        state = driver_state(run.mixer, run.normalizer, run.episodes)
        if step == cfg.train.steps or _due(step, cfg.run.save_every):
            last = step == cfg.train.steps  # the last one is published before the run ends; others while training
            write_checkpoint(run.rt, run.out, step, cfg.run.keep_checkpoints, state, wait=last, export=last)  # 9.
            run.saved = step
        run.finished, run.snapshot, run.dirty = step, state, False
        if run.bar is not None:
            run.bar.update(step, metrics)


def recover(run: RunParts, e: LearnerFailure) -> int:
    """After a learner failure (its stacks dumped in ``stacks/``): restart the learner group from the newest
    checkpoint, bring the driver back to it (mixer, normalizer, episode stream, logs: rows after it move to
    ``*.discarded.jsonl``, the replay logs them anew) and return its step. Without a checkpoint, or past
    ``faults.learner_restarts``, the run ends (``RunAborted``, exit 3; resumable where a checkpoint exists)."""
    limit = run.cfg.faults.learner_restarts
    settle_pending(run.out, run.cfg.run.keep_checkpoints)  # published if its write ended, else removed
    ck = latest_checkpoint(run.out)
    stacks = f"; stacks in {e.stacks}" if e.stacks else ""
    if ck is None or run.restarts >= limit:
        why = (
            "no checkpoint yet to restart the learners from"
            if ck is None
            else f"faults.learner_restarts={limit} restart(s) used"
        )
        raise RunAborted(f"{e}{stacks}; {why}") from e
    run.restarts += 1
    print(
        f"jointrl: {e}{stacks}; restarting the learners from {ck} ({run.restarts} of faults.learner_restarts="
        f"{limit}) and replaying the steps after it",
        file=sys.stderr,
        flush=True,
    )
    run.episodes.discard()  # the in-flight generation (async) was drawn after the checkpoint
    run.rt.restart_learners(str(ck))
    step, state = read_checkpoint(ck)
    restore_driver(state, step, run.mixer, run.normalizer, run.episodes)
    run.logger.rewind(step)
    run.finished = run.saved = step
    run.snapshot, run.dirty = state, False
    run.new_restarts += 1
    return step


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
    signals: StopSignals | None = None
    step: int = 0  # the step in progress (0: none yet)
    finished: int = -1  # the last step whose update, log and checkpoint are done (-1: not started)
    saved: int = -1  # the newest step checkpointed
    snapshot: dict[str, Any] | None = None  # the driver's state at ``finished`` (what its checkpoint holds)
    dirty: bool = False  # the learner may hold part of a step that is not finished
    restarts: int = 0  # learner group restarts in this run (faults.learner_restarts bounds them)
    new_restarts: int = 0  # restarts not logged yet (faults/learner_restarts of the next logged step)


def prepare_model(cfg: Recipe) -> str:
    """The model's local path (a Hub id is downloaded); LoRA target modules and routing replay checked before any
    actor starts."""
    model_path = resolve_model(cfg.model.path, Path(cfg.source).parent if cfg.source else None, cfg.model.revision)
    check_targets(model_path, cfg.learner.lora, "learner.lora.target_modules")
    check_replay(model_path, cfg.learner)  # learner.routing_replay on a dense model
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
    c = collect_step(run, step)
    return c.trajs, update_step(run, c)


@dataclass
class Collected:
    """A step's episodes and batch before the update (``collect_step``): nothing of the learner changed yet."""

    trajs: list[Trajectory]
    batch: Any
    metrics: dict[str, float]  # batch, shaping and mixer statistics, timing/reward_s
    t0: float  # the step's start (perf_counter)
    t_scored: float  # its rewards' end


def collect_step(run: RunParts, step: int) -> Collected:
    """Step ``step``'s episodes scored, the mixer told, rewards shaped and the batch built."""
    rt, cfg = run.rt, run.cfg
    t0 = time.perf_counter()
    trajs = run.episodes.take(step)  # 1-2. draw tasks, run episodes (async: during step-1)
    t1 = time.perf_counter()
    trajs = rt.score(trajs)  # 3. rewards
    t2 = time.perf_counter()
    run.mixer.update(trajs)
    shaped, norm_metrics = shape_step(run.normalizer, trajs)  # 4. reward shaping (per-domain norm)
    r3 = cfg.learner.routing_replay == "r3"  # a sample without the engine's routing cannot be replayed: dropped
    batch, batch_stats = build_batch(trajs, cfg.algo, shaped, tuple(cfg.mixer.seq_level_domains), r3)
    m = batch_stats | norm_metrics | run.mixer.last_counts | {"timing/reward_s": t2 - t1}
    return Collected(trajs, batch, m, t0, t2)


def update_step(run: RunParts, c: Collected) -> dict[str, float]:
    """The learner's update on the collected batch and the weight sync; the step's metrics."""
    rt = run.rt
    metrics = rt.train_step(c.batch)  # 5. update
    t3 = time.perf_counter()
    run.episodes.weights_updated()  # 6. weight sync (async: once the engines are idle)
    t4 = time.perf_counter()
    return (
        metrics
        | c.metrics
        | rollout_metrics(c.trajs)
        | rt.metrics()
        | {"timing/learner_s": t3 - c.t_scored, "timing/step_s": t4 - c.t0}
        | run.episodes.metrics()
    )


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
    """Each step's episodes (``rollout.max_staleness``: synchronous, or streamed within the bound): the mixer's draw,
    each task ``rollout.group_size`` times with its seeds, through the runtime."""
    r, seed = cfg.rollout, cfg.run.seed
    by_id = {t.id: t for src in sources for t in src.tasks}

    def lookup(ids: list[str], step: int) -> tuple[list[Task], list[int], list[int]]:
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise ValueError(f"the checkpoint's drawn tasks {missing[:5]} are not in data.train_files any more")
        return expand([by_id[i] for i in ids], r.group_size, seed, step)

    return EpisodeStream(
        rt,
        lambda step: expand(mixer.sample(step), r.group_size, seed, step),
        rt.sync_weights,
        sampling,
        r.max_staleness,
        cfg.train.steps,
        lookup,
        partial=r.partial_rollouts,
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
        min_groups_per_domain=mx.min_groups_per_domain,
        spread_by=mx.spread_by,
    )


def make_normalizer(cfg: Recipe) -> RewardNormalizer:
    n = cfg.algo.reward_norm
    return RewardNormalizer(n.mode, stat=n.stat, ema=n.ema, prior_samples=n.prior_samples, prior_std=n.prior_std)


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
    """``checkpoints/step_NNNNNN``: the learner's state (``rt.save``) and the driver's (``driver_state``)."""
    return write_checkpoint(rt, out, step, keep, driver_state(mixer, normalizer, episodes))


def driver_state(mixer: TaskMixer, normalizer: RewardNormalizer, episodes: EpisodeStream | None) -> dict[str, Any]:
    """What a checkpoint holds of the driver: the mixer's draw state, the reward normalizer's statistics and,
    when streaming, the drawn and untrained steps with their finished groups (``EpisodeStream.state_dict``); a copy (plain JSON data), so later steps leave it as is."""
    return json.loads(
        json.dumps(
            {
                "mixer": mixer.state_dict(),
                "normalizer": normalizer.state_dict(),
                "episodes": episodes.state_dict() if episodes is not None else {},
            }
        )
    )


class RunCrashed(RunAborted):
    """An unexpected error once the run was under way (a user estimator's bad output, a dead learner, ...);
    the message names it, where it happened and what checkpoint a ``run.resume=auto`` continues from."""


# Errors of the user's input, raised while the run starts (the cluster section against the Ray cluster, a
# file): reported as they are (the CLI's exit 2), as before any actor starts.
_BAD_INPUT = (FileNotFoundError, FileExistsError, TaskFormatError, RecipeError, PlacementError)


def stop_at(run: RunParts, e: BaseException) -> None:
    """The run ends on ``e``: checkpoint the last finished step where the learner's state is that step's
    (not after a skipped-update streak or a failed write: ``RunAborted``), mark the folder ``STOPPED``
    (interrupted or crashed) and raise ``e``, or for an unexpected error ``RunCrashed`` naming it."""
    if isinstance(e, (SystemExit, GeneratorExit)) or (run.step == 0 and isinstance(e, _BAD_INPUT + (RunAborted,))):
        raise e  # bad input found while starting (the CLI's exit 2), or a stop of the interpreter
    interrupted = isinstance(e, KeyboardInterrupt)
    # a checkpoint still being written is published once written (not waited for from a dead learner)
    wait_s = 0.0 if isinstance(e, LearnerFailure) else run.cfg.faults.learner_io_s
    finish_pending(run.out, run.cfg.run.keep_checkpoints, wait_s)
    note = save_at_stop(run) if not isinstance(e, RunAborted) else ""
    last = latest_checkpoint(run.out)
    where = f"step {run.step}" if run.step else "start-up"
    err = getattr(e, "cause", None) or e  # a Ray task error carries the remote exception
    reason = "interrupted by a signal" if interrupted else f"{where}: {type(err).__name__}: {err}"
    write_stopped(run.out, "interrupted" if interrupted else "crashed", max(run.finished, 0), last, reason)
    resume = f"run.resume=auto continues from {last}" if last else "run.resume=auto starts again from step 1"
    if interrupted or isinstance(e, (RunAborted, EngineFailure)):
        print(f"jointrl: {note}{resume}", file=sys.stderr, flush=True)
        raise e
    log = run.out / "crash.log"
    with contextlib.suppress(OSError):
        log.write_text("".join(traceback.format_exception(e)))
    raise RunCrashed(f"{reason} (traceback in {log}); {note}{resume}") from e


def save_at_stop(run: RunParts) -> str:
    """Checkpoint the last finished step if it is not on disk yet and the learner holds exactly it; a note
    for the message (what was written, or why not)."""
    if run.finished < 1 or run.finished <= run.saved or run.snapshot is None:
        return ""
    if run.dirty:
        return f"the learner's state after step {run.finished} is not known (stopped mid-update), not saved; "
    try:
        ck = write_checkpoint(run.rt, run.out, run.finished, run.cfg.run.keep_checkpoints, run.snapshot)
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - a dead learner: the older checkpoint stays
        return f"no checkpoint of step {run.finished} ({type(e).__name__}: {e}); "
    run.saved = run.finished
    return f"checkpoint of step {run.finished} written ({ck}); "


def restore(
    rt: Runtime, ck: Path, mixer: TaskMixer, normalizer: RewardNormalizer, episodes: EpisodeStream | None = None
) -> int:
    """Load checkpoint ``ck`` into the learner and engines (``rt.restore``), the mixer, normalizer and episode
    stream; return its step."""
    rt.restore(str(ck))
    step, state = read_checkpoint(ck)
    restore_driver(state, step, mixer, normalizer, episodes)
    return step


def restore_driver(
    state: dict[str, Any], step: int, mixer: TaskMixer, normalizer: RewardNormalizer, episodes: EpisodeStream | None
) -> None:
    """The driver's part of a checkpoint of ``step`` (``driver_state``) into the mixer, normalizer and stream."""
    mixer.load_state_dict(state["mixer"])
    normalizer.load_state_dict(state["normalizer"])
    if episodes is not None:
        episodes.start_at(step)
        episodes.load_state_dict(state.get("episodes", {}))


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
            skipped: list[str] = []
            tasks = load_tasks(path, harbor_skip_bad=cfg.data.harbor_skip_bad, skipped=skipped)
            if skipped:
                say_always(
                    f"Harbor tasks: skipped {len(skipped)} task dir(s) of {path} that do not load "
                    "(data.harbor_skip_bad):\n" + "\n".join(f"  {m}" for m in skipped)
                )
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
