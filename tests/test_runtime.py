"""The runtimes' wiring without starting them: what the Ray runtime hands the rollout pool, and the
in-process runtime's errors. The loop on the in-process runtime is tests/test_loop_inprocess.py."""

from __future__ import annotations

import dataclasses

import pytest

from rl.config.recipe import load_recipe


def test_rollout_max_restarts_reaches_the_pool(recipe_copy, monkeypatch) -> None:
    from rl.driver import ray_runtime

    got = {}

    class Pool:
        def __init__(self, n, model_path, env_specs, **kwargs):
            got.update(kwargs, n=n, env_specs=env_specs)

    monkeypatch.setattr(ray_runtime, "RolloutPool", Pool)
    cfg = load_recipe(recipe_copy("tiny.yaml"))
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_restarts=5))
    ray_runtime.make_rollout_pool(cfg, "m", [{}], None, colocated=False)
    assert got["max_restarts"] == 5, "rollout.max_restarts, not the pool's default"
    assert got["n"] == cfg.rollout.num_engines and got["env_specs"] == [("tool_call", "envs.toolcall.ToolCallEnv", {})]


def test_local_runtime_without_a_learner_says_so(recipe_copy, tiny_model_path) -> None:
    from rl.driver.local_runtime import LocalRuntime

    cfg = load_recipe(recipe_copy("tiny.yaml"))
    rt = LocalRuntime(cfg, tiny_model_path, learner=False)
    with pytest.raises(RuntimeError, match="start\\(\\) first"):
        rt.generate([], [], [], None)
    rt.start()
    try:
        with pytest.raises(RuntimeError, match="no learner"):
            rt.sync_weights()
    finally:
        rt.stop()


def test_unknown_engine_kind_is_named(tiny_model_path) -> None:
    from rollout.hf_engine import make_engine

    with pytest.raises(ValueError, match="engine 'tpu'"):
        make_engine("tpu", tiny_model_path)


@pytest.mark.parametrize(
    "sync, match",
    [("ipc", "learner.weight_sync: ipc"), ("collective", "learner.weight_sync: collective .* engine cannot join one")],
)
def test_local_runtime_refuses_ipc_weight_sync_before_building_anything(
    recipe_copy, tiny_model_path, sync: str, match: str
) -> None:
    """``learner.weight_sync: ipc`` pairs Ray actors on a shared GPU, ``collective`` needs engines that join a
    process group (the HF engine cannot); the in-process runtime says so at start."""
    from rl.driver.local_runtime import LocalRuntime

    cfg = load_recipe(recipe_copy("tiny.yaml"), [f"learner.weight_sync={sync}"])
    rt = LocalRuntime(cfg, tiny_model_path)
    with pytest.raises(ValueError, match=match):
        rt.start()
    assert rt.worker is None and rt.learner is None


def test_local_runtime_shared_memory_folder_goes_without_a_stop(recipe_copy, tiny_model_path) -> None:
    """The learner's weight file lives in a /dev/shm folder (memory): a runtime dropped without ``stop()`` (a caller
    that forgot it, an exception between start and stop) must not leave it behind for the machine's life."""
    import gc
    import os

    from rl.driver.local_runtime import LocalRuntime

    cfg = load_recipe(recipe_copy("tiny.yaml"))
    rt = LocalRuntime(cfg, tiny_model_path)
    rt.start()
    folder = rt.shm_dir
    assert folder and os.path.isdir(folder)
    del rt
    gc.collect()
    assert not os.path.exists(folder), "left behind after the runtime was dropped"
    again = LocalRuntime(cfg, tiny_model_path)
    again.start()
    folder = again.shm_dir
    again.stop()
    assert not os.path.exists(folder)
    again.stop()  # a second stop is a no-op
