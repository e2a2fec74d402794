"""The tiny MoE model, routing capture and replay on it, and expert load metrics (rollout.routing, rl.trainer.moe)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl.trainer.hub import resolve_model
from rl.trainer.moe import expert_counts, load_metrics
from rollout.routing import capture_routing, is_moe, replay_routing, routers, routing_dtype


@pytest.fixture(scope="module")
def moe_path() -> str:
    return resolve_model("embedded:tiny-moe")


@pytest.fixture
def moe(moe_path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(moe_path, dtype=torch.float32).eval()


def _ids(n: int = 12, batch: int = 2) -> torch.Tensor:
    return torch.randint(5, 500, (batch, n), generator=torch.Generator().manual_seed(3))


def _experts_inputs(model) -> tuple[list, list]:
    """Forward pre-hooks on every experts block recording the ``top_k_index`` it is run with."""
    seen: list[torch.Tensor] = []
    handles = [
        layer.mlp.experts.register_forward_pre_hook(lambda _m, args: seen.append(args[1].clone()))
        for layer in model.model.layers
    ]
    return seen, handles


def test_tiny_moe_shape(moe) -> None:
    cfg = moe.config
    assert type(moe).__name__ == "Qwen3MoeForCausalLM"
    assert (cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok, cfg.head_dim) == (2, 8, 2, 32)
    assert is_moe(moe) and len(routers(moe)) == 2
    assert tuple(moe.model.layers[0].mlp.experts.gate_up_proj.shape) == (8, 128, 128)  # fused 3-D experts


def test_capture_gives_one_compact_row_per_token(moe) -> None:
    ids = _ids()
    with capture_routing(moe) as cap:
        moe(ids)
    r = cap.routing()
    assert r.shape == (24, 2, 2) and r.dtype == torch.uint8
    assert int(r.max()) < 8
    assert (r[:, :, 0] != r[:, :, 1]).all(), "top-2 picks two different experts"
    assert len({tuple(x) for x in r[:, 0].tolist()}) > 3, "the random router spreads tokens"
    assert routing_dtype(300) == torch.int16


def test_replay_of_own_routing_keeps_logits(moe) -> None:
    ids = _ids()
    with torch.no_grad(), capture_routing(moe) as cap:
        plain = moe(ids).logits
    with torch.no_grad(), replay_routing(moe, cap.routing()):
        replayed = moe(ids).logits
    assert torch.equal(plain, replayed)


def test_replay_forces_the_recorded_experts_and_router_learns(moe) -> None:
    ids = _ids()
    with torch.no_grad(), capture_routing(moe) as cap:
        plain = moe(ids).logits
    own = cap.routing()
    forced = (own.long() + 3) % 8  # every token to other experts than its own (still two distinct ones)
    seen, handles = _experts_inputs(moe)
    try:
        with replay_routing(moe, forced), capture_routing(moe) as cap2:
            out = moe(ids).logits
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(cap2.routing().long(), forced)
    for layer, idx in enumerate(seen):  # the experts actually run are the forced ones
        assert torch.equal(idx, forced[:, layer, :])
    assert not torch.allclose(out, plain), "other experts, other logits"
    out.float().logsumexp(-1).mean().backward()
    for r in routers(moe):
        assert r.weight.grad is not None and float(r.weight.grad.abs().sum()) > 0


def test_replay_weights_are_the_routers_softmax_over_the_forced_experts(moe) -> None:
    h = torch.randn(5, 128, generator=torch.Generator().manual_seed(0))
    gate = routers(moe)[0]
    forced = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7], [7, 0]])
    routing = torch.zeros(5, 2, 2, dtype=torch.long)
    routing[:, 0] = forced
    seen = []
    handle = gate.register_forward_hook(lambda _m, _a, out: seen.append(out))
    with replay_routing(moe, routing):
        for r in routers(moe):
            r(h)
    handle.remove()
    logits, weights, idx = seen[0]
    p = torch.softmax(h @ gate.weight.T, -1).gather(-1, forced)
    assert torch.equal(idx, forced)
    assert torch.allclose(weights, p / p.sum(-1, keepdim=True), atol=1e-6)


def test_replay_refuses_routing_that_does_not_fit(moe) -> None:
    ids = _ids(n=4, batch=1)
    with pytest.raises(ValueError, match="expected"):
        with replay_routing(moe, torch.zeros(4, 3, 2, dtype=torch.uint8)):
            pass
    with pytest.raises(ValueError, match="outside 0..7"):
        with replay_routing(moe, torch.full((4, 2, 2), 9, dtype=torch.uint8)):
            pass
    with pytest.raises(RuntimeError, match="4 rows given, 2 tokens"), torch.no_grad():
        with replay_routing(moe, torch.zeros(4, 2, 2, dtype=torch.uint8)):
            moe(ids[:, :2])
    with pytest.raises(RuntimeError, match="saw 8 tokens"), torch.no_grad():
        with replay_routing(moe, torch.zeros(4, 2, 2, dtype=torch.uint8)):
            moe(ids)
            moe(ids)


def test_replay_refuses_a_dense_model(tiny_model_path: str) -> None:
    from transformers import AutoModelForCausalLM

    dense = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert not is_moe(dense)
    with pytest.raises(ValueError, match="needs an MoE model"):
        with replay_routing(dense, torch.zeros(1, 2, 2, dtype=torch.uint8)):
            pass


def test_replay_refuses_a_router_that_is_not_softmax(moe, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = routers(moe)[0]
    own_forward = gate.forward

    def flat_weights(h):  # same experts, gate weights not the softmax's
        logits, scores, idx = own_forward(h)
        return logits, torch.full_like(scores, 0.5), idx

    ids = _ids(n=4, batch=1)
    with torch.no_grad(), capture_routing(moe) as cap:
        moe(ids)
    monkeypatch.setattr(gate, "forward", flat_weights)
    with pytest.raises(NotImplementedError, match="softmax"), torch.no_grad():
        with replay_routing(moe, cap.routing()):
            moe(ids)


def test_load_metrics_against_a_hand_count() -> None:
    # 4 tokens, 2 layers, top-2, 4 experts. Layer 0: experts 0,1 | 0,2 | 0,1 | 3,0 -> counts [4, 2, 1, 1].
    # Layer 1: every token to 2,3 -> counts [0, 0, 4, 4].
    routing = np.array(
        [[[0, 1], [2, 3]], [[0, 2], [2, 3]], [[0, 1], [3, 2]], [[3, 0], [2, 3]]],
        dtype=np.uint8,
    )
    counts = expert_counts(routing, 4)
    assert counts.tolist() == [[4, 2, 1, 1], [0, 0, 4, 4]]
    m = load_metrics(counts)
    assert m["moe/layer_0/tokens_expert_0"] == 4.0 and m["moe/layer_1/tokens_expert_2"] == 4.0
    p = np.array([4, 2, 1, 1]) / 8
    assert m["moe/layer_0/entropy"] == pytest.approx(float(-(p * np.log(p)).sum()))
    assert m["moe/layer_1/entropy"] == pytest.approx(math.log(2))
    assert m["moe/layer_0/max_mean"] == pytest.approx(4 / 2)
    assert m["moe/layer_1/max_mean"] == pytest.approx(4 / 2)
    assert m["moe/entropy_min"] == pytest.approx(math.log(2)) and m["moe/max_mean_max"] == pytest.approx(2.0)
    # Only the last two tokens: layer 0 -> [2, 1, 0, 1].
    assert expert_counts(routing, 4, mask=[False, False, True, True])[0].tolist() == [2, 1, 0, 1]
    balanced = load_metrics(np.array([[3, 3, 3, 3]]))
    assert balanced["moe/layer_0/entropy"] == pytest.approx(math.log(4)) and balanced["moe/layer_0/max_mean"] == 1.0
    empty = load_metrics(np.zeros((1, 4), dtype=np.int64))
    assert empty["moe/layer_0/entropy"] == 0.0 and "moe/entropy_min" not in empty


def test_load_metrics_refuse_bad_routing() -> None:
    with pytest.raises(ValueError, match="outside 0..3"):
        expert_counts(np.full((2, 1, 2), 4), 4)
    with pytest.raises(ValueError, match="expected"):
        expert_counts(np.zeros((2, 2)), 4)
    with pytest.raises(ValueError, match="mask"):
        expert_counts(np.zeros((2, 1, 2)), 4, mask=[True])


def test_hf_engine_generations_carry_their_routing(moe_path: str, moe) -> None:
    """The in-process engine's routing (R3's engine side): one row per token it ran, and forcing it in one
    full forward of prompt + completion reproduces the engine's log-probs token by token."""
    from envs.types import Sampling
    from rollout.hf_engine import HFEngine

    eng = HFEngine(moe_path)
    prompt = [5, 17, 42, 99, 7, 250, 31]
    (g,) = eng.generate([prompt], Sampling(max_new_tokens=6, temperature=1.0), seeds=[4])
    assert g.routing is not None and g.routing.dtype == np.uint8
    assert g.routing.shape == (len(prompt) + len(g.token_ids) - 1, 2, 2)
    ids = torch.tensor([prompt + g.token_ids[:-1]])
    with torch.no_grad(), replay_routing(moe, torch.from_numpy(g.routing)):
        logp = torch.log_softmax(moe(ids).logits[0].float(), -1)
    mine = [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(g.token_ids)]
    assert mine == pytest.approx(g.logprobs, abs=1e-4)


def test_hf_engine_on_a_dense_model_reports_no_routing(tiny_model_path: str) -> None:
    from envs.types import Sampling
    from rollout.hf_engine import HFEngine

    (g,) = HFEngine(tiny_model_path).generate([[5, 6, 7]], Sampling(max_new_tokens=3), seeds=[0])
    assert g.routing is None


def test_lora_default_targets_on_moe_are_the_attention_projections(moe_path: str, moe, tiny_model_path) -> None:
    from rl.config.recipe import LoraConfig
    from rl.trainer import lora

    cfg = LoraConfig(rank=4)
    lora.check_targets(moe_path, cfg)
    assert lora.targets(moe, cfg) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    lora.check_targets(tiny_model_path, cfg)  # a dense model keeps the whole default list
    peft = lora.attach(moe, cfg)
    adapted = {n.rsplit(".", 1)[0] for n, p in peft.named_parameters() if p.requires_grad}
    assert adapted and all(".self_attn." in n for n in adapted)
    peft(_ids()).logits.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in peft.parameters() if p.requires_grad)
    names = {n for n, _ in lora.merged_tensors(peft.base_model.model)}
    assert "model.layers.0.mlp.experts.gate_up_proj" in names and not any(".lora_" in n for n in names)


def test_lora_expert_targets_are_refused_naming_the_key(moe_path: str) -> None:
    from rl.config.recipe import LoraConfig, RecipeError
    from rl.trainer import lora

    with pytest.raises(RecipeError, match=r"learner\.lora\.target_modules: \['down_proj'\] are the fused expert"):
        lora.check_targets(moe_path, LoraConfig(rank=4, target_modules=["q_proj", "down_proj"]))
    with pytest.raises(RecipeError, match=r"learner\.lora\.target_modules: \['gate_proj'\] not linear layers"):
        lora.check_targets(moe_path, LoraConfig(rank=4, target_modules=["q_proj", "gate_proj"]))


def test_weight_export_round_trip_learner_engine_hf(moe, tmp_path) -> None:
    """learner -> engine file -> HF export -> learner: the engine file holds the learner's own tensor names
    (fused ``mlp.experts.*``, what vLLM's loader reads: tests/test_moe_e2e.py), ``save_pretrained`` of those
    tensors (the checkpoint's HF export) writes per-expert checkpoint names, and loading that folder gives
    back every tensor bit for bit."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rl.trainer.weights import WeightExport

    with torch.no_grad():  # away from the saved init, so a stale tensor would show
        for p in moe.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    file = WeightExport(moe, None, 0, torch.device("cpu"), tmp_path / "shm").file("float32")
    sent = load_file(file)
    own = moe.state_dict()
    assert set(sent) == set(own) | {"lm_head.weight"}
    assert tuple(sent["model.layers.1.mlp.experts.down_proj"].shape) == (8, 128, 64)
    moe.save_pretrained(tmp_path / "hf", state_dict=sent)
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert "model.layers.0.mlp.experts.7.gate_proj.weight" in saved and not any(
        k.endswith("gate_up_proj") for k in saved
    )
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).state_dict()
    assert set(back) == set(own)
    for k, v in own.items():
        assert torch.equal(back[k], v), k
