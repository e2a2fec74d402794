"""Hub models through huggingface_hub, offline, from a Hub cache this test builds (no network).

The cache has the layout huggingface_hub reads: ``models--org--name/{blobs/<sha256>,
snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/main}``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl.trainer.hub import hub_snapshot, is_hub_id, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def build_hub_cache(home: Path, repo_id: str, src: Path, commit: str = COMMIT) -> Path:
    """Put the files of model folder ``src`` into ``home/hub`` as the Hub cache holds repo ``repo_id`` at
    ``commit`` (also ``refs/main``); return the snapshot folder."""
    repo = home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if not f.is_file():
            continue
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snap


@pytest.fixture
def offline_hub(tmp_path, monkeypatch, tiny_model_path):
    home = tmp_path / "hf"
    snap = build_hub_cache(home, "jointrl-test/tiny", Path(tiny_model_path))
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home, snap


def test_hub_id_resolves_offline_from_the_cache(offline_hub, tiny_model_path):
    from transformers import AutoConfig, AutoTokenizer

    _, snap = offline_hub
    got = resolve_model("jointrl-test/tiny")
    assert Path(got) == snap
    assert resolve_model("jointrl-test/tiny", revision="main") == got
    assert resolve_model("jointrl-test/tiny", revision=COMMIT) == got  # a commit hash
    assert AutoConfig.from_pretrained(got).model_type == "qwen2"
    assert len(AutoTokenizer.from_pretrained(got)) == len(AutoTokenizer.from_pretrained(tiny_model_path))


def test_not_cached_while_offline_is_a_clear_error(offline_hub):
    with pytest.raises(
        FileNotFoundError,
        match=r"model\.path: Hub model 'jointrl-test/other' .*not in the Hub "
        r"cache .*HF_HUB_OFFLINE is set",
    ):
        resolve_model("jointrl-test/other")
    with pytest.raises(FileNotFoundError, match=r"model\.revision 'v2'"):
        hub_snapshot("jointrl-test/tiny", "v2")


def test_local_folders_win_over_hub_ids(tmp_path, monkeypatch, tiny_model_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    os.symlink(tiny_model_path, tmp_path / "org" / "tiny")
    assert resolve_model("org/tiny") == "org/tiny"  # an existing local folder, not the Hub
    assert is_hub_id("Qwen/Qwen2.5-7B-Instruct") and not is_hub_id("./a/b") and not is_hub_id("a/b/c")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model("/nonexistent/folder")


def test_cli_exits_2_before_actors_for_an_uncached_hub_id(tmp_path, recipe_copy):
    recipe = recipe_copy("tiny.yaml")
    env = {**os.environ, "HF_HOME": str(tmp_path / "empty-hf"), "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": ""}
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run(
        [str(exe), "train", str(recipe), "model.path=jointrl-test/missing"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "model.path: Hub model 'jointrl-test/missing'" in r.stderr and "not in the Hub cache" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out" / "placement.json").exists()


class _Stop(Exception):
    pass


def _start_until_learners(monkeypatch, cfg, model_path, out, folders=None):
    """RayRuntime.start with Ray and the actors faked: the events up to the learners' creation, in order."""
    import ray

    import rl.driver.actors.cluster as cluster
    import rl.driver.actors.learners as learners_mod
    import rl.driver.actors.placement as actor_placement
    import rl.driver.placement as placement
    from rl.driver import ray_runtime

    events: list[str] = []

    class Reserved:
        def options(self, role):
            return []

        def remove(self):
            pass

    def prefetch(path, revision=""):
        events.append(f"prefetch {path}")
        return folders if folders is not None else {"node-a": model_path, "node-b": model_path}

    def learners(workers, path, model_cfg, *a, **k):
        events.append(f"learners engine_dtype={model_cfg.engine_dtype} autocast={model_cfg.autocast}")
        raise _Stop

    monkeypatch.setattr(ray_runtime.RayRuntime, "_init_ray", lambda self: None)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(placement, "resolve_device", lambda cfg, gpus: "cpu")
    monkeypatch.setattr(placement, "plan_placement", lambda cfg, device: type("P", (), {"colocated": False})())
    monkeypatch.setattr(actor_placement, "reserve", lambda plan, t: events.append("reserve") or Reserved())
    monkeypatch.setattr(ray_runtime, "free_dead_run", lambda p, sweep: None)
    monkeypatch.setattr(cluster, "prefetch_on_nodes", prefetch)
    monkeypatch.setattr(learners_mod, "LearnerGroup", learners)
    rt = ray_runtime.RayRuntime(cfg, model_path, out, False)
    try:
        with pytest.raises(_Stop):
            rt.start()
    finally:
        rt.stop()
    return events


def test_driver_prefetches_a_hub_model_on_every_node_before_actors(offline_hub, recipe_copy, tmp_path, monkeypatch):
    from rl.config.recipe import load_recipe

    cfg = load_recipe(recipe_copy("tiny.yaml"), ["model.path=jointrl-test/tiny"])
    path = resolve_model(cfg.model.path)
    events = _start_until_learners(monkeypatch, cfg, path, tmp_path)
    assert events == ["prefetch jointrl-test/tiny", "reserve", "learners engine_dtype=bfloat16 autocast=True"]


def test_local_model_is_not_prefetched(offline_hub, recipe_copy, tiny_model_path, tmp_path, monkeypatch):
    from rl.config.recipe import load_recipe

    cfg = load_recipe(recipe_copy("tiny.yaml"))  # embedded:tiny, a local folder once built
    assert _start_until_learners(monkeypatch, cfg, tiny_model_path, tmp_path) == [
        "reserve",
        "learners engine_dtype=bfloat16 autocast=True",
    ]


def test_ray_runtime_resolves_auto_precision_before_actors(recipe_copy, tiny_model_path, tmp_path, monkeypatch):
    """`auto` precisions are concrete in the config the learners (and then the engines) get: here fp32 timed
    faster (a faked timing), so autocast off and float32 engine weights."""
    import torch

    from rl.config.recipe import load_recipe
    from rl.trainer import precision

    monkeypatch.setattr(precision, "matmul_gflops", lambda dtype, **k: 100.0 if dtype == torch.float32 else 50.0)
    precision.timed_choice.cache_clear()
    try:
        cfg = load_recipe(recipe_copy("tiny.yaml"), ["learner.precision=auto", "model.engine_dtype=auto"])
        events = _start_until_learners(monkeypatch, cfg, tiny_model_path, tmp_path)
    finally:
        precision.timed_choice.cache_clear()
    assert events == ["reserve", "learners engine_dtype=float32 autocast=False"]


def test_hub_model_elsewhere_on_a_node_is_named(offline_hub, recipe_copy, tmp_path, monkeypatch):
    from rl.config.recipe import load_recipe

    cfg = load_recipe(recipe_copy("tiny.yaml"), ["model.path=jointrl-test/tiny"])
    path = resolve_model(cfg.model.path)
    with pytest.raises(FileNotFoundError, match=r"model.path: Hub model 'jointrl-test/tiny' is at /x on node n2"):
        _start_until_learners(monkeypatch, cfg, path, tmp_path, folders={"n1": path, "n2": "/x"})
