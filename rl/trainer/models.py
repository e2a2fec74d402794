"""Model building: the policy (LoRA adapters, FSDP sharding, activation checkpointing, the packed attention), the
frozen reference and the critic (a value head on the policy's trunk, or a separate trunk with its own head).

``build(...)`` returns a ``Models`` record; the learner keeps its fields. No optimizer, no forward pass.

Sharded start-up (``learner.meta_init``, FSDP2): the policy and the reference are built on the meta device
(parameters without storage; buffers such as rotary frequencies computed for real), sharded with
``fully_shard``, given storage for this rank's shard only, and filled from the checkpoint's safetensors
files by slices: each rank reads the rows it holds, never the whole model. LoRA adapters start from a
generator seeded with the learner's seed on every path, so a meta start and a full load (any number of
ranks) begin from the same adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import contextlib
import json
import math
from pathlib import Path
from typing import Iterator

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
    autocast: bool = False,
) -> Models:
    """The policy of ``model_path`` in ``model_cfg.learner_dtype`` (LoRA attached when ``lcfg.lora.rank > 0``, before
    sharding: the adapters shard with their layers); a reference in ``reference_dtype`` (None: no KL term, no
    reference; with LoRA the policy with its adapters disabled is the reference); ``critic``:
    ``"value_head"`` | ``"separate"`` | None (``algo.critic.model``, when the estimator needs one).

    Sharded with ``lcfg.meta_init``: built on the meta device and filled per shard (module docstring), with
    ``lcfg.cpu_offload`` FSDP2 keeps parameters, gradients and optimizer state in host memory. With LoRA and a
    bf16 compute (``autocast``, or FSDP's bf16 policy) the frozen base is held in bf16, the compute precision;
    the adapters stay in ``learner_dtype``."""
    dtype = DTYPES[model_cfg.learner_dtype]
    peft_on = lora.enabled(lcfg.lora)
    # bf16 base under LoRA where the compute is bf16 anyway; a sharded CPU learner (no FSDP dtype policy) keeps
    # one dtype per FSDP unit, so its base stays in learner_dtype
    base_dtype = torch.bfloat16 if peft_on and autocast and (bf16_compute or not sharded) else dtype
    meta = sharded and lcfg.meta_init
    offload = lcfg.cpu_offload
    if offload and not sharded:
        raise ValueError(offload_problem())
    model = _causal_lm(model_path, base_dtype, device, meta)
    model.config.use_cache = False
    packed_attention.install(model)
    if lcfg.activation_checkpointing:  # per decoder layer, recomputed in the backward
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    peft = lora.attach(model, lcfg.lora) if peft_on else None
    model.train()
    if sharded:  # sharded before the optimizer is built: its state is sharded too
        fsdp.shard(model, bf16_compute=bf16_compute, offload=offload, pin=device.type == "cuda")
    if meta:
        fill_from_checkpoint(model, model_path, device)
    if peft is not None:
        _init_adapters(model)
    ref = None
    if reference_dtype is not None and peft is None:
        ref = _causal_lm(model_path, DTYPES[reference_dtype], device, meta)
        ref.eval().requires_grad_(False)
        packed_attention.install(ref)
        if sharded:
            fsdp.shard(ref, bf16_compute=bf16_compute, offload=offload, pin=device.type == "cuda")
        if meta:
            fill_from_checkpoint(ref, model_path, device)
    value_head, crit = None, None
    hidden_size = model.config.hidden_size
    if critic == "value_head":
        value_head = _value_head(hidden_size).to(device, dtype)
    elif critic is not None:
        from transformers import AutoModelForCausalLM

        trunk_src = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        trunk_src.config.use_cache = False
        packed_attention.install(trunk_src)
        crit = Critic(trunk(trunk_src), hidden_size).to(device, dtype)
        del trunk_src
        crit.train()
    return Models(model, peft, ref, reference_dtype is not None, value_head, crit)


def offload_problem() -> str:
    """Why ``learner.cpu_offload`` cannot run on an unsharded learner: it is FSDP2's, which offloads shards."""
    return (
        "learner.cpu_offload: offloads FSDP2 shards, but this learner is not sharded; set learner.workers 2+ "
        "or learner.fsdp always, or cpu_offload false"
    )


def _causal_lm(model_path: str, dtype: torch.dtype, device: torch.device, meta: bool) -> Any:
    """The HF causal LM of ``model_path`` in ``dtype``: loaded whole onto ``device``, or (``meta``) its skeleton
    with parameters on the meta device (no storage, nothing read) for ``fill_from_checkpoint`` after sharding."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not meta:
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
    config = AutoConfig.from_pretrained(model_path)
    with params_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()
    return model


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Every parameter registered inside the block goes to the meta device; buffers (e.g. a rotary embedding's
    frequencies, computed in ``__init__`` and not in the checkpoint) stay real."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            p = module._parameters[name]
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def _weight_files(model_path: str) -> dict[str, Path]:
    """Checkpoint key -> the safetensors file holding it (``model.safetensors`` or its index)."""
    root = Path(model_path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        return {k: root / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = root / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(
            f"{root}: no model.safetensors or model.safetensors.index.json; learner.meta_init reads the weights "
            "by slices from safetensors files (set learner.meta_init: false to load other formats whole)"
        )
    from safetensors import safe_open

    with safe_open(str(single), "pt") as f:
        return {k: single for k in f.keys()}


def _checkpoint_key(name: str, files: dict[str, Path]) -> str | None:
    """The checkpoint's key of parameter ``name`` (LoRA's ``base_layer`` removed), or None for an adapter."""
    if ".lora_" in name:
        return None
    key = name.replace(".base_layer.", ".")
    return key if key in files else None


def _local_rows(p: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(local shape, global offset) of this rank's shard of ``p`` (a DTensor), or the whole tensor."""
    if not fsdp.is_dtensor(p):
        return tuple(p.shape), (0,) * p.dim()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return tuple(shape), tuple(offset)


def fill_from_checkpoint(model: torch.nn.Module, model_path: str, device: torch.device) -> None:
    """Give ``model``'s meta parameters storage (this rank's shard only) and read each one's rows from the
    safetensors files of ``model_path``: a rank reads what it holds. Buffers keep their values. Adapters (not in
    the checkpoint) are left for ``_init_adapters``; a fused MoE expert tensor absent from the files is built from
    the per-expert weights HF checkpoints hold (``_expert_keys``); any other parameter missing from the files is an
    error naming it."""
    files = _weight_files(model_path)
    buffers = {n: b for n, b in model.named_buffers()}
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    tied = out is not None and out.weight is inp.weight
    model.to_empty(device=device)
    if tied and out.weight is not inp.weight:  # an unsharded to_empty gives each module its own tensor
        out.weight = inp.weight
    for n, b in buffers.items():  # to_empty gave the buffers fresh storage too: their values back
        mod, _, leaf = n.rpartition(".")
        model.get_submodule(mod)._buffers[leaf] = b.to(device)
    handles: dict[Path, Any] = {}
    try:
        with torch.no_grad():
            for name, p in model.named_parameters():
                key = _checkpoint_key(name, files)
                experts = None if key is not None else _expert_keys(name, files)
                if key is None and experts is None:
                    if ".lora_" in name:
                        continue
                    raise KeyError(
                        f"{model_path}: parameter {name} is in no safetensors file of the checkpoint (learner.meta_init "
                        "reads each parameter under its own name; meta_init: false loads through transformers)"
                    )
                shape, offset = _local_rows(p)
                if experts is not None:
                    part = _read_experts(handles, files, experts, shape, offset)
                else:
                    part = _open(handles, files[key]).get_slice(key)[
                        tuple(slice(o, o + s) for o, s in zip(offset, shape))
                    ]
                fsdp.local(p).copy_(part.to(p.dtype))
    finally:
        handles.clear()


def _open(handles: dict[Path, Any], path: Path) -> Any:
    from safetensors import safe_open

    return handles.get(path) or handles.setdefault(path, safe_open(str(path), "pt"))


# A fused expert tensor of transformers 5 (``<prefix>.experts.<leaf>``, ``(experts, rows, cols)``) and the
# per-expert weights of an HF checkpoint it is made of, concatenated along the rows in this order (transformers'
# own conversion for Qwen2/3-MoE, Mixtral, OLMoE: gate then up).
_FUSED_EXPERTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


def _expert_keys(name: str, files: dict[str, Path]) -> list[str] | None:
    """For a fused expert parameter absent from the checkpoint, the key patterns (``{e}``: the expert) of the
    per-expert weights it is built from, when the checkpoint holds them; else None."""
    prefix, _, leaf = name.rpartition(".")
    if not prefix.endswith(".experts") or leaf not in _FUSED_EXPERTS:
        return None
    keys = [f"{prefix}.{{e}}.{part}.weight" for part in _FUSED_EXPERTS[leaf]]
    return keys if all(k.format(e=0) in files for k in keys) else None


def _read_experts(
    handles: dict[Path, Any], files: dict[str, Path], keys: list[str], shape: tuple[int, ...], offset: tuple[int, ...]
) -> torch.Tensor:
    """This rank's rows (``shape`` at ``offset``) of a fused expert tensor: per expert it holds, the per-expert
    weights of ``keys`` read and concatenated along their rows, then cut to the rank's rows and columns."""
    rows = []
    for e in range(offset[0], offset[0] + shape[0]):
        whole = torch.cat([_open(handles, files[k.format(e=e)]).get_tensor(k.format(e=e)) for k in keys], dim=0)
        rows.append(whole[tuple(slice(o, o + s) for o, s in zip(offset[1:], shape[1:]))])
    if not rows:
        raise ValueError(f"no expert rows to read for {keys[0]} (shape {shape})")
    return torch.stack(rows)


def _init_adapters(model: torch.nn.Module) -> None:
    """LoRA's ``lora_A`` (Kaiming-uniform, as ``peft``) and ``lora_B`` (zeros), drawn in full from a
    generator seeded with the learner's seed (``torch.initial_seed``) and each rank keeping its rows: every path
    (meta or full start, 1 or N ranks) starts from the same adapters."""
    gen = torch.Generator().manual_seed(torch.initial_seed())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_A." in name:
                bound = 1.0 / math.sqrt(p.shape[1])  # kaiming_uniform_(a=sqrt(5)) on a [r, in] weight
                full = torch.rand(tuple(p.shape), generator=gen, dtype=torch.float32) * (2 * bound) - bound
            elif ".lora_B." in name:
                full = torch.zeros(tuple(p.shape))
            else:
                continue
            shape, offset = _local_rows(p)
            local = fsdp.local(p)
            local.copy_(full[tuple(slice(o, o + s) for o, s in zip(offset, shape))].to(local.dtype))
