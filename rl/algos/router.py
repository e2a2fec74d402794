"""The auxiliary term from a mixture-of-experts model's outputs: its routers' load-balancing loss.

An MoE layer's router scores every token against ``E`` experts and sends it to the top ``k``. Left alone, RL
updates can collapse the routing onto a few experts; Switch Transformer's load-balancing loss (Fedus et al.,
2021, eq. 4-6; ``router_aux_loss_coef`` in transformers' Mixtral / Qwen-MoE models) pulls it back toward
uniform. Over the routed tokens ``t`` of every MoE layer ``l`` (``R`` rows in all), with ``p_lt`` the router's
softmax over the experts::

    f_e  = (1 / R) sum_{l,t} [e in top_k(p_lt)]     share of the top-k assignments that went to expert e
    P_e  = (1 / R) sum_{l,t} p_lte                   mean router probability of expert e
    loss = E * sum_e f_e * P_e                       (k for a uniform routing; up to k * E when collapsed)

``f`` is a count (no gradient); the gradient flows into the routers through ``P``. The learner asks the
trunk for its router logits (``output_router_logits=True``) only when the objective has this term
(``algo.loss.aux_coef > 0``) or the policy loss needs it (``"aux_loss"``), and computes it over every token a
micro-batch's trunk calls ran (prompt, responses, environment tokens), padding rows left out. Pure tensor
code: no models, no I/O.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["RouterCall", "router_spec", "load_balancing_loss"]

# One trunk call's router logits: one [rows, E] tensor per MoE layer, and which rows are real tokens ([rows]
# bool; None: all of them).
RouterCall = tuple[Sequence[torch.Tensor], torch.Tensor | None]


def router_spec(config: Any) -> tuple[int, int] | None:
    """(experts ``E``, experts per token ``k``) of a transformers MoE config (``num_experts`` for Qwen-MoE,
    ``num_local_experts`` for Mixtral; ``num_experts_per_tok``), or None for a model without routers."""
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    if not experts or not top_k or not hasattr(config, "output_router_logits"):
        return None
    return int(experts), int(top_k)


def load_balancing_loss(calls: Sequence[RouterCall], num_experts: int, top_k: int) -> torch.Tensor:
    """The load-balancing loss (see the module docstring) over every real row of ``calls``: a float32 scalar
    with the routers' gradient; 0 when no row was routed."""
    counts: torch.Tensor | float = 0.0
    probs: torch.Tensor | float = 0.0
    rows = 0
    for layers, keep in calls:
        for logits in layers:
            p = torch.softmax(logits.float(), dim=-1)
            if keep is not None:
                p = p[keep.to(p.device)]
            chosen = p.detach().topk(top_k, dim=-1).indices.reshape(-1)
            counts = counts + torch.bincount(chosen, minlength=num_experts).float()
            probs = probs + p.sum(dim=0)
            rows += p.shape[0]
    if not rows:
        return torch.zeros((), dtype=torch.float32)
    assert isinstance(counts, torch.Tensor) and isinstance(probs, torch.Tensor)
    return num_experts * ((counts / rows) * (probs / rows)).sum()
