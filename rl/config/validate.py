"""``validate_recipe``: everything about a recipe that can be checked without starting anything.

Field types, choices and bounds were checked when the recipe was built (``rl/config/loading.py``).
This runs, in order: the rules across sections (``rl/config/rules.py``), the cluster section
(``rl/config/cluster_checks.py``), then the world: the model folder, task files (loaded once for all
their checks, ``rl/config/task_files.py``) and dataset folders, env and reward classes (imported,
their kwargs bound to their signatures), ``rollout.engine_kwargs`` against the installed vLLM, the
learner's allocator, and the output dir (``rl/config/output_dir.py``). The first problem raises
``RecipeError`` naming its key and line.

This module does not start Ray, load models or touch the network (it imports vLLM, lazily, only to
check a non-empty ``rollout.engine_kwargs``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rl.config.cluster_checks import check_cluster
from rl.config.loading import Fail, failer, resolve_path
from rl.config.output_dir import check_output_dir
from rl.config.rules import cross_section_rules
from rl.config.schema import HUB_ID, Recipe
from rl.config.task_files import check_task_files, load_task_files

__all__ = ["validate_recipe", "ENGINE_KWARGS_OWNED", "vllm_engine_arg_names", "check_engine_kwargs"]


def validate_recipe(recipe: Recipe, check_imports: bool = True, *, task_domains: bool = False) -> None:
    """Check everything about ``recipe`` that can be checked without starting anything (this module's
    docstring lists it); ``check_imports`` imports the env and reward classes, ``task_domains`` checks that
    ``rollout.envs`` serves every task's domain. Raises ``RecipeError`` naming the first problem's key."""
    fail = failer(recipe)
    for key, msg in cross_section_rules(recipe):
        fail(key, msg)
    check_cluster(recipe)
    _check_files(recipe, fail)
    check_task_files(recipe, load_task_files(recipe), fail, domains=task_domains)
    if check_imports:
        _check_classes(recipe, fail)
    check_engine_kwargs(recipe.rollout.engine_kwargs, fail)
    _check_allocator(recipe, fail)
    check_output_dir(recipe, fail)


def _check_allocator(recipe: Recipe, fail: Fail) -> None:
    from rl.trainer.memory import jemalloc_path

    if recipe.learner.allocator == "jemalloc" and jemalloc_path() is None:
        fail(
            "learner.allocator",
            "jemalloc, but libjemalloc.so.2 is not installed on this machine (Debian/Ubuntu: apt install "
            "libjemalloc2); 'auto' uses it where it is found, 'system' keeps glibc's malloc",
        )


# vLLM engine arguments jointrl sets itself, and the recipe key that owns each.
ENGINE_KWARGS_OWNED = {
    "model": "model.path",
    "tokenizer": "model.path",
    "dtype": "model.engine_dtype",
    "seed": "run.seed",
    "max_model_len": "rollout.max_model_len",
    "gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "kv_cache_memory_bytes": "rollout.kv_cache_gib",
    "tensor_parallel_size": "cluster.engine_tp",
    "distributed_executor_backend": "cluster.engine_tp",
    "enable_sleep_mode": "cluster.placement",
    "enable_return_routed_experts": "learner.routing_replay",
}


def vllm_engine_arg_names() -> set[str]:
    """The field names of the installed vLLM's ``EngineArgs`` (imports vLLM: seconds)."""
    from vllm.engine.arg_utils import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)}


def check_engine_kwargs(kwargs: dict[str, Any], fail: Fail) -> None:
    """``rollout.engine_kwargs``: not an option jointrl sets, and one of the installed vLLM's ``EngineArgs``."""
    import difflib

    for k in kwargs:
        if k in ENGINE_KWARGS_OWNED:
            fail(f"rollout.engine_kwargs.{k}", f"jointrl sets {k} itself from {ENGINE_KWARGS_OWNED[k]}: set that key")
    if not kwargs:
        return
    try:
        names = vllm_engine_arg_names()
    except ImportError as e:
        fail("rollout.engine_kwargs", f"cannot check the engine arguments: vLLM does not import here ({e})")
    for k in kwargs:
        if k not in names:
            close = difflib.get_close_matches(k, sorted(names), n=3)
            fail(
                f"rollout.engine_kwargs.{k}",
                f"not an argument of the installed vLLM's EngineArgs"
                f"{'; did you mean ' + ', '.join(close) + '?' if close else ''}",
            )


def _check_files(recipe: Recipe, fail: Fail) -> None:
    from envs.harbor.env import is_harbor_source

    mp = recipe.model.path
    if not mp.startswith("embedded:"):
        folder = resolve_path(recipe, mp)
        if not folder.exists() and HUB_ID.fullmatch(mp):
            pass  # a Hub id: resolved through huggingface_hub before any actor starts (rl/trainer/hub.py)
        elif not folder.is_dir():
            fail("model.path", f"model folder not found: {folder}")
        elif not (folder / "config.json").is_file():
            fail("model.path", f"{folder} is not a Hugging Face model folder (no config.json)")
    for key, files in (("data.train_files", recipe.data.train_files), ("data.eval_files", recipe.data.eval_files)):
        for i, f in enumerate(files):
            if is_harbor_source(resolve_path(recipe, f)):  # Harbor task dirs: loaded with the task files
                continue
            if not resolve_path(recipe, f).is_file():
                fail(f"{key}.{i}", f"task file not found: {resolve_path(recipe, f)}")
    for key, entries in (
        ("data.train_datasets", recipe.data.train_datasets),
        ("data.eval_datasets", recipe.data.eval_datasets),
    ):
        for i, e in enumerate(entries):  # a path that can only be local must exist (a Hub id is checked at start)
            if e.path.startswith(("/", "./", "../", "~")) and not resolve_path(recipe, e.path).exists():
                fail(f"{key}.{i}.path", f"dataset folder not found: {resolve_path(recipe, e.path)}")


def _check_classes(recipe: Recipe, fail: Fail) -> None:
    from envs.base import resolve
    from rewards.protocol import check_reward_kwargs

    for i, e in enumerate(recipe.rollout.envs):
        _check_class(fail, f"rollout.envs.{i}.cls", e.cls, e.kwargs, resolve)
        _check_sandbox_config(fail, f"rollout.envs.{i}.kwargs", e.kwargs)
        _check_tool_latency(fail, f"rollout.envs.{i}.kwargs", e.kwargs)
    objs: list[Any] = []
    for i, spec in enumerate(recipe.rewards):
        obj = _check_class(fail, f"rewards.{i}.cls", spec.cls, spec.kwargs, resolve, check_reward_kwargs)
        _check_sandbox_config(fail, f"rewards.{i}.kwargs", spec.kwargs)
        if isinstance(obj, type) and not any("__call__" in vars(k) for k in obj.__mro__):
            fail(f"rewards.{i}.cls", f"{spec.cls} has no __call__(trajectory) method")
        if not spec.domains and not getattr(obj, "domains", None):
            fail(f"rewards.{i}.domains", f"{spec.cls} has no `domains` attribute: list the domains it scores")
        objs.append(obj)
    _check_reward_coverage(recipe, objs, fail)


def _check_reward_coverage(recipe: Recipe, objs: list[Any], fail: Fail) -> None:
    """Every domain ``rollout.envs`` serves has a reward that can score it (non-zero weight, not a shaping
    term), and every domain a reward names is served: otherwise every sample of that domain would be
    left out of the update with "no reward function scored", or the reward would never run."""
    served = [e.domain for e in recipe.rollout.envs]
    scorers: dict[str, list[str]] = {d: [] for d in served}
    for i, (spec, obj) in enumerate(zip(recipe.rewards, objs)):
        domains = list(spec.domains or getattr(obj, "domains", ()) or ())
        unserved = [d for d in domains if d != "*" and d not in served]
        if unserved:
            key = f"rewards.{i}.domains" if spec.domains else f"rewards.{i}.cls"
            fail(key, f"{spec.cls} scores {unserved}, which no env in rollout.envs serves (served: {served})")
        if spec.weight != 0.0 and not getattr(obj, "shaping", False):
            for d in served:
                if d in domains or "*" in domains:
                    scorers[d].append(spec.cls)
    for d, fns in scorers.items():
        if not fns:
            i = served.index(d)
            fail(
                f"rollout.envs.{i}.domain",
                f"no reward can score domain {d!r}: no reward with a non-zero weight that is not a shaping term "
                f"lists it in its domains (every {d!r} sample would be left out of the update)",
            )


def _check_tool_latency(fail: Fail, key: str, kwargs: dict) -> None:
    """``<key>.tool_latency`` (the tool-call env's simulated tool latency) is valid now, not when the first env
    is built on a rollout worker."""
    if kwargs.get("tool_latency") is None:
        return
    from envs.toolcall_latency import ToolLatency

    try:
        ToolLatency.from_option(kwargs["tool_latency"])
    except (TypeError, ValueError) as e:
        fail(f"{key}.tool_latency", str(e).removeprefix("tool_latency: ").removeprefix("tool_latency."))


def _check_sandbox_config(fail: Fail, key: str, kwargs: dict) -> None:
    """``<key>.sandbox_config`` (storage and output caps of the env's or reward's sandboxes) is valid now,
    not when the first env is built on a rollout worker."""
    if "sandbox_config" not in kwargs:
        return
    from envs.sandbox.config import SandboxConfig

    try:
        SandboxConfig.coerce(kwargs["sandbox_config"])
    except (TypeError, ValueError) as e:
        fail(f"{key}.sandbox_config", str(e).removeprefix("sandbox_config: ").removeprefix("sandbox_config."))


def _bind_constructor(obj: Any, kwargs: dict) -> None:
    """Raise ``TypeError`` when ``kwargs`` do not fit ``obj``'s constructor (no signature: checked when built)."""
    import inspect

    try:
        inspect.signature(obj).bind(**kwargs)
    except ValueError:
        pass  # no signature available (builtins)


def _check_class(fail: Fail, key: str, dotted: str, kwargs: dict, resolve, bind=_bind_constructor) -> Any:
    """Import ``dotted``, check it is callable and that ``bind(obj, kwargs)`` accepts the kwargs (default:
    its constructor; rewards pass ``check_reward_kwargs``, which also takes plain functions); returns it."""
    try:
        obj = resolve(dotted)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to see
        fail(key, f"cannot import {dotted!r}: {e}")
    if not callable(obj):
        fail(key, f"{dotted} is a {type(obj).__name__}, not a class or function")
    try:
        bind(obj, kwargs)
    except TypeError as e:
        what = "constructor" if isinstance(obj, type) else "signature (called as fn(traj, **kwargs))"
        fail(key.rsplit(".", 1)[0] + ".kwargs", f"do not match {dotted}'s {what}: {e}")
    return obj
