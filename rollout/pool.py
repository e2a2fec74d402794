"""Rollout workers (one vLLM engine + envs each) and the pool that spreads tasks over them.

``RolloutWorker`` is a plain class that tests run in-process; ``RolloutPool`` wraps N of
them as Ray actors. A pool call keeps each GRPO group on one engine (the group shares its
prompt, so the engine's prefix cache serves it once) and returns trajectories in the order
of the input. ``sync_weights`` pushes a safetensors file (written by the learner into
shared memory) into every engine, or with ``adapter=True`` a LoRA adapter folder. Engines are shut down explicitly in ``shutdown()``;
otherwise each leaks ~420 MB of /dev/shm.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Callable

from envs.actors import ActorGroup, GroupOwner, actor_died, ray_factory
from envs.base import resolve
from envs.stacks import child_stacks
from envs.stacks import register as register_stacks
from envs.types import Sampling, Task, Trajectory
from rollout.engine import VLLMEngine
from rollout.reaper import descendants, reap, stamped
from rollout.episode import run_episodes
from rollout.tools_prompt import check_mode

log = logging.getLogger("jointrl.rollout")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


class RolloutWorker:
    """One engine plus the env classes of each domain. Not thread-safe."""

    def __init__(
        self,
        model_path: str,
        env_specs: list[tuple[str, str, dict[str, Any]]],
        *,
        dtype: str = "bfloat16",
        seed: int = 0,
        max_model_len: int = 2048,
        kv_cache_gib: float = 1.0,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        engine_kwargs: dict[str, Any] | None = None,
        lora_rank: int = 0,
        engine: Any = None,
        stops: dict[str, list[str]] | None = None,
        env_workers: int = 0,
        tools_in_prompt: str = "auto",
    ) -> None:
        """``engine``: an engine object to use instead of starting a ``VLLMEngine`` (the in-process runtime
        passes a ``rollout.hf_engine.HFEngine``); the engine keyword arguments are then unused.
        ``lora_rank`` > 0: the engine serves the learner's LoRA adapter (``load_adapter``).
        ``stops[domain]``: strings that end a policy turn of that domain (``rollout.envs[].stop``).
        ``env_workers``: env calls run on up to this many threads at once (``rollout.env_workers``;
        0 = one per CPU this process may run on). ``tools_in_prompt``: how tool schemas reach the prompt
        (``rollout.tools_in_prompt``, :mod:`rollout.tools_prompt`); ``template`` with a chat template that
        does not render tools raises ``ValueError`` here, before any rollout."""
        from transformers import AutoTokenizer

        register_stacks("rollout_worker")  # SIGUSR1 -> this process's stacks in the run's stacks/ (a hung call)
        self.envs = {domain: (resolve(cls), dict(kwargs)) for domain, cls, kwargs in env_specs}
        self.stops = dict(stops or {})
        self.env_workers = env_workers or usable_cpus()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        check_mode(self.tokenizer, tools_in_prompt)
        self.tools_in_prompt = tools_in_prompt
        # vLLM's engine core and the other Python processes started with the engine register their stack dumps too
        with child_stacks("engine_proc"):
            self.engine = (
                engine
                if engine is not None
                else VLLMEngine(
                    model_path,
                    dtype=dtype,
                    seed=seed,
                    max_model_len=max_model_len,
                    kv_cache_gib=kv_cache_gib,
                    gpu_memory_utilization=gpu_memory_utilization,
                    tensor_parallel_size=tensor_parallel_size,
                    enable_sleep_mode=enable_sleep_mode,
                    engine_kwargs=engine_kwargs,
                    lora_rank=lora_rank,
                )
            )
        # Where weights that arrive through the object store (learner on another node) are put.
        self._blob = (
            f"/dev/shm/jointrl-weights-{os.getpid()}.safetensors"
            if os.path.isdir("/dev/shm")
            else os.path.join(tempfile.gettempdir(), f"jointrl-weights-{os.getpid()}.safetensors")
        )
        # The engine core's shared-memory segments (~420 MB on CPU) and that file, and the engine's
        # processes: if this process is killed nobody unlinks them, so the pool does it on this node
        # after the death (``free_dead_engine``), killing whatever of the engine outlived it first.
        self._shm = (shm_segments(os.getpid()) if engine is None else []) + [self._blob]
        self._procs = stamped(descendants(os.getpid())) if engine is None else []
        self._adapter_seq = 0  # adapter folders received from another node (load_adapter_blob)

    def _make_env(self, domain: str) -> Any:
        if domain not in self.envs:
            raise KeyError(f"no env configured for domain {domain!r} (rollout.envs has {sorted(self.envs)})")
        cls, kwargs = self.envs[domain]
        return cls(**kwargs)

    def generate(
        self, tasks: list[Task], group_ids: list[int], seeds: list[int], sampling: Sampling
    ) -> list[Trajectory]:
        return run_episodes(
            self.engine,
            self.tokenizer,
            self._make_env,
            tasks,
            group_ids,
            seeds,
            sampling,
            self.stops,
            env_workers=self.env_workers,
            tools_in_prompt=self.tools_in_prompt,
        )

    def load_weights(self, path: str) -> None:
        self.engine.load_weights(path)

    def load_weights_ipc(self, update: dict[str, Any]) -> None:
        """Weights from a learner rank on this engine's GPU (``Learner.export_ipc``), mapped, not copied."""
        self.engine.load_weights_ipc(update)

    def load_weights_blob(self, blob: bytes) -> None:
        """Weights as the bytes of a safetensors file (sent through Ray's object store from a learner on
        another node): written to this node's shared memory, then loaded like a local file."""
        tmp = self._blob + ".tmp"
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, self._blob)
        self.engine.load_weights(self._blob)

    def load_adapter(self, path: str) -> None:
        """Serve the LoRA adapter folder ``path`` (the learner's ``export_adapter``) over the base weights."""
        self.engine.load_adapter(path)

    def load_adapter_blob(self, files: dict[str, bytes]) -> None:
        """An adapter folder as ``{file name: bytes}`` (from a learner on another node): written to a new
        folder on this node (the previous one removed), then loaded like a local folder."""
        self._adapter_seq += 1
        folder = f"{self._blob}.adapter-{self._adapter_seq}"
        os.makedirs(folder, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(folder, os.path.basename(name)), "wb") as f:
                f.write(data)
        self.engine.load_adapter(folder)
        shutil.rmtree(f"{self._blob}.adapter-{self._adapter_seq - 1}", ignore_errors=True)

    def score(self, prompt: list[int], continuation: list[int]) -> list[float]:
        return self.engine.score(prompt, continuation)

    def sleep(self, level: int = 1) -> None:
        self.engine.sleep(level)

    def wake_up(self) -> None:
        self.engine.wake_up()

    def pid(self) -> int:
        return os.getpid()

    def health(self) -> str | None:
        """None while this worker's engine can serve, else why not. The pool calls it in the ``health``
        concurrency group (its own thread) while ``generate`` runs: the death check of a call in flight."""
        alive = getattr(self.engine, "alive", None)
        return alive() if alive is not None else None

    def engine_pids(self) -> list[int]:
        """Process ids of this worker's engine core processes (tests kill them to inject faults)."""
        return [p.pid for p in getattr(self.engine, "_core_procs", [])]

    def placement(self) -> tuple[str, list[str], list[tuple[int, int]]]:
        """This worker's Ray node id, the /dev/shm segments its engine maps, and its engine's processes
        as ``(pid, start time)`` (what ``free_dead_engine`` needs once this process is dead)."""
        import ray

        return ray.get_runtime_context().get_node_id(), self._shm, self._procs

    def shutdown(self) -> None:
        try:
            self.engine.shutdown()
        finally:
            if os.path.exists(self._blob):
                os.unlink(self._blob)
            for folder in glob.glob(self._blob + ".adapter-*"):  # adapters received from another node
                shutil.rmtree(folder, ignore_errors=True)


class EngineFailure(RuntimeError):
    """A rollout worker kept dying: more than ``max_restarts`` replacements within one call."""


# The calls that give a worker the latest synced weights (a replaced worker makes its own on start).
LOAD_CALLS = ("load_weights", "load_weights_blob", "load_adapter", "load_adapter_blob")


class EngineUnresponsive(RuntimeError):
    """A rollout worker whose engine died under it, or that stopped answering: it is replaced like a dead one."""


class RolloutPool(GroupOwner):
    """N ``RolloutWorker`` Ray actors. Requires ``ray.init`` to have run.

    Fault tolerance: a worker whose process (or vLLM engine core) dies during ``generate``
    or ``sync_weights`` is replaced by a fresh actor with the same options, which loads the
    latest synced weights; its in-flight prompts are re-issued (same seeds, so the samples
    are those the dead engine would have drawn). ``restarts`` counts replacements; each call
    re-issues a shard at most ``max_restarts`` times before raising. Spawning, replacing and
    counting are ``envs.actors.ActorGroup``'s (shared with the reward and learner groups); the
    death check, the shared-memory sweep and the re-issue are this pool's.

    Every call has a deadline and a death check: while a call is in flight the pool probes
    each busy worker every ``probe_every_s`` (``RolloutWorker.health``, in its own actor
    thread); a worker whose engine core process died (vLLM's client would wait forever), that
    does not answer the probe within ``probe_timeout_s``, or whose call runs past
    ``call_timeout_s`` is replaced and its prompts re-issued, as if its actor had died.
    Starting a worker has ``start_timeout_s``.
    """

    def __init__(
        self,
        n: int,
        model_path: str,
        env_specs: list[tuple[str, str, dict[str, Any]]],
        num_cpus: float = 0.5,
        num_gpus: float = 0,
        max_restarts: int = 2,
        actor_options: list[dict[str, Any]] | None = None,
        length_estimator: Callable[[Task], float | None] | None = None,
        *,
        call_timeout_s: float = 3600.0,
        probe_every_s: float = 5.0,
        probe_timeout_s: float = 60.0,
        start_timeout_s: float = 900.0,
        worker_cls: type | None = None,
        dump_stacks: Callable[[str], Any] | None = None,
        **worker_kwargs: Any,
    ) -> None:
        """``actor_options``: one dict of Ray actor options per worker (e.g. ``rl.driver.placement.Placement.options``:
        its CPU/GPU share and placement-group bundle), replacing ``num_cpus``/``num_gpus``; a replaced worker
        gets the same. ``length_estimator(task)``: estimated trajectory tokens of one sample (None: unknown),
        used to balance engines (``plan_shards``); default ``task.meta["est_len"]``. ``worker_cls``: the
        worker class (default ``RolloutWorker``; tests pass stand-ins without an engine). ``dump_stacks(why)``:
        called before a worker that missed its deadline or whose engine died under it is replaced (the run's
        stack dump of every process, while the hung one is still there to dump)."""
        import ray

        self.dump_stacks = dump_stacks
        self.length_estimator = length_estimator
        self.call_timeout_s, self.probe_every_s = call_timeout_s, probe_every_s
        self.probe_timeout_s, self.start_timeout_s = probe_timeout_s, start_timeout_s
        self.max_restarts = max_restarts
        self._weights: dict[str, Any] | None = None  # the latest sync (file, its node, bytes), for replacements
        self._closing = False
        # Per worker, read at each (re)spawn: a replacement starts with its predecessor's arguments.
        self._kwargs = [{**worker_kwargs, "seed": worker_kwargs.get("seed", 0) + i} for i in range(n)]
        # The "health" group is a second thread in each actor: its probe answers while generate is blocked.
        factory = ray_factory(
            worker_cls or RolloutWorker,
            {"num_cpus": num_cpus, "num_gpus": num_gpus, "concurrency_groups": {"health": 1}},
            (model_path, env_specs),
            lambda i: self._kwargs[i],
        )
        self.group = ActorGroup(
            n, factory, metric="faults/rollout_restarts", options=actor_options, what="rollout workers"
        )
        # Surface start-up errors (bad model, vLLM failure) here rather than at the first generate.
        self._placement = ray.get([w.placement.remote() for w in self.workers], timeout=start_timeout_s)

    def _replace(self, i: int, why: BaseException) -> None:
        """Kill worker ``i`` (whatever is left of it) and start a fresh one with the latest weights."""
        import ray

        reason = f"{type(why).__name__}: {str(why).splitlines()[0][:200] if str(why) else ''}"
        log.warning("rollout worker %d died (%s); restarting it", i, reason)
        self.group.retire(i, reason)
        self._free([i])
        self.group.respawn(i)
        self._placement[i] = ray.get(self.workers[i].placement.remote(), timeout=self.start_timeout_s)
        if self._weights is not None:
            m, args = self._load_job(i)
            ray.get(getattr(self.workers[i], m).remote(*args), timeout=self.start_timeout_s)

    def _free(self, workers: list[int]) -> None:
        """Kill what is left of the engines of ``workers`` (dead or killed) and unlink their shared memory,
        each on its own node (skipped if the node is gone). Both are no-ops for an engine shut down cleanly."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        sweep, refs = ray.remote(num_cpus=0)(free_dead_engine), {}
        for i in workers:
            node, segments, procs = self._placement[i]
            if segments or procs:
                on_node = NodeAffinitySchedulingStrategy(node, soft=False)
                refs[i] = sweep.options(scheduling_strategy=on_node).remote(segments, procs, 30.0)
        for i, ref in refs.items():
            try:
                left = ray.get(ref, timeout=90)
            except Exception as e:  # noqa: BLE001 - a leak is logged, never fatal
                left = f"{type(e).__name__}: {e}"
            if left:
                log.warning("rollout worker %d: could not free its engine's shared memory: %s", i, left)

    def _call(self, jobs: dict[int, tuple[str, tuple[Any, ...]]]) -> dict[int, Any]:
        """Run ``jobs`` (worker index -> method name, args) concurrently; replace and re-issue dead ones."""
        import ray

        out: dict[int, Any] = {}
        attempts = dict.fromkeys(jobs, 0)
        pending = {i: self._issue(i, jobs[i]) for i in jobs}
        while pending:
            ready, _ = ray.wait([ref for ref, _ in pending.values()], num_returns=1, timeout=self.probe_every_s)
            if ready:
                i = next(i for i, (ref, _) in pending.items() if ref == ready[0])
                try:
                    out[i] = ray.get(ready[0])
                    del pending[i]
                    continue
                except BaseException as e:  # noqa: BLE001 - sorted out by _engine_died
                    if not _engine_died(e) or self._closing:  # shutting down: a killed worker is no fault
                        raise
                    failed: dict[int, BaseException] = {i: e}
            else:
                failed = self._probe(pending)
                if failed and self.dump_stacks is not None:
                    self.dump_stacks("; ".join(f"rollout worker {i}: {e}" for i, e in sorted(failed.items())))
            for i, e in failed.items():
                if attempts[i] >= self.max_restarts:
                    raise EngineFailure(
                        f"rollout worker {i} died {attempts[i] + 1} times in one call; giving up "
                        f"(last error: {type(e).__name__}: {str(e).splitlines()[0][:300]})"
                    ) from e
                attempts[i] += 1
                self._replace(i, e)
                if jobs[i][0] in LOAD_CALLS:  # the replacement loaded the newest as it started
                    out[i] = None
                    del pending[i]
                else:
                    pending[i] = self._issue(i, jobs[i])
        return out

    def _issue(self, i: int, job: tuple[str, tuple[Any, ...]]) -> tuple[Any, float]:
        """Start ``job`` on worker ``i``: its ObjectRef and its deadline (monotonic seconds)."""
        m, a = job
        return getattr(self.workers[i], m).remote(*a), time.monotonic() + self.call_timeout_s

    def _probe(self, pending: dict[int, tuple[Any, float]]) -> dict[int, BaseException]:
        """The death check of calls in flight: the busy workers that are past their deadline, whose engine
        died, or that did not answer the health probe in ``probe_timeout_s`` (-> why, for ``_replace``)."""
        import ray
        from ray.exceptions import GetTimeoutError

        now, failed = time.monotonic(), {}
        probes = {i: self.workers[i].health.options(concurrency_group="health").remote() for i in pending}
        for i, probe in probes.items():
            if now > pending[i][1]:
                failed[i] = EngineUnresponsive(f"call ran past rollout call_timeout_s={self.call_timeout_s:g}")
                continue
            try:
                why = ray.get(probe, timeout=self.probe_timeout_s)
            except GetTimeoutError:
                why = f"no answer to the health probe within {self.probe_timeout_s:g} s"
            except BaseException as e:  # noqa: BLE001 - a dead actor: its call's ref says so next round
                if not _engine_died(e):
                    raise
                continue
            if why is not None:
                failed[i] = EngineUnresponsive(why)
        return failed

    def generate(
        self, tasks: list[Task], group_ids: list[int], seeds: list[int], sampling: Sampling
    ) -> list[Trajectory]:
        """Episodes for ``tasks`` (in order); whole groups go to one engine, engines balanced by estimated
        tokens (``plan_shards``)."""
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(group_ids):
            groups.setdefault(g, []).append(i)
        members = list(groups.values())
        est = [estimate_length(tasks[idxs[0]], sampling, self.length_estimator) for idxs in members]
        shards = [
            sorted(i for g in plan for i in members[g])
            for plan in plan_shards([len(m) for m in members], est, len(self.workers))
        ]
        jobs = {
            w: (
                "generate",
                ([tasks[i] for i in shard], [group_ids[i] for i in shard], [seeds[i] for i in shard], sampling),
            )
            for w, shard in enumerate(shards)
            if shard
        }
        res = self._call(jobs)
        out: list[Trajectory | None] = [None] * len(tasks)
        for w, trajs in res.items():
            for i, traj in zip(shards[w], trajs):
                out[i] = traj
        return out  # type: ignore[return-value]

    def sleep(self, level: int = 1) -> None:
        """Put every engine to sleep (colocated placement, GPU: frees the GPU for the learner step)."""
        import ray

        ray.get([w.sleep.remote(level) for w in self.workers])

    def wake_up(self) -> None:
        """Wake every engine after ``sleep``."""
        import ray

        ray.get([w.wake_up.remote() for w in self.workers])

    def sync_weights(
        self,
        path: str,
        source_node: str | None = None,
        fetch: Callable[[], Any] | None = None,
        *,
        adapter: bool = False,
    ) -> None:
        """Load the weights file ``path`` into every engine (``adapter``: the LoRA adapter folder ``path``).

        ``path`` is on node ``source_node`` (None: every engine can read it). An engine on
        another node gets the file's bytes (an adapter: ``{file name: bytes}``) through Ray's object
        store instead: ``fetch()`` returns an ObjectRef of them, made once per sync, and pulled by
        each remote engine's node.
        """
        # Recorded first: a worker replaced during this call loads the newest weights as it starts.
        self._weights = {"path": path, "node": source_node, "fetch": fetch, "ref": None, "adapter": adapter}
        self._call({i: self._load_job(i) for i in range(len(self.workers))})

    def sync_weights_ipc(self, updates: list[dict[str, Any]]) -> None:
        """Each engine i maps learner rank i's CUDA IPC export (``learner.weight_sync: ipc``: engine i and learner
        worker i share a GPU in the colocated placement)."""
        if len(updates) != len(self.workers):
            raise ValueError(
                f"{len(updates)} learner exports for {len(self.workers)} engines: ipc pairs them one to one"
            )
        self._weights = {"ipc": updates}  # recorded first: a replacement maps the same buffer as it starts
        self._call({i: self._load_job(i) for i in range(len(self.workers))})

    def _load_job(self, i: int) -> tuple[str, tuple[Any, ...]]:
        """The call that gives worker ``i`` the latest synced weights: its learner rank's CUDA IPC export, a file
        path, or the bytes' ObjectRef."""
        w = self._weights
        assert w is not None
        if "ipc" in w:
            return "load_weights_ipc", (w["ipc"][i],)
        kind = "load_adapter" if w.get("adapter") else "load_weights"
        if self.route(i, w["node"]) == "file":
            return kind, (w["path"],)
        if w["ref"] is None:
            if w["fetch"] is None:
                raise ValueError(
                    f"rollout worker {i} is on another node than the weights file {w['path']}; sync_weights needs fetch"
                )
            w["ref"] = w["fetch"]()
        return f"{kind}_blob", (w["ref"],)

    def route(self, i: int, source_node: str | None) -> str:
        """How worker ``i`` receives weights from a learner on ``source_node``: ``file`` or ``object_store``."""
        return "file" if source_node is None or self._placement[i][0] == source_node else "object_store"

    def score(self, prompt: list[int], continuation: list[int]) -> list[list[float]]:
        res = self._call({i: ("score", (prompt, continuation)) for i in range(len(self.workers))})
        return [res[i] for i in range(len(self.workers))]

    def shm_owned(self) -> list[tuple[str, list[str]]]:
        """Per worker: its node id and the /dev/shm segments its engine maps."""
        return [(node, list(segs)) for node, segs, _ in self._placement]

    def pids(self) -> list[int]:
        """Process id of each worker (tests kill them to inject faults)."""
        return [r for _, r in sorted(self._call({i: ("pid", ()) for i in range(len(self.workers))}).items())]

    def metrics(self) -> dict[str, float]:
        """``faults/rollout_restarts`` since the last call (then reset)."""
        return self.group.metrics()

    def shutdown(self) -> None:
        import ray

        self._closing = True
        unclean = []
        for i, w in enumerate(self.workers):
            try:
                ray.get(w.shutdown.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead actor has nothing left to shut down
                unclean.append(i)
        self.group.kill_all()
        # A worker that could not shut its engine down (dead, or past the timeout and killed above)
        # leaves the engine's processes and /dev/shm segments behind: free them on its node.
        self._free(unclean)


def _engine_died(e: BaseException) -> bool:
    """True for a dead worker process or a dead vLLM engine core inside a live worker."""
    from ray.exceptions import RayTaskError

    if actor_died(e):
        return True
    if isinstance(e, RayTaskError):
        names = {c.__name__ for c in type(e).__mro__} | {type(getattr(e, "cause", None)).__name__}
        return "EngineDeadError" in names or "EngineDeadError" in str(e)
    return False


def shm_segments(pid: int) -> list[str]:
    """/dev/shm files mapped by the descendants of process ``pid`` (Linux /proc; [] elsewhere)."""
    found: set[str] = set()
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/maps") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                        found.add(parts[5])
        except OSError:
            continue
    return sorted(found)


def free_dead_engine(paths: list[str], procs: list[tuple[int, int]], wait_s: float = 0.0) -> list[str]:
    """What a dead rollout worker's engine left on this node: SIGKILL each of ``procs`` (``(pid, start
    time)``, recorded at its start) still running with that start time, with its descendants, then unlink
    ``paths`` once nothing maps them (waiting up to ``wait_s``). Returns the paths still left ([]: freed).

    The worker's reaper (``rollout.reaper``) kills the engine core too, but only its descendants as they are
    when it acts: a core that exits first leaves its own worker process orphaned, holding the segments."""
    reap(procs)
    unlink_unmapped(paths, wait_s)
    return [p for p in paths if os.path.exists(p)]


def unlink_unmapped(paths: list[str], wait_s: float = 0.0) -> list[str]:
    """Unlink each of ``paths`` that no live process on this node maps or holds open; return those removed.

    ``wait_s``: how long to wait for processes still using some of them to exit (the engine
    processes of a killed run die on their own, seconds after their parent).
    """
    deadline = time.monotonic() + wait_s
    removed: list[str] = []
    todo = {p for p in paths if os.path.exists(p)}
    while todo:
        busy = _in_use(todo)
        for p in sorted(todo - busy):
            try:
                os.unlink(p)
                removed.append(p)
            except OSError:
                pass
        todo = {p for p in busy if os.path.exists(p)}
        if not todo or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return removed


def _in_use(paths: set[str]) -> set[str]:
    """Those of ``paths`` some process on this node maps or holds open."""
    in_use: set[str] = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/maps") as f:
                in_use |= {ln.split()[-1] for ln in f if "/dev/shm/" in ln} & paths
            for fd in os.listdir(f"/proc/{d}/fd"):
                try:
                    t = os.readlink(f"/proc/{d}/fd/{fd}")
                except OSError:
                    continue
                if t in paths:
                    in_use.add(t)
        except OSError:
            continue
    return in_use


def estimate_length(task: Task, sampling: Sampling, estimator: Callable[[Task], float | None] | None = None) -> float:
    """Estimated trajectory tokens of one sample of ``task``: ``estimator(task)`` when it knows (the
    driver passes the mixer's per-task length EMA), else ``task.meta["est_len"]``, else the sampling
    budget ``max_new_tokens x max_turns``; never more than ``max_model_len``."""
    est = estimator(task) if estimator is not None else None
    if not (isinstance(est, (int, float)) and est > 0):
        prior = task.meta.get("est_len") if isinstance(task.meta, dict) else None
        est = prior if isinstance(prior, (int, float)) and not isinstance(prior, bool) and prior > 0 else None
    if est is None:
        est = sampling.max_new_tokens * max(1, sampling.max_turns)
    return float(min(est, sampling.max_model_len))


def plan_shards(group_sizes: list[int], est_lengths: list[float], n_engines: int) -> list[list[int]]:
    """Group indices for each of ``n_engines`` engines, balancing estimated token work. Pure.

    A group's work is ``size x est_length`` (its samples decode side by side on one engine,
    which keeps the shared prompt in its prefix cache). Longest-processing-time first:
    groups in decreasing work (ties: lower index first) each go to the engine with the least
    work so far (ties: lower engine index), so engines finish close together: the largest
    load is at most 4/3 of the optimum. Each engine's list is in increasing group index.
    With equal estimates and equal group sizes this is the former count balancing (each group,
    in order, to the engine with the fewest samples).
    """
    if n_engines < 1:
        raise ValueError(f"n_engines must be >= 1, got {n_engines}")
    if len(group_sizes) != len(est_lengths):
        raise ValueError(f"{len(group_sizes)} group sizes for {len(est_lengths)} length estimates")
    work = [max(0, s) * max(0.0, float(e)) for s, e in zip(group_sizes, est_lengths)]
    loads = [0.0] * n_engines
    plan: list[list[int]] = [[] for _ in range(n_engines)]
    for g in sorted(range(len(work)), key=lambda g: (-work[g], g)):
        k = min(range(n_engines), key=lambda i: (loads[i], i))
        plan[k].append(g)
        loads[k] += work[g]
    return [sorted(p) for p in plan]
