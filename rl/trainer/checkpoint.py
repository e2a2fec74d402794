"""Learner checkpoints: ``save`` and ``load`` round-trip a learner's training state; ``policy_from_checkpoint``
rebuilds a checkpoint's policy as one plain HF model (adapters merged), for ``jointrl export``.

A checkpoint folder holds ``dcp/`` (the trainable weights and the main optimizer through
``torch.distributed.checkpoint``, each rank its shard: a restore onto another number of ranks reshards),
``model/`` only where the save was asked for an HF export (``export_dtype``: the run's last checkpoint, in the
engines' dtype; gathering the full model on rank 0 at every save would stall training, and ``jointrl export``
writes the same folder from ``dcp/`` for any checkpoint), ``adapter/`` (LoRA), ``critic.safetensors``,
``learner_state.pt`` (schedules, the critic's optimizer, the KL controller, counters, rank 0's RNG states) and
``rng_rank<r>.pt``, and ``dcp/.complete``, written by rank 0 once every rank's ``dcp/`` is on disk: a folder
without it is torn (its writer was killed) and is never loaded.

``dcp/`` is written asynchronously (``torch.distributed.checkpoint.async_save``, in a thread, over a gloo
process group of its own so that its collectives never interleave with training's): ``save`` returns once the
state is copied to host memory and training goes on while it is written. The next ``save``, a ``load``,
``finish`` and the learner's shutdown wait for the write in flight (and raise its error). The functions read and
set the learner's parts by name (``model``, ``peft``, ``opt``,
``sched``, ``critic_opt``, ``critic_sched``, ``kl_ctl``, ``gen``, counters); they do not train.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Any

import torch

from rl.trainer import fsdp, lora


def _state_modules(lrn: Any) -> torch.nn.Module:
    """The modules of the main optimizer under stable names (``policy``, ``value_head``), for
    ``torch.distributed.checkpoint``'s parameter <-> name mapping."""
    mods = torch.nn.ModuleDict({"policy": lrn.model})
    if lrn.value_head is not None:
        mods["value_head"] = lrn.value_head
    return mods


DONE_FILE = ".complete"  # in dcp/


def finish(lrn: Any) -> None:
    """Wait for the learner's checkpoint write in flight, if any (every rank); raise its error, naming the folder."""
    pending = getattr(lrn, "_ckpt_pending", None)
    if pending is None:
        return
    lrn._ckpt_pending = None
    future, path = pending
    try:
        future.result()
    except Exception as e:
        raise RuntimeError(f"{path}: the asynchronous checkpoint write failed: {type(e).__name__}: {e}") from e
    if lrn.rank == 0:  # the done-callback may still be running: the marker is written before this returns
        _mark_done(path, future)


def _async_group(lrn: Any) -> Any:
    """A gloo process group of the learner's ranks for the checkpoint thread's collectives (made once, by every
    rank at its first save), or None without a process group."""
    if not fsdp.active():
        return None
    group = getattr(lrn, "_ckpt_group", None)
    if group is None:
        import torch.distributed as dist

        group = lrn._ckpt_group = dist.new_group(backend="gloo")
    return group


def _mark_done(path: Path, future: Any) -> None:
    """Rank 0's ``dcp/.complete`` once its write (which ends after every rank's: dcp gathers their results
    before it writes ``.metadata``) succeeded."""
    done = path / "dcp" / DONE_FILE
    if future.exception() is None and not done.is_file():
        with contextlib.suppress(FileNotFoundError):  # the driver already published (renamed) the folder
            done.write_text("complete\n")


def save(lrn: Any, path: str, wait: bool = True, export_dtype: str | None = None) -> None:
    """Into folder ``path`` (every rank calls it, into the same folder); first waits for the previous save's
    write (``finish``). ``wait=False``: returns while ``dcp/`` is written (module docstring);
    ``dcp/.complete`` appears when it is complete.

    - ``dcp/``: the policy's trainable weights (all of them; with LoRA the adapters only),
      the value head and their AdamW state through ``torch.distributed.checkpoint``, each
      rank writing its own shard;
    - ``model/`` (only with ``export_dtype``, e.g. ``"bfloat16"``): the policy as an HF folder + tokenizer in
      that dtype (gathered on rank 0 one tensor at a time; with LoRA the merged weights; what ``jointrl
      eval``/``score``, transformers and vLLM load);
    - ``adapter/``: with LoRA, the adapters as a ``peft`` folder;
    - ``critic.safetensors``: value head or separate critic, if any (rank 0);
    - ``learner_state.pt`` (rank 0): the critic's optimizer, LR schedulers, KL controller,
      rank 0's torch/Python/shuffle/CUDA RNG states, ``steps_done``, ``updates_done``;
      ``rng_rank<r>.pt``: rank r's RNG states (r > 0).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    finish(lrn)
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    (p / "dcp" / DONE_FILE).unlink(missing_ok=True)
    full = _full_weights(lrn, _DTYPES[export_dtype]) if export_dtype is not None else None
    adapter = _adapter_weights(lrn)
    rng = _rng_states(lrn)
    if lrn.rank > 0:
        torch.save(rng, p / f"rng_rank{lrn.rank}.pt")
    else:
        if full is not None:
            _save_hf(lrn, p / "model", full, export_dtype)  # type: ignore[arg-type]
        _save_rank0(lrn, p, adapter, rng)
    del full
    mods = _state_modules(lrn)
    future = dcp.async_save(
        {"model": _trainable_state(mods), "optim": get_optimizer_state_dict(mods, lrn.opt)},
        checkpoint_id=str(p / "dcp"),
        process_group=_async_group(lrn),
        no_dist=not fsdp.active(),
    )
    if lrn.rank == 0:
        future.add_done_callback(lambda f: _mark_done(p, f))
    lrn._ckpt_pending = (future, p)
    if wait:
        finish(lrn)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _full_weights(lrn: Any, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The policy's full weights (with LoRA: merged) in ``dtype`` on rank 0 (empty on the others), gathered one
    tensor at a time when sharded (every rank takes part), so rank 0 holds the export's bytes plus one full
    tensor in the learner's dtype, not the whole model in it. A tied weight (``lm_head`` sharing the
    embeddings) is one tensor under both names, which ``save_pretrained`` writes once."""
    live = lrn.peft is None  # the module's own tensors (keep_vars), alive throughout: their ids are stable
    items = lrn.model.state_dict(keep_vars=True).items() if live else lora.merged_tensors(lrn.model)
    full: dict[str, torch.Tensor] = {}
    seen: dict[int, str] = {}  # id of a parameter -> its first name (tied weights are one Parameter)
    for k, v in items:
        if live and id(v) in seen:
            if lrn.rank == 0:
                full[k] = full[seen[id(v)]]
            continue
        seen[id(v)] = k
        v = v.full_tensor() if fsdp.is_dtensor(v) else v
        if lrn.rank == 0:
            full[k] = v.detach().to("cpu", dtype, copy=True)
        del v
    return full


def _adapter_weights(lrn: Any) -> dict[str, torch.Tensor] | None:
    """With LoRA, the adapters' tensors (gathered when sharded; every rank takes part); else None."""
    if lrn.peft is None:
        return None
    return {
        k: (v.full_tensor() if fsdp.is_dtensor(v) else v).detach().cpu()
        for k, v in lrn.peft.state_dict().items()
        if ".lora_" in k
    }


def _save_hf(lrn: Any, folder: Path, full: dict[str, torch.Tensor], dtype: str) -> None:
    """``folder`` as an HF model folder of ``full`` with the tokenizer; ``config.json`` records ``dtype`` (the
    learner's model config holds the learner's, which ``save_pretrained`` writes)."""
    import copy

    lrn.model.save_pretrained(folder, state_dict=full)
    config = copy.deepcopy(lrn.model.config)
    config.dtype = dtype
    config.save_pretrained(folder)
    lrn.tokenizer.save_pretrained(folder)


def _rng_states(lrn: Any) -> dict[str, Any]:
    """This rank's torch, Python, shuffle and CUDA RNG states."""
    return {
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "shuffle_rng": lrn.gen.get_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _save_rank0(lrn: Any, p: Path, adapter: dict[str, torch.Tensor] | None, rng: dict[str, Any]) -> None:
    """Rank 0's part of ``save_checkpoint`` besides ``model/``: ``adapter/``, ``critic.safetensors``,
    ``learner_state.pt``."""
    from safetensors.torch import save_file

    if lrn.peft is not None:
        lrn.peft.save_pretrained(p / "adapter", state_dict=adapter)
    crit = lrn.critic_module()
    if crit is not None:
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in crit.state_dict().items()}, str(p / "critic.safetensors")
        )
    state = {
        "scheduler": lrn.sched.state_dict(),
        "critic_optimizer": lrn.critic_opt.state_dict() if lrn.critic_opt is not None else None,
        "critic_scheduler": lrn.critic_sched.state_dict() if lrn.critic_sched is not None else None,
        "kl_controller": lrn.kl_ctl.state_dict(),
        "steps_done": lrn.steps_done,
        "updates_done": lrn.updates_done,
        "algo": lrn.algo.name,
        "critic": lrn.algo.critic.model if crit is not None else None,
        "world_size": lrn.world_size,
        "dcp_async": True,  # dcp/.complete marks the end of the write (check_complete)
        **rng,
    }
    torch.save(state, p / "learner_state.pt")


def load(lrn: Any, path: str) -> None:
    """Restore everything ``save_checkpoint`` wrote (every rank calls it); the learner must be built with
    the same algorithm and critic.

    Onto the same number of learners the restore is exact. Onto a different number,
    ``torch.distributed.checkpoint`` reshards the weights and optimizer state (exact too);
    ranks without an RNG file of their own take rank 0's, and the batch is sharded
    differently, so later steps match a same-size resume only in distribution.
    """
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    finish(lrn)
    p = Path(path)
    if (p / "learner_state.pt").is_file() and (p / "dcp").is_dir():
        check_complete(p)  # a torn folder is named as one
    if not (p / "dcp" / ".metadata").is_file():
        raise ValueError(
            f"{p}: not a learner checkpoint of this version (no dcp/.metadata: sharded weights and optimizer state)"
        )
    st = torch.load(p / "learner_state.pt", weights_only=False)
    crit = lrn.critic_module()
    if st.get("critic") != (lrn.algo.critic.model if crit is not None else None):
        raise ValueError(
            f"{p}: checkpoint critic {st.get('critic')!r} does not match this learner's "
            f"({lrn.algo.critic.model if crit is not None else None!r})"
        )
    mods = _state_modules(lrn)
    state = {"model": _trainable_state(mods), "optim": get_optimizer_state_dict(mods, lrn.opt)}
    dcp.load(state, checkpoint_id=str(p / "dcp"), no_dist=not fsdp.active())
    set_model_state_dict(mods, state["model"], options=StateDictOptions(strict=False))
    set_optimizer_state_dict(mods, lrn.opt, state["optim"])
    del state
    if crit is not None:
        crit.load_state_dict(load_file(str(p / "critic.safetensors")))
    lrn.sched.load_state_dict(st["scheduler"])
    if lrn.critic_opt is not None:
        lrn.critic_opt.load_state_dict(st["critic_optimizer"])
        lrn.critic_sched.load_state_dict(st["critic_scheduler"])  # type: ignore[union-attr]
    lrn.kl_ctl.load_state_dict(st["kl_controller"])
    lrn.steps_done = st["steps_done"]
    lrn.updates_done = st.get("updates_done", 0)
    own = p / f"rng_rank{lrn.rank}.pt"
    rng = torch.load(own, weights_only=False) if lrn.rank > 0 and own.is_file() else st
    torch.set_rng_state(rng["torch_rng"])
    random.setstate(rng["python_rng"])
    lrn.gen.set_state(rng["shuffle_rng"])
    if rng.get("cuda_rng") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda_rng"])


def check_complete(path: Path) -> None:
    """Raise naming ``path`` when its ``dcp/`` write never finished (no ``dcp/.complete``: a torn checkpoint).
    Checkpoints written before asynchronous saves (``learner_state.pt`` without ``dcp_async``) were whole."""
    st = torch.load(path / "learner_state.pt", weights_only=False)
    if st.get("dcp_async") and not (path / "dcp" / DONE_FILE).is_file():
        raise ValueError(
            f"{path}: a torn checkpoint (no dcp/{DONE_FILE}: its asynchronous write was interrupted); use an older one"
        )


def policy_from_checkpoint(path: str | Path, model_path: str, lora_cfg: Any = None) -> Any:
    """The policy of learner checkpoint ``path`` as a plain HF causal LM (float32, on CPU), for an export.

    Read from the checkpoint's ``dcp/`` (``save_checkpoint``; written by 1 or N ranks,
    ``torch.distributed.checkpoint`` reshards on load, here into one unsharded model): the base
    ``model_path`` (the run's ``model.path``, resolved) is loaded, the trainable weights (all of
    them; with LoRA, built with the run's ``learner.lora``, the adapters) are set from the
    checkpoint, and LoRA adapters are merged into the base (``peft``'s ``merge_and_unload``).
    Raises ``FileNotFoundError`` naming ``dcp/.metadata`` when the checkpoint has none.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoModelForCausalLM

    meta = Path(path) / "dcp" / ".metadata"
    if (Path(path) / "learner_state.pt").is_file() and meta.parent.is_dir():
        check_complete(Path(path))  # a torn folder is named as one
    if not meta.is_file():
        raise FileNotFoundError(f"{meta}: not found; {path} is not a learner checkpoint of this version")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    peft = lora.attach(model, lora_cfg) if lora.enabled(lora_cfg) else None
    mods = torch.nn.ModuleDict({"policy": model})  # the names save_checkpoint used (_state_modules)
    state = {"model": _trainable_state(mods)}
    dcp.load(state, checkpoint_id=str(meta.parent), no_dist=True)
    set_model_state_dict(mods, state["model"], options=StateDictOptions(strict=False))
    return peft.merge_and_unload() if peft is not None else model


def _trainable_state(mods: torch.nn.Module) -> dict[str, Any]:
    """``get_model_state_dict(mods)`` without frozen parameters (LoRA's base: it never changes and is not
    checkpointed). Filtered by name because ``ignore_frozen_params`` lets a tied alias (lm_head) through."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    live = {k for k, v in mods.named_parameters(remove_duplicate=False) if v.requires_grad}
    frozen = {k for k, v in mods.named_parameters(remove_duplicate=False) if not v.requires_grad}
    sd = get_model_state_dict(mods, options=StateDictOptions(ignore_frozen_params=True))
    return {k: v for k, v in sd.items() if k in live or k not in frozen}
