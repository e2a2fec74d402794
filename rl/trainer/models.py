"""Model building: the policy (LoRA adapters, FSDP sharding, activation checkpointing, the packed attention), the
frozen reference and the critic (a value head on the policy's trunk, or a separate trunk with its own head).

``build(...)`` returns a ``Models`` record; the learner keeps its fields. No optimizer, no forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rl.trainer import fsdp, lora, packed_attention
from rl.trainer.forward import trunk

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Critic(torch.nn.Module):
    """A separate value model: a copy of the policy's transformer trunk and a scalar head ([N, H] -> [N])."""

    def __init__(self, trunk: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = _value_head(hidden_size)


def _value_head(hidden_size: int) -> torch.nn.Linear:
    head = torch.nn.Linear(hidden_size, 1)
    torch.nn.init.zeros_(head.weight)  # V = 0 at start: deterministic, and no initial pull on the trunk
    torch.nn.init.zeros_(head.bias)
    return head


@dataclass
class Models:
    """What ``build`` made: ``model`` (the policy, trainable; sharded when asked), ``peft`` (its LoRA wrapper or
    None), ``ref`` (the frozen reference, or None: none needed, or LoRA's policy with adapters disabled serves),
    ``has_ref`` (a reference is needed), ``value_head`` or ``critic`` (at most one; None without a critic)."""

    model: Any
    peft: Any
    ref: Any
    has_ref: bool
    value_head: torch.nn.Linear | None
    critic: Critic | None


def build(
    model_path: str,
    model_cfg: Any,
    lcfg: Any,
    device: torch.device,
    *,
    sharded: bool,
    bf16_compute: bool,
    reference_dtype: str | None,
    critic: str | None,
) -> Models:
    """The policy of ``model_path`` in ``model_cfg.learner_dtype`` (LoRA attached when ``lcfg.lora.rank > 0``, before
    sharding: the adapters shard with their layers); a reference in ``reference_dtype`` (None: no KL term, no
    reference; with LoRA the policy with its adapters disabled is the reference); ``critic``:
    ``"value_head"`` | ``"separate"`` | None (``algo.critic.model``, when the estimator needs one)."""
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[model_cfg.learner_dtype]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
    model.config.use_cache = False
    packed_attention.install(model)
    if lcfg.activation_checkpointing:  # per decoder layer, recomputed in the backward
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    peft = lora.attach(model, lcfg.lora) if lora.enabled(lcfg.lora) else None
    model.train()
    if sharded:  # sharded before the optimizer is built: its state is sharded too
        fsdp.shard(model, bf16_compute=bf16_compute)
    ref = None
    if reference_dtype is not None and peft is None:
        ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[reference_dtype]).to(device)
        ref.eval().requires_grad_(False)
        packed_attention.install(ref)
        if sharded:
            fsdp.shard(ref, bf16_compute=bf16_compute)
    value_head, crit = None, None
    hidden_size = model.config.hidden_size
    if critic == "value_head":
        value_head = _value_head(hidden_size).to(device, dtype)
    elif critic is not None:
        trunk_src = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        trunk_src.config.use_cache = False
        packed_attention.install(trunk_src)
        crit = Critic(trunk(trunk_src), hidden_size).to(device, dtype)
        del trunk_src
        crit.train()
    return Models(model, peft, ref, reference_dtype is not None, value_head, crit)
