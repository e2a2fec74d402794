"""LoRA for the learner through ``peft``: adapters on a frozen base, merged weights for the engines.

``attach(model, cfg)`` injects LoRA adapters (``learner.lora``: rank, alpha, dropout, target
modules) into an HF causal LM in place with ``peft.get_peft_model`` and returns the
``PeftModel`` wrapper; the HF model keeps its own forward (the learner calls it as before)
and only the adapters' ``lora_A``/``lora_B`` weights require gradients, so only they get
gradients and optimizer state. The reference model of a KL term is the same model with the
adapters disabled (``peft``'s ``disable_adapter``): no second copy.

``merged_tensors(model)`` yields the HF state dict of base + adapters one tensor at a time,
under the base model's own names (``W + scaling * B @ A`` for every adapted linear, through
``peft``'s ``get_delta_weight``): what the engines load and what an HF export holds.
``check_targets(model_dir, cfg)`` checks, before any actor starts, that every target module
is a linear layer of the model (built on the meta device from ``config.json``: no weights are read).

Mixture-of-experts models (``targets``): transformers 5 keeps each MoE block's experts as fused 3-D
parameters (``mlp.experts.gate_up_proj``, ``mlp.experts.down_proj``), not linear layers. The default
``target_modules`` on such a model means the linear layers among them (the attention projections, and
the MLP projections of any dense layers); naming an expert parameter is an error naming the key, because
peft adapts fused experts only through ``target_parameters``, which the merged export and vLLM's adapter
serving here do not handle (docs/moe.md).

Adapter-only transfer (``learner.lora.transfer: adapter``): ``AdapterExports.write`` saves the
adapters alone as a ``peft`` folder (``adapter_config.json`` + ``adapter_model.safetensors``),
a new numbered folder per sync under the learner's shared-memory dir, keeping the last two (an
engine replaced mid-sync reloads the newest while the one before stays readable). The engines
serve it with vLLM's LoRA support over their unchanged base (``rollout.engine.VLLMEngine.load_adapter``).

Sharded (FSDP2, several learners): the adapters are sharded with the layers they belong to;
merging gathers base, A and B one layer at a time, and an adapter export gathers A and B.
This module does not train, and it does not send anything to an engine itself.
"""

from __future__ import annotations

from typing import Any, Iterator

import shutil
from pathlib import Path

import torch

__all__ = [
    "enabled",
    "attach",
    "merged_tensors",
    "check_targets",
    "targets",
    "adapter_state",
    "AdapterExports",
]


def enabled(cfg: Any) -> bool:
    """Whether ``cfg`` (a ``rl.config.recipe.LoraConfig`` or None) asks for LoRA."""
    return cfg is not None and cfg.rank > 0


def _peft_config(cfg: Any, target_modules: list[str]) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def attach(model: torch.nn.Module, cfg: Any) -> Any:
    """Inject adapters into ``model`` (in place; the base is frozen); return the ``PeftModel``."""
    from peft import get_peft_model

    return get_peft_model(model, _peft_config(cfg, targets(model, cfg)))


def _lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def _full(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) tensor gathered in full (a collective), or ``t`` itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class Merged:
    """A merged weight computed on call (``shape`` known before): base + the active adapters' deltas.

    Sharded weights are gathered first (every rank must call it, in the same order), so the merge
    is the same ``W + scaling x B @ A`` as peft's ``get_delta_weight`` on full tensors.
    """

    def __init__(self, base: torch.Tensor, layer: Any) -> None:
        self.base, self.layer, self.shape = base, layer, base.shape

    def __call__(self) -> torch.Tensor:
        with torch.no_grad():
            w = _full(self.base.detach()).clone()
            for adapter in self.layer.active_adapters:
                if adapter not in self.layer.lora_A:
                    continue
                a = _full(self.layer.lora_A[adapter].weight.detach()).float()
                b = _full(self.layer.lora_B[adapter].weight.detach()).float()
                delta = b @ a
                if self.layer.fan_in_fan_out:
                    delta = delta.T
                w += (delta * self.layer.scaling[adapter]).to(w.dtype)
        return w


def merged_tensors(model: torch.nn.Module, lazy: bool = False) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) of the merged weights of ``model`` (an HF model with injected adapters).

    Adapted linears give ``base.weight + delta`` under the base's name (``.base_layer`` dropped;
    a ``Merged`` to call instead when ``lazy``, so that one merged copy exists at a time);
    adapter tensors themselves are left out; everything else is the parameter itself, so that
    tied tensors stay tied (sharded: a DTensor, which the caller gathers).
    """
    layers = _lora_layers(model)
    for key, t in model.state_dict(keep_vars=True).items():
        if ".lora_" in key:
            continue
        name = key.replace(".base_layer.", ".")
        owner = key.rsplit(".base_layer.", 1)[0] if ".base_layer." in key else None
        if owner in layers and key.endswith(".base_layer.weight"):
            m = Merged(t, layers[owner])
            yield name, (m if lazy else m())
        else:
            yield name, t


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors (detached, on CPU, gathered in full when sharded: a collective), under their
    state-dict names."""
    return {k: _full(v).detach().cpu() for k, v in model.state_dict().items() if ".lora_" in k}


class AdapterExports:
    """Numbered ``peft`` adapter folders ``adapter-NNNNNN`` under ``root``, the last ``keep`` of them kept.

    A new folder per export (never rewritten in place): an engine loading the previous one while
    the next is written reads a complete folder, and the folder name changes with every sync.
    """

    def __init__(self, root: str | Path, keep: int = 2) -> None:
        self.root, self.keep, self.count = Path(root), keep, 0

    def write(self, peft_model: Any, state: dict[str, torch.Tensor]) -> str:
        """Save ``state`` (``adapter_state``'s tensors) with ``peft_model``'s adapter config; return the folder."""
        self.count += 1
        folder = self.root / f"adapter-{self.count:06d}"
        tmp = self.root / f".adapter-{self.count:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        # peft renames the keys itself (``.default`` dropped): the folder is what PeftModel.from_pretrained and
        # vLLM's LoRARequest read. No model card: it would be rewritten every step for nobody.
        peft_model.save_pretrained(str(tmp), state_dict=state, safe_serialization=True)
        (tmp / "README.md").unlink(missing_ok=True)
        tmp.rename(folder)  # published whole
        for old in sorted(self.root.glob("adapter-*"))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return str(folder)


def _layer_names(model: torch.nn.Module) -> tuple[set[str], set[str]]:
    """(last names of the model's linear layers, last names of its fused 3-D expert parameters)."""
    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    experts = {name.rsplit(".", 1)[-1] for name, p in model.named_parameters() if p.dim() == 3 and ".experts." in name}
    return linear, experts


def targets(model: torch.nn.Module, cfg: Any, key: str = "learner.lora.target_modules") -> list[str]:
    """The module names to adapt in ``model``: ``cfg.target_modules``, except that on a mixture-of-experts model
    the default list means the linear layers among it. Raises ``rl.config.recipe.RecipeError`` naming ``key``
    for a name that is a fused expert parameter or no linear layer of the model."""
    from rl.config.recipe import LoraConfig, RecipeError

    linear, experts = _layer_names(model)
    wanted = list(cfg.target_modules)
    kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    if experts and wanted == LoraConfig().target_modules:
        wanted = [t for t in wanted if t in linear]
    fused = sorted(set(wanted) & experts - linear)
    if fused:
        raise RecipeError(
            f"{key}: {fused} are the fused expert weights of {kind}'s MoE blocks (3-D parameters "
            "mlp.experts.*), not linear layers; LoRA on experts is not supported (peft adapts them only through "
            "target_parameters, which the merged weight export and vLLM adapter serving do not handle): adapt "
            f"linear layers only, e.g. {sorted(t for t in linear if t.endswith(('q_proj', 'k_proj', 'v_proj', 'o_proj')))}"
        )
    missing = sorted(set(wanted) - linear)
    if missing or not wanted:
        raise RecipeError(
            f"{key}: {missing or wanted} not linear layers of {kind}; its linear layers are {sorted(linear)}"
        )
    return wanted


def check_targets(model_dir: str, cfg: Any, key: str = "learner.lora.target_modules") -> None:
    """Raise ``rl.config.recipe.RecipeError`` naming ``key`` when a target module is not a linear layer of the model
    in ``model_dir`` (built on the meta device from its config: no weights read; ``targets`` says which names
    count on an MoE model). No-op when LoRA is off."""
    if not enabled(cfg):
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(conf)
    targets(meta, cfg, key)
