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

Pure functions of integer arrays: no model, no torch state. The learner's logging of them is not wired
yet (docs/moe.md says how it will be).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["expert_counts", "load_metrics"]


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
