"""R3 through vLLM (docs/moe.md): vLLM 0.32's routed-experts output converted to the trajectory's routing, and
the checks that keep r3 off an engine that cannot report routing.

vLLM returns routed experts only from its model runner V2 (Triton, CUDA), so nothing here runs vLLM: the
conversion is tested on request outputs built with vLLM's own output classes, in the shape and dtype its
source gives them (``CompletionOutput.routed_experts``: ``(tokens, num_hidden_layers, top_k)``, ``uint8`` up to
256 experts, else ``uint16``; a dense layer's column never written, so zeros).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl.config.loading import RecipeError
from rl.config.recipe import LearnerConfig
from rl.trainer import moe
from rollout.routing import from_vllm, moe_layers, routers


def _mixed_config(**kw):
    """A tiny Qwen3-MoE config whose layer 1 is dense (``mlp_only_layers``): 4 layers, 8 experts, top-2."""
    from transformers import Qwen3MoeConfig

    base = dict(
        vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=8, num_experts_per_tok=2,
        mlp_only_layers=[1],
    )  # fmt: skip
    return Qwen3MoeConfig(**(base | kw))


@pytest.mark.parametrize("kw,want", [({}, [0, 2, 3]), ({"mlp_only_layers": [], "decoder_sparse_step": 2}, [1, 3])])
def test_moe_layers_are_the_layers_with_a_router(kw, want) -> None:
    """The config rule gives the layers transformers builds a router in (the routing layout's layers)."""
    from transformers import AutoModelForCausalLM

    config = _mixed_config(**kw)
    model = AutoModelForCausalLM.from_config(config)
    with_router = [i for i, layer in enumerate(model.model.layers) if routers(layer)]
    assert moe_layers(config) == with_router == want
    assert len(routers(model)) == len(want)


def _output(routed: np.ndarray | None, prompt: list[int], ids: list[int]):
    """A finished vLLM ``RequestOutput`` of one completion, built with vLLM's classes."""
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    lps = [{t: Logprob(logprob=-0.5 - i)} for i, t in enumerate(ids)]
    c = CompletionOutput(0, "", ids, None, lps, routed_experts=routed, finish_reason="length")
    return RequestOutput("r0", None, prompt, None, [c], True)


def test_vllm_routed_experts_become_the_generations_routing() -> None:
    """Rows = prompt + generated - 1 (the last token is sampled, never run); the dense layer's column goes; the
    dtype is the routing's compact one. The episode then takes the rows as the HF engine's (same layout)."""
    from rollout.engine import _generation

    prompt, ids = [3, 4, 5, 6], [10, 11, 12]
    g = np.random.default_rng(0)
    routed = np.stack([g.permutation(8)[:2] for _ in range(6 * 4)]).reshape(6, 4, 2).astype(np.uint8)
    routed[:, 1] = 0  # vLLM never writes a dense layer's column
    layout = (moe_layers(_mixed_config()), 8)
    gen = _generation(_output(routed, prompt, ids), layout)
    assert gen.token_ids == ids and gen.logprobs == [-0.5, -1.5, -2.5] and gen.finish_reason == "length"
    assert gen.routing is not None and gen.routing.dtype == np.uint8
    assert gen.routing.shape == (len(prompt) + len(ids) - 1, 3, 2)
    assert np.array_equal(gen.routing, routed[:, [0, 2, 3]])
    # an engine started without routed experts, or a request that reported none: no routing
    assert _generation(_output(routed, prompt, ids)).routing is None
    assert _generation(_output(None, prompt, ids), layout).routing is None
    # a model of every layer sparse: vLLM's columns are the layout's as they are
    assert np.array_equal(from_vllm(routed[:, [0, 2, 3]], [0, 2, 3], 8), routed[:, [0, 2, 3]])


def test_vllm_routed_experts_above_256_experts_and_bad_shapes() -> None:
    big = np.array([[[300, 7]], [[0, 511]]], dtype=np.uint16)  # vLLM's uint16 above 256 experts
    r = from_vllm(big, [0], 512)
    assert r.dtype == np.int16 and r.tolist() == [[[300, 7]], [[0, 511]]]
    assert torch.from_numpy(r).dtype == torch.int16  # what Sample.routing becomes
    with pytest.raises(ValueError, match="outside 0..255"):
        from_vllm(big, [0], 256)
    with pytest.raises(ValueError, match="expected \\(tokens, layers, top_k\\)"):
        from_vllm(np.zeros((3, 2), np.uint8), [0, 1], 8)
    with pytest.raises(ValueError, match="2 layers for a model whose MoE layers are \\[0, 2, 3\\]"):
        from_vllm(np.zeros((3, 2, 2), np.uint8), [0, 2, 3], 8)


def test_r3_through_vllm_is_refused_on_cpu_and_asked_for_on_gpu() -> None:
    """On CPU r3 with vLLM is refused naming the key and saying it needs a GPU; on a GPU it is allowed and the
    engine is started with enable_return_routed_experts (prefix caching left on: vLLM keeps cached blocks'
    routing). An engine asked for routed experts without CUDA fails naming why."""
    from rl.config.validate import ENGINE_KWARGS_OWNED, check_engine_kwargs
    from rollout.engine import _routing_layout

    r3 = LearnerConfig(routing_replay="r3")
    with pytest.raises(RecipeError, match=r"learner.routing_replay: r3 needs an engine .* only on a GPU"):
        moe.check_replay_engine(r3, "vllm", "cpu")
    moe.check_replay_engine(r3, "vllm", "gpu")
    moe.check_replay_engine(r3, "vllm", "gpu", {"enable_prefix_caching": True})
    with pytest.raises(RecipeError, match=r"learner.routing_replay: r3 through vLLM with .*enable_prefix_caching"):
        moe.check_replay_engine(r3, "vllm", "gpu", {"enable_prefix_caching": False})
    moe.check_replay_engine(r3, "hf", "cpu")
    moe.check_replay_engine(LearnerConfig(routing_replay="r2"), "vllm", "cpu")
    assert moe.engine_routing_kwargs(r3) == {"enable_return_routed_experts": True}
    assert moe.engine_routing_kwargs(LearnerConfig(routing_replay="r2")) == {}
    assert ENGINE_KWARGS_OWNED["enable_return_routed_experts"] == "learner.routing_replay"

    def fail(key: str, msg: str) -> None:
        raise RecipeError(f"{key}: {msg}")

    with pytest.raises(RecipeError, match="engine_kwargs.enable_return_routed_experts: .* learner.routing_replay"):
        check_engine_kwargs({"enable_return_routed_experts": True}, fail)
    with pytest.raises(RuntimeError, match="needs CUDA"):
        _routing_layout("unused", cuda=False)
