"""Mixture-of-experts support for the learner: expert load metrics from captured routing.

Routing itself (which experts each token went to, captured and forced through hooks on the routers) is
``rollout.routing``, shared with the in-process engine; this module turns routing into what a run logs:

* ``expert_counts(routing, num_experts, mask)``: per layer, how many token slots each expert received
  (a token routed top-k counts once for each of its k experts);
* ``load_metrics(counts)``: per layer ``moe/layer_<i>/tokens_expert_<e>``, the entropy of the load
  distribution (nats; ``log(num_experts)`` when perfectly balanced, 0 when one expert takes all) and the
  max/mean ratio (1 when balanced, ``num_experts`` when one expert takes all), plus the step's summary
  over layers (``moe/entropy_min``, ``moe/max_mean_max``, and ``moe/entropy_balanced``: ``log(num_experts)``,
  the entropy of a perfectly balanced load, to read ``entropy_min`` against).

Routing replay in the learner (``learner.routing_replay``, docs/moe.md) keeps routing per sample: a
``(len(input_ids), layers, top_k)`` tensor whose row p holds the experts of the token at position p of the
sample's sequence. A forward's routers see its trunk calls' flattened tokens in call order; ``gather`` lays
per-sample routing out in that order (to force it, ``rollout.routing.replay_routing``) and ``scatter`` puts
captured rows back per sample, both through the layout's row map (``Forward.rows``: per router row the
(sample, position) pairs it stands for: one, several for a prompt shared by a group, none for padding). Rows a layout never feeds (a sample's last token in the packed
layout) hold the default experts ``0..top_k-1``; no forward reads them back.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = [
    "expert_counts",
    "load_metrics",
    "gather",
    "scatter",
    "disagreement",
    "RoutingStats",
    "check_replay",
    "check_replay_engine",
    "engine_routing_kwargs",
]

KEY = "learner.routing_replay"

Rows = list[list[tuple[int, int]]]  # per router row, the (sample, position) pairs it stands for ([]: padding)


def expert_counts(routing: Any, num_experts: int, mask: Any = None) -> np.ndarray:
    """``(layers, num_experts)`` int64 counts of ``routing`` (``(tokens, layers, top_k)``, numpy or torch);
    ``mask`` (``(tokens,)`` bools) keeps only the tokens to count (e.g. response tokens)."""
    r = np.asarray(routing.cpu() if hasattr(routing, "cpu") else routing)
    if r.ndim != 3:
        raise ValueError(f"routing of shape {r.shape}: expected (tokens, layers, top_k)")
    if mask is not None:
        m = np.asarray(mask.cpu() if hasattr(mask, "cpu") else mask, dtype=bool)
        if m.shape != r.shape[:1]:
            raise ValueError(f"mask of shape {m.shape} for routing of {r.shape[0]} tokens")
        r = r[m]
    idx = r.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= num_experts):
        raise ValueError(f"routing holds expert indices outside 0..{num_experts - 1}")
    return np.stack([np.bincount(idx[:, i, :].ravel(), minlength=num_experts) for i in range(r.shape[1])])


def load_metrics(counts: np.ndarray) -> dict[str, float]:
    """Metrics of ``expert_counts``' output (see the module docstring); a layer with no tokens gives entropy 0
    and max/mean 0, and no summary is given when no layer saw a token."""
    out: dict[str, float] = {}
    entropies, ratios = [], []
    for i, row in enumerate(np.asarray(counts)):
        total = float(row.sum())
        for e, c in enumerate(row):
            out[f"moe/layer_{i}/tokens_expert_{e}"] = float(c)
        if total > 0:
            p = row[row > 0] / total
            ent = float(-(p * np.log(p)).sum())
            ratio = float(row.max()) / (total / len(row))
            entropies.append(ent)
            ratios.append(ratio)
        else:
            ent, ratio = 0.0, 0.0
        out[f"moe/layer_{i}/entropy"] = ent
        out[f"moe/layer_{i}/max_mean"] = ratio
    if entropies:
        out["moe/entropy_min"] = min(entropies)
        out["moe/max_mean_max"] = max(ratios)
        out["moe/entropy_balanced"] = math.log(np.asarray(counts).shape[1])
    return out


def gather(routings: list[torch.Tensor], rows: Rows, shape: tuple[int, int]) -> torch.Tensor:
    """The ``(len(rows), layers, top_k)`` routing of a forward whose router rows are ``rows``, taken from the
    per-sample ``routings`` (a shared row: its first pair's); ``shape``: (layers, top_k). Padding rows get the
    default experts (their outputs are masked out of every token that counts)."""
    layers, k = shape
    dtype = routings[0].dtype if routings else torch.uint8
    default = torch.arange(k, dtype=dtype).expand(1, layers, k)
    for i, r in enumerate(routings):
        if r.dim() != 3 or tuple(r.shape[1:]) != (layers, k):
            raise ValueError(f"sample {i}: routing of shape {tuple(r.shape)}, expected (tokens, {layers}, {k})")
    table = torch.cat([default, *[r.to(dtype) for r in routings]])
    offsets = [1]
    for r in routings:
        offsets.append(offsets[-1] + r.shape[0])
    idx = []
    for pairs in rows:
        if not pairs:
            idx.append(0)
            continue
        i, p = pairs[0]
        if p >= routings[i].shape[0]:
            raise ValueError(f"sample {i}: routing has {routings[i].shape[0]} rows, position {p} is fed")
        else:
            idx.append(offsets[i] + p)
    return table[torch.tensor(idx, dtype=torch.long)]


def scatter(routing: torch.Tensor, rows: Rows, lengths: list[int]) -> list[torch.Tensor]:
    """Per sample (sequence ``lengths``), the ``(length, layers, top_k)`` routing the captured ``routing`` (one row
    per entry of ``rows``) gives its positions (a shared prompt row goes to every member of its group);
    positions no row holds keep the default experts ``0..top_k-1``."""
    if routing.shape[0] != len(rows):
        raise ValueError(f"{routing.shape[0]} captured rows for a row map of {len(rows)}")
    _, layers, k = routing.shape
    out = [torch.arange(k, dtype=routing.dtype).expand(n, layers, k).clone() for n in lengths]
    for row, pairs in enumerate(rows):
        for i, p in pairs:
            out[i][p] = routing[row]
    return out


def disagreement(engine: torch.Tensor, learner: torch.Tensor) -> tuple[int, int]:
    """(differing, total) token-layer selections of two routings of the same tokens (``(tokens, layers, top_k)``):
    a token-layer differs when its set of experts differs (the order within the top-k does not count)."""
    if engine.shape != learner.shape:
        raise ValueError(f"routing shapes differ: {tuple(engine.shape)} vs {tuple(learner.shape)}")
    a = engine.to(torch.long).sort(dim=-1).values
    b = learner.to(torch.long).sort(dim=-1).values
    differ = (a != b).any(dim=-1)
    return int(differ.sum()), int(differ.numel())


class RoutingStats:
    """A step's routing sums from the learner's old-log-prob pass: per layer and expert the token slots of each
    sample's tokens but its last (a group's shared prompt counted once per member, as the full layout runs it),
    and per domain the token-layer selections
    where the engine's routing (``Sample.routing``, where the rollout carried it) and the learner's differ.

    ``values(domains)`` flattens them for an all-reduce over data-parallel ranks; ``metrics`` of the reduced
    values gives ``moe/layer_<i>/entropy``, ``moe/layer_<i>/max_mean``, the summary over layers and
    ``moe/routing_disagreement`` (and ``/<domain>``); the per-expert counts only with ``per_expert``."""

    def __init__(self, layers: int, experts: int) -> None:
        self.layers, self.experts = layers, experts
        self.counts = np.zeros((layers, experts), dtype=np.int64)
        self.differ: dict[str, list[int]] = {}

    def add(self, samples: list[Any], routing: list[torch.Tensor]) -> None:
        """Count the learner's ``routing`` of ``samples`` (per sample ``(len(input_ids), layers, top_k)``; the
        rows a layout does not feed, its last token, left out) and compare it with each sample's engine routing."""
        for s, r in zip(samples, routing):
            fed = r[: max(len(s.input_ids) - 1, 0)]
            self.counts += expert_counts(fed, self.experts)
            eng = getattr(s, "routing", None)
            if eng is not None:
                d, n = disagreement(eng[: fed.shape[0]], fed)
                acc = self.differ.setdefault(s.domain, [0, 0])
                acc[0] += d
                acc[1] += n

    def values(self, domains: tuple[str, ...]) -> list[float]:
        """The counts, then per domain of ``domains`` (the whole batch's, the same on every rank) differ, total."""
        out = [float(c) for c in self.counts.ravel()]
        for d in domains:
            out += [float(x) for x in self.differ.get(d, [0, 0])]
        return out

    def metrics(self, values: list[float], domains: tuple[str, ...], per_expert: bool = False) -> dict[str, float]:
        """The step's metrics from ``values`` (``values``' layout, summed over ranks); disagreement only where
        some sample carried engine routing."""
        n = self.layers * self.experts
        counts = np.asarray(values[:n], dtype=np.float64).reshape(self.layers, self.experts)
        out = {k: v for k, v in load_metrics(counts).items() if per_expert or "/tokens_expert_" not in k}
        differ, total = 0.0, 0.0
        for j, d in enumerate(domains):
            dd, tt = values[n + 2 * j], values[n + 2 * j + 1]
            if tt > 0:
                out[f"moe/routing_disagreement/{d}"] = dd / tt
                differ, total = differ + dd, total + tt
        if total > 0:
            out["moe/routing_disagreement"] = differ / total
        return out


def check_replay(model_dir: str, learner: Any) -> None:
    """Refuse ``learner.routing_replay`` (``learner``: the recipe's learner section) on a model whose config has
    no routers (read from its config, no weights), and with activation checkpointing (the backward's recomputed
    layers would route on their own): a ``RecipeError`` naming the key, before any actor starts."""
    from transformers import AutoConfig

    from rl.algos.router import router_spec
    from rl.config.loading import RecipeError

    mode = learner.routing_replay
    if mode == "none":
        return
    if router_spec(AutoConfig.from_pretrained(model_dir)) is None:
        raise RecipeError(f"{KEY}: {mode} needs a mixture-of-experts model; {model_dir} has no router (set none)")
    if learner.activation_checkpointing:
        raise RecipeError(
            f"{KEY}: {mode} with learner.activation_checkpointing: the backward's recomputation would not replay "
            "the routing; turn one of them off"
        )


def check_replay_engine(learner: Any, engine: str, device: str = "cpu", engine_kwargs: Any = None) -> None:
    """Refuse ``learner.routing_replay: r3`` with an engine that does not report each token's experts on
    ``device`` (``cpu`` | ``gpu``): the in-process HF engine (``hf``, ``jointrl train --local``) always does;
    vLLM only on a GPU (``enable_return_routed_experts`` needs its model runner V2, which needs Triton), so
    vLLM on CPU (the Ray runtime, ``--local`` with vLLM) is refused, naming the key, before any actor starts;
    so is vLLM with ``rollout.engine_kwargs.enable_prefix_caching: false`` (vLLM returns routed experts only
    with prefix caching on)."""
    from rl.config.loading import RecipeError

    if learner.routing_replay != "r3" or engine == "hf":
        return
    if engine == "vllm" and device == "gpu":
        if (engine_kwargs or {}).get("enable_prefix_caching", True) is False:
            raise RecipeError(
                f"{KEY}: r3 through vLLM with rollout.engine_kwargs.enable_prefix_caching: false; vLLM returns "
                "routed experts only with prefix caching on (it keeps cached tokens' routing): remove that key"
            )
        return
    raise RecipeError(
        f"{KEY}: r3 needs an engine that reports each token's experts; the {engine} engine does not report "
        f"them on {device}: vLLM reports them only on a GPU (enable_return_routed_experts: its model runner V2, "
        "Triton; docs/moe.md). Use r2, or jointrl train --local (the in-process HF engine)"
    )


def engine_routing_kwargs(learner: Any) -> dict[str, Any]:
    """The vLLM engine arguments ``learner.routing_replay`` asks for: r3 has the engine return each request's
    routed experts (``rollout.engine``). Prefix caching stays on: vLLM 0.32 requires it for this output and keeps
    each cached block's routing (its aux-output block store, keyed by the KV block hashes), returning it for a
    cache hit's tokens too; a request whose rows still fall short leaves R3's batch, counted."""
    return {"enable_return_routed_experts": True} if learner.routing_replay == "r3" else {}
