"""The auxiliary term from the model's outputs (``algo.loss.aux_coef``): an MoE router's load-balancing loss.

``rl.algos.router.load_balancing_loss`` against transformers' own ``load_balancing_loss_func``; through the
learner, on a tiny random Qwen3-MoE, the term changes the gradient by exactly ``aux_coef`` times the gradient of
the aux loss transformers computes on the same trunk calls; a dense model with the term is refused naming the
key (zero-advantage samples still train when the term is on: tests/test_batch.py).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from rl.algos.batch import Batch, Sample
from rl.algos.router import load_balancing_loss, router_spec
from rl.config.recipe import AlgoConfig, LearnerConfig, LossConfig, ModelConfig, OptimConfig

COEF = 0.5


def _hf_balance(router_logits, experts: int, top_k: int, mask=None) -> torch.Tensor:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    return load_balancing_loss_func(tuple(router_logits), experts, top_k, mask)


def test_load_balancing_loss_is_transformers():
    g = torch.Generator().manual_seed(0)
    layers = [torch.randn(11, 8, generator=g, requires_grad=True) for _ in range(3)]  # float32, as the learner's
    mask = torch.tensor([1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1], dtype=torch.bool)
    for keep in (None, mask):
        mine = load_balancing_loss([(layers, keep)], 8, 2)
        want = _hf_balance(layers, 8, 2, None if keep is None else keep.long())
        assert float(mine.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
        for a, b in zip(torch.autograd.grad(mine, layers), torch.autograd.grad(want, layers)):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-8)
    # two calls are one loss over all their rows (the micro-batch's), not the mean of two
    split = [([t[:5] for t in layers], None), ([t[5:] for t in layers], None)]
    whole = float(_hf_balance(layers, 8, 2).detach())
    assert float(load_balancing_loss(split, 8, 2).detach()) == pytest.approx(whole, rel=1e-6)
    assert float(load_balancing_loss([], 8, 2)) == 0.0


@pytest.fixture(scope="module")
def tiny_moe_path(tiny_model_path, tmp_path_factory) -> str:
    """A tiny random Qwen3-MoE (2 layers, 8 experts, top-2, head_dim 32) with embedded:tiny's tokenizer."""
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    out = tmp_path_factory.mktemp("tiny-moe")
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    sizes = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, head_dim=32)
    layers = dict(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    experts = dict(num_experts=8, num_experts_per_tok=2)
    tokens = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**sizes, **layers, **experts, **tokens, tie_word_embeddings=True))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    yield str(out)
    shutil.rmtree(out, ignore_errors=True)


def _batch() -> Batch:
    a = Sample([5, 6, 7, 40, 41, 42, 43], 3, [1, 1, 0, 1], [-1.0] * 4, 1.0, "t", uid=0)
    b = Sample([9, 10, 50, 51], 2, [1, 1], [-1.0] * 2, -0.5, "t", uid=1, group_id=1)
    return Batch([a, b], num_tokens=5, num_seqs=2)


def _grads(tmp_path, path: str, coef: float, share_prompt: bool, monkeypatch) -> tuple[list, dict]:
    """The learner's pre-clip gradients of one step on ``_batch()`` (captured at ``optim.apply``) and its metrics."""
    from rl.trainer import optim
    from rl.trainer.learner import Learner

    seen: list = []
    apply = optim.apply

    def spy(params, *a, **k):
        seen.append([torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params])
        return apply(params, *a, **k)

    monkeypatch.setattr(optim, "apply", spy)
    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3, max_grad_norm=0.0), loss=LossConfig(aux_coef=coef))
    mcfg = ModelConfig(path=path, learner_dtype="float32", autocast=False)
    where = str(tmp_path / f"shm{coef}{share_prompt}")
    lrn = Learner(path, mcfg, algo, threads=1, shm_dir=where, learner=LearnerConfig(share_prompt=share_prompt))
    try:
        m = lrn.step(_batch())
    finally:
        lrn.shutdown()
    assert len(seen) == 1
    return seen[0], m


def _reference_aux_grads(path: str, share_prompt: bool, pad_id: int) -> tuple[float, list]:
    """transformers' aux loss on the trunk calls the learner's layout makes, and its gradient.

    Full layout: one call on the padded batch with its attention mask. Packed (each sample its own group): one
    call per sample on its prompt and response but the last token, the router logits of both calls in one loss.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    experts, top_k = router_spec(model.config)
    samples = _batch().samples
    if share_prompt:
        outs = [model(input_ids=torch.tensor([s.input_ids[:-1]]), output_router_logits=True) for s in samples]
        logits = [torch.cat([o.router_logits[i] for o in outs]) for i in range(len(outs[0].router_logits))]
        aux = _hf_balance(logits, experts, top_k)
    else:
        L = max(len(s.input_ids) for s in samples)
        ids = torch.full((len(samples), L), pad_id, dtype=torch.long)
        att = torch.zeros((len(samples), L), dtype=torch.long)
        for i, s in enumerate(samples):
            ids[i, : len(s.input_ids)] = torch.tensor(s.input_ids)
            att[i, : len(s.input_ids)] = 1
        aux = model(input_ids=ids, attention_mask=att, output_router_logits=True).aux_loss
    params = [p for p in model.parameters() if p.requires_grad]
    return float(aux.detach()), list(torch.autograd.grad(aux, params, allow_unused=True))


@pytest.mark.parametrize("share_prompt", [False, True])
def test_aux_term_changes_the_gradient_by_its_own(tmp_path, tiny_moe_path, share_prompt, monkeypatch):
    from transformers import AutoTokenizer

    pad_id = AutoTokenizer.from_pretrained(tiny_moe_path).pad_token_id
    g0, m0 = _grads(tmp_path, tiny_moe_path, 0.0, share_prompt, monkeypatch)
    g1, m1 = _grads(tmp_path, tiny_moe_path, COEF, share_prompt, monkeypatch)
    aux, ref = _reference_aux_grads(tiny_moe_path, share_prompt, pad_id)
    # one micro-batch holding every policy token of the minibatch: its share is 1
    assert m1["loss/aux"] == pytest.approx(aux, rel=1e-5)
    assert "loss/aux" not in m0
    assert m1["loss/policy"] == pytest.approx(m0["loss/policy"], rel=1e-6)
    assert len(g0) == len(g1) == len(ref)
    moved = 0.0
    for a, b, r in zip(g0, g1, ref):
        want = COEF * r if r is not None else torch.zeros_like(a)
        assert torch.allclose(b - a, want, atol=2e-6, rtol=1e-4)
        moved += float((b - a).abs().sum())
    assert moved > 1e-4, "the aux term must move the gradient"


def test_a_dense_model_with_the_aux_term_is_refused(tmp_path, tiny_model_path):
    from rl.trainer.learner import Learner

    algo = AlgoConfig(name="grpo", loss=LossConfig(aux_coef=0.01))
    mcfg = ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False)
    with pytest.raises(ValueError, match=r"algo\.loss\.aux_coef.*no routers"):
        Learner(tiny_model_path, mcfg, algo, threads=1, shm_dir=str(tmp_path / "shm"))
