"""The packed layout's mask-free attention (rl.trainer.packed_attention) against the dense masked call."""

from __future__ import annotations

import pytest
import torch

from rl.trainer import packed_attention, packing
from rl.trainer.packed_attention import Segments, split_attention
from tests.test_learner_packing import _batch, _s, pair  # noqa: F401  (pair: the packed/padded learners)


def _dense_mask(p: int, lengths: list[int]) -> torch.Tensor:
    seg = torch.tensor([0] * p + [k + 1 for k, n in enumerate(lengths) for _ in range(n)])
    q = torch.arange(len(seg))
    return (q[:, None] >= q[None, :]) & ((seg[None, :] == 0) | (seg[:, None] == seg[None, :]))


@pytest.mark.parametrize(
    "p, lengths",
    [(7, [5, 3, 0, 6, 1]), (1, [4]), (12, [0, 0]), (3, [1, 1, 1]), (30, [17, 9, 23, 2])],
)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.float64, 1e-10)])
@pytest.mark.parametrize("math_rows", [packed_attention._MATH_ROWS, 0], ids=["matmul-backward", "flash-backward"])
def test_split_equals_the_dense_masked_call(
    p: int, lengths: list[int], dtype: torch.dtype, tol: float, math_rows: int, monkeypatch
):
    # Both backwards of the response segments: batched matmuls (segments up to _MATH_ROWS rows) and the flash kernel.
    monkeypatch.setattr(packed_attention, "_MATH_ROWS", math_rows)
    torch.manual_seed(0)
    S, H, D = p + sum(lengths), 3, 16
    q, k, v = (torch.randn(1, H, S, D, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, H, S, D, dtype=dtype)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=_dense_mask(p, lengths))
    split = split_attention(q, k, v, Segments.of(p, lengths), D**-0.5)
    torch.testing.assert_close(split, dense, atol=tol, rtol=tol)
    for a, b in zip(torch.autograd.grad(split, (q, k, v), grad), torch.autograd.grad(dense, (q, k, v), grad)):
        torch.testing.assert_close(a, b, atol=tol * 10, rtol=tol * 10)


def test_split_in_bf16_stays_near_fp32():
    torch.manual_seed(1)
    p, lengths, H, D = 20, [9, 14, 3], 4, 32
    S = p + sum(lengths)
    q, k, v = (torch.randn(1, H, S, D, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, H, S, D)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=_dense_mask(p, lengths))
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    out = split_attention(*(x.bfloat16() for x in (q, k, v)), Segments.of(p, lengths), D**-0.5)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() < 0.05
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad.bfloat16()), ref_grads):
        assert a.dtype == torch.float32  # through the casts, back to the float32 leaves
        assert (a - b).abs().max() < 0.05 * b.abs().max()


def test_a_wrong_segment_changes_the_result():
    # The split reads the segments, not the mask: a response given the wrong boundary attends wrongly.
    torch.manual_seed(2)
    p, H, D = 5, 2, 8
    q, k, v = (torch.randn(1, H, p + 8, D) for _ in range(3))
    right = split_attention(q, k, v, Segments.of(p, [4, 4]), D**-0.5)
    wrong = split_attention(q, k, v, Segments.of(p, [8]), D**-0.5)
    assert not torch.allclose(right[:, :, p + 4 :], wrong[:, :, p + 4 :])
    torch.testing.assert_close(right[:, :, : p + 4], wrong[:, :, : p + 4])


def test_segments_index_the_response_rows():
    seg = Segments.of(3, [2, 0, 3])
    assert seg.gather.tolist() == [[0, 1, 0], [2, 3, 4]]
    assert seg.valid.tolist() == [[True, True, False], [True, True, True]]
    assert seg.flat.tolist() == [0, 1, 3, 4, 5]
    assert seg.rows == 5


def test_pack_gives_the_segments_of_its_mask():
    a = [5, 6, 7]
    pk = packing.pack([_s(a, [10, 11, 12]), _s(a, [20]), _s(a, [13, 14])], rows_b=[0, 1, 2], T=3)
    assert pk.segments.prompt_len == 3
    assert pk.segments.gather.tolist() == [[0, 1], [2, 2]]  # responses minus their last token: 2, 0, 1 rows
    assert pk.segments.valid.tolist() == [[True, True], [True, False]]


def test_the_learner_packed_call_runs_the_split(pair, monkeypatch):
    # The learner's models use the implementation, and a packed trunk call goes through the split
    # (not the dense mask it also passes), with the padded layout's log-probs.
    packed, padded = pair
    assert packed.model.config._attn_implementation == packed_attention.NAME
    calls = []
    real = packed_attention.split_attention

    def spy(*a, **k):
        calls.append(a[3].prompt_len)
        return real(*a, **k)

    monkeypatch.setattr(packed_attention, "split_attention", spy)
    batch = _batch(len(packed.tokenizer))
    with torch.no_grad():
        lp_k, _ = packed.fwd.logprobs(packed.model, batch.samples)
        assert len(calls) == 3 * packed.model.config.num_hidden_layers  # 3 groups, each layer once
        lp_d, _ = padded.fwd.logprobs(padded.model, batch.samples)
    assert len(calls) == 3 * packed.model.config.num_hidden_layers  # the padded layout does not use it
    torch.testing.assert_close(lp_k, lp_d, rtol=0, atol=1e-5)
