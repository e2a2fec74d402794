"""Sharding the learner's models over the learner workers with PyTorch FSDP2 (``fully_shard``).

``shard(model)`` applies ``torch.distributed.fsdp.fully_shard`` to every decoder layer and then
to the root (embeddings, final norm and ``lm_head``, tied or not, stay in the root's unit), so
that parameters, gradients and optimizer state are DTensors sharded over the process group's
ranks. Gradients are SUM-reduced (not averaged): each rank's loss is its part of the whole
batch's loss (global denominators, see ``rl.trainer.collectives``), so the reduce-scatter sum
is the single-learner gradient. Gloo has no pre-multiplied sum, hence
``set_force_sum_reduction_for_comms``.

Every forward of a sharded module is a collective (all-gather of its parameters, and in the
backward a reduce-scatter of its gradients), so every rank must run the same sequence of
module calls even though its shard of the batch differs. ``Lockstep`` provides that:

* ``Lockstep.root(model, fn)`` runs ``fn`` inside the root's forward hooks (FSDP's
  ``register_fsdp_forward_method``), so the learner may call the transformer trunk several
  times (a shared prompt, then its continuations) and ``lm_head`` on hidden states only;
* the caller says how many trunk calls ``fn`` will make; before ``fn`` runs the ranks agree on
  the largest count (one small all-reduce), and after it the ranks below that count run
  one-token dummy calls (through ``lm_head`` too), returned as a zero-valued scalar ``pad``
  that the caller adds to its loss so that the dummies' backward (and its collectives) runs.
  Trunk calls go through ``Lockstep.trunk``, which checks the count.

Why that suffices: every trunk call runs the decoder layers in order, so each rank's forward
is the same sequence of layer units ``[L0 .. Ln-1] x K``, and autograd runs the backward in
reverse creation order, so each rank's backward (an all-gather and a reduce-scatter per layer
call) is ``[Ln-1 .. L0] x K``: the collectives line up, whatever each call computes.
* ``Lockstep.count(n)`` gives the largest ``n`` over the ranks (micro-batches per minibatch).

With one learner (no process group) nothing is sharded and ``Lockstep`` adds no work: the same
learner code runs for 1..N workers. ``full_tensors`` yields a sharded model's state one tensor at
a time, gathered on every rank (for the weight export, without a full copy per rank).

This module does not compute losses and does not know about batches.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Iterator

import torch

from rl.trainer.collectives import active

__all__ = ["active", "shard", "is_sharded", "Lockstep", "full_tensors", "local", "grad_sq_sum"]


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    trunk = getattr(model, getattr(model, "base_model_prefix", ""), model)
    layers = getattr(trunk, "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__}: no decoder layers found at .{model.base_model_prefix}.layers; "
            "sharding needs a Llama/Qwen2-style causal LM"
        )
    return list(layers)


def _root_call(self: Any, fn: Callable[[], Any]) -> Any:
    return fn()


def shard(
    model: torch.nn.Module, *, bf16_compute: bool = False, offload: bool = False, pin: bool = False
) -> torch.nn.Module:
    """``fully_shard`` each decoder layer, then the root; SUM gradient reduction. In place; returns ``model``.

    ``bf16_compute``: FSDP's ``MixedPrecisionPolicy`` (bf16 parameters in compute, fp32 gradient
    reduction, fp32 master weights); the learner uses it on CUDA, where it replaces autocast. It runs on
    CPU over gloo too (tests/test_fsdp_mixed_precision.py), and on a GPU over NCCL at one rank
    (bench/gpu_learner.py). ``offload``: FSDP's ``CPUOffloadPolicy`` (``learner.cpu_offload``): shards,
    gradients and optimizer state live in host memory, copied to the device around each unit's compute;
    ``pin``: in pinned (page-locked) memory, for the copies to and from a GPU. Pinning needs an accelerator
    (``Tensor.pin_memory`` raises "Cannot access accelerator device when none is available" on a CPU-only
    host), so a CPU learner offloads unpinned: its shards are in host memory already, and the policy then
    changes where nothing lives, only the code path (tests/test_learner_startup.py: the same update).
    """
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16_compute
        else MixedPrecisionPolicy()
    )
    off = CPUOffloadPolicy(pin_memory=pin) if offload else OffloadPolicy()
    for layer in _layers(model):
        fully_shard(layer, mp_policy=mp, offload_policy=off)
    fully_shard(model, mp_policy=mp, offload_policy=off)
    for m in model.modules():
        if hasattr(m, "set_gradient_divide_factor"):  # every FSDP unit, not only the root
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    model._jointrl_root = types.MethodType(_root_call, model)  # type: ignore[attr-defined]
    register_fsdp_forward_method(model, "_jointrl_root")
    return model


def is_sharded(model: torch.nn.Module | None) -> bool:
    return model is not None and hasattr(model, "_jointrl_root")


class Lockstep:
    """Keeps the ranks' calls of sharded modules in step (see the module docstring); free without sharding."""

    def __init__(self, pad_id: int = 0) -> None:
        self.pad_id = pad_id
        self._calls: int | None = None

    def trunk(self, base: Any, **kwargs: Any) -> Any:
        """``base(**kwargs)``, counted when inside ``root``."""
        if self._calls is not None:
            self._calls += 1
        return base(**kwargs)

    def count(self, n: int) -> int:
        """The largest ``n`` over the ranks (``n`` itself without a process group)."""
        if not active():
            return n
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.int64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def root(self, model: Any, fn: Callable[[], Any], calls: int) -> tuple[Any, torch.Tensor | None]:
        """(``fn()``, pad): ``fn``, which makes ``calls`` trunk calls, run inside ``model``'s root forward
        when sharded; ``pad`` is a zero scalar joined to the dummy calls' graph (add it to the loss
        before a backward), or None when none ran."""
        if not is_sharded(model):
            return fn(), None
        outer, self._calls = self._calls, 0

        def body() -> tuple[Any, torch.Tensor | None]:
            most = self.count(calls)  # first, on every rank: right after the root's all-gather
            out = fn()
            if self._calls != calls:
                raise RuntimeError(
                    f"sharded forward: {self._calls} trunk calls made, {calls} planned "
                    "(the ranks would fall out of step)"
                )
            missing = most - calls
            pad = None
            trunk = getattr(model, model.base_model_prefix)
            head = model.get_output_embeddings()
            for _ in range(missing):  # through lm_head too: every parameter of the root is used, as in a real call
                ids = torch.full((1, 1), self.pad_id, dtype=torch.long, device=_param_device(model))
                h = trunk(input_ids=ids).last_hidden_state
                z = head(h).float().sum() * 0.0
                pad = z if pad is None else pad + z
            return out, pad

        try:
            return model._jointrl_root(body)
        finally:
            self._calls = outer


def _param_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _comm_device() -> torch.device:
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def is_dtensor(t: torch.Tensor) -> bool:
    """Whether ``t`` is a DTensor (a sharded parameter or gradient)."""
    return hasattr(t, "to_local")


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, or ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def full_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every state-dict entry of ``model``, one at a time.

    A sharded tensor is all-gathered (a collective: every rank must iterate to the end), so a
    rank holds one full tensor at a time, never the whole model. Names are the model's own.
    """
    for name, t in model.state_dict().items():
        yield name, (t.full_tensor() if hasattr(t, "full_tensor") else t)


def grad_sq_sum(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Sum of squared gradients over ``params`` (float32): sharded gradients summed over the ranks,
    replicated ones (already all-reduced, the same on every rank) counted once."""
    sharded = torch.zeros((), dtype=torch.float32)
    plain = torch.zeros((), dtype=torch.float32)
    for p in params:
        if p.grad is None:
            continue
        g = p.grad.detach()
        if hasattr(g, "to_local"):
            sharded = sharded + g.to_local().float().pow(2).sum().cpu()
        else:
            plain = plain + g.float().pow(2).sum().cpu()
    if active() and any(hasattr(p, "to_local") for p in params):  # the same decision on every rank
        import torch.distributed as dist

        t = sharded.to(_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        sharded = t.cpu()
    return sharded + plain
