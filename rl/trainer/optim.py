"""One optimizer and one update path, for the policy (with its value head) and for a separate critic alike.

``adamw(params, ...)``: AdamW with the recipe's ``algo.optim`` (weight decay, betas 0.9/0.999, eps 1e-8) and its LR
schedule (``rl.algos.schedules.LRSchedule``: warmup, then constant or cosine over the run's optimizer steps).
``apply(params, opt, sched, max_grad_norm)``: reduce the accumulated gradients over data-parallel ranks,
take their global norm, clip, step the optimizer and the schedule; a non-finite norm skips the step (the
gradients are left for ``zero_grad``). No loss, no model building.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rl.algos.schedules import LRSchedule
from rl.trainer import fsdp
from rl.trainer.collectives import all_reduce_grads


def adamw(
    groups: list[dict[str, Any]] | list[torch.nn.Parameter], lr: float, optim_cfg: Any, updates: int
) -> tuple[Any, Any]:
    """(AdamW over ``groups`` at ``lr``, its LambdaLR schedule over ``updates`` optimizer steps)."""
    o = optim_cfg
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=o.weight_decay, betas=(0.9, 0.999), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, LRSchedule(o.warmup_steps, o.schedule, updates, o.min_lr_ratio))
    return opt, sched


def apply(params: list[torch.nn.Parameter], opt: Any, sched: Any, max_grad_norm: float) -> tuple[float, bool]:
    """Reduce, clip and apply the accumulated gradients of ``params``; returns (pre-clip global norm, stepped).

    Sharded parameters already hold their shard of the summed gradient (FSDP's reduce-scatter); replicated
    ones (a value head, a separate critic) are SUM-all-reduced here. ``max_grad_norm`` 0: no clipping.
    """
    all_reduce_grads([p for p in params if not fsdp.is_dtensor(p)])
    norm = grad_norm(params)
    if not math.isfinite(float(norm)):
        return float(norm), False
    if max_grad_norm > 0:
        clip(params, max_grad_norm, norm)
    opt.step()
    sched.step()
    return float(norm), True


def grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Global L2 norm of the gradients (float32; 0 without any gradient), over every rank's shard."""
    return fsdp.grad_sq_sum(params).sqrt()


def clip(params: list[torch.nn.Parameter], max_norm: float, norm: torch.Tensor) -> None:
    """Scale the gradients by ``max_norm / (norm + 1e-6)`` when below 1 (``clip_grads_with_norm_``'s rule),
    with a Python float, so that sharded (DTensor) and plain gradients take the same path."""
    coef = max_norm / (float(norm) + 1e-6)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.detach().mul_(coef)
