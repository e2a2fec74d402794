"""``learner.weight_sync: auto`` (the default) resolved from where the actors landed
(``rl.driver.ray_runtime.resolve_weight_sync``): collective where an engine sits on another node than learner
rank 0 on CPU, file otherwise (same node, GPU, or a recipe collective refuses)."""

from __future__ import annotations

import pytest

from rl.config.recipe import load_recipe
from rl.driver.ray_runtime import resolve_weight_sync


@pytest.fixture
def tiny(recipe_copy):
    return lambda *overrides: load_recipe(recipe_copy("tiny.yaml"), list(overrides))


def test_auto_is_the_default_and_validates(tiny) -> None:
    assert tiny().learner.weight_sync == "auto"
    assert tiny("learner.delta_sync_full_every=3").learner.weight_sync == "auto", "delta sync keeps auto (file)"


def test_auto_is_collective_where_an_engine_is_on_another_node_on_cpu(tiny) -> None:
    cfg = tiny()
    choice, why = resolve_weight_sync(cfg, "cpu", "node-a", ["node-a", "node-b"])
    assert choice == "collective" and "1 engine(s) on other nodes" in why
    assert resolve_weight_sync(cfg, "cpu", "node-a", ["node-b", "node-b"])[0] == "collective"


def test_auto_is_file_on_one_node_on_gpu_and_where_collective_is_refused(tiny) -> None:
    cfg = tiny()
    assert resolve_weight_sync(cfg, "cpu", "node-a", ["node-a", "node-a"]) == (
        "file",
        "every engine is on learner rank 0's node",
    )
    choice, why = resolve_weight_sync(cfg, "gpu", "node-a", ["node-b"])
    assert choice == "file" and "NCCL" in why
    refused = (["learner.delta_sync_full_every=2"], ["learner.lora.rank=4", "learner.lora.transfer=adapter"])
    for overrides in refused:
        assert resolve_weight_sync(tiny(*overrides), "cpu", "node-a", ["node-b"])[0] == "file", overrides
