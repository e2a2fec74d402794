"""The run's Ray placement groups (``reserve``, from ``rl.driver.placement.plan_placement``'s plan), each actor's
Ray options into its bundle (``Placement.options``), and where each actor landed (``actor_nodes``)."""

from __future__ import annotations

import time
from typing import Any

from rl.driver.placement import Plan, PlacementError, describe_group, fits_somewhere, fmt_resources

__all__ = ["Placement", "reserve", "actor_nodes"]


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
        never = [b for b in g.bundles if not fits_somewhere(b, totals)]
        why = (
            f"no node has the resources of a bundle {fmt_resources(never[0])}"
            if never
            else "each bundle fits some node, but not all of them at once with what is free (other actors or runs, "
            "or the strategy)"
        )
        lines.append(f"- {g.name}: {describe_group(g)} (strategy {g.strategy}): {why}; sized by {g.keys}")
    avail = ray.available_resources()
    node_lines = [
        f"  node {n.get('NodeManagerAddress', '?')} ({n.get('NodeID', '')[:8]}): {fmt_resources(t)}"
        for n, t in zip(nodes, totals)
    ]
    placement.remove()
    raise PlacementError(
        f"the Ray cluster could not place the run's actors within {timeout_s:g}s (cluster.placement_timeout_s):\n"
        + "\n".join(lines)
        + f"\nthe cluster's nodes ({len(nodes)}):\n"
        + "\n".join(node_lines)
        + f"\nfree now (this run's placed groups still holding theirs): {fmt_resources({k: float(v) for k, v in avail.items()})}\n"
        "custom resources come from `ray start --resources='{\"name\": amount}'` (docs/cluster.md)"
    )


def _node_of(_actor: Any) -> str:
    from rl.driver.actors.cluster import node_id

    return node_id()


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
