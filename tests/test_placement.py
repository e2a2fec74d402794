"""Placement groups per role (rl/driver/placement.py): the plan from the recipe's ``cluster`` section (pure), the
device resolution errors, and a group the cluster cannot hold failing fast with the resources named."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rl.config.recipe import RecipeError, load_recipe
from rl.driver.actors.placement import reserve
from rl.driver.placement import PlacementError, local_ray_cpus, plan_placement, resolve_device


@pytest.fixture
def recipe_file(recipe_copy) -> Path:
    return recipe_copy("tiny.yaml", filename="r.yaml")


def test_cpu_default_plan_keeps_todays_shares(recipe_file: Path) -> None:
    cfg = load_recipe(recipe_file)
    plan = plan_placement(cfg, "cpu")
    assert [g.name for g in plan.groups] == ["engines", "learners", "reward workers"]
    assert [list(g.bundles) for g in plan.groups] == [[{"CPU": 0.5}], [{"CPU": 1.0}], [{"CPU": 0.1}]]
    assert [(s.num_cpus, s.num_gpus) for s in plan.slots["engine"]] == [(0.5, 0.0)]
    assert [(s.num_cpus, s.num_gpus) for s in plan.slots["learner"]] == [(1.0, 0.0)]
    assert plan.total() == {"CPU": 1.6}
    assert local_ray_cpus(plan, cores=2, num_engines=1) == 3  # max(cores, 2 + engines), as before


def test_split_gpu_plan_with_custom_resources(recipe_file: Path) -> None:
    cfg = load_recipe(
        recipe_file,
        [
            "rollout.num_engines=3",
            "learner.workers=2",
            "reward_service.workers=2",
            "cluster.engine_resources={node_b: 1}",
            "cluster.learner_resources={node_a: 0.5}",
            "cluster.reward_resources={node_a: 0.1}",
            "cluster.engine_tp=2",
            "cluster.engine_gpus=2",
            "cluster.engine_cpus=2",
        ],
    )
    plan = plan_placement(cfg, "gpu")
    eng, lrn, rew = plan.groups
    assert eng.bundles == ({"CPU": 2.0, "GPU": 2.0, "node_b": 1.0},) * 3
    assert lrn.bundles == ({"CPU": 1.0, "GPU": 1.0, "node_a": 0.5},) * 2
    assert rew.bundles == ({"CPU": 0.1, "node_a": 0.1},) * 2
    assert [(s.group, s.bundle, s.num_gpus) for s in plan.slots["engine"]] == [(0, 0, 2.0), (0, 1, 2.0), (0, 2, 2.0)]
    assert [(s.group, s.bundle) for s in plan.slots["learner"]] == [(1, 0), (1, 1)]
    assert [(s.group, s.bundle, s.num_cpus) for s in plan.slots["reward"]] == [(2, 0, 0.1), (2, 1, 0.1)]
    assert plan.total()["GPU"] == 8.0 and not plan.colocated
    # The same recipe on CPU asks for no GPU (engine_tp would be refused by resolve_device first).
    assert "GPU" not in plan_placement(cfg, "cpu").total()


def test_colocated_plan_pairs_engine_and_learner_on_one_gpu(recipe_file: Path) -> None:
    cfg = load_recipe(
        recipe_file,
        [
            "cluster.placement=colocated",
            "rollout.num_engines=2",
            "learner.workers=2",
            "cluster.engine_gpus=0.4",
            "cluster.learner_gpus=0.6",
            "cluster.engine_resources={gpu_node: 1}",
        ],
    )
    plan = plan_placement(cfg, "gpu")
    assert plan.colocated and [g.name for g in plan.groups] == ["engines+learners", "reward workers"]
    assert plan.groups[0].bundles == ({"CPU": 1.5, "GPU": 1.0, "gpu_node": 1.0},) * 2
    assert [(s.group, s.bundle, s.num_gpus) for s in plan.slots["engine"]] == [(0, 0, 0.4), (0, 1, 0.4)]
    assert [(s.group, s.bundle, s.num_gpus) for s in plan.slots["learner"]] == [(0, 0, 0.6), (0, 1, 0.6)]


@pytest.mark.parametrize(
    "overrides, gpus, expected",
    [
        (
            ["cluster.placement=colocated", "cluster.engine_gpus=0.5", "cluster.learner_gpus=0.5"],
            0,
            "cluster.placement: colocated shares GPUs between engines and learners; the run is on CPU (cluster.device: auto, "
            "no GPU in the Ray cluster)",
        ),
        (["cluster.engine_tp=2", "cluster.engine_gpus=2"], 0, "cluster.engine_tp: tensor parallelism (2) needs GPUs"),
        (["cluster.device=gpu"], 0, "cluster.device: gpu, but the Ray cluster has no GPU"),
    ],
)
def test_resolve_device_errors(recipe_file: Path, overrides: list[str], gpus: float, expected: str) -> None:
    with pytest.raises(RecipeError) as e:
        resolve_device(load_recipe(recipe_file, overrides), gpus)
    assert expected in str(e.value)


def test_resolve_device(recipe_file: Path) -> None:
    cfg = load_recipe(recipe_file)
    assert resolve_device(cfg, 0) == "cpu" and resolve_device(cfg, 8) == "gpu"
    assert resolve_device(load_recipe(recipe_file, ["cluster.device=cpu"]), 8) == "cpu"


@pytest.mark.slow  # starts Ray
def test_unsatisfiable_placement_fails_fast_naming_the_resources(recipe_file: Path) -> None:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        # The CPU default fits a 2-CPU Ray; actors placed by its options land in their bundles.
        ok = reserve(plan_placement(load_recipe(recipe_file), "cpu"), timeout_s=30)
        try:
            probe = ray.remote(lambda: ray.get_runtime_context().get_node_id())
            nodes = ray.get(
                [probe.options(**o).remote() for r in ("engine", "learner", "reward") for o in ok.options(r)]
            )
            assert set(nodes) == {ray.get_runtime_context().get_node_id()}
            assert ok.node_ids("engine") == nodes[:1]
        finally:
            ok.remove()
        cfg = load_recipe(recipe_file, ["cluster.engine_resources={node_z: 1}", "rollout.num_engines=2"])
        t0 = time.monotonic()
        with pytest.raises(PlacementError) as e:
            reserve(plan_placement(cfg, "cpu"), timeout_s=2)
        assert time.monotonic() - t0 < 10
        msg = str(e.value)
        assert "within 2s (cluster.placement_timeout_s)" in msg
        assert "- engines: 2 x {CPU: 0.5, node_z: 1}" in msg and "no node has the resources" in msg
        assert "cluster.engine_resources" in msg and "rollout.num_engines" in msg
        assert "learners" not in msg  # the groups that were placed are not blamed
        # Too many CPUs: each bundle fits a node, not all at once.
        cfg = load_recipe(recipe_file, ["cluster.learner_cpus=1.5", "learner.workers=2"])
        with pytest.raises(PlacementError, match=r"- learners: 2 x \{CPU: 1.5\} \(strategy PACK\): each bundle fits"):
            reserve(plan_placement(cfg, "cpu"), timeout_s=2)
        deadline = time.monotonic() + 20
        while ray.available_resources().get("CPU") != 2.0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ray.available_resources().get("CPU") == 2.0  # every group of a failed reservation is removed
    finally:
        ray.shutdown()


@pytest.mark.slow  # `jointrl train` starts Ray before it can see the placement fails
@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["cluster.engine_resources={node_z: 1}", "cluster.placement_timeout_s=2"],
            [
                "could not place the run's actors within 2s",
                "- engines: 1 x {CPU: 0.5, node_z: 1}",
                "cluster.engine_resources",
            ],
        ),
        # auto resolves to cpu on this GPU-less machine: colocated is refused at start, naming the key.
        (
            ["cluster.placement=colocated", "cluster.engine_gpus=0.5", "cluster.learner_gpus=0.5"],
            ["cluster.placement: colocated shares GPUs", "no GPU in the Ray cluster"],
        ),
    ],
)
def test_cli_train_fails_fast_on_placement(
    recipe_file: Path, capsys: pytest.CaptureFixture, overrides: list[str], expected: list[str]
) -> None:
    from rl.cli.main import main

    t0 = time.monotonic()
    rc = main(["train", str(recipe_file), *overrides])
    # The start-up phase lines come first; the error is the one message after them.
    err = "\n".join(x for x in capsys.readouterr().err.splitlines() if not x.startswith("jointrl: start-up ["))
    assert rc == 2 and err.startswith("jointrl: error: ") and "Traceback" not in err
    for frag in expected:
        assert frag in err
    assert time.monotonic() - t0 < 60  # no engine was started
