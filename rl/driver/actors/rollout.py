"""The rollout workers as Ray actors: ``RolloutPool`` over ``rollout.pool.RolloutWorker``.

A pool call keeps each GRPO group on one engine (the group shares its prompt, so the engine's prefix cache
serves it once); engines pull chunks of groups of balanced estimated tokens (``rollout.balance.plan_chunks``)
from one queue, and the call returns trajectories in the order of the input. ``sync_weights`` pushes a safetensors file (written by the learner
into shared memory) into every engine, or with ``adapter=True`` a LoRA adapter folder; an engine on another
node gets the bytes through Ray's object store; ``stream_weights`` has every engine take part in the
``collective`` transport's group while the learner side runs. Engines are shut down explicitly in ``shutdown()``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable

from envs.types import Sampling, Task, Trajectory
from rl.driver.actors.cluster import node_id, on_node
from rl.driver.actors.group import ActorGroup, GroupOwner, actor_died, ray_factory
from rollout.balance import estimate_length, plan_chunks
from rollout.pool import EngineFailure, RolloutWorker, free_dead_engine
from rollout.weights import CollectiveJoin, CollectiveWeights, FileWeights, IpcWeights

__all__ = ["RolloutPool", "EngineUnresponsive", "engines_call"]

log = logging.getLogger("jointrl.rollout")


def _placement(worker: Any) -> tuple[str, list[str], list[tuple[int, int]]]:
    """In a rollout worker's process (``__ray_call__``): its Ray node id and what its engine holds outside the
    process (``RolloutWorker.leftovers``)."""
    segments, procs = worker.leftovers()
    return node_id(), list(segments), list(procs)


# The call that gives a worker the latest synced weights (a replaced worker makes its own on start).
LOAD_CALLS = ("receive",)


class EngineUnresponsive(RuntimeError):
    """A rollout worker whose engine died under it, or that stopped answering: it is replaced like a dead one."""


class RolloutPool(GroupOwner):
    """N ``RolloutWorker`` Ray actors. Requires ``ray.init`` to have run.

    Fault tolerance: a worker whose process (or vLLM engine core) dies during ``generate``
    or ``sync_weights`` is replaced by a fresh actor with the same options, which loads the
    latest synced weights; its in-flight prompts are re-issued (same seeds, so the samples
    are those the dead engine would have drawn). ``restarts`` counts replacements; each call
    re-issues a shard at most ``max_restarts`` times before raising. Spawning, replacing and
    counting are ``rl.driver.actors.group.ActorGroup``'s (shared with the reward and learner groups); the
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
        """``actor_options``: one dict of Ray actor options per worker (e.g. ``rl.driver.actors.placement.Placement.options``:
        its CPU/GPU share and placement-group bundle), replacing ``num_cpus``/``num_gpus``; a replaced worker
        gets the same. ``length_estimator(task)``: estimated trajectory tokens of one sample (None: unknown),
        used to balance engines (``plan_chunks``); default ``task.meta["est_len"]``. ``worker_cls``: the
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
        self._repairs = 0  # engines that refused a delta and got the full weights (weights/delta_repairs)
        self.replaced = 0  # workers replaced so far (a collective weight group must be re-formed after one)
        self._closing = False
        # Per worker, read at each (re)spawn: a replacement starts with its predecessor's arguments.
        self._kwargs = [{**worker_kwargs, "seed": worker_kwargs.get("seed", 0) + i} for i in range(n)]
        # The "health" group is a second thread in each actor: its probe answers while generate is blocked. The
        # "control" group a third: partial rollouts' interrupt, resume and the weight loads between them.
        self._paused = False  # interrupted (partial rollouts): weight loads go to the control thread
        self._interrupt_s = 60.0  # the last interrupt's timeout (a worker replaced while paused is interrupted too)
        self._version: int | None = None  # the policy version the last resume gave the engines
        # With partial rollouts two driver threads call the pool at once (generate; interrupt, sync, resume): a
        # worker is replaced under this lock, once, by whichever call saw it die first, and ``_paused`` changes
        # under it, so a replacement started during an interrupt is interrupted too.
        self._lock = threading.RLock()
        factory = ray_factory(
            worker_cls or RolloutWorker,
            {"num_cpus": num_cpus, "num_gpus": num_gpus, "concurrency_groups": {"health": 1, "control": 1}},
            (model_path, env_specs),
            lambda i: self._kwargs[i],
        )
        self.group = ActorGroup(
            n, factory, metric="faults/rollout_restarts", options=actor_options, what="rollout workers"
        )
        # Surface start-up errors (bad model, vLLM failure) here rather than at the first generate.
        self._placement = ray.get([w.__ray_call__.remote(_placement) for w in self.workers], timeout=start_timeout_s)

    def _replace(self, i: int, why: BaseException, dead: Any = None) -> bool:
        """Kill worker ``i`` (whatever is left of it) and start a fresh one with the latest weights; while the
        pool is interrupted (partial rollouts) the fresh one is interrupted too, so it generates nothing until
        ``resume``. ``dead``: the handle that failed; when another thread has replaced it already, nothing is
        done and False is returned (the caller re-issues its job on the replacement)."""
        import ray

        with self._lock:
            if dead is not None and self.workers[i] is not dead:
                return False
            reason = f"{type(why).__name__}: {str(why).splitlines()[0][:200] if str(why) else ''}"
            log.warning("rollout worker %d died (%s); restarting it", i, reason)
            self.group.retire(i, reason)
            self.replaced += 1
            self._free([i])
            w = self.group.respawn(i)
            self._placement[i] = ray.get(w.__ray_call__.remote(_placement), timeout=self.start_timeout_s)
            if self._weights is not None:
                m, args = self._load_job(i)
                ray.get(getattr(w, m).remote(*args), timeout=self.start_timeout_s)
            if self._version is not None:  # the policy version those weights are (the last resume's)
                ray.get(w.resume.remote(self._version), timeout=self.start_timeout_s)
            if self._paused:
                ray.get(w.interrupt.remote(self._interrupt_s), timeout=self.start_timeout_s)
            return True

    def _free(self, workers: list[int]) -> None:
        """Kill what is left of the engines of ``workers`` (dead or killed) and unlink their shared memory,
        each on its own node (skipped if the node is gone). Both are no-ops for an engine shut down cleanly."""
        import ray

        refs = {}
        for i in workers:
            node, segments, procs = self._placement[i]
            if segments or procs:
                refs[i] = on_node(free_dead_engine, node).remote(segments, procs, 30.0)
        for i, ref in refs.items():
            try:
                left = ray.get(ref, timeout=90)
            except Exception as e:  # noqa: BLE001 - a leak is logged, never fatal
                left = f"{type(e).__name__}: {e}"
            if left:
                log.warning("rollout worker %d: could not free its engine's shared memory: %s", i, left)

    def _call(self, jobs: dict[int, tuple[str, tuple[Any, ...]]]) -> dict[int, Any]:
        """Run ``jobs`` (worker index -> method name, args) concurrently; replace and re-issue dead ones."""
        res = self._dispatch(lambda i, first: (i, jobs[i]) if first and i in jobs else None)
        return {i: r for (i, r) in res}

    def _dispatch(self, next_job: Callable[[int, bool], tuple[Any, tuple[str, tuple[Any, ...]]] | None]) -> list:
        """Run jobs on the workers until none is left: ``next_job(i, first)`` gives free worker ``i`` its next
        (key, (method name, args)) or None (``first``: its first ask of this call); a dead worker is replaced and
        its job re-issued on the replacement. Returns (key, result) pairs in the order the jobs ended."""
        import ray

        out: list[tuple[Any, Any]] = []
        attempts = dict.fromkeys(range(len(self.workers)), 0)
        jobs: dict[int, tuple[Any, tuple[str, tuple[Any, ...]]]] = {}  # worker -> (key, job) it runs
        pending: dict[int, tuple[Any, float, Any]] = {}  # worker -> (ref, deadline, the handle it runs on)

        def feed(i: int, first: bool = False) -> None:
            nxt = next_job(i, first)
            if nxt is not None:
                jobs[i] = nxt
                pending[i] = self._issue(i, nxt[1])

        for i in range(len(self.workers)):
            feed(i, first=True)
        while pending:
            ready, _ = ray.wait([p[0] for p in pending.values()], num_returns=1, timeout=self.probe_every_s)
            if ready:
                i = next(i for i, p in pending.items() if p[0] == ready[0])
                try:
                    out.append((jobs[i][0], ray.get(ready[0])))
                    del pending[i]
                    feed(i)  # an engine that finished early takes the next job
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
                # A replacement made here loaded the newest weights as it started; one another thread made
                # may have started before this sync recorded them, so the load is re-issued on it.
                if self._replace(i, e, pending[i][2]) and jobs[i][1][0] in LOAD_CALLS:
                    out.append((jobs[i][0], None))
                    del pending[i]
                    feed(i)
                else:
                    pending[i] = self._issue(i, jobs[i][1])
        return out

    def _issue(self, i: int, job: tuple[str, tuple[Any, ...]]) -> tuple[Any, float, Any]:
        """Start ``job`` on worker ``i``: its ObjectRef, its deadline (monotonic seconds) and the worker's handle."""
        m, a = job
        w = self.workers[i]
        method = getattr(w, m)
        if self._paused and m in LOAD_CALLS:  # generate holds the actor's main thread, waiting for these weights
            method = method.options(concurrency_group="control")
        return method.remote(*a), time.monotonic() + self.call_timeout_s, w

    def _probe(self, pending: dict[int, tuple[Any, float, Any]]) -> dict[int, BaseException]:
        """The death check of calls in flight: the busy workers that are past their deadline, whose engine
        died, or that did not answer the health probe in ``probe_timeout_s`` (-> why, for ``_replace``)."""
        import ray
        from ray.exceptions import GetTimeoutError

        now, failed = time.monotonic(), {}
        probes = {i: p[2].health.options(concurrency_group="health").remote() for i, p in pending.items()}
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
        """Episodes for ``tasks`` (in order); whole groups go to one engine. The groups are cut into chunks of
        balanced estimated tokens (``plan_chunks``: one per engine with one engine, two per engine otherwise),
        queued heaviest first; each engine takes the next chunk from the one queue as it finishes one, so an
        engine that finishes early takes more work instead of waiting for the slowest."""
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(group_ids):
            groups.setdefault(g, []).append(i)
        members = list(groups.values())
        est = [estimate_length(tasks[idxs[0]], sampling, self.length_estimator) for idxs in members]
        chunks = [
            sorted(i for g in plan for i in members[g])
            for plan in plan_chunks([len(m) for m in members], est, len(self.workers))
        ]
        queue = deque(range(len(chunks)))

        def next_chunk(_: int, first: bool) -> tuple[int, tuple[str, tuple[Any, ...]]] | None:
            if not queue:
                return None
            j = queue.popleft()
            c = chunks[j]
            return j, ("generate", ([tasks[i] for i in c], [group_ids[i] for i in c], [seeds[i] for i in c], sampling))

        out: list[Trajectory | None] = [None] * len(tasks)
        for c, trajs in self._dispatch(next_chunk):
            for i, traj in zip(chunks[c], trajs):
                out[i] = traj
        return out  # type: ignore[return-value]

    def interrupt(self, timeout_s: float) -> None:
        """Partial rollouts (``rollout.partial``): stop every worker's generation in flight at its next token
        (``RolloutWorker.interrupt``, on each actor's control thread while ``generate`` holds its main one); the
        unfinished turns keep their tokens. Until ``resume`` the weight loads (``sync_weights``) run on the control
        thread too. A worker that does not stop within ``timeout_s`` raises, every worker resumed first. A dead
        worker is passed over: it has nothing left to stop, and its replacement (made by whichever call meets the
        death, ``generate``'s or the sync's) starts interrupted until ``resume``."""
        with self._lock:
            self._paused, self._interrupt_s = True, timeout_s
            calls = [w.interrupt.options(concurrency_group="control").remote(timeout_s) for w in self.workers]
        try:
            self._wait_alive(calls, timeout_s + 60)
        except BaseException:
            self.resume()
            raise

    def resume(self, version: int | None = None) -> None:
        """Let every worker's interrupted turns continue on the weights loaded since ``interrupt`` (``version``:
        their policy version; None: each engine's count of weight loads). A dead worker is passed over: its
        replacement starts with ``version``."""
        with self._lock:
            self._paused = False
            if version is not None:
                self._version = version
            calls = [w.resume.options(concurrency_group="control").remote(version) for w in self.workers]
        self._wait_alive(calls, None)

    def _wait_alive(self, refs: list[Any], timeout_s: float | None) -> None:
        """Wait for one control call per worker (``timeout_s`` for all of them); a worker that died is passed over
        (its call in flight meets the death and replaces it), any other error is raised."""
        import ray

        end = None if timeout_s is None else time.monotonic() + timeout_s
        for i, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=None if end is None else max(0.0, end - time.monotonic()))
            except BaseException as e:
                if not actor_died(e):
                    raise
                log.info("rollout worker %d is dead; it is replaced by the call that meets its death", i)

    def sync_weights(
        self,
        path: str,
        source_node: str | None = None,
        fetch: Callable[[], Any] | None = None,
        *,
        adapter: bool = False,
        delta: Callable[[], Any] | None = None,
    ) -> None:
        """Load the weights file ``path`` into every engine (``adapter``: the LoRA adapter folder ``path``).

        ``path`` is on node ``source_node`` (None: every engine can read it). An engine on
        another node gets the file's bytes (an adapter: ``{file name: bytes}``) through Ray's object
        store instead: ``fetch()`` returns an ObjectRef of their ``rollout.weights.BlobWeights`` record, made
        once per sync, and pulled by each remote engine's node. ``delta()``: instead, for those engines, an
        ObjectRef of the learner's ``DeltaWeights`` (``learner.delta_sync_full_every``); an engine that cannot
        apply it exactly (it missed a sync, or its weights drifted) then gets the full weights, counted in
        ``weights/delta_repairs``.
        """
        # Recorded first: a worker replaced during this call loads the newest weights as it starts.
        self._weights = {"path": path, "node": source_node, "fetch": fetch, "ref": None, "adapter": adapter}
        jobs = {i: self._load_job(i, delta) for i in range(len(self.workers))}
        refused = [i for i, ok in self._call(jobs).items() if ok is False]
        if refused:
            self._repairs += len(refused)
            self._call({i: self._load_job(i) for i in refused})

    def sync_weights_ipc(self, updates: list[IpcWeights]) -> None:
        """Each engine i maps learner rank i's CUDA IPC export (``learner.weight_sync: ipc``: engine i and learner
        worker i share a GPU in the colocated placement)."""
        if len(updates) != len(self.workers):
            raise ValueError(
                f"{len(updates)} learner exports for {len(self.workers)} engines: ipc pairs them one to one"
            )
        self._weights = {"ipc": updates}  # recorded first: a replacement maps the same buffer as it starts
        self._call({i: self._load_job(i) for i in range(len(self.workers))})

    def stream_weights(
        self, updates: list[CollectiveJoin] | list[CollectiveWeights], learner_side: Callable[[], Any], fallback: Any
    ) -> None:
        """The ``collective`` transport: worker i ``receive``s ``updates[i]`` (joining the weight group, or taking
        one weight stream) while ``learner_side()`` (learner rank 0's side of the same, on a thread) runs; both
        block until every member took part. ``fallback()``: an ObjectRef of the latest weights as a
        ``BlobWeights`` record, what a worker replaced from now on loads as it starts (a replacement is no member
        of the group until the caller re-forms it, seeing ``replaced`` change). Any failure is raised: an engine
        whose stream broke refuses to serve (``RolloutWorker.load_weights_stream``) until a full sync."""
        from concurrent.futures import ThreadPoolExecutor

        if len(updates) != len(self.workers):
            raise ValueError(f"{len(updates)} weight-group records for {len(self.workers)} engines")
        if updates and isinstance(updates[0], CollectiveWeights):
            self._weights = {"collective": fallback, "ref": None}  # recorded first, as sync_weights does
        with ThreadPoolExecutor(1, thread_name_prefix="weight-stream") as ex:
            side = ex.submit(learner_side)
            try:
                self._call({i: ("receive", (u,)) for i, u in enumerate(updates)})
            finally:
                side.result()

    def _load_job(self, i: int, delta: Callable[[], Any] | None = None) -> tuple[str, tuple[Any, ...]]:
        """The call that gives worker ``i`` the latest synced weights: ``RolloutWorker.receive`` of a
        ``rollout.weights`` record (its learner rank's CUDA IPC export, or the weights file on its node), or of
        the ObjectRef of a ``BlobWeights`` for an engine on another node (a top-level argument, so Ray pulls it
        to that node and hands the worker the record)."""
        w = self._weights
        assert w is not None
        if "ipc" in w:
            return "receive", (w["ipc"][i],)
        if "collective" in w:  # a replaced worker: the learner's file export, through the object store
            if w["ref"] is None:
                w["ref"] = w["collective"]()
            return "receive", (w["ref"],)
        if self.route(i, w["node"]) == "file":
            return "receive", (FileWeights(w["path"], adapter=bool(w.get("adapter"))),)
        if delta is not None:
            if w.get("delta_ref") is None:
                w["delta_ref"] = delta()
            return "receive", (w["delta_ref"],)
        if w["ref"] is None:
            if w["fetch"] is None:
                raise ValueError(
                    f"rollout worker {i} is on another node than the weights file {w['path']}; sync_weights needs fetch"
                )
            w["ref"] = w["fetch"]()
        return "receive", (w["ref"],)

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
        """``faults/rollout_restarts`` and ``weights/delta_repairs`` (full syncs after a refused delta) since the
        last call (then reset)."""
        repairs, self._repairs = self._repairs, 0
        return self.group.metrics() | ({"weights/delta_repairs": float(repairs)} if repairs else {})

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


def engines_call(workers: list[Any], method: str, args: tuple[Any, ...], timeout_s: float) -> list[int]:
    """``method(*args)`` on every worker at once (``sleep``, ``wake_up``), waiting at most ``timeout_s``: the
    indices of the workers that gave no answer in time ([]: all answered; an answer that is an error raises)."""
    import ray

    refs = [getattr(w, method).remote(*args) for w in workers]
    ready, late = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if not late:
        ray.get(ready)
    return [refs.index(r) for r in late]
