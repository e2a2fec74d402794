"""Chunked logits (rl/trainer/logits.py, ``learner.logits_chunk_tokens``): same numbers, bounded vocab tensors.

The learner's log-probs, entropy, loss terms and gradients with chunking equal the unchunked
ones (float32, no autocast: float tolerance) in full fine-tuning, with LoRA, and over 2 FSDP
ranks (slow); and the largest vocabulary-sized tensor any op produces in a learner step (forward
and backward, counted by a dispatch mode) is bounded by the chunk, where unchunked it holds every
token of the micro-batch.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from rl.config.recipe import AlgoConfig, KLConfig, LearnerConfig, LoraConfig, LossConfig, OptimConfig, UpdateConfig
from rl.trainer.logits import head_logprobs
from test_learner import PROMPT_A, enc, make_batch, make_learner, use_sgd  # noqa: F401 (fixture)
from conftest import gloo_ranks

ALGO = AlgoConfig(
    name="grpo",
    optim=OptimConfig(lr=1e-2),
    kl=KLConfig(coef=0.1),
    loss=LossConfig(entropy_coef=0.01),
)
CHUNK = 4


class VocabRows(TorchDispatchMode):
    """Records the most rows of any op output whose last dimension is the vocabulary (a logits-like tensor)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.rows = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[-1] != self.vocab:
                continue
            if t.untyped_storage().data_ptr() in ins:
                continue  # a view of an input (e.g. lm_head.weight.t()), not a new allocation
            self.rows = max(self.rows, t.numel() // self.vocab)
        return out


def _loss(lp: torch.Tensor, ent: torch.Tensor | None) -> torch.Tensor:
    w = torch.linspace(-1.0, 1.0, lp.numel())
    return (lp * w).sum() + (0.0 if ent is None else (ent * w.flip(0)).sum())


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_head_logprobs_values_and_grads_match(chunk):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(13, 16, requires_grad=True)
    targets = torch.randint(0, 50, (13,))
    lp0, ent0 = head_logprobs(head, hidden, targets, 0, "grad")
    g0 = torch.autograd.grad(_loss(lp0, ent0), [hidden, head.weight])
    lp, ent = head_logprobs(head, hidden, targets, chunk, "grad")
    g = torch.autograd.grad(_loss(lp, ent), [hidden, head.weight])
    torch.testing.assert_close(lp, lp0)
    torch.testing.assert_close(ent, ent0)
    for a, b in zip(g, g0):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    lpv, entv = head_logprobs(head, hidden, targets, chunk, "value")
    assert not entv.requires_grad and lpv.requires_grad
    torch.testing.assert_close(entv, ent0.detach())
    assert head_logprobs(head, hidden, targets, chunk, "none")[1] is None


def test_head_logprobs_under_bf16_autocast_recomputes_in_bf16():
    """Under autocast the backward's recompute runs in bf16 too (checkpoint keeps the autocast state): the
    chunked gradients match the unchunked ones to bf16 tolerance, not merely fp32-vs-bf16 closeness."""
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 64, bias=False)
    hidden = torch.randn(20, 32, requires_grad=True)
    targets = torch.randint(0, 64, (20,))
    grads = {}
    for chunk in (0, 6):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp, ent = head_logprobs(head, hidden, targets, chunk, "grad")
        grads[chunk] = torch.autograd.grad(_loss(lp, ent), [hidden, head.weight])
    # d hidden is per row: the same bf16 ops chunked or not (an fp32 recompute would be ~1e-3 off here);
    # d W sums over the chunks in bf16, so it may differ by a bf16 rounding step.
    torch.testing.assert_close(grads[6][0], grads[0][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(grads[6][1], grads[0][1], rtol=1e-2, atol=2e-2)
    with torch.no_grad():
        lp32 = head_logprobs(head, hidden, targets, 0, "none")[0]
    assert not torch.allclose(lp.detach(), lp32, atol=1e-4)  # the test runs bf16 logits, not fp32


def test_head_logprobs_bounds_vocab_tensors():
    """Forward and backward: no op output with a vocabulary last dim has more rows than the chunk."""
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(40, 16, requires_grad=True)
    targets = torch.randint(0, 50, (40,))
    for chunk, most in ((0, 40), (8, 8)):
        mode = VocabRows(50)
        with mode:
            lp, ent = head_logprobs(head, hidden, targets, chunk, "grad")
            _loss(lp, ent).backward()
        assert mode.rows == most, (chunk, mode.rows)


def _pair(make_learner, algo: AlgoConfig, **lcfg):
    one = make_learner(algo, learner=LearnerConfig(**lcfg))
    two = make_learner(algo, learner=LearnerConfig(logits_chunk_tokens=CHUNK, **lcfg))
    for lrn in (one, two):
        use_sgd(lrn, lr=0.5)
    return one, two


def _same_step(one, two, tok, keys=("loss/policy", "loss/kl", "kl/mean", "entropy/mean", "loss/entropy")):
    m1, m2 = one.step(make_batch(tok)), two.step(make_batch(tok))
    for k in keys + ("grad/norm",):
        assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-7), k
    p1 = dict(one.model.named_parameters())
    for k, v in two.model.named_parameters():
        torch.testing.assert_close(v, p1[k], rtol=0, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
    return m1


def test_learner_chunked_equals_unchunked(make_learner, tiny_tokenizer):
    """One update with an entropy bonus and the KL loss: metrics, gradients (through SGD's update), weights."""
    tok = tiny_tokenizer
    one, two = _pair(make_learner, ALGO)
    prompt, cont = enc(tok, PROMPT_A), enc(tok, "get weather Paris in celsius") + [tok.eos_token_id]
    assert len(cont) > CHUNK
    assert two.logprobs(prompt, cont) == pytest.approx(one.logprobs(prompt, cont), abs=1e-6)
    m = _same_step(one, two, tok)
    assert m["learner/tokens"] > CHUNK  # several chunks per micro-batch


def test_learner_chunked_prepare_pass(make_learner, tiny_tokenizer):
    """Two epochs: the prepare pass (old and reference log-probs) goes through the chunked path too."""
    algo = dataclasses.replace(ALGO, update=UpdateConfig(epochs=2))
    one, two = _pair(make_learner, algo)
    p1, p2 = one.prepare(make_batch(tiny_tokenizer)), two.prepare(make_batch(tiny_tokenizer))
    for key in ("old", "ref"):
        for a, b in zip(p1[key], p2[key]):
            assert b == pytest.approx(a, abs=1e-6), key
    _same_step(one, two, tiny_tokenizer)


def test_learner_chunked_with_lora(make_learner, tiny_tokenizer):
    """LoRA (reference = adapters disabled): the same update chunked or not."""
    one, two = _pair(make_learner, ALGO, lora=LoraConfig(rank=4, alpha=8.0))
    assert one.peft is not None
    _same_step(one, two, tiny_tokenizer)


def test_learner_step_vocab_tensors_bounded(make_learner, tiny_tokenizer):
    """A whole learner step (policy forward, reference forward, backward): the largest vocabulary-sized
    tensor has at most CHUNK rows with chunking, and every response token of the micro-batch without."""
    rows = {}
    for chunk in (0, CHUNK):
        lrn = make_learner(ALGO, learner=LearnerConfig(logits_chunk_tokens=chunk))
        batch = make_batch(tiny_tokenizer)
        mode = VocabRows(lrn.model.config.vocab_size)
        with mode:
            lrn.step(batch)
        rows[chunk] = mode.rows
    assert rows[CHUNK] == CHUNK
    assert rows[0] == sum(s.num_tokens for s in make_batch(tiny_tokenizer).samples) > 3 * CHUNK


def _fsdp_rank(rank: int, port: int, path: str, out: str) -> None:
    """One of 2 FSDP learners with chunked logits (torch.multiprocessing, no Ray): one SGD step, gathered state."""
    from transformers import AutoTokenizer

    from rl.trainer.sharding import shard_batch
    from rl.trainer.learner import Learner
    from test_dp import _state, _use_sgd, dp_batch
    from test_learner import MODEL_CFG

    tok = AutoTokenizer.from_pretrained(path)
    lrn = Learner(
        path,
        MODEL_CFG,
        ALGO,
        threads=1,
        rank=rank,
        world_size=2,
        dist_port=port,
        shm_dir=f"{out}/shm{rank}",
        learner=LearnerConfig(logits_chunk_tokens=CHUNK),
    )
    _use_sgd(lrn)
    metrics = lrn.step(shard_batch(dp_batch(tok, False), 2)[rank])
    state = _state(lrn)
    if rank == 0:
        torch.save({"state": state, "metrics": metrics}, f"{out}/rank0.pt")
    lrn.shutdown()


@pytest.mark.slow
@gloo_ranks
def test_fsdp_chunked_equals_one_unchunked_learner(tiny_model_path, tiny_tokenizer, tmp_path):
    """2 FSDP ranks with chunked logits (recomputed in the backward inside the root's gathered parameters)
    take the same update as one unchunked learner: metrics, gradients and weights."""
    import torch.multiprocessing as mp

    from rl.trainer.collectives import free_port
    from rl.trainer.learner import Learner
    from test_dp import _state, _use_sgd, dp_batch
    from test_learner import MODEL_CFG

    mp.spawn(_fsdp_rank, args=(free_port(), tiny_model_path, str(tmp_path)), nprocs=2)
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)
    one = Learner(tiny_model_path, MODEL_CFG, ALGO, threads=1, shm_dir=str(tmp_path / "one"))
    try:
        _use_sgd(one)
        m1 = one.step(dp_batch(tiny_tokenizer, False))
        for k in ("loss/policy", "loss/kl", "kl/mean", "entropy/mean", "loss/entropy", "grad/norm"):
            assert got["metrics"][k] == pytest.approx(m1[k], rel=1e-5, abs=1e-7), k
        want = _state(one)
        assert want.keys() == got["state"].keys() and any(k.startswith("grad.") for k in want)
        for k, v in want.items():
            torch.testing.assert_close(got["state"][k], v, rtol=1e-4, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
    finally:
        one.shutdown()
