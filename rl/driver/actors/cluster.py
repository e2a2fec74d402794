"""Ray itself: connecting to (or starting) a cluster, reading its resources, stopping it, and running a plain
function on one node or on every node (a zero-CPU task pinned there with ``NodeAffinitySchedulingStrategy``).

The functions run on the nodes are plain ones of other packages (``rollout.pool.free_dead_engine``,
``rollout.shm.unlink_unmapped``, ``envs.stacks.dump_registered``, ``rl.trainer.hub.hub_snapshot``); this module
only places them.
"""

from __future__ import annotations

import os
from typing import Any, Callable

__all__ = [
    "init_ray",
    "is_up",
    "shutdown",
    "cluster_resources",
    "node_id",
    "alive_nodes",
    "on_node",
    "sweep_on_node",
    "prefetch_on_nodes",
]


def init_ray(*, address: str | None, num_cpus: int | None, verbose: bool, env_vars: dict[str, str]) -> bool:
    """Connect to ``address`` (None: start a local Ray with ``num_cpus``) unless Ray is up in this process already;
    every actor gets ``env_vars``. True when this call started the connection (the caller then shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address=address,
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=verbose,
        logging_level="INFO" if verbose else "WARNING",
        runtime_env={"env_vars": env_vars},
    )
    return True


def is_up() -> bool:
    import ray

    return bool(ray.is_initialized())


def shutdown() -> None:
    """Disconnect from Ray (and stop the local cluster this process started)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def cluster_resources() -> dict[str, float]:
    """The cluster's total resources (``CPU``, ``GPU``, custom ones)."""
    import ray

    return {k: float(v) for k, v in ray.cluster_resources().items()}


def node_id() -> str:
    """The Ray node id of the calling process (driver or actor)."""
    import ray

    return str(ray.get_runtime_context().get_node_id())


def alive_nodes() -> list[dict[str, Any]]:
    """Ray's record of every alive node (``NodeID``, ``NodeManagerAddress``, ``Resources``); [] when Ray is down."""
    import ray

    if not ray.is_initialized():
        return []
    return [n for n in ray.nodes() if n.get("Alive")]


def on_node(fn: Callable[..., Any], node: str, **remote: Any) -> Any:
    """``fn`` as a zero-CPU Ray task pinned to ``node`` (``.remote(*args)`` starts it); ``remote``: more task options."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, **remote)(fn)
    return task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))


def sweep_on_node(node: str, segments: list[str], wait_s: float) -> list[str] | None:
    """``rollout.shm.unlink_unmapped(segments, wait_s)`` on ``node`` (what a killed run's engines left there):
    the paths removed, or None when ``node`` is not an alive node of this cluster."""
    import ray

    from rollout.shm import unlink_unmapped

    if node not in {n["NodeID"] for n in alive_nodes()}:
        return None
    return list(ray.get(on_node(unlink_unmapped, node).remote(segments, wait_s), timeout=2 * wait_s + 30))


def prefetch_on_nodes(path: str, revision: str = "") -> dict[str, str]:
    """Resolve a Hub id once on every alive Ray node (a zero-CPU task pinned to each), so that actors on
    any node find it in that node's cache; returns {node id: local folder}. A local path or embedded
    model is resolved on the driver only (it must be reachable from the nodes as it is)."""
    from pathlib import Path

    import ray

    from rl.trainer.hub import hub_snapshot, is_hub_id, resolve_model

    if not is_hub_id(path) or Path(path).exists():
        return {node_id(): resolve_model(path, revision=revision)}
    nodes = [n["NodeID"] for n in alive_nodes()]
    return dict(zip(nodes, ray.get([on_node(hub_snapshot, n).remote(path, revision) for n in nodes])))
