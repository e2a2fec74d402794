"""Data-parallel learner: collectives for ``rl.trainer.learner.Learner`` and the group of learner actors.

Design (``learner.workers = N``):

* N Ray actors join one ``torch.distributed`` process group (gloo on CPU, NCCL on GPU; world
  size N). The policy and the reference model are sharded over them with FSDP2
  (``rl.trainer.fsdp``): each rank holds 1/N of the parameters, gradients and AdamW state.
  The value head and a separate critic are small or optional and stay replicated (their
  gradients SUM-all-reduced by :func:`all_reduce_grads`). Without a
  placement, every learner runs on the driver's node and meets at ``127.0.0.1`` on a port the
  driver found free. With one (``actor_options`` from ``rl.driver.placement``), a probe task in rank
  0's bundle finds a free port on rank 0's node; the rendezvous is ``127.0.0.1`` when every
  rank's bundle is on that node, else that node's IP (``JOINTRL_DIST_ADDR`` in each learner's
  environment). Rank 0 broadcasts the replicated parameters at start so that they begin identical.
* The driver shards each batch (:func:`shard_batch`): whole GRPO groups per shard (group
  statistics stay local), balanced by token count. Every shard keeps the *global* loss
  denominators (``num_tokens``, ``num_seqs`` of the full batch), so each rank's loss is
  its part of the full-batch loss and the SUM of the gradients (FSDP's reduce-scatter for the
  sharded models, :func:`all_reduce_grads` for the replicated ones) is exactly the
  single-learner gradient; every rank then steps its shard with the same global clip factor. Whole-batch statistics (advantage whitening, per-minibatch
  token counts, metrics) are SUM all-reduces of partial sums (:func:`all_reduce_sum`).
* Every rank takes part in a weight export (tensors are gathered one at a time; rank 0
  writes the engines' file) and in a checkpoint (each rank writes its shard).

With ``algo.update.minibatches > 1`` each rank draws its minibatches from its own shard, so the
k-th global minibatch is a random 1/M of the batch as with one learner, but not the same
draw: the update then equals a single learner's only in distribution. With one minibatch
(the default) it is the same update (up to float summation order).

This module does not compute losses or advantages and never touches the rollout engines.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace
from typing import Any, Iterable

import torch

from envs.actors import ActorGroup, ray_factory
from rl.algos.batch import Batch, Sample
from rl.trainer import memory

__all__ = [
    "learner_env",
    "free_port",
    "init_process_group",
    "all_reduce_sum",
    "all_reduce_grads",
    "broadcast_params",
    "shard_batch",
    "LearnerGroup",
    "LearnerFailure",
    "Deadlines",
]

_BUCKET = 1 << 25  # elements per all-reduce bucket (128 MiB in fp32)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (the rendezvous of the process group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _rendezvous_probe() -> tuple[str, str, int]:
    """Runs on a learner's node (a zero-CPU Ray task in its bundle): (node id, node IP, a free port)."""
    import ray

    ctx = ray.get_runtime_context()
    return ctx.get_node_id(), ray.util.get_node_ip_address(), free_port("")


# The collective timeout (seconds) in each learner's environment (``faults.collective_s``, set by LearnerGroup).
COLLECTIVE_TIMEOUT_ENV = "JOINTRL_COLLECTIVE_TIMEOUT_S"


def init_process_group(rank: int, world_size: int, port: int, device: torch.device, addr: str | None = None) -> None:
    """Join the learners' process group: gloo on CPU, NCCL on CUDA; rendezvous at ``addr:port``
    (``addr`` default: ``$JOINTRL_DIST_ADDR``, else 127.0.0.1). A collective waits for its peers at most
    ``$JOINTRL_COLLECTIVE_TIMEOUT_S`` seconds (``faults.collective_s``; 30 minutes without it), then raises."""
    import datetime
    import os

    import torch.distributed as dist

    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    if port <= 0:
        raise ValueError("a data-parallel learner needs the rendezvous port (dist_port > 0)")
    backend = "nccl" if device.type == "cuda" else "gloo"
    addr = addr or os.environ.get("JOINTRL_DIST_ADDR") or "127.0.0.1"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=float(os.environ.get(COLLECTIVE_TIMEOUT_ENV) or 1800)),
    )


def _active() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """SUM of ``t`` over the ranks (a new tensor; ``t`` itself unchanged); ``t`` as is when not distributed."""
    if not _active():
        return t
    import torch.distributed as dist

    out = t.detach().clone().contiguous()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_reduce_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """SUM-all-reduce the ``.grad`` of ``params`` in place, in flat buckets.

    A parameter without a gradient on one rank but with one on another gets zeros there;
    one without a gradient on every rank keeps ``grad = None`` (as with a single learner,
    where the optimizer then skips it).
    """
    if not _active():
        return
    import torch.distributed as dist

    params = [p for p in params if p.requires_grad]
    if not params:
        return
    dev = params[0].device
    has = torch.tensor([float(p.grad is not None) for p in params], device=dev)
    dist.all_reduce(has, op=dist.ReduceOp.SUM)
    live = [p for p, h in zip(params, has.tolist()) if h > 0]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for p in live:
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        bucket: list[torch.nn.Parameter] = []
        size = 0
        for p in group + [None]:  # type: ignore[list-item]
            if p is not None and (size + p.numel() <= _BUCKET or not bucket):
                bucket.append(p)
                size += p.numel()
                continue
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            off = 0
            for q in bucket:
                q.grad.copy_(flat[off : off + q.numel()].view_as(q.grad))
                off += q.numel()
            if p is not None:
                bucket, size = [p], p.numel()


def broadcast_params(params: Iterable[torch.nn.Parameter], src: int = 0) -> None:
    """Overwrite every rank's ``params`` with rank ``src``'s (so that replicas start identical)."""
    if not _active():
        return
    import torch.distributed as dist

    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=src)


def shard_batch(batch: Batch, n: int) -> list[Batch]:
    """Split ``batch`` into ``n`` shards of whole groups (``Sample.group_id``), balanced by token count.

    Greedy longest-first: groups in decreasing cost (the tokens the learner runs: prompt
    once plus every computed member's response; skipped members cost nothing) go to the
    shard with the least cost so far (ties: lowest index). Skipped (zero-advantage)
    members follow their group. Every shard keeps the batch's global ``num_tokens`` and
    ``num_seqs``. Samples keep their batch order (by ``uid``) within a shard. Pure.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    groups: dict[int, tuple[list[Sample], list[Sample]]] = {}
    for s in batch.samples:
        groups.setdefault(s.group_id, ([], []))[0].append(s)
    for s in batch.skipped:
        groups.setdefault(s.group_id, ([], []))[1].append(s)

    def cost(g: tuple[list[Sample], list[Sample]]) -> int:
        comp = g[0]
        if not comp:
            return 0
        return max(s.prompt_len for s in comp) + sum(len(s.input_ids) - s.prompt_len for s in comp)

    order = sorted(groups, key=lambda gid: (-cost(groups[gid]), gid))
    loads = [0] * n
    assigned: list[list[int]] = [[] for _ in range(n)]
    for gid in order:
        k = min(range(n), key=lambda i: (loads[i], i))
        assigned[k].append(gid)
        loads[k] += cost(groups[gid])
    shards = []
    for gids in assigned:
        samples = sorted((s for g in gids for s in groups[g][0]), key=lambda s: s.uid)
        skipped = sorted((s for g in gids for s in groups[g][1]), key=lambda s: s.uid)
        shards.append(replace(batch, samples=samples, skipped=skipped))
    return shards


def learner_env(learner: Any, model_cfg: Any = None) -> dict[str, str]:
    """Environment variables of a learner actor's process for the recipe's ``learner`` section.

    ``learner.huge_pages``: ``THP_MEM_ALLOC_ENABLE=1``, which torch's CPU allocator reads once, at its
    first allocation, to ``madvise(MADV_HUGEPAGE)`` every block of 2 MB or more. A learner step allocates
    and frees gigabytes (activations, vocabulary-sized logits, gradients); when the learner hands freed
    pages back to the OS after each step (``learner.hold_memory: false``, ``rl.trainer.memory.trim``), with
    4 KB pages the next step faults them all in again: 2.4 million minor faults and 16-20 s of system time
    per quickstart-shaped step, against 20 thousand to 1.2 million with huge pages (bench/RESULTS.md). It
    must be set before the process imports torch, hence in the actor's environment. The kernel uses huge
    pages only where ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` or ``always``;
    elsewhere it is a no-op.

    ``learner.allocator``: ``jemalloc`` (or ``auto`` where ``libjemalloc.so.2`` is installed) puts jemalloc
    first in ``LD_PRELOAD`` (before any preload already set), so it is the process's ``malloc`` from its
    start (``rl.trainer.memory``: why it is faster here). ``LD_PRELOAD`` is read when the process starts,
    hence again the actor's environment. ``system`` sets the preload without a jemalloc the actor would
    otherwise inherit from the driver's environment. ``auto`` follows the learner's precision
    (``model_cfg.autocast``, concrete once ``rl.trainer.precision.resolve`` ran): glibc for an fp32 learner
    (``rl.trainer.memory.resolve_allocator`` says why).
    """
    fp32 = model_cfg is not None and not getattr(model_cfg, "autocast", True)
    return memory.process_env(getattr(learner, "huge_pages", True), getattr(learner, "allocator", "auto"), fp32=fp32)


@dataclass(frozen=True)
class Deadlines:
    """How long the driver waits for a learner call (the recipe's ``faults`` section; the key is named in
    the message of a missed one), and each collective's timeout inside the learners."""

    step_s: float = 3600.0  # faults.learner_step_s: one step
    io_s: float = 1800.0  # faults.learner_io_s: export, save, load, log-probs, start
    collective_s: float = 1800.0  # faults.collective_s


class LearnerFailure(RuntimeError):
    """A learner rank died, lost its peers, or a learner call missed its deadline: the group is unusable and
    must be restarted (``rl.driver.ray_runtime.RayRuntime.restart_learners``) or the run ends. ``rank``: the
    rank that died or did not answer; ``stacks``: where the learners' stacks were dumped (if they were)."""

    def __init__(self, rank: int, what: str, why: str) -> None:
        super().__init__(f"learner rank {rank} {why} (during {what})")
        self.rank, self.what, self.why = rank, what, why
        self.stacks: str | None = None


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


def dump_run_stacks(stacks_dir: str, why: str, timeout_s: float = 15.0) -> str:
    """Every live process of the run dumps its Python stacks into ``stacks_dir``, each dump headed by ``why``;
    returns ``stacks_dir``. The driver's own go to ``driver_pid<pid>.txt``; every process registered there
    (``envs.stacks.register``: rollout and reward workers, learners) on this node is sent ``SIGUSR1``; on every
    other alive Ray node a zero-CPU task pinned there (``NodeAffinitySchedulingStrategy``) does the same
    and ships the files back. Each remote step waits at most ``timeout_s`` in all, and every failure is noted
    in the driver's file, never raised: a dump never hangs or ends a recovery."""
    import os

    from envs.stacks import dump_registered, dump_self

    own = os.path.join(stacks_dir, f"driver_pid{os.getpid()}.txt")
    notes: list[str] = []
    try:
        dump_self(own, why)
        local = dump_registered(stacks_dir, why)
        notes += [f"{n}: wrote no stack within 3 s" for n in local["silent"]]
        notes += _dump_remote_nodes(stacks_dir, why, timeout_s)
    except Exception as e:  # noqa: BLE001 - a post-mortem aid: its failure must not mask the failure it documents
        notes.append(f"stack dump failed: {type(e).__name__}: {e}")
    if notes:
        try:
            with open(own, "a") as f:
                f.write("".join(f"# {n}\n" for n in notes))
        except OSError:
            pass
    return stacks_dir


def _dump_remote_nodes(stacks_dir: str, why: str, timeout_s: float) -> list[str]:
    """``envs.stacks.dump_registered`` on every alive Ray node but this one (a task pinned there); the files it
    returns are written into ``stacks_dir`` here. Notes on the nodes that did not answer within ``timeout_s``."""
    import os

    import ray

    if not ray.is_initialized():
        return []
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from envs.stacks import dump_registered

    here = ray.get_runtime_context().get_node_id()
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    task = ray.remote(num_cpus=0, max_retries=0)(dump_registered)
    refs = {
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(stacks_dir, why): n
        for n in nodes
    }
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    notes = [f"node {refs[r]}: no answer to the stack dump within {timeout_s:g} s" for r in late]
    for r in late:
        try:
            ray.cancel(r, force=True)
        except Exception:  # noqa: BLE001, S110 - the task ends with its node or its process anyway
            pass
    for r in ready:
        try:
            got = ray.get(r, timeout=1.0)
        except Exception as e:  # noqa: BLE001 - noted, never raised
            notes.append(f"node {refs[r]}: {type(e).__name__}: {e}")
            continue
        for name, text in got["files"].items():
            _write_remote(stacks_dir, refs[r], os.path.basename(name), text)
        notes += [f"node {refs[r]}: {n}: wrote no stack within 3 s" for n in got["silent"]]
    return notes


def _write_remote(stacks_dir: str, node: str, name: str, text: str) -> None:
    """A remote node's stacks file ``name`` into ``stacks_dir`` here: under its own name, unless a different file
    of this node has it (same pid on two hosts), then prefixed by the node id; nothing when the folder is shared
    and already holds it."""
    import os

    path = os.path.join(stacks_dir, name)
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            if f.read() == text:
                return
        path = os.path.join(stacks_dir, f"node{node[:12]}.{name}")
    with open(path, "w") as f:
        f.write(text)


class LearnerGroup:
    """N ``Learner`` Ray actors in one process group (N = 1: a single actor, no torch.distributed).

    ``step`` shards the batch and returns rank 0's metrics (already reduced over the
    ranks); ``export_weights``, ``logprobs``, ``save_checkpoint`` and ``load_checkpoint`` go to every rank
    (collectives over the shards) and return rank 0's answer. ``actors[0]`` is rank 0's handle.

    The actors are spawned, each with its rank's options, and killed through an
    ``envs.actors.ActorGroup``, like the rollout and reward workers; unlike them, a dead learner is
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
        ``actor_options`` (one dict of Ray actor options per rank, e.g. ``rl.driver.placement.Placement.options``)
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
        import ray

        if actor_options is None:
            if n == 1:
                return [{}], 0
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
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

        from envs.actors import actor_died

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
        from envs.actors import actor_died

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
        return self._io("export_weights", dtype)[0]

    def export_adapter(self) -> str:
        """The LoRA adapter folder (every rank: A, B gathered); rank 0's path."""
        return self._io("export_adapter")[0]

    def export_ipc(self, dtype: str) -> list[dict[str, Any]]:
        """Every rank's CUDA IPC export (``Learner.export_ipc``), in rank order: engine i maps rank i's."""
        return self._io("export_ipc", dtype)

    def logprobs(self, prompt: list[int], continuation: list[int]) -> list[float]:
        """The policy's log-probs of ``continuation`` after ``prompt`` (every rank: a sharded forward)."""
        return self._io("logprobs", prompt, continuation)[0]

    def save_checkpoint(self, path: str, wait: bool = True) -> None:
        self._io("save_checkpoint", path, wait)

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


def _empty_cuda_cache(_actor: Any) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
