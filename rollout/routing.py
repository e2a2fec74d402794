"""Mixture-of-experts routing on Hugging Face models: which experts each token went to, recorded and forced.

A sparse-MoE decoder layer (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE in transformers 5) has a router
module (``mlp.gate``) returning ``(router_logits, top_k_weights, top_k_indices)`` for the flattened
tokens of a forward; the experts then run on those indices with those weights. Everything here works
through forward hooks on those routers, so the model's own code runs unchanged:

* ``capture_routing(model)``: records every router call's ``top_k_indices``; ``.routing()`` gives one
  row per token fed through the model (calls concatenated in order: a prompt forward, then each decode
  step), shape ``(tokens, layers, top_k)`` in a compact integer dtype (``routing_dtype``).
* ``replay_routing(model, routing)``: forces the experts of ``routing`` (same shape) in the forwards
  inside the block, rows consumed in order. The gate weights are recomputed from the router's own
  logits over the forced experts (softmax, then renormalised over the top-k where the router does so),
  so the router's weight still gets a gradient: what routing replay (R2/R3, docs/moe.md) needs.

Replay only matches routers that weigh experts by the softmax of their logits; on the first call where
the forced experts equal the router's own choice the recomputed weights are compared with the router's,
and a router that computes them otherwise (sigmoid scores, score biases) is refused, not silently
mis-weighted.

vLLM reports routing itself (``enable_return_routed_experts``, GPU only): ``moe_layers(config)`` and
``from_vllm`` turn its per-request array into the same layout. This module does not know about the learner,
episodes or engines.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

__all__ = [
    "routers",
    "is_moe",
    "routing_dtype",
    "capture_routing",
    "replay_routing",
    "RoutingCapture",
    "moe_layers",
    "from_vllm",
]


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers in layer order: modules with ``top_k``, ``num_experts`` and a
    ``(num_experts, hidden)`` weight (transformers 5's ``*TopKRouter``); [] for a dense model."""
    found = []
    for _, m in model.named_modules():
        w = getattr(m, "weight", None)
        if (
            isinstance(getattr(m, "top_k", None), int)
            and isinstance(getattr(m, "num_experts", None), int)
            and isinstance(w, torch.Tensor)
            and w.dim() == 2
            and w.shape[0] == m.num_experts
        ):
            found.append(m)
    return found


def is_moe(model: torch.nn.Module) -> bool:
    return bool(routers(model))


def routing_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer dtype holding every expert index: uint8 up to 256 experts, else int16."""
    if num_experts <= 256:
        return torch.uint8
    if num_experts <= 2**15:
        return torch.int16
    return torch.int32


class RoutingCapture:
    """What ``capture_routing`` recorded: per router, the ``top_k_indices`` of each call, in call order."""

    def __init__(self, rs: list[torch.nn.Module]) -> None:
        self.calls: list[list[torch.Tensor]] = [[] for _ in rs]
        self.dtype = routing_dtype(max((r.num_experts for r in rs), default=1))

    def routing(self) -> torch.Tensor:
        """``(tokens, layers, top_k)`` on CPU in ``routing_dtype``: row t = the experts token t went to."""
        if not self.calls:
            raise ValueError("the model has no MoE router: there is no routing to capture")
        per_layer = [torch.cat(c) if c else torch.empty(0, 0, dtype=torch.long) for c in self.calls]
        n = {t.shape[0] for t in per_layer}
        if len(n) != 1:
            raise RuntimeError(f"the routers saw different token counts {sorted(n)}: not one model's forwards")
        return torch.stack(per_layer, dim=1).to(self.dtype)

    def clear(self) -> None:
        for c in self.calls:
            c.clear()


@contextmanager
def capture_routing(model: torch.nn.Module) -> Iterator[RoutingCapture]:
    """Record the experts every router selects in the forwards run inside the block (after any replay)."""
    rs = routers(model)
    cap = RoutingCapture(rs)

    def hook(i: int):
        def record(_m: Any, _args: Any, out: Any) -> None:
            cap.calls[i].append(out[2].detach().reshape(-1, out[2].shape[-1]).to("cpu", torch.long))

        return record

    handles = [r.register_forward_hook(hook(i)) for i, r in enumerate(rs)]
    try:
        yield cap
    finally:
        for h in handles:
            h.remove()


def _check_routing(rs: list[torch.nn.Module], routing: torch.Tensor) -> None:
    if not rs:
        raise ValueError("routing replay needs an MoE model; this model has no router")
    if routing.dim() != 3 or routing.shape[1] != len(rs) or routing.shape[2] != rs[0].top_k:
        raise ValueError(
            f"routing of shape {tuple(routing.shape)}: expected (tokens, {len(rs)} layers, top_k {rs[0].top_k})"
        )
    if routing.numel() and (int(routing.min()) < 0 or int(routing.max()) >= rs[0].num_experts):
        raise ValueError(f"routing holds expert indices outside 0..{rs[0].num_experts - 1}")


class _Replay:
    """One router's forced experts, handed out call by call; the gate weights recomputed from its logits."""

    def __init__(self, router: torch.nn.Module, forced: torch.Tensor, layer: int) -> None:
        self.router, self.forced, self.layer, self.used, self.checked = router, forced, layer, 0, False

    def __call__(self, _m: Any, _args: Any, out: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, scores, own = out[0], out[1], out[2]
        n = logits.shape[0]
        if self.used + n > self.forced.shape[0]:
            raise RuntimeError(
                f"routing replay: layer {self.layer} saw {self.used + n} tokens, the routing has "
                f"{self.forced.shape[0]} rows"
            )
        idx = self.forced[self.used : self.used + n].to(logits.device, torch.long)
        self.used += n
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights = probs.gather(-1, idx)
        if getattr(self.router, "norm_topk_prob", False):
            weights = _renormalise(weights, logits.float().gather(-1, idx))
        weights = weights.to(logits.dtype)
        if not self.checked:
            self._check_softmax(idx, own, weights, scores)
        return logits, weights, idx

    def _check_softmax(self, idx: torch.Tensor, own: torch.Tensor, weights: torch.Tensor, scores: torch.Tensor) -> None:
        same = (idx == own).all(dim=-1)
        if bool(same.any()):
            self.checked = True
            if not torch.allclose(weights[same].detach().float(), scores[same].detach().float(), atol=1e-5):
                raise NotImplementedError(
                    f"routing replay: {type(self.router).__name__} does not weigh its experts by a softmax over its "
                    "logits; replay would change the gate weights, so it is refused for this model"
                )


def _renormalise(weights: torch.Tensor, forced_logits: torch.Tensor) -> torch.Tensor:
    """``weights`` (softmax probabilities at the forced experts) over their sum, as the router renormalises its
    top-k. Where forced experts lie so far below the router's own choice that their probabilities underflow to 0
    (0 / 0, NaN gradients), the softmax of their logits instead: the same value, computed in log space."""
    total = weights.sum(dim=-1, keepdim=True)
    tiny = torch.finfo(total.dtype).tiny
    return torch.where(total > tiny, weights / total.clamp_min(tiny), torch.softmax(forced_logits, dim=-1))


@contextmanager
def replay_routing(model: torch.nn.Module, routing: torch.Tensor) -> Iterator[None]:
    """Force ``routing`` (``(tokens, layers, top_k)``, e.g. ``RoutingCapture.routing()``) in the forwards
    inside the block, rows consumed in call order; every row must be used by the end of the block.

    Which experts run is fixed; their gate weights are the router's softmax over its current logits at the
    forced experts (renormalised over them when the router renormalises its top-k), so gradients reach the
    router. With a model's own routing the forward is the same as without replay.
    """
    rs = routers(model)
    _check_routing(rs, routing)
    replays = [_Replay(r, routing[:, i, :], i) for i, r in enumerate(rs)]
    handles = [r.register_forward_hook(rp, prepend=True) for r, rp in zip(rs, replays)]
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        for h in handles:
            h.remove()
        if not failed:
            left = {rp.forced.shape[0] - rp.used for rp in replays}
            if left != {0}:
                raise RuntimeError(
                    f"routing replay: {routing.shape[0]} rows given, {replays[0].used} tokens forwarded "
                    "(the routing does not belong to these forwards)"
                )


def moe_layers(config: Any) -> list[int]:
    """The decoder layers of a transformers MoE ``config`` that have a router, in order (the layers of the
    routing layout): every layer, less Qwen-MoE's ``mlp_only_layers`` and the layers ``decoder_sparse_step``
    skips, and DeepSeek's first ``first_k_dense_replace``; the same rules vLLM's model code builds its MoE
    blocks by."""
    n = int(config.num_hidden_layers)
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    step = int(getattr(config, "decoder_sparse_step", None) or 1)
    first = int(getattr(config, "first_k_dense_replace", None) or 0)
    return [i for i in range(n) if i not in dense and (i + 1) % step == 0 and i >= first]


def from_vllm(routed: Any, layers: list[int], num_experts: int) -> np.ndarray | None:
    """vLLM's routed experts of one request (``CompletionOutput.routed_experts``, vLLM 0.32: ``(tokens,
    num_hidden_layers, top_k)`` ``uint8``, ``uint16`` above 256 experts; one row per token the engine ran, the
    prompt's then each generated token's but the last; a dense layer's row is never written) as this module's
    routing: the MoE ``layers`` (``moe_layers``) only, in ``routing_dtype(num_experts)``. None stays None (the
    request reported none). Rows are not checked against the tokens: the episode does (``rollout.episode``),
    and a sample whose rows fall short leaves R3's batch, counted."""
    if routed is None:
        return None
    r = np.asarray(routed)
    if r.ndim != 3:
        raise ValueError(f"vLLM routed experts of shape {r.shape}: expected (tokens, layers, top_k)")
    if r.shape[1] != len(layers):
        if not layers or r.shape[1] <= max(layers):
            raise ValueError(f"vLLM routed experts of {r.shape[1]} layers for a model whose MoE layers are {layers}")
        r = r[:, layers]
    if r.size and int(r.max()) >= num_experts:
        raise ValueError(f"vLLM routed experts hold indices outside 0..{num_experts - 1}")
    return np.ascontiguousarray(r.astype(str(routing_dtype(num_experts)).removeprefix("torch.")))
