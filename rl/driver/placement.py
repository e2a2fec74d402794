"""Where the actors go: Ray placement groups per role, from the recipe's ``cluster`` section.

``plan_placement`` (pure) turns a recipe and a device into bundles:

* **split** (default): one placement group of ``rollout.num_engines`` bundles
  ``{CPU: engine_cpus, GPU: engine_gpus, **engine_resources}`` (strategy PACK), one of
  ``learner.workers`` bundles ``{CPU: learner_cpus, GPU: learner_gpus, **learner_resources}``
  (PACK: on one node when it fits, which keeps the learners' rendezvous local);
* **colocated** (GPU only): one group of ``num_engines`` (= ``learner_workers``) bundles, each
  ``{CPU: engine_cpus + learner_cpus, GPU: 1, **both resources}``;
  engine i and learner worker i share bundle i, i.e. one GPU (Ray's fractional GPUs only
  schedule: both processes see the whole device; vLLM sleeps during the learner step);
* reward workers: one group of ``reward_service.workers`` bundles ``{CPU: reward_cpus, **reward_resources}``.

On CPU the GPU keys are ignored (0 GPUs). ``reserve`` creates the groups and waits for them
at most ``cluster.placement_timeout_s``; a group the cluster cannot hold raises
``PlacementError`` naming what was asked for, the recipe keys that size it, and what each
node has, instead of hanging. ``Placement.options(role)`` gives each actor's Ray options
(its CPU/GPU share and a ``PlacementGroupSchedulingStrategy`` into its bundle). ``reserve`` and
``Placement`` are Ray's, in ``rl.driver.actors.placement``; this module plans, and imports no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rl.config.recipe import Recipe, RecipeError, check_cluster

__all__ = [
    "GroupPlan",
    "Slot",
    "Plan",
    "PlacementError",
    "plan_placement",
    "resolve_device",
    "local_ray_cpus",
]

ROLES = ("engine", "learner", "reward")


class PlacementError(RuntimeError):
    """The cluster could not place the run's actors (message names the resources and recipe keys)."""


@dataclass(frozen=True)
class GroupPlan:
    """One placement group: its bundles, strategy, and the recipe keys that size it (for errors)."""

    name: str
    bundles: tuple[dict[str, float], ...]
    strategy: str
    keys: str


@dataclass(frozen=True)
class Slot:
    """Where one actor goes: bundle ``bundle`` of group ``group``, taking ``num_cpus``/``num_gpus`` of it."""

    group: int
    bundle: int
    num_cpus: float
    num_gpus: float


@dataclass(frozen=True)
class Plan:
    device: str  # cpu | gpu
    colocated: bool
    groups: tuple[GroupPlan, ...]
    slots: dict[str, tuple[Slot, ...]]  # role -> one slot per actor

    def total(self) -> dict[str, float]:
        """Resources of all bundles together."""
        out: dict[str, float] = {}
        for g in self.groups:
            for b in g.bundles:
                for k, v in b.items():
                    out[k] = out.get(k, 0.0) + v
        return out


def _bundle(cpus: float, gpus: float, custom: dict[str, float]) -> dict[str, float]:
    b = {"CPU": float(cpus)}
    if gpus > 0:
        b["GPU"] = float(gpus)
    for k, v in custom.items():
        b[k] = b.get(k, 0.0) + float(v)
    return b


def plan_placement(recipe: Recipe, device: str) -> Plan:
    """The placement groups and actor slots of ``recipe`` on ``device`` (``cpu`` | ``gpu``). Pure."""
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be cpu or gpu, got {device!r}")
    c, n_rew = recipe.cluster, recipe.reward_service.workers
    colocated = c.placement == "colocated"
    groups, slots = (_colocated_groups if colocated else _split_groups)(recipe, device == "gpu")
    groups.append(
        GroupPlan(
            "reward workers",
            tuple(_bundle(c.reward_cpus, 0, c.reward_resources) for _ in range(n_rew)),
            "PACK",
            "reward_service.workers, cluster.reward_cpus, cluster.reward_resources",
        )
    )
    slots["reward"] = tuple(Slot(len(groups) - 1, i, c.reward_cpus, 0.0) for i in range(n_rew))
    return Plan(device, colocated, tuple(groups), slots)


_GroupsAndSlots = tuple[list[GroupPlan], dict[str, tuple[Slot, ...]]]


def _colocated_groups(recipe: Recipe, gpu: bool) -> _GroupsAndSlots:
    """One group whose bundle ``i`` holds engine ``i`` and learner ``i`` (one GPU each, shared)."""
    c, n_eng, n_lrn = recipe.cluster, recipe.rollout.num_engines, recipe.learner.workers
    eg, lg = (c.engine_gpus, c.learner_gpus) if gpu else (0.0, 0.0)
    merged = dict(c.engine_resources)
    for k, v in c.learner_resources.items():
        merged[k] = merged.get(k, 0.0) + v
    group = GroupPlan(
        "engines+learners",
        tuple(_bundle(c.engine_cpus + c.learner_cpus, 1.0 if gpu else 0.0, merged) for _ in range(n_eng)),
        "PACK",
        "rollout.num_engines, learner.workers, cluster.engine_cpus/_gpus/_resources, "
        "cluster.learner_cpus/_gpus/_resources",
    )
    slots = {
        "engine": tuple(Slot(0, i, c.engine_cpus, eg) for i in range(n_eng)),
        "learner": tuple(Slot(0, i, c.learner_cpus, lg) for i in range(n_lrn)),
    }
    return [group], slots


def _split_groups(recipe: Recipe, gpu: bool) -> _GroupsAndSlots:
    """An engine group and a learner group, each bundle its own resources."""
    c, n_eng, n_lrn = recipe.cluster, recipe.rollout.num_engines, recipe.learner.workers
    eg, lg = (c.engine_gpus, c.learner_gpus) if gpu else (0.0, 0.0)
    groups = [
        GroupPlan(
            "engines",
            tuple(_bundle(c.engine_cpus, eg, c.engine_resources) for _ in range(n_eng)),
            "PACK",
            "rollout.num_engines, cluster.engine_cpus, cluster.engine_gpus, cluster.engine_resources",
        ),
        GroupPlan(
            "learners",
            tuple(_bundle(c.learner_cpus, lg, c.learner_resources) for _ in range(n_lrn)),
            "PACK",
            "learner.workers, cluster.learner_cpus, cluster.learner_gpus, cluster.learner_resources",
        ),
    ]
    slots = {
        "engine": tuple(Slot(0, i, c.engine_cpus, eg) for i in range(n_eng)),
        "learner": tuple(Slot(1, i, c.learner_cpus, lg) for i in range(n_lrn)),
    }
    return groups, slots


def resolve_device(recipe: Recipe, cluster_gpus: float) -> str:
    """``cluster.device`` resolved against the Ray cluster's GPU count; re-checks the ``cluster`` section
    for that device (``RecipeError`` naming the key, e.g. colocated or engine_tp > 1 on CPU)."""
    d = recipe.cluster.device
    if d == "gpu" and cluster_gpus <= 0:
        raise RecipeError(
            "cluster.device: gpu, but the Ray cluster has no GPU (ray.cluster_resources() lists none); "
            "start the nodes on GPU machines or set cluster.device: cpu"
        )
    dev = d if d != "auto" else ("gpu" if cluster_gpus > 0 else "cpu")
    check_cluster(recipe, dev)
    return dev


def local_ray_cpus(plan: Plan, cores: int, num_engines: int) -> int:
    """CPUs of the local Ray a run starts: the machine's cores, at least ``2 + num_engines`` (the
    historical default) and at least what the placement groups ask for."""
    return max(cores, 2 + num_engines, math.ceil(plan.total().get("CPU", 0.0) - 1e-9))


def oversubscription(recipe: Recipe, cores: int, gpus: int, where: str = "a machine") -> list[str]:
    """Warnings for a run whose actors ask for more CPUs or GPUs than ``where`` has (``cores``, ``gpus``):
    on this machine Ray is started large enough to place them, so they would share the cores (or a GPU)
    and run slower than the recipe suggests, with no error; on an existing Ray cluster (``where`` "the Ray
    cluster", its resources) the placement would wait for resources that never come. Empty when everything
    fits."""
    device = recipe.cluster.device if recipe.cluster.device != "auto" else ("gpu" if gpus else "cpu")
    total = plan_placement(recipe, device).total()
    roles = (
        f"rollout.num_engines={recipe.rollout.num_engines} x cluster.engine_cpus={recipe.cluster.engine_cpus}, "
        f"learner.workers={recipe.learner.workers} x cluster.learner_cpus={recipe.cluster.learner_cpus}, "
        f"reward_service.workers={recipe.reward_service.workers} x cluster.reward_cpus={recipe.cluster.reward_cpus}"
    )
    out = []
    cpu = total.get("CPU", 0.0)
    if cpu > cores + 1e-9:
        share = "they will share the cores" if where == "a machine" else "they cannot all be placed"
        out.append(f"the actors ask for {cpu:g} CPUs ({roles}) on {where} with {cores}: {share}")
    gpu = total.get("GPU", 0.0)
    if gpu > gpus + 1e-9:
        out.append(
            f"the actors ask for {gpu:g} GPUs on {where} with {gpus} (cluster.engine_gpus, cluster.learner_gpus)"
        )
    return out


def local_gpus() -> int:
    """NVIDIA GPUs this machine lists (``nvidia-smi -L``; 0 without the tool), without importing torch."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def fmt_resources(d: dict[str, float]) -> str:
    """``{CPU: 1, node_b: 0.5, memory: 12.0 GiB}``: Ray's internal keys (per-node ``node:<ip>``,
    placement-group ``*_group_*``) left out, byte counts in GiB."""
    parts = []
    for k, v in sorted(d.items()):
        if k.startswith("node:") or "_group_" in k:
            continue
        parts.append(f"{k}: {v / 2**30:.1f} GiB" if k in ("memory", "object_store_memory") else f"{k}: {v:g}")
    return "{" + ", ".join(parts) + "}"


def describe_group(g: GroupPlan) -> str:
    """``2 x {CPU: 1} + 1 x {CPU: 2}``: a group's bundles by shape (for placement errors)."""
    shapes: dict[str, int] = {}
    for b in g.bundles:
        shapes[fmt_resources(b)] = shapes.get(fmt_resources(b), 0) + 1
    return " + ".join(f"{n} x {s}" for s, n in shapes.items())


def fits_somewhere(bundle: dict[str, float], nodes: list[dict[str, float]]) -> bool:
    """Whether some node's total resources could ever hold ``bundle``."""
    return any(all(n.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()) for n in nodes)
