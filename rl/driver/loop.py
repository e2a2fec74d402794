"""The training loop on the driver. ``train`` reads top to bottom as the table of contents.

Actors: N rollout workers (vLLM + envs), learners, a reward pool, placed per ``cluster``.
The driver draws tasks, moves typed records between actors, logs, evaluates and
checkpoints. Episodes come from ``rl.driver.stream.EpisodeStream``: generated on demand, or one
step ahead while the learner trains (``rollout.async_steps=1``). Engines are shut down on
every exit path (normal end, exception, Ctrl-C, SIGTERM); faults the run survives are
counted (``faults/...``), those it cannot end it with one message (docs/reliability.md).
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
from typing import Any, Callable

from envs.io import TaskFormatError, load_tasks
from envs.types import Sampling, Task
from rewards.service import RewardFnSpec, RewardService
from rl.algos.batch import build_batch, rollout_metrics
from rl.config.recipe import Recipe, recipe_to_dict, resolve_output_dir, resolve_path
from rl.driver.logger import ProgressBar, RunLogger
from rl.algos.shaping import RewardNormalizer, shape_step
from rl.data.mixer import AdaptiveTaskMixer, Source, TaskMixer, sources_by_domain
from rl.driver.stream import EpisodeStream
from rl.trainer.hub import resolve_model
from rl.trainer.lora import check_targets
from rollout.pool import RolloutPool


def train(cfg: Recipe, *, verbose: bool = False, progress: bool = True) -> Path:
    """Run the recipe; return the output dir. Raises on failure after shutting everything down."""
    out, resume_from = prepare_output_dir(cfg)
    model_path = resolve_model(cfg.model.path, Path(cfg.source).parent if cfg.source else None, cfg.model.revision)
    check_targets(model_path, cfg.learner.lora, "learner.lora.target_modules")  # LoRA target modules exist: before any actor starts
    train_sources, eval_tasks = load_task_sets(cfg)
    mixer, normalizer = make_mixer(cfg, train_sources), make_normalizer(cfg)
    r = cfg.rollout
    sampling = Sampling(r.max_new_tokens, r.temperature, r.top_p, r.max_turns, r.max_model_len)
    greedy = Sampling(r.max_new_tokens, 0.0, 1.0, r.max_turns, r.max_model_len)
    actors = Actors(cfg, model_path, out, verbose)
    logger = bar = episodes = None
    try:
        actors.start(length_estimate=lambda t: s.est_len if (s := mixer.stats.get(t.id)) else None)
        episodes = make_episode_stream(cfg, actors, mixer, train_sources, sampling)
        first = actors.restore(resume_from, mixer, normalizer, episodes) + 1 if resume_from else 1
        logger = RunLogger(out, recipe_to_dict(cfg), mode=cfg.wandb.mode, project=cfg.wandb.project,
                           entity=cfg.wandb.entity, run_name=cfg.wandb.run_name, tags=cfg.wandb.tags,
                           table_every=cfg.wandb.table_every, last_step=cfg.train.steps)
        bar = ProgressBar(cfg.train.steps) if progress else None
        guard = BadStepGuard(cfg.train.max_bad_steps, out)
        if first == 1:
            logger.log(0, evaluate(actors, logger, eval_tasks, greedy, 0))                      # 0. baseline eval
        for step in range(first, cfg.train.steps + 1):
            t0 = time.perf_counter()
            trajs = episodes.take(step)                         # 1-2. draw tasks, run episodes (async: during step-1)
            t1 = time.perf_counter()
            trajs = actors.rewards.score(trajs)                                                    # 3. rewards
            t2 = time.perf_counter()
            mixer.update(trajs)
            shaped, norm_metrics = shape_step(normalizer, trajs)                      # 4. reward shaping (per-domain norm)
            batch, batch_stats = build_batch(trajs, cfg.algo, shaped, tuple(cfg.mixer.seq_level_domains))
            metrics = actors.learner_step(batch)                                                   # 5. update
            t3 = time.perf_counter()
            episodes.weights_updated()                              # 6. weight sync (async: once the engines are idle)
            t4 = time.perf_counter()
            metrics |= batch_stats | norm_metrics | mixer.last_counts | rollout_metrics(trajs) | actors.fault_metrics() | {
                "timing/reward_s": t2 - t1, "timing/learner_s": t3 - t2, "timing/step_s": t4 - t0} | episodes.metrics()
            if cfg.run.rollouts_every and step % cfg.run.rollouts_every == 0:
                logger.rollouts(step, "train", trajs)
            if step == cfg.train.steps or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
                episodes.quiesce()  # the newest weights in idle engines
                metrics |= evaluate(actors, logger, eval_tasks, greedy, step)                     # 7. held-out eval
            logger.log(step, metrics)                                                              # 8. log
            guard.check(step, metrics)                                 # stop after train.max_bad_steps skipped updates
            if step == cfg.train.steps or (cfg.run.save_every and step % cfg.run.save_every == 0):
                actors.checkpoint(out, step, cfg.run.keep_checkpoints, mixer, normalizer, episodes)  # 9. checkpoint
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
        if episodes is not None:
            episodes.close()  # after the actors: an in-flight generation ends when its engine does
    return out


class RunAborted(RuntimeError):
    """The run cannot go on (e.g. too many skipped updates in a row); outputs so far are kept."""


class BadStepGuard:
    """Stops the run after ``limit`` steps in a row whose update the learner skipped.

    The learner skips an optimizer step whose loss or gradient norm is not finite (weights and
    optimizer state stay as they were, ``learner/skipped_update`` > 0). One such step is logged
    with its reason and the run goes on; ``limit`` in a row means the run is broken (a
    diverged policy, a reward producing absurd values), so it stops before writing another
    checkpoint: the last checkpoint on disk is from before the streak.
    """

    def __init__(self, limit: int, out: Path) -> None:
        self.limit, self.out, self.streak = limit, out, 0

    def check(self, step: int, metrics: dict[str, float]) -> None:
        skipped = metrics.get("learner/skipped_update", 0.0)
        if not skipped > 0:
            self.streak = 0
            return
        self.streak += 1
        loss = metrics.get("loss/policy", float("nan"))
        why = "non-finite loss" if not _finite(loss) else "non-finite gradient norm"
        print(f"jointrl: step {step}: {skipped:.0%} of the optimizer updates skipped ({why}: loss/policy={loss}, "
              f"grad/norm={metrics.get('grad/norm')}); {self.streak} such step(s) in a row, the run stops at "
              f"{self.limit}", file=sys.stderr, flush=True)
        if self.streak >= self.limit:
            last = latest_checkpoint(self.out)
            raise RunAborted(f"{self.streak} steps in a row (up to step {step}) skipped their update ({why}); "
                             f"stopping (train.max_bad_steps={self.limit}). Metrics of every step are in "
                             f"{self.out / 'metrics.jsonl'}; last good checkpoint: "
                             f"{last if last is not None else 'none (set run.save_every)'}")


def _finite(v: Any) -> bool:
    import math

    return isinstance(v, (int, float)) and math.isfinite(v)


def make_episode_stream(cfg: Recipe, actors: Actors, mixer: TaskMixer, sources: list[Source],
                        sampling: Sampling) -> EpisodeStream:
    """Each step's episodes (``rollout.async_steps``: synchronous or one step ahead): the mixer's draw,
    each task ``rollout.group_size`` times with its seeds, through the actors' rollout pool."""
    r, seed = cfg.rollout, cfg.run.seed
    by_id = {t.id: t for src in sources for t in src.tasks}

    def lookup(ids: list[str], step: int) -> tuple[list[Task], list[int], list[int]]:
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise ValueError(f"the checkpoint's in-flight tasks {missing[:5]} are not in data.train_files any more")
        return expand([by_id[i] for i in ids], r.group_size, seed, step)

    return EpisodeStream(actors.pool, lambda step: expand(mixer.sample(step), r.group_size, seed, step),
                         actors.sync_weights, sampling, r.async_steps, cfg.train.steps, lookup)


def make_mixer(cfg: Recipe, sources: list[Source]) -> TaskMixer:
    mx = cfg.mixer
    cls, extra = (AdaptiveTaskMixer, {"adaptive": dict(mx.adaptive)}) if mx.mode == "adaptive" else (TaskMixer, {})
    return cls(sources, cfg.rollout.prompts_per_step, cfg.run.seed, **extra,
               domain_weights=dict(mx.domain_weights) or {d: float(sum(len(s.tasks) for s in sources if s.domain == d))
                                                         for d in {s.domain for s in sources}},
               strata=mx.strata, strata_proportions=list(mx.strata_proportions), length_ema=mx.length_ema,
               curriculum_window=mx.curriculum_window, curriculum_weight=mx.curriculum_weight,
               solved_threshold=mx.solved_threshold)


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

    Learners: ``learner.workers`` data-parallel ``Learner`` actors (``rl.trainer.distributed.LearnerGroup``);
    ``learner`` is rank 0's handle (weights export, log-probs, checkpoints).
    """

    def __init__(self, cfg: Recipe, model_path: str, out: Path, verbose: bool) -> None:
        self.cfg, self.model_path, self.out, self.verbose = cfg, model_path, out, verbose
        self.pool: Any = None
        self.rewards: Any = None
        self.learners: Any = None
        self.learner: Any = None
        self._own_ray = False
        self.placement: Any = None  # rl.driver.placement.Placement: the run's placement groups
        self.colocated = False
        self._old_term: Any = None
        self.shm_dir = ""
        self.learner_node: str | None = None  # learner rank 0's Ray node: its weights file is there

    def start(self, length_estimate: Callable[[Task], float | None] | None = None) -> None:
        """Connect to (or start) Ray, reserve the placement groups of ``cluster``, start the actors.

        ``length_estimate(task)``: estimated trajectory tokens of a task (the mixer's EMA), used by the
        pool to balance engines; also writes ``placement.json`` (each actor's node) into the output dir.
        """
        import ray

        from rl.trainer.distributed import LearnerGroup
        from rl.driver.placement import actor_nodes, local_ray_cpus, plan_placement, reserve, resolve_device

        cfg, r = self.cfg, self.cfg.rollout
        address = cfg.run.ray_address or os.environ.get("RAY_ADDRESS") or None
        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            cpus = os.cpu_count() or 2
            ray.init(address=address,
                     num_cpus=None if address else local_ray_cpus(plan_placement(cfg, "cpu"), cpus, r.num_engines),
                     include_dashboard=False, log_to_driver=self.verbose, logging_level="INFO" if self.verbose else "WARNING",
                     runtime_env={"env_vars": _actor_env(self.verbose)})
            self._own_ray = True
        # SIGTERM becomes an exception so that `finally` shuts the engines down. Installed after
        # ray.init, whose own handler (print a stack trace, abort) would otherwise replace it.
        self._old_term = signal.signal(signal.SIGTERM, _raise_on_term)
        from rl.trainer.hub import cache_dir  # noqa: F401 - the actors resolve the same cache through the env

        # cluster.device (auto: GPUs when the Ray cluster has any), then one placement group per role,
        # reserved before any actor starts: a cluster that cannot hold them fails here, naming the resources.
        device = resolve_device(cfg, float(ray.cluster_resources().get("GPU", 0.0)))
        plan = plan_placement(cfg, device)
        self.colocated = plan.colocated
        self.placement = reserve(plan, cfg.cluster.placement_timeout_s)
        # Weights travel through shared memory; the driver owns the folder so that it goes
        # away on every exit path, even when the learner is busy or dead.
        free_dead_run(self.out / LIVE_FILE)  # what a killed driver of this output dir left behind
        self.shm_dir = tempfile.mkdtemp(prefix="jointrl-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.learners = LearnerGroup(cfg.learner.workers, self.model_path, cfg.model, cfg.algo, seed=cfg.run.seed,
                                     threads=cfg.run.threads, shm_dir=self.shm_dir, total_steps=cfg.train.steps,
                                     actor_options=self.placement.options("learner"), learner=cfg.learner)
        self.learner = self.learners.actors[0]
        self.pool = RolloutPool(r.num_engines, self.model_path, [(e.domain, e.cls, dict(e.kwargs)) for e in r.envs],
                                actor_options=self.placement.options("engine"), length_estimator=length_estimate,
                                dtype=cfg.model.engine_dtype, seed=cfg.run.seed,
                                max_model_len=r.max_model_len, kv_cache_gib=r.kv_cache_gib,
                                gpu_memory_utilization=r.gpu_memory_utilization,
                                tensor_parallel_size=cfg.cluster.engine_tp, enable_sleep_mode=plan.colocated,
                                engine_kwargs=dict(r.engine_kwargs))
        specs = [RewardFnSpec(s.cls, s.weight, tuple(s.domains), dict(s.kwargs)) for s in cfg.rewards]
        self.rewards = RewardService(specs, workers=cfg.reward_service.workers, timeout_s=cfg.reward_service.timeout_s,
                                     actor_options=self.placement.options("reward"))
        self.learners.ready()
        # Where every actor landed, asked of the actors themselves (docs/cluster.md).
        where = {"device": device, "placement": cfg.cluster.placement,
                 "engine": actor_nodes(self.pool.workers), "learner": actor_nodes(self.learners.actors),
                 "reward": actor_nodes(self.rewards.workers)}
        self.learner_node = where["learner"][0]["node_id"]
        for i, e in enumerate(where["engine"]):
            e["weights"] = self.pool.route(i, self.learner_node)  # file (same node) | object_store
        (self.out / "placement.json").write_text(json.dumps(where, indent=1) + "\n")
        # Read by the next run in this dir if this driver dies without cleaning up (SIGKILL, OOM).
        (self.out / LIVE_FILE).write_text(json.dumps({"pid": os.getpid(), "shm_dir": self.shm_dir,
                                                      "engines": self.pool.shm_owned()}) + "\n")

    def learner_step(self, batch: Any) -> dict[str, float]:
        """One learner step: the batch sharded over the learners, metrics of the whole batch.

        Colocated placement (GPU): the engines sleep (weights offloaded to CPU, KV cache freed)
        while the learners use their GPUs, and wake up after it, before the weight sync.
        """
        if not self.colocated:
            return self.learners.step(batch)
        self.pool.sleep(1)
        try:
            return self.learners.step(batch)
        finally:
            try:
                self.learners.release_gpu_memory()
            finally:
                self.pool.wake_up()

    def fault_metrics(self) -> dict[str, float]:
        """Since the last call: ``faults/rollout_restarts``, reward-service restarts and per-function errors."""
        return self.pool.metrics() | self.rewards.metrics()

    def sync_weights(self) -> None:
        path = self.learners.export_weights(self.cfg.model.engine_dtype)  # every rank: the shards are gathered
        # Engines on the learner's node read the file in shared memory; others get its bytes
        # through Ray's object store (one copy per node), written to their own shared memory.
        self.pool.sync_weights(path, self.learner_node, lambda: self.learner.read_weights.remote(path))

    def checkpoint(self, out: Path, step: int, keep: int, mixer: TaskMixer, normalizer: RewardNormalizer,
                   episodes: EpisodeStream | None = None) -> None:
        """Atomically write ``checkpoints/step_NNNNNN`` (temp dir + rename); keep the newest ``keep``.

        It holds the learner's state (model, optimizer, schedules, RNG) and the driver's
        (the mixer's draw state, the reward normalizer's statistics and, in async mode, the
        in-flight draw of the next step: ``driver.json``).
        """
        ck = out / "checkpoints"
        ck.mkdir(exist_ok=True)
        final, tmp = ck / f"step_{step:06d}", ck / f".step_{step:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            self.learners.save_checkpoint(str(tmp))
            (tmp / "driver.json").write_text(json.dumps({
                "mixer": mixer.state_dict(), "normalizer": normalizer.state_dict(),
                "episodes": episodes.state_dict() if episodes is not None else {}}))
            (tmp / "step.json").write_text(json.dumps({"step": step}) + "\n")
        except Exception as e:  # e.g. the disk filled up: say so, keep the previous checkpoint
            shutil.rmtree(tmp, ignore_errors=True)
            last = latest_checkpoint(out)
            err = getattr(e, "cause", None) or e  # a Ray task error carries the learner's exception
            raise RunAborted(f"could not write the step-{step} checkpoint into {ck}: {type(err).__name__}: "
                             f"{err}; the previous checkpoint is intact: "
                             f"{last if last is not None else 'none'}") from e
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        done = sorted(p for p in ck.iterdir() if p.name.startswith("step_"))
        for old in done[: max(len(done) - max(keep, 1), 0)]:
            shutil.rmtree(old, ignore_errors=True)

    def restore(self, ck: Path, mixer: TaskMixer, normalizer: RewardNormalizer,
                episodes: EpisodeStream | None = None) -> int:
        """Load checkpoint ``ck`` into the learners, engines, mixer, normalizer and episode stream; return its step."""
        self.learners.load_checkpoint(str(ck))
        self.sync_weights()
        state = json.loads((ck / "driver.json").read_text())
        mixer.load_state_dict(state["mixer"])
        normalizer.load_state_dict(state["normalizer"])
        step = int(json.loads((ck / "step.json").read_text())["step"])
        if episodes is not None:
            episodes.start_at(step)
            episodes.load_state_dict(state.get("episodes", {}))
        return step

    def stop(self) -> None:
        import ray

        try:
            if self.pool is not None:
                self.pool.shutdown()
            if self.rewards is not None:
                self.rewards.shutdown()
            if self.learners is not None:
                self.learners.kill()
            if self.placement is not None:
                self.placement.remove()  # frees the reserved resources on a cluster that outlives the run
        finally:
            if self.shm_dir:
                shutil.rmtree(self.shm_dir, ignore_errors=True)
                (self.out / LIVE_FILE).unlink(missing_ok=True)
            if self._own_ray and ray.is_initialized():
                ray.shutdown()
            if self._old_term is not None:
                signal.signal(signal.SIGTERM, self._old_term)


LIVE_FILE = ".live.json"


# How long a resumed run waits for a killed run's orphaned engine processes to exit (they die on
# their own, seconds after their parent) before it leaves their shared memory in place.
_DEAD_ENGINE_WAIT_S = 60.0


def free_dead_run(live: Path) -> list[str]:
    """Free the shared memory a dead driver's run left (its weights folder, its engines' segments).

    ``live`` is the run's ``.live.json`` (driver pid, weights folder, engine nodes and segments).
    Nothing is touched while that driver is still alive; segments some live process still
    maps are kept (``rollout.pool.unlink_unmapped``). Returns what was removed.
    """
    import ray

    from rollout.pool import unlink_unmapped

    try:
        rec = json.loads(live.read_text())
    except (OSError, ValueError):
        return []
    if rec.get("pid") != os.getpid() and _alive(int(rec.get("pid", 0))):
        return []
    removed = []
    d = rec.get("shm_dir", "")
    if d.startswith("/dev/shm/jointrl-") and os.path.isdir(d):
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")} if ray.is_initialized() else set()
    for node, segments in rec.get("engines", []):
        if node in alive:  # a node of a cluster that outlived the driver
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            sweep = ray.remote(num_cpus=0)(unlink_unmapped).options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
            removed += ray.get(sweep.remote(segments, _DEAD_ENGINE_WAIT_S), timeout=2 * _DEAD_ENGINE_WAIT_S)
        else:  # the driver's own local cluster, gone with it: this machine
            removed += unlink_unmapped(segments, wait_s=_DEAD_ENGINE_WAIT_S)
    live.unlink(missing_ok=True)
    left = [p for _, segs in rec.get("engines", []) for p in segs if p not in removed and os.path.exists(p)]
    if left:
        print(f"jointrl: shared memory of the killed run still in use after {_DEAD_ENGINE_WAIT_S:.0f} s, "
              f"left in place: {left}", file=sys.stderr)
    if removed:
        print(f"jointrl: freed {len(removed)} shared-memory object(s) left by the killed run", file=sys.stderr)
    return removed


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _raise_on_term(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


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
