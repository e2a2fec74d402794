"""The Ray runtime (``rl.driver.runtime.Runtime``): rollout workers, reward service and learners as Ray actors.

Placed per ``cluster`` (``rl.driver.placement``): N rollout workers (vLLM + envs,
``rl.driver.actors.rollout.RolloutPool``), a reward pool (``rl.driver.actors.rewards.RewardService``) and
``learner.workers`` data-parallel learners (``rl.driver.actors.learners.LearnerGroup``).
Weights travel through shared memory (same node) or Ray's object store. The actor groups
restart their own dead actors and count it (``faults/...``); this class starts, wires and
stops them, and frees what a killed driver of the same output dir left (``rl.driver.recovery``).
It reaches Ray only through the edge package ``rl.driver.actors``; the CLI reaches Ray only through this
module (``RayRuntime``, and :func:`score_on_ray` for ``jointrl score --workers``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Callable

from envs.stacks import STACKS_ENV
from envs.types import Sampling, Task, Trajectory
from rewards.service import RewardFnSpec, StatsTable, reward_specs
from rl.algos.batch import Batch
from rl.config.recipe import Recipe
from rl.driver.actors import cluster
from rl.driver.actors.rewards import RewardService
from rl.driver.actors.rollout import RolloutPool, engines_call
from rl.driver.logger import STARTUP
from rl.driver.recovery import LIVE_FILE, free_dead_run, raise_on_term
from rl.driver.runtime import Deadlines, LearnerFailure, learner_settings
from rl.trainer.moe import check_replay_engine, engine_routing_kwargs
from rl.trainer.shm import make_shm_dir
from rollout.collective import bucket_bytes
from rollout.pool import EngineFailure
from rollout.weights import CollectiveJoin, CollectiveWeights, JoinFailed

log = logging.getLogger(__name__)


class RayRuntime:
    """The run's Ray actors (``rl.driver.runtime.Runtime``), their start-up and their shutdown.

    Learners: ``learner.workers`` data-parallel ``Learner`` actors (``rl.driver.actors.learners.LearnerGroup``);
    ``learner`` is rank 0's handle (weights export, log-probs, checkpoints).
    """

    def __init__(self, cfg: Recipe, model_path: str, out: Path, verbose: bool) -> None:
        self.cfg, self.model_path, self.out, self.verbose = cfg, model_path, out, verbose
        self.pool: Any = None
        self.rewards: Any = None
        self.learners: Any = None
        self.learner: Any = None
        self._own_ray = False
        self._syncs = 0  # weight syncs so far (learner.delta_sync_full_every counts them)
        self.placement: Any = None  # rl.driver.actors.placement.Placement: the run's placement groups
        self.colocated = False
        self._old_term: Any = None
        self.shm_dir = ""
        self.learner_node: str | None = None  # learner rank 0's Ray node: its weights file is there
        self.device = "cpu"  # cpu | gpu, resolved at start
        # learner.weight_sync collective: the weight group's formation (tag; None: to form, again after a learner
        # restart or an engine replacement), the pool's replacement count it was formed at, the last stream
        self._group: tuple[str, int] | None = None
        self._formations = 0
        self._stream = 0
        self._fallbacks = 0  # broken streams redone by file, since the last metrics() (faults/weight_stream_fallbacks)

    def start(self, length_estimate: Callable[[Task], float | None] | None = None) -> None:
        """Connect to (or start) Ray, reserve the placement groups of ``cluster``, start the actors.

        ``length_estimate(task)``: estimated trajectory tokens of a task (the mixer's EMA), used by the
        pool to balance engines; also writes ``placement.json`` (each actor's node) into the output dir.
        """
        from rl.driver.actors.placement import reserve
        from rl.driver.placement import plan_placement, resolve_device
        from rl.trainer.precision import resolve_logged

        cfg = self.cfg
        address = cfg.run.ray_address or os.environ.get("RAY_ADDRESS")
        STARTUP.phase(f"Ray: connecting to {address}" if address else "Ray: starting a local cluster")
        self._init_ray()
        STARTUP.phase("placement: resolving the device and precision, reserving the actors' resources")
        # cluster.device (auto: GPUs when the Ray cluster has any), then one placement group per role,
        # reserved before any actor starts: a cluster that cannot hold them fails here, naming the resources.
        self.device = device = resolve_device(cfg, cluster.cluster_resources().get("GPU", 0.0))
        # r3 needs engine routing: vLLM gives it on a GPU only
        check_replay_engine(cfg.learner, "vllm", device, cfg.rollout.engine_kwargs)
        self.cfg = cfg = resolve_logged(cfg, device)  # `auto` precisions: one timing for learners and engines
        self._prefetch_model()  # a Hub model: into every node's Hub cache before any actor starts
        plan = plan_placement(cfg, device)
        self.colocated = plan.colocated
        self.placement = reserve(plan, cfg.cluster.placement_timeout_s)
        # Weights travel through shared memory; the driver owns the folder so that it goes
        # away on every exit path, even when the learner is busy or dead.
        free_dead_run(self.out / LIVE_FILE, cluster.sweep_on_node)  # what a killed driver of this dir left behind
        self.shm_dir = make_shm_dir("jointrl-run-")  # and what killed drivers of other dirs left
        STARTUP.phase(f"learner: starting {cfg.learner.workers} worker(s)")
        self.learners = self._make_learners()
        STARTUP.phase(f"engines: starting {cfg.rollout.num_engines} vLLM engine(s) on {self.model_path}")
        self.pool = make_rollout_pool(
            cfg,
            self.model_path,
            self.placement.options("engine"),
            length_estimate,
            colocated=plan.colocated,
            dump_stacks=self.dump_stacks,
        )
        specs = reward_specs(cfg.rewards)
        STARTUP.phase(f"rewards: starting {cfg.reward_service.workers} reward worker(s)")
        self.rewards = RewardService(
            specs,
            workers=cfg.reward_service.workers,
            timeout_s=cfg.reward_service.timeout_s,
            actor_options=self.placement.options("reward"),
        )
        STARTUP.phase("learner: loading the model")
        self.learners.ready()
        self._record_placement(device)

    def _make_learners(self) -> Any:
        """The learner group (``learner.workers`` ranks in their placement bundles), each call under the
        recipe's ``faults`` deadlines; stacks of a failed call go to ``stacks/`` in the output dir."""
        from rl.driver.actors.learners import LearnerGroup

        cfg, f = self.cfg, self.cfg.faults
        group = LearnerGroup(
            cfg.learner.workers,
            self.model_path,
            cfg.model,
            cfg.algo,
            shm_dir=self.shm_dir,
            actor_options=self.placement.options("learner"),
            deadlines=Deadlines(f.learner_step_s, f.learner_io_s, f.collective_s),
            stacks_dir=str((self.out / "stacks").resolve()),
            **learner_settings(cfg),
        )
        self.learner = group.actors[0]
        return group

    def dump_stacks(self, why: str) -> str:
        """Every live process of the run (driver, learners, rollout and reward workers, on every node) dumps its
        Python stacks into ``stacks/`` of the output dir, headed by ``why`` (``rl.driver.actors.stacks``)."""
        from rl.driver.actors.stacks import dump_run_stacks

        return dump_run_stacks(str((self.out / "stacks").resolve()), why)

    def restart_learners(self, path: str) -> None:
        """Replace the whole learner group (a rank died or missed a deadline; its stacks are dumped already):
        kill every rank, start new ones in the same placement bundles, load checkpoint ``path``, push its
        weights into the engines. A failure here raises (the run ends)."""
        self.learners.kill(graceful=False)
        self._group = None  # the new rank 0 is no member of the weight group
        self.learners = self._make_learners()
        self.learners.ready()
        self.restore(path)

    def _prefetch_model(self) -> None:
        """A Hub model (``model_path`` is a snapshot in the Hub cache): resolved once on every alive Ray node
        (``rl.driver.actors.cluster.prefetch_on_nodes``), so that actors anywhere find it. A local folder or an
        embedded model is left alone: the actors get that path as it is."""
        from rl.data.hub_cache import hub_cache

        if not Path(self.model_path).resolve().is_relative_to(hub_cache().resolve()):
            return
        folders = cluster.prefetch_on_nodes(self.cfg.model.path, self.cfg.model.revision)
        elsewhere = {node: f for node, f in folders.items() if f != self.model_path}
        if elsewhere:  # the actors get one path: every node's Hub cache must hold the model there
            node, folder = next(iter(elsewhere.items()))
            raise FileNotFoundError(
                f"model.path: Hub model {self.cfg.model.path!r} is at {folder} on node {node}, not at "
                f"{self.model_path} as on the driver; give every node the same HF_HOME / HF_HUB_CACHE"
            )

    def _init_ray(self) -> None:
        """Connect to ``run.ray_address`` (or ``RAY_ADDRESS``) or start a local Ray sized for the plan."""
        from rl.driver.placement import local_gpus, local_ray_cpus, oversubscription, plan_placement

        cfg = self.cfg
        address = cfg.run.ray_address or os.environ.get("RAY_ADDRESS") or None
        if not cluster.is_up():
            cpus = os.cpu_count() or 2
            if not address:
                for w in oversubscription(cfg, cpus, local_gpus()):
                    print(f"jointrl: warning: {w}", file=sys.stderr, flush=True)
            self._own_ray = cluster.init_ray(
                address=address,
                num_cpus=None if address else local_ray_cpus(plan_placement(cfg, "cpu"), cpus, cfg.rollout.num_engines),
                verbose=self.verbose,
                env_vars=_actor_env(self.verbose, (self.out / "stacks").resolve()),
            )
            if address:  # an existing cluster: its resources, not this machine's, bound the placement
                res = cluster.cluster_resources()
                cpus, gpus = int(res.get("CPU", 0)), int(res.get("GPU", 0))
                for w in oversubscription(cfg, cpus, gpus, where="the Ray cluster"):
                    print(f"jointrl: warning: {w}", file=sys.stderr, flush=True)
        # SIGTERM becomes an exception so that `finally` shuts the engines down. Installed after
        # ray.init, whose own handler (print a stack trace, abort) would otherwise replace it.
        self._old_term = signal.signal(signal.SIGTERM, raise_on_term)

    def _record_placement(self, device: str) -> None:
        """``placement.json``: where every actor landed, asked of the actors themselves (docs/cluster.md);
        ``.live.json``: read by the next run in this dir if this driver dies without cleaning up (SIGKILL, OOM)."""
        from rl.driver.actors.placement import actor_nodes

        where = {
            "device": device,
            "placement": self.cfg.cluster.placement,
            "engine": actor_nodes(self.pool.workers),
            "learner": actor_nodes(self.learners.actors),
            "reward": actor_nodes(self.rewards.workers),
        }
        self.learner_node = where["learner"][0]["node_id"]
        self._resolve_weight_sync(device, [e["node_id"] for e in where["engine"]])
        where["weight_sync"] = self.cfg.learner.weight_sync
        for i, e in enumerate(where["engine"]):
            e["weights"] = self.pool.route(i, self.learner_node)  # file (same node) | object_store
            if self.cfg.learner.weight_sync == "collective":
                e["weights"] = "collective"
        (self.out / "placement.json").write_text(json.dumps(where, indent=1) + "\n")
        (self.out / LIVE_FILE).write_text(
            json.dumps({"pid": os.getpid(), "shm_dir": self.shm_dir, "engines": self.pool.shm_owned()}) + "\n"
        )

    def _resolve_weight_sync(self, device: str, engine_nodes: list[str]) -> None:
        """``learner.weight_sync: auto`` made concrete from where the actors landed (:func:`resolve_weight_sync`),
        printed once and written into ``recipe.resolved.yaml`` (which the run dir's readers show)."""
        if self.cfg.learner.weight_sync != "auto":
            return
        choice, why = resolve_weight_sync(self.cfg, device, self.learner_node, engine_nodes)
        self.cfg = dataclasses.replace(self.cfg, learner=dataclasses.replace(self.cfg.learner, weight_sync=choice))
        print(f"jointrl: weight_sync auto: {choice} ({why})", file=sys.stderr, flush=True)
        resolved = self.out / "recipe.resolved.yaml"
        if resolved.is_file():
            import yaml

            d = yaml.safe_load(resolved.read_text()) or {}
            d.setdefault("learner", {})["weight_sync"] = choice
            resolved.write_text(yaml.safe_dump(d, sort_keys=False))

    def generate(
        self, tasks: list[Task], group_ids: list[int], seeds: list[int], sampling: Sampling
    ) -> list[Trajectory]:
        return self.pool.generate(tasks, group_ids, seeds, sampling)

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        return self.rewards.score(trajs)

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One learner step: the batch sharded over the learners, metrics of the whole batch.

        Colocated placement (GPU): the engines sleep (weights offloaded to CPU, KV cache freed)
        while the learners use their GPUs, and wake up after it, before the weight sync.
        """
        if not self.colocated:
            return self.learners.step(batch)
        self._engines("sleep", 1)
        try:
            metrics = self.learners.step(batch)
            self.learners.release_gpu_memory()  # a failed step's learners are killed: their memory goes with them
            return metrics
        finally:
            self._engines("wake_up")

    def _engines(self, method: str, *args: Any) -> None:
        """``sleep`` or ``wake_up`` on every engine, within ``faults.engine_sleep_s``; past it the run ends,
        naming the key (an engine that cannot free or retake its GPU memory is not replaced mid-step)."""
        timeout = self.cfg.faults.engine_sleep_s
        late = engines_call(self.pool.workers, method, args, timeout)
        if late:
            why = f"engine {method}: rollout worker(s) {late} gave no answer within faults.engine_sleep_s={timeout:g} s"
            raise EngineFailure(f"{why}; stacks in {self.dump_stacks(why)}")

    def metrics(self, *, rollout: bool = True) -> dict[str, float]:
        """Since the last call: ``faults/rollout_restarts`` (``rollout``), reward-service restarts and per-function
        errors (``faults/learner_restarts`` is the loop's: ``rl.driver.loop``)."""
        train_side = self.pool.metrics() if rollout else {}
        if rollout and self._fallbacks:
            train_side["faults/weight_stream_fallbacks"], self._fallbacks = float(self._fallbacks), 0
        return train_side | self.rewards.metrics()

    def update_in_flight(self, sync: Callable[[], None] | None = None, version: int | None = None) -> None:
        """Partial rollouts (``rollout.partial_rollouts``): new weights while ``generate`` runs on another thread.
        Every engine is interrupted (unfinished turns keep their tokens; env calls go on), ``sync()`` loads the
        weights (default ``sync_weights``), then the turns resume on them as policy ``version`` (None: each
        engine's count of weight loads); resumed even when ``sync`` raises. An engine that does not stop within
        ``faults.engine_call_s`` raises. The one-step-off stream's wiring, in ``EpisodeStream.weights_updated``
        instead of waiting for the generation: ``self.pool.update_in_flight(self._push, self.learner_version)``."""
        self.pool.interrupt(self.cfg.faults.engine_call_s)
        try:
            (sync or self.sync_weights)()
        finally:
            self.pool.resume(version)

    def sync_weights(self) -> None:
        """The policy into every engine: merged weights (a safetensors file, or with ``learner.weight_sync: ipc``
        each learner rank's GPU buffer mapped by the engine on its GPU, or with ``collective`` a bucketed
        broadcast from learner rank 0) or, with ``learner.lora.transfer: adapter``, the LoRA adapter alone (a
        ``peft`` folder)."""

        if self.cfg.learner.weight_sync == "ipc":  # colocated: engine i maps learner rank i's GPU buffer
            self.pool.sync_weights_ipc(self.learners.export_ipc(self.cfg.model.engine_dtype))
            return
        if self.cfg.learner.weight_sync == "collective":
            self._sync_collective()
            return
        self._sync_file()

    def _sync_file(self) -> None:
        """The file transport (also the collective's fallback for one sync): rank 0's export in its node's
        shared memory, read there, sent through the object store to engines elsewhere."""
        adapter = self.cfg.learner.lora.engine_rank > 0
        if adapter:
            path = self.learners.export_adapter()  # every rank: A, B gathered
        else:
            path = self.learners.export_weights(self.cfg.model.engine_dtype)  # every rank: the shards are gathered
        # Engines on the learner's node read the file (folder) in shared memory; others get its bytes
        # through Ray's object store (one copy per node), written to their own shared memory, or, with
        # learner.delta_sync_full_every N, only the changed entries except on every N-th sync.
        n, self._syncs = self.cfg.learner.delta_sync_full_every, self._syncs + 1
        delta = n > 0 and not adapter and (self._syncs - 1) % n != 0
        self.pool.sync_weights(
            path,
            self.learner_node,
            lambda: self.learners.read_weights_ref(path),
            adapter=adapter,
            delta=(lambda: self.learners.read_weights_ref(path, delta=True)) if delta else None,
        )

    def _sync_collective(self) -> None:
        """``learner.weight_sync: collective``: learner rank 0 broadcasts the merged weights in buckets of
        ``learner.weight_bucket_mb`` to every engine's worker through the weight group (``rollout.collective``),
        formed first when there is none or its members changed. A replaced engine loads the learner's file
        export through the object store as it starts, and the group is re-formed before the next stream.

        An engine lost mid-stream (or a broadcast past ``faults.collective_s``) does not end the run: the
        learner's broadcast fails (:class:`rollout.collective.BucketSender` walks the export to its end so that
        its sharded ranks stay in step, and closes its membership, so the other engines' waits fail at once),
        the pool replaces the dead engine (``faults/rollout_restarts``), and this sync is redone by file to every
        engine (``faults/weight_stream_fallbacks``); the next sync forms the group again."""
        if (self._group is None or self._group[1] != self.pool.replaced) and not self._form_weight_group():
            return
        assert self._group is not None
        dtype, tag = self.cfg.model.engine_dtype, self._group[0]
        self._stream += 1
        version, bucket = self._stream, bucket_bytes(self.cfg.learner.weight_bucket_mb)
        why = self._collective_call(
            [CollectiveWeights(version, tag)] * len(self.pool.workers),
            lambda: self.learners.export_collective(dtype, version, bucket),
            lambda: self.learners.read_weights_ref(self.learners.export_weights(dtype)),
        )
        if why:
            self._stream_fallback(f"weight stream {version}", why)

    def _collective_call(self, updates: list[Any], learner_side: Callable[[], Any], fallback: Any) -> str:
        """``pool.stream_weights`` (a formation or a stream); why it broke, or "": the learner side answered
        ``JoinFailed`` or a stream marked ``broken``, an engine was replaced meanwhile (it is no member), or a
        surviving engine's end raised. No engine left to replace (``EngineFailure``) or a learner rank lost
        (``LearnerFailure``) are raised: the run's own fault paths."""
        replaced, answers = self.pool.replaced, []

        def side() -> Any:
            answers.append(learner_side())
            return answers[-1]

        try:
            self.pool.stream_weights(updates, side, fallback)
        except (EngineFailure, LearnerFailure):
            raise
        except Exception as e:  # noqa: BLE001 - a surviving engine's end of a broken group
            return f"an engine's end failed: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1][:300]}"
        got = answers[0] if answers else None
        if isinstance(got, JoinFailed):
            return f"learner rank 0 could not form the group: {got.why}"
        if getattr(got, "broken", ""):
            return f"learner rank 0's broadcast failed: {got.broken}"
        return "an engine was replaced meanwhile" if self.pool.replaced != replaced else ""

    def _stream_fallback(self, what: str, why: str) -> None:
        """``what`` (a stream, or the group's formation) broke (``why``): the group is dropped (formed again at
        the next sync) and every engine gets this sync's weights by file, so none serves a torn stream's weights."""
        log.warning("%s broke (%s); this sync goes by file, the weight group is formed again", what, why)
        self._group = None
        self._fallbacks += 1
        self._sync_file()

    def _form_weight_group(self) -> bool:
        """Learner rank 0 (member 0, the rendezvous on a free port of its node) and engine i's worker (member
        i + 1) join a new weight group: gloo on CPU, NCCL on GPU, broadcasts waiting ``faults.collective_s``.
        False where the formation broke (a member died first): this sync went by file instead."""
        self._formations += 1
        replaced = self.pool.replaced
        addr, port = self.learners.weight_group_address()
        world, backend = len(self.pool.workers) + 1, "nccl" if self.device == "gpu" else "gloo"
        tag = f"{os.getpid()}-{self._formations}"

        def member(rank: int) -> CollectiveJoin:
            return CollectiveJoin(addr, port, rank, world, backend, float(self.cfg.faults.collective_s), tag)

        why = self._collective_call(
            [member(i + 1) for i in range(len(self.pool.workers))],
            lambda: self.learners.join_weight_group(member(0)),
            None,
        )
        if why:
            self._stream_fallback(f"weight group {tag}", why)
            return False
        self._group = (tag, replaced)
        return True

    def save(self, path: str, wait: bool = True, export: bool = False) -> None:
        from rl.driver.runtime import export_dtype

        self.learners.save_checkpoint(path, wait, export_dtype(self.cfg.model.engine_dtype) if export else None)

    def restore(self, path: str) -> None:
        self.learners.load_checkpoint(path)
        self.sync_weights()

    def stop(self) -> None:
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
            if self._own_ray:
                cluster.shutdown()
            if self._old_term is not None:
                signal.signal(signal.SIGTERM, self._old_term)


def resolve_weight_sync(cfg: Recipe, device: str, learner_node: str | None, engine_nodes: list[str]) -> tuple[str, str]:
    """``learner.weight_sync: auto``: (``collective`` | ``file``, why). Collective where an engine sits on another
    node than learner rank 0 (the file path would carry every byte through Ray's object store and each node's
    heap) and the run is on CPU, where the gloo path has run end to end. File otherwise: engines on the learner's
    node read its shared-memory file in place; on GPU the NCCL path has never run, so it is not chosen for the
    user; and where collective is refused (``cluster.engine_tp`` > 1, ``lora.transfer adapter``) or delta sync
    (``learner.delta_sync_full_every``, file only) is asked for."""
    remote = sum(1 for n in engine_nodes if n != learner_node)
    if not remote:
        return "file", "every engine is on learner rank 0's node"
    lr = cfg.learner
    if device != "cpu":
        return "file", f"{remote} engine(s) on other nodes, but on GPU collective (NCCL) has not run yet"
    if cfg.cluster.engine_tp != 1 or lr.lora.engine_rank > 0 or lr.delta_sync_full_every:
        return "file", "engine_tp > 1, lora.transfer adapter or delta_sync_full_every rule collective out"
    return "collective", f"{remote} engine(s) on other nodes than learner rank 0; gloo on CPU"


def make_rollout_pool(
    cfg: Recipe,
    model_path: str,
    actor_options: list[dict[str, Any]],
    length_estimate: Callable[[Task], float | None] | None,
    *,
    colocated: bool,
    dump_stacks: Callable[[str], Any] | None = None,
) -> RolloutPool:
    """The run's ``rollout.num_engines`` rollout workers, each with its placement ``actor_options``.

    ``rollout.max_restarts``: how often one call replaces a dead worker before it gives up; ``dump_stacks(why)``:
    run before a worker past ``faults.engine_call_s`` (or whose engine died) is replaced.
    """
    r = cfg.rollout
    return RolloutPool(
        r.num_engines,
        model_path,
        [(e.domain, e.cls, dict(e.kwargs)) for e in r.envs],
        actor_options=actor_options,
        length_estimator=length_estimate,
        max_restarts=r.max_restarts,
        dtype=cfg.model.engine_dtype,
        seed=cfg.run.seed,
        max_model_len=r.max_model_len,
        kv_cache_gib=r.kv_cache_gib,
        gpu_memory_utilization=r.gpu_memory_utilization,
        tensor_parallel_size=cfg.cluster.engine_tp,
        enable_sleep_mode=colocated,
        call_timeout_s=cfg.faults.engine_call_s,
        engine_kwargs=dict(r.engine_kwargs) | engine_routing_kwargs(cfg.learner),
        lora_rank=cfg.learner.lora.engine_rank,
        stops=r.stops(),
        env_workers=r.env_workers,
        tools_in_prompt=r.tools_in_prompt,
        partial_rollouts=r.partial_rollouts,
        dump_stacks=dump_stacks,
    )


def _actor_env(verbose: bool, stacks_dir: Path) -> dict[str, str]:
    """Env vars every actor process needs (Ray sets OMP_NUM_THREADS=1 for fractional-CPU actors);
    ``JOINTRL_STACKS_DIR``: where each registers its stack dump (``envs.stacks.register``)."""
    env = {
        STACKS_ENV: str(stacks_dir),
        "OMP_NUM_THREADS": str(os.cpu_count() or 1),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # needed to run our reload function in vLLM workers
        "JOINTRL_CACHE": os.environ.get("JOINTRL_CACHE", ""),
        "JOINTRL_IMAGE_CACHE": os.environ.get("JOINTRL_IMAGE_CACHE", ""),  # Harbor images: the driver built them there
        # User reward/env modules importable on the driver must import in the actors too.
        "PYTHONPATH": os.pathsep.join(
            p for p in [os.environ.get("PYTHONPATH", ""), *sys.path] if p and os.path.isdir(p)
        ),
        "PYTHONWARNINGS": "ignore",
    }
    if verbose:
        env["JOINTRL_VERBOSE"] = "1"
    return {k: v for k, v in env.items() if v}


def score_on_ray(
    specs: list[RewardFnSpec], trajs: list[Trajectory], workers: int, timeout_s: float, verbose: bool
) -> tuple[list[Trajectory], StatsTable, dict[str, Any]]:
    """``jointrl score --workers N``: ``trajs`` scored by a ``RewardService`` of ``workers`` Ray actors (Ray started
    here unless it is up already, and stopped again); the scored trajectories, the per-(domain, fn) counts, and
    the service's restarts and worker errors."""
    env = {
        "PYTHONPATH": os.pathsep.join(
            p for p in [os.environ.get("PYTHONPATH", ""), *sys.path] if p and os.path.isdir(p)
        ),
        "PYTHONWARNINGS": "ignore",
    }
    own = cluster.init_ray(address=None, num_cpus=max(2, os.cpu_count() or 2), verbose=verbose, env_vars=env)
    service = None
    try:
        service = RewardService(specs, workers=workers, timeout_s=timeout_s)
        out = service.score(trajs)
        stats = service.take_stats()
        m = service.metrics()
        restarts, errors = int(m["reward/service/restarts"]), int(m["reward/service/worker_errors"])
        return out, stats, {"service": {"workers": workers, "restarts": restarts, "worker_errors": errors}}
    finally:
        if service is not None:
            service.shutdown()
        if own:
            cluster.shutdown()
