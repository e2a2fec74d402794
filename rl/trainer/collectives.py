"""Collectives of the data-parallel learner ranks: joining the process group, SUM all-reduces of tensors and of
gradients, and the broadcast that starts replicas identical.

Every rank of ``learner.workers`` joins one ``torch.distributed`` process group (gloo on CPU, NCCL on GPU). Each
rank's loss is its part of the full-batch loss (every shard keeps the batch's global denominators,
``rl.trainer.sharding.shard_batch``), so the SUM of the gradients (FSDP's reduce-scatter for the sharded models,
:func:`all_reduce_grads` for the replicated value head or critic) is the single-learner gradient, and whole-batch
statistics (advantage whitening, token counts, metrics) are SUMs of partial sums (:func:`all_reduce_sum`).
Without a process group of more than one rank every function here is a no-op.
"""

from __future__ import annotations

import socket
from typing import Iterable

import torch

__all__ = [
    "COLLECTIVE_TIMEOUT_ENV",
    "free_port",
    "init_process_group",
    "active",
    "all_reduce_sum",
    "all_reduce_grads",
    "broadcast_params",
]

_BUCKET = 1 << 25  # elements per all-reduce bucket (128 MiB in fp32)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (the rendezvous of the process group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# The collective timeout (seconds) in each learner's environment (``faults.collective_s``, set by ``rl.driver.actors.learners.LearnerGroup``).
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


def active() -> bool:
    """Whether a process group of more than one rank is initialised."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """SUM of ``t`` over the ranks (a new tensor; ``t`` itself unchanged); ``t`` as is when not distributed."""
    if not active():
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
    if not active():
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
    if not active():
        return
    import torch.distributed as dist

    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=src)
