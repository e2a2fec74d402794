"""The learner ranks as Ray actors: ``LearnerGroup`` over ``rl.trainer.learner.Learner``.

Design (``learner.workers = N``):

* N Ray actors join one ``torch.distributed`` process group (``rl.trainer.collectives``; gloo on CPU, NCCL on
  GPU). The policy and the reference model are sharded over them with FSDP2 (``rl.trainer.fsdp``). Without a
  placement, every learner runs on the driver's node and meets at ``127.0.0.1`` on a port the driver found
  free. With one (``actor_options`` from ``rl.driver.actors.placement``), a probe task in rank 0's bundle finds a
  free port on rank 0's node; the rendezvous is ``127.0.0.1`` when every rank's bundle is on that node, else
  that node's IP (``JOINTRL_DIST_ADDR`` in each learner's environment).
* The driver shards each batch (``rl.trainer.sharding.shard_batch``): whole GRPO groups per shard, balanced by
  token count, every shard with the global loss denominators, so the SUM of the ranks' gradients is the
  single-learner gradient.
* Every rank takes part in a weight export (tensors are gathered one at a time; rank 0 writes the engines'
  file) and in a checkpoint (each rank writes its shard).

With ``algo.update.minibatches > 1`` each rank draws its minibatches from its own shard, so the k-th global
minibatch is a random 1/M of the batch as with one learner, but not the same draw: the update then equals a
single learner's only in distribution. With one minibatch (the default) it is the same update (up to float
summation order).
"""

from __future__ import annotations

from typing import Any

import torch

from rl.algos.batch import Batch
from rl.driver.actors.group import ActorGroup, actor_died, ray_factory
from rl.driver.actors.stacks import dump_run_stacks
from rl.driver.runtime import Deadlines, LearnerFailure
from rl.trainer.collectives import COLLECTIVE_TIMEOUT_ENV, free_port
from rl.trainer.memory import learner_env
from rl.trainer.sharding import shard_batch
from rollout.weights import CollectiveJoin, IpcWeights

__all__ = ["LearnerGroup"]


def _rendezvous_probe() -> tuple[str, str, int]:
    """Runs on a learner's node (a zero-CPU Ray task in its bundle): (node id, node IP, a free port)."""
    import ray

    from rl.driver.actors.cluster import node_id

    return node_id(), ray.util.get_node_ip_address(), free_port("")


# How long, after one rank failed, the others get to fail too (a dead rank's peers see their
# collective break at once): the rank that died is then the one named, not a peer that noticed it.
_PEER_GRACE_S = 10.0


def _peer_lost(e: BaseException) -> bool:
    """Whether a learner's error says its process group broke (a peer died or timed out), not a bug of its own."""
    text = f"{type(getattr(e, 'cause', None) or e).__name__}: {e}"
    marks = ("DistBackendError", "Connection closed by peer", "Connection reset", "timed out", "Timeout", "gloo")
    return any(m in text for m in marks)


def _register_stack_dump(_actor: Any, name: str, stacks_dir: str) -> int:
    """In a learner process: ``SIGUSR1`` writes every thread's Python stack to ``<stacks_dir>/<name>_pid<pid>.txt``
    (``envs.stacks.register``: faulthandler, no GIL needed, so a rank stuck in a collective or in C code still
    answers); returns the process id."""
    import os

    from envs.stacks import register

    register(name, stacks_dir)
    return os.getpid()


class LearnerGroup:
    """N ``Learner`` Ray actors in one process group (N = 1: a single actor, no torch.distributed).

    ``step`` shards the batch and returns rank 0's metrics (already reduced over the
    ranks); ``export_weights``, ``logprobs``, ``save_checkpoint`` and ``load_checkpoint`` go to every rank
    (collectives over the shards) and return rank 0's answer. ``actors[0]`` is rank 0's handle.

    The actors are spawned, each with its rank's options, and killed through an
    ``rl.driver.actors.group.ActorGroup``, like the rollout and reward workers; unlike them, a dead learner is
    not replaced alone: its shard of the weights and optimizer state is gone and the process group
    cannot take a new rank mid-run. Every call has a deadline (``deadlines``) and watches each rank:
    a rank that dies, loses its peers or misses the deadline raises :class:`LearnerFailure`, after
    :meth:`dump_stacks`; the driver then replaces the whole group from the newest checkpoint
    (``rl.driver.ray_runtime.RayRuntime.restart_learners``, which counts ``faults/learner_restarts``).
    """

    def __init__(
        self,
        n: int,
        model_path: str,
        model_cfg: Any,
        algo: Any,
        *,
        seed: int = 0,
        threads: int = 0,
        shm_dir: str | None = None,
        total_steps: int = 0,
        num_cpus: float = 1.0,
        num_gpus: float = 0,
        actor_options: list[dict[str, Any]] | None = None,
        learner: Any = None,
        deadlines: Deadlines | None = None,
        stacks_dir: str | None = None,
        temperature: float = 1.0,
    ) -> None:
        """``deadlines``: of each call (default: ``Deadlines()``); ``stacks_dir``: where :meth:`dump_stacks` writes
        (None: nowhere). ``learner``: the recipe's ``learner`` section, passed to each ``Learner``. ``num_cpus`` is shared by the N actors (``num_cpus / n`` each); ``num_gpus`` is per actor;
        ``threads`` (0 = all cores) is split too: each learner runs ``threads // n`` torch threads.
        ``actor_options`` (one dict of Ray actor options per rank, e.g. ``rl.driver.actors.placement.Placement.options``)
        replaces ``num_cpus``/``num_gpus``: each rank goes where its options say (its placement-group bundle)."""
        import os

        from rl.trainer.learner import Learner

        if n < 1:
            raise ValueError(f"learner.workers must be >= 1, got {n}")
        if actor_options is not None and len(actor_options) != n:
            raise ValueError(f"{len(actor_options)} actor_options for {n} learners")
        self.n = n
        self.deadlines, self.stacks_dir = deadlines or Deadlines(), stacks_dir
        self.pids: list[int] = []  # by rank, once ready() ran
        opts, port = self._placed(n, actor_options)
        env = learner_env(learner, model_cfg) | {COLLECTIVE_TIMEOUT_ENV: f"{self.deadlines.collective_s:g}"}
        for o in opts:  # a rank's own runtime_env (the rendezvous address) keeps its variables
            o.setdefault("runtime_env", {}).setdefault("env_vars", {}).update(env)
        per = max(1, (threads or os.cpu_count() or 1) // n)
        factory = ray_factory(
            Learner,
            {"num_cpus": num_cpus / n, "num_gpus": num_gpus},
            (model_path, model_cfg, algo),
            lambda r: {
                "seed": seed,
                "threads": per,
                "shm_dir": shm_dir,
                "total_steps": total_steps,
                "rank": r,
                "world_size": n,
                "dist_port": port,
                "learner": learner,
                "temperature": temperature,
            },
        )
        # Never replaced (see the class docstring): the group spawns, reports restarts (0) and kills.
        self.group = ActorGroup(n, factory, metric="faults/learner_restarts", options=opts, what="learners")

    @property
    def actors(self) -> list[Any]:
        """The learners' actor handles, by rank."""
        return self.group.actors

    def metrics(self) -> dict[str, float]:
        """The group's own replacements (``faults/learner_restarts`` key): always 0, since a failed group is
        replaced whole by its owner, which counts that (``RayRuntime.restart_learners``)."""
        return self.group.metrics()

    def _placed(self, n: int, actor_options: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], int]:
        """Each rank's Ray actor options and the rendezvous port (0 with one learner). Without
        ``actor_options`` every learner is pinned to the driver's node (the rendezvous is 127.0.0.1 on a
        port free here); with them, the ranks meet where :meth:`_rendezvous` finds."""
        if actor_options is None:
            if n == 1:
                return [{}], 0
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            from rl.driver.actors.cluster import node_id

            here = NodeAffinitySchedulingStrategy(node_id(), soft=False)
            return [{"scheduling_strategy": here} for _ in range(n)], free_port()
        opts = [dict(o) for o in actor_options]
        if n == 1:
            return opts, 0
        addr, port = self._rendezvous(opts)
        for o in opts:  # merged with the job's env vars by Ray
            o["runtime_env"] = {"env_vars": {"JOINTRL_DIST_ADDR": addr}}
        return opts, port

    @staticmethod
    def _rendezvous(opts: list[dict[str, Any]]) -> tuple[str, int]:
        """(address, port) where the ranks meet: a free port on rank 0's node; 127.0.0.1 when every rank's
        slot is on that node, else rank 0's node IP. Probes run as zero-CPU tasks in each rank's slot."""
        import ray

        probe = ray.remote(num_cpus=0)(_rendezvous_probe)
        sched = [{k: v for k, v in o.items() if k == "scheduling_strategy"} for o in opts]
        found = ray.get([probe.options(**s).remote() for s in sched])
        node0, ip0, port = found[0]
        same = all(node == node0 for node, _, _ in found)
        return ("127.0.0.1" if same else ip0), port

    def ready(self) -> None:
        """Wait for every rank to start (``faults.learner_io_s``); set up :meth:`dump_stacks` in each."""
        self._wait([a.__ray_ready__.remote() for a in self.actors], self.deadlines.io_s, "faults.learner_io_s", "start")
        if self.stacks_dir:
            import os

            os.makedirs(self.stacks_dir, exist_ok=True)
            refs = [
                a.__ray_call__.remote(_register_stack_dump, f"learner_rank{r}", self.stacks_dir)
                for r, a in enumerate(self.actors)
            ]
            self.pids = self._wait(refs, self.deadlines.io_s, "faults.learner_io_s", "start")

    def _call(self, method: str, args: list[tuple[Any, ...]], timeout_s: float, key: str) -> list[Any]:
        """``method(*args[r])`` on every rank ``r`` at once; their answers by rank (see :meth:`_wait`)."""
        refs = [getattr(a, method).remote(*x) for a, x in zip(self.actors, args)]
        return self._wait(refs, timeout_s, key, method)

    def _wait(self, refs: list[Any], timeout_s: float, key: str, what: str) -> list[Any]:
        """The results of ``refs`` (one per rank) by rank. A rank that died, or whose error says its process group
        broke, or no answer from some rank within ``timeout_s`` (recipe key ``key``): :meth:`dump_stacks`, then
        :class:`LearnerFailure` naming the rank (the dead one, where one died). Any other error of a rank (a
        bug in the learner) is raised as it is."""
        import time

        import ray

        rank_of = {ref: r for r, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        failed: dict[int, BaseException] = {}
        pending, deadline = list(refs), time.monotonic() + timeout_s
        grace = deadline
        while pending:
            now = time.monotonic()
            if now >= deadline:
                late = sorted(rank_of[p] for p in pending)
                self._fail(what, LearnerFailure(late[0], what, f"gave no answer within {key}={timeout_s:g} s"), failed)
            if failed and now >= grace:
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=min(deadline, grace) - now)
            for ref in ready:
                try:
                    results[rank_of[ref]] = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - sorted below: dead, peer lost, or its own error
                    if not (actor_died(e) or _peer_lost(e)):
                        raise
                    failed[rank_of[ref]] = e
                    grace = min(grace, time.monotonic() + _PEER_GRACE_S)  # the dead rank shows up soon
        if failed:
            self._fail(what, None, failed)
        return [results[r] for r in range(len(refs))]

    def _fail(self, what: str, late: LearnerFailure | None, failed: dict[int, BaseException]) -> None:
        """Raise the failure: a rank that died, else ``late`` (a missed deadline), else a rank whose process
        group broke; every live rank's stacks dumped before."""
        dead = [r for r, e in sorted(failed.items()) if actor_died(e)]
        if dead:
            err = LearnerFailure(dead[0], what, f"died ({type(failed[dead[0]]).__name__})")
        elif late is not None:
            err = late
        else:
            r, e = min(failed.items())
            lines = str(getattr(e, "cause", None) or e).strip().splitlines()
            err = LearnerFailure(r, what, f"lost its process group ({lines[-1][:300] if lines else type(e).__name__})")
        err.stacks = self.dump_stacks(str(err))
        raise err from next(iter(failed.values()), None)

    def dump_stacks(self, why: str) -> str | None:
        """Every live process of the run dumps its Python stacks into ``stacks_dir`` (:func:`dump_run_stacks`:
        the driver, the learners registered by :meth:`ready`, the rollout and reward workers, on every node),
        each dump headed by ``why``; the folder, or None without one. A dead rank has none to dump."""
        if not self.stacks_dir:
            return None
        return dump_run_stacks(self.stacks_dir, why)

    def step(self, batch: Batch) -> dict[str, float]:
        """One step on every rank (``faults.learner_step_s``): the batch sharded by groups; rank 0's metrics."""
        shards = [batch] if self.n == 1 else shard_batch(batch, self.n)
        return self._call("step", [(s,) for s in shards], self.deadlines.step_s, "faults.learner_step_s")[0]

    def _io(self, method: str, *args: Any) -> list[Any]:
        return self._call(method, [args] * self.n, self.deadlines.io_s, "faults.learner_io_s")

    def export_weights(self, dtype: str) -> str:
        """The policy as one safetensors file in shared memory on rank 0's node (every rank: shards gathered)."""
        return self._io("export_weights", dtype)[0]

    def read_weights_ref(self, path: str, delta: bool = False) -> Any:
        """An object-store reference to what export wrote at ``path`` (rank 0's ``read_weights``: a ``BlobWeights`` of a
        weights file, or an adapter folder's files; ``delta``: the ``DeltaWeights`` from the export before when
        there is one), for engines on other nodes."""
        return self.actors[0].read_weights.remote(path, delta)

    def weight_group_address(self) -> tuple[str, int]:
        """Rank 0's node IP and a port free there: where the ``collective`` weight group meets."""
        import ray

        return tuple(ray.get(self.actors[0].__ray_call__.remote(_node_ip_port), timeout=self.deadlines.io_s))

    def join_weight_group(self, spec: CollectiveJoin) -> Any:
        """Rank 0 joins the ``collective`` weight group as member 0 (the other ranks are not members: they hold
        what rank 0 broadcasts, gathered, already); returns when every engine joined (``faults.learner_io_s``):
        None, or ``rollout.weights.JoinFailed`` where the formation did not complete."""
        return self._wait(
            [self.actors[0].join_weight_group.remote(spec)], self.deadlines.io_s, "faults.learner_io_s", "join"
        )[0]

    def export_collective(self, dtype: str, version: int, bucket_bytes: int) -> Any:
        """Stream ``version`` of the policy to the weight group (every rank: shards gathered; rank 0 broadcasts);
        rank 0's ``CollectiveWeights``, whose ``broken`` says why a broadcast failed midway (a member died)."""
        return self._io("export_collective", dtype, version, bucket_bytes)[0]

    def export_adapter(self) -> str:
        """The LoRA adapter folder (every rank: A, B gathered); rank 0's path."""
        return self._io("export_adapter")[0]

    def export_ipc(self, dtype: str) -> list[IpcWeights]:
        """Every rank's CUDA IPC export (``Learner.export_ipc``), in rank order: engine i maps rank i's."""
        return self._io("export_ipc", dtype)

    def logprobs(self, prompt: list[int], continuation: list[int]) -> list[float]:
        """The policy's log-probs of ``continuation`` after ``prompt`` (every rank: a sharded forward)."""
        return self._io("logprobs", prompt, continuation)[0]

    def save_checkpoint(self, path: str, wait: bool = True, export_dtype: str | None = None) -> None:
        self._io("save_checkpoint", path, wait, export_dtype)

    def load_checkpoint(self, path: str) -> None:
        self._io("load_checkpoint", path)

    def release_gpu_memory(self) -> None:
        """Return the learners' cached CUDA blocks to the device (colocated placement: before the
        engines sharing their GPUs wake up). No-op on CPU."""
        self._wait(
            [a.__ray_call__.remote(_empty_cuda_cache) for a in self.actors],
            self.deadlines.io_s,
            "faults.learner_io_s",
            "release_gpu_memory",
        )

    def kill(self, graceful: bool = True) -> None:
        """Stop the learners: ``shutdown`` first (it removes the weights folder on each learner's node,
        which the driver cannot reach when that node is another machine), then kill. ``graceful=False``
        (a failed group about to be replaced): kill at once, the weights folder stays for the next group."""
        import ray

        if not graceful:
            self.group.kill_all()
            return
        try:
            ray.get([a.shutdown.remote() for a in self.actors], timeout=30)
        except Exception:  # noqa: BLE001 - a dead or stuck learner is killed all the same
            pass
        self.group.kill_all()


def _node_ip_port(_actor: Any) -> tuple[str, int]:
    """In a learner's process (``__ray_call__``): its node's IP as Ray knows it, and a TCP port free there."""
    import ray

    return ray.util.get_node_ip_address(), free_port("")


def _empty_cuda_cache(_actor: Any) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
