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
(its CPU/GPU share and a ``PlacementGroupSchedulingStrategy`` into its bundle).

Ray is imported inside the functions that need it; ``plan_placement`` needs none.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from rl.config.recipe import Recipe, RecipeError, check_cluster

__all__ = [
    "GroupPlan",
    "Slot",
    "Plan",
    "PlacementError",
    "plan_placement",
    "resolve_device",
    "reserve",
    "Placement",
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


def _fmt(d: dict[str, float]) -> str:
    """``{CPU: 1, node_b: 0.5, memory: 12.0 GiB}``: Ray's internal keys (per-node ``node:<ip>``,
    placement-group ``*_group_*``) left out, byte counts in GiB."""
    parts = []
    for k, v in sorted(d.items()):
        if k.startswith("node:") or "_group_" in k:
            continue
        parts.append(f"{k}: {v / 2**30:.1f} GiB" if k in ("memory", "object_store_memory") else f"{k}: {v:g}")
    return "{" + ", ".join(parts) + "}"


def _describe(g: GroupPlan) -> str:
    shapes: dict[str, int] = {}
    for b in g.bundles:
        shapes[_fmt(b)] = shapes.get(_fmt(b), 0) + 1
    return " + ".join(f"{n} x {s}" for s, n in shapes.items())


def _fits_somewhere(bundle: dict[str, float], nodes: list[dict[str, float]]) -> bool:
    return any(all(n.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()) for n in nodes)


class Placement:
    """The run's placement groups (``reserve``) and each actor's Ray options."""

    def __init__(self, plan: Plan, pgs: list[Any]) -> None:
        self.plan, self.pgs = plan, pgs

    def options(self, role: str) -> list[dict[str, Any]]:
        """One dict of Ray actor options per actor of ``role`` (engine | learner | reward)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        out = []
        for s in self.plan.slots[role]:
            out.append(
                {
                    "num_cpus": s.num_cpus,
                    "num_gpus": s.num_gpus,
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        self.pgs[s.group],
                        placement_group_bundle_index=s.bundle,
                        placement_group_capture_child_tasks=False,
                    ),
                }
            )
        return out

    def node_ids(self, role: str) -> list[str]:
        """The Ray node id of each actor slot of ``role`` (from the placement groups' bundle table)."""
        from ray.util import placement_group_table

        tables = [placement_group_table(pg).get("bundles_to_node_id", {}) for pg in self.pgs]
        return [tables[s.group].get(s.bundle, "") for s in self.plan.slots[role]]

    def remove(self) -> None:
        from ray.util import remove_placement_group

        for pg in self.pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - already gone with the cluster
                pass
        self.pgs = []


def reserve(plan: Plan, timeout_s: float) -> Placement:
    """Create ``plan``'s placement groups and wait until all are placed, at most ``timeout_s`` seconds.

    Raises ``PlacementError`` (after removing the groups) naming each group that was not
    placed: its bundles, the recipe keys behind them, whether any node could ever hold one
    of its bundles, and every node's resources.
    """
    import ray
    from ray.util import placement_group

    pgs = [placement_group([dict(b) for b in g.bundles], strategy=g.strategy, name="") for g in plan.groups]
    placement = Placement(plan, pgs)
    deadline = time.monotonic() + timeout_s
    pending = {pg.ready(): i for i, pg in enumerate(pgs)}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=max(0.0, deadline - time.monotonic()))
        for ref in ready:
            pending.pop(ref)
        if pending and time.monotonic() >= deadline:
            break
    if not pending:
        return placement
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    totals = [
        {k: float(v) for k, v in n.get("Resources", {}).items() if not k.startswith("node:") and "_group_" not in k}
        for n in nodes
    ]
    lines = []
    for i in sorted(pending.values()):
        g = plan.groups[i]
        never = [b for b in g.bundles if not _fits_somewhere(b, totals)]
        why = (
            f"no node has the resources of a bundle {_fmt(never[0])}"
            if never
            else "each bundle fits some node, but not all of them at once with what is free (other actors or runs, "
            "or the strategy)"
        )
        lines.append(f"- {g.name}: {_describe(g)} (strategy {g.strategy}): {why}; sized by {g.keys}")
    avail = ray.available_resources()
    node_lines = [
        f"  node {n.get('NodeManagerAddress', '?')} ({n.get('NodeID', '')[:8]}): {_fmt(t)}"
        for n, t in zip(nodes, totals)
    ]
    placement.remove()
    raise PlacementError(
        f"the Ray cluster could not place the run's actors within {timeout_s:g}s (cluster.placement_timeout_s):\n"
        + "\n".join(lines)
        + f"\nthe cluster's nodes ({len(nodes)}):\n"
        + "\n".join(node_lines)
        + f"\nfree now (this run's placed groups still holding theirs): {_fmt({k: float(v) for k, v in avail.items()})}\n"
        "custom resources come from `ray start --resources='{\"name\": amount}'` (docs/cluster.md)"
    )


def _node_of(_actor: Any) -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def actor_nodes(handles: list[Any]) -> list[dict[str, Any]]:
    """Where each actor runs, asked of the actor itself: ``{"node_id", "node_ip", "resources"}`` (the
    node's custom resources, e.g. ``{"node_b": 1}``)."""
    import ray

    ids = ray.get([h.__ray_call__.remote(_node_of) for h in handles])
    nodes = {n["NodeID"]: n for n in ray.nodes()}
    out = []
    for i in ids:
        n = nodes.get(i, {})
        custom = {
            k: v
            for k, v in n.get("Resources", {}).items()
            if k not in ("CPU", "GPU", "memory", "object_store_memory")
            and not k.startswith(("node:", "accelerator_type:"))
        }
        out.append({"node_id": i, "node_ip": n.get("NodeManagerAddress", ""), "resources": custom})
    return out
