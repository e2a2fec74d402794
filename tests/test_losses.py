"""Tests for rl.algos.losses against hand-computed values (arithmetic in the comments)."""

import math

import pytest
import torch

from rl.algos.losses import (
    aggregate,
    entropy_from_logits,
    kl,
    policy_loss,
    token_logprobs,
    truncated_is_weights,
    value_loss,
)


def close(actual, expected, atol=1e-5):
    actual = torch.as_tensor(actual)
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# --------------------------------------------------------------------------- kl

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])  # d = logp - ref = [0.5, -1.0]


def test_kl_k1_k2_k3_values():
    close(kl(LOGP, REF, "k1"), [[0.5, -1.0]])
    # 0.5 * d^2 = [0.5*0.25, 0.5*1.0]
    close(kl(LOGP, REF, "k2"), [[0.125, 0.5]])
    # x = ref - logp = [-0.5, 1.0]; exp(x) - x - 1:
    #   exp(-0.5) + 0.5 - 1 = 0.6065307 - 0.5 = 0.1065307
    #   exp(1) - 1 - 1      = 2.7182818 - 2   = 0.7182818
    close(kl(LOGP, REF, "k3"), [[0.1065307, 0.7182818]])


def test_kl_k3_nonnegative_and_clamped():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(64, 32, generator=g) * 10
    ref = torch.randn(64, 32, generator=g) * 10
    assert (kl(logp, ref, "k3") >= 0).all()
    # ref - logp = 100 is clamped to 20: exp(20) - 20 - 1 = 485165195.41 - 21 = 485165174.41
    out = kl(torch.tensor([-100.0]), torch.tensor([0.0]), "k3")
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), torch.tensor([485165174.41], dtype=torch.float64), rtol=1e-6, atol=0)


def test_kl_invalid_kind_lists_valid():
    with pytest.raises(ValueError, match="k1.*k2.*k3"):
        kl(LOGP, REF, "k4")


# --------------------------------------------------------------------------- aggregate

AGG_VALUES = [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0], [5.0, 6.0, 7.0, 8.0]]
AGG_MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])  # row 2 fully padded


def test_aggregate_three_modes():
    v = torch.tensor(AGG_VALUES)
    # token-mean: (1 + 2 + 10 + 20 + 30) / 5 = 63 / 5
    close(aggregate(v, AGG_MASK, "token-mean"), 12.6)
    # seq-mean-token-mean: row means 1.5 and 20; row 2 empty, not counted -> (1.5 + 20) / 2
    close(aggregate(v, AGG_MASK, "seq-mean-token-mean"), 10.75)
    # seq-mean-token-sum: row sums 3 and 60 -> (3 + 60) / 2
    close(aggregate(v, AGG_MASK, "seq-mean-token-sum"), 31.5)
    # explicit denominators: 63 / 10; (1.5 + 20) / 4; (3 + 60) / 3
    close(aggregate(v, AGG_MASK, "token-mean", num_tokens=10), 6.3)
    close(aggregate(v, AGG_MASK, "seq-mean-token-mean", num_seqs=4), 5.375)
    close(aggregate(v, AGG_MASK, "seq-mean-token-sum", num_seqs=3), 21.0)


def test_aggregate_invalid_mode():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "sum")


def test_aggregate_ignores_garbage_and_empty_mask():
    v = torch.tensor([[1.0, float("nan")], [float("inf"), 3.0]], requires_grad=True)
    mask = torch.tensor([[1, 0], [0, 1]])
    out = aggregate(v, mask, "token-mean")
    close(out.detach(), 2.0)  # (1 + 3) / 2
    (g,) = torch.autograd.grad(out, v)
    close(g, [[0.5, 0.0], [0.0, 0.5]])
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        out = aggregate(v, torch.zeros_like(mask), agg)
        (g,) = torch.autograd.grad(out, v)
        close(out.detach(), 0.0)
        close(g, torch.zeros(2, 2))


@pytest.mark.parametrize(
    "agg, full_loss, grad_rows",
    [
        # d/dx of sum(m*x)/5: 1/5 on each masked token
        ("token-mean", 12.6, [[0.2, 0.2, 0, 0], [0.2, 0.2, 0.2, 0], [0, 0, 0, 0]]),
        # row 0: 1/(2 tokens * 2 seqs) = 0.25; row 1: 1/(3 * 2) = 0.1666667
        ("seq-mean-token-mean", 10.75, [[0.25, 0.25, 0, 0], [1 / 6, 1 / 6, 1 / 6, 0], [0, 0, 0, 0]]),
        # 1 / 2 seqs on each masked token
        ("seq-mean-token-sum", 31.5, [[0.5, 0.5, 0, 0], [0.5, 0.5, 0.5, 0], [0, 0, 0, 0]]),
    ],
)
def test_aggregate_gradient_accumulation_identity(agg, full_loss, grad_rows):
    v = torch.tensor(AGG_VALUES, requires_grad=True)
    full = aggregate(v, AGG_MASK, agg)
    (g_full,) = torch.autograd.grad(full, v)
    close(full.detach(), full_loss)
    close(g_full, grad_rows)
    # micro-batches rows [0] and [1, 2] with the full batch's denominators (5 tokens, 2 seqs)
    acc = aggregate(v[:1], AGG_MASK[:1], agg, num_tokens=5, num_seqs=2) + aggregate(
        v[1:], AGG_MASK[1:], agg, num_tokens=5, num_seqs=2
    )
    (g_acc,) = torch.autograd.grad(acc, v)
    close(acc.detach(), full_loss)
    close(g_acc, grad_rows)
    # without them, token-mean micro-batches would give 3/2 + 60/3 = 21.5 != 12.6
    if agg == "token-mean":
        naive = aggregate(v[:1], AGG_MASK[:1], agg) + aggregate(v[1:], AGG_MASK[1:], agg)
        close(naive.detach(), 21.5)


def test_policy_loss_gradient_accumulation_identity():
    g = torch.Generator().manual_seed(1)
    B, T = 4, 5
    logp = (torch.randn(B, T, generator=g) * 0.3 - 1.0).requires_grad_(True)
    old_logp = logp.detach() + torch.randn(B, T, generator=g) * 0.3
    adv = torch.randn(B, T, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 1, 1, 0]])
    n_tok, n_seq = 11, 3  # 3 + 5 + 0 + 3 masked tokens; 3 non-empty rows
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        full, _ = policy_loss(logp, old_logp, adv, mask, dual_clip=3.0, agg=agg)
        (g_full,) = torch.autograd.grad(full, logp)
        acc = sum(
            policy_loss(
                logp[s], old_logp[s], adv[s], mask[s], dual_clip=3.0, agg=agg, num_tokens=n_tok, num_seqs=n_seq
            )[0]
            for s in (slice(0, 1), slice(1, 4))
        )
        (g_acc,) = torch.autograd.grad(acc, logp)
        torch.testing.assert_close(acc, full, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(g_acc, g_full, atol=1e-6, rtol=1e-6)


# --------------------------------------------------------------------------- policy_loss


def _pl_inputs():
    # ratios r chosen per token; old_logp = 0 so logp = log(r). Token cases (clip 0.2/0.2):
    #   a: A=+1, r=1.5: max(-1.5, -1.2) = -1.2  (clipped)
    #   b: A=+1, r=0.5: max(-0.5, -0.8) = -0.5
    #   c: A=-1, r=1.5: max( 1.5,  1.2) =  1.5
    #   d: A=-1, r=0.5: max( 0.5,  0.8) =  0.8  (clipped)
    #   e: A=+2, r=1.1: max(-2.2, -2.2) = -2.2  (inside the range)
    #   f: A=-1, r=4.0: max( 4.0,  1.2) =  4.0  (dual clip 3 -> min(4, 3) = 3)
    # padding: logp = 1000 (exp overflows if not masked), A = nan
    ratios = torch.tensor([[1.5, 0.5, 1.5, 1.0], [0.5, 1.1, 4.0, 1.0]])
    logp = ratios.log()
    logp[:, 3] = 1000.0
    logp.requires_grad_(True)
    old_logp = torch.zeros(2, 4)
    adv = torch.tensor([[1.0, 1.0, -1.0, float("nan")], [-1.0, 2.0, -1.0, float("nan")]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    return logp, old_logp, adv, mask


def test_policy_loss_values_clip_fraction_and_stats():
    logp, old_logp, adv, mask = _pl_inputs()
    loss, stats = policy_loss(logp, old_logp, adv, mask)
    # (-1.2 - 0.5 + 1.5 + 0.8 - 2.2 + 4.0) / 6 = 2.4 / 6
    close(loss.detach(), 0.4)
    assert stats["clip/fraction"] == pytest.approx(2 / 6)  # a and d
    assert stats["clip/dual_fraction"] == 0.0
    assert "ratio/mean" not in stats and "ratio/max" not in stats  # dead metrics (no caller read them): removed
    # 0.5 * mean(log r)^2 = 0.5 * (2*0.1644019 + 2*0.4804530 + 0.0090840 + 1.9218121) / 6
    assert stats["kl/old_approx"] == pytest.approx(0.2683838, abs=1e-5)
    assert all(isinstance(v, float) for v in stats.values())
    # gradient d(-A r)/dlogp = -A r on unclipped tokens, 0 on clipped ones and padding, / 6
    (g,) = torch.autograd.grad(loss, logp)
    close(g, [[0.0, -0.5 / 6, 1.5 / 6, 0.0], [0.0, -2.2 / 6, 4.0 / 6, 0.0]])


def test_policy_loss_is_weights_scale_each_token():
    logp, old_logp, adv, mask = _pl_inputs()
    # per-token pg (see _pl_inputs): [-1.2, -0.5, 1.5, pad], [0.8, -2.2, 4.0, pad]; weights below,
    # padding weight nan (must be ignored)
    w = torch.tensor([[2.0, 1.0, 0.5, float("nan")], [1.0, 0.0, 0.25, float("nan")]])
    loss, _ = policy_loss(logp, old_logp, adv, mask, is_weights=w)
    # (-2.4 - 0.5 + 0.75 + 0.8 + 0 + 1.0) / 6 = -0.35 / 6
    close(loss.detach(), -0.35 / 6)
    (g,) = torch.autograd.grad(loss, logp)
    # unclipped tokens: -A r w / 6 -> b: -0.5, c: 1.5 * 0.5, e: 0 (w = 0), f: 4.0 * 0.25
    close(g, [[0.0, -0.5 / 6, 0.75 / 6, 0.0], [0.0, 0.0, 1.0 / 6, 0.0]])
    with pytest.raises(ValueError, match="is_weights has shape"):
        policy_loss(logp, old_logp, adv, mask, is_weights=torch.ones(2, 3))


def test_truncated_is_weights_hand_values():
    old = torch.tensor([[0.0, -1.0, -0.5, 5.0]])
    behaviour = torch.tensor([[0.0, -2.0, -0.25, 0.0]])  # old - behaviour = [0, 1, -0.25, pad]
    mask = torch.tensor([[1, 1, 1, 0]])
    w, stats = truncated_is_weights(old, behaviour, mask, cap=2.0)
    # exp([0, 1, -0.25]) = [1, 2.71828 -> capped 2, 0.77880]; padding 0
    close(w, [[1.0, 2.0, 0.7788008, 0.0]])
    assert stats["is/weight_mean"] == pytest.approx((1 + 2 + 0.7788008) / 3, abs=1e-6)
    assert stats["is/truncated_fraction"] == pytest.approx(1 / 3)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(old, behaviour, mask, cap=0.0)


def test_policy_loss_dual_clip():
    logp, old_logp, adv, mask = _pl_inputs()
    loss, stats = policy_loss(logp, old_logp, adv, mask, dual_clip=3.0)
    # f: min(4.0, -(-1) * 3) = 3 -> (2.4 - 4.0 + 3.0) / 6 = 1.4 / 6
    close(loss.detach(), 1.4 / 6)
    assert stats["clip/dual_fraction"] == pytest.approx(1 / 6)
    assert stats["clip/fraction"] == pytest.approx(2 / 6)
    (g,) = torch.autograd.grad(loss, logp)
    close(g, [[0.0, -0.5 / 6, 1.5 / 6, 0.0], [0.0, -2.2 / 6, 0.0, 0.0]])
    for bad in (1.0, 0.5):
        with pytest.raises(ValueError, match="dual_clip"):
            policy_loss(logp, old_logp, adv, mask, dual_clip=bad)


def test_policy_loss_asymmetric_clip_higher():
    ratios = torch.tensor([[1.5, 1.25, 0.5]])
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3)
    loss, stats = policy_loss(ratios.log(), torch.zeros(1, 3), adv, mask, clip_low=0.2, clip_high=0.28)
    # r=1.5, A=+1:  clamp -> 1.28: max(-1.5, -1.28) = -1.28   (clipped)
    # r=1.25, A=+1: inside [0.8, 1.28]:               -1.25
    # r=0.5, A=-1:  clamp -> 0.8:  max(0.5, 0.8)     =  0.8    (clipped)
    # (-1.28 - 1.25 + 0.8) / 3 = -1.73 / 3
    close(loss, -1.73 / 3)
    assert stats["clip/fraction"] == pytest.approx(2 / 3)
    # symmetric 0.2 clips r=1.25 too: (-1.2 - 1.2 + 0.8) / 3 = -1.6 / 3
    loss_sym, stats_sym = policy_loss(ratios.log(), torch.zeros(1, 3), adv, mask)
    close(loss_sym, -1.6 / 3)
    assert stats_sym["clip/fraction"] == pytest.approx(1.0)


def test_policy_loss_sequence_advantages_broadcast_and_agg():
    ratios = torch.tensor([[1.0, 1.1, 1.0], [0.9, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([2.0, -1.0])  # [B]
    loss, _ = policy_loss(ratios.log(), torch.zeros(2, 3), adv, mask, agg="seq-mean-token-sum")
    # row 0: -2*1.0 + -2*1.1 = -4.2; row 1: -(-1)*0.9 = 0.9 -> (-4.2 + 0.9) / 2
    close(loss, -1.65)


def test_policy_loss_no_masked_tokens():
    logp, old_logp, adv, mask = _pl_inputs()
    loss, stats = policy_loss(logp, old_logp, adv, torch.zeros_like(mask), dual_clip=2.0)
    (g,) = torch.autograd.grad(loss, logp)
    close(loss.detach(), 0.0)
    close(g, torch.zeros(2, 4))
    assert set(stats) == {"clip/fraction", "clip/dual_fraction", "kl/old_approx"}
    assert all(v == 0.0 for v in stats.values())


# --------------------------------------------------------------------------- value_loss


def _vl_inputs():
    # clip 0.2; tokens (v, old_v, R):
    #   a: (1.0, 0.5, 1.0): vf1 = 0,    v_clip = 0.7 -> vf2 = 0.09; max 0.09 -> 0.045 (clipped)
    #   b: (0.6, 0.5, 1.0): vf1 = 0.16, v_clip = 0.6 -> vf2 = 0.16;          -> 0.08
    #   c: (0.0, 0.5, 0.0): vf1 = 0,    v_clip = 0.3 -> vf2 = 0.09;          -> 0.045 (clipped)
    #   d: (2.0, 0.5, 0.0): vf1 = 4,    v_clip = 0.7 -> vf2 = 0.49; max 4    -> 2.0
    values = torch.tensor([[1.0, 0.6, 99.0], [0.0, 2.0, -99.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    returns = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    return values, old, returns, mask


def test_value_loss_clipped():
    values, old, returns, mask = _vl_inputs()
    loss, stats = value_loss(values, old, returns, mask, clip=0.2)
    # (0.045 + 0.08 + 0.045 + 2.0) / 4 = 2.17 / 4
    close(loss.detach(), 0.5425)
    assert stats["value/clip_fraction"] == pytest.approx(0.5)
    assert stats["value/mean"] == pytest.approx((1.0 + 0.6 + 0.0 + 2.0) / 4, abs=1e-6)
    assert stats["value/error"] == pytest.approx((0 + 0.16 + 0 + 4) / 4, abs=1e-6)
    # gradient: clipped tokens 0; b: (0.6 - 1) / 4 = -0.1; d: (2 - 0) / 4 = 0.5
    (g,) = torch.autograd.grad(loss, values)
    close(g, [[0.0, -0.1, 0.0], [0.0, 0.5, 0.0]])


def test_value_loss_unclipped():
    values, old, returns, mask = _vl_inputs()
    loss, stats = value_loss(values, old, returns, mask, clip=None)
    # 0.5 * (0 + 0.16 + 0 + 4) / 4
    close(loss.detach(), 0.52)
    assert stats["value/clip_fraction"] == 0.0
    # seq-mean-token-sum: row sums 0.5*(0 + 0.16) = 0.08 and 0.5*(0 + 4) = 2.0 -> 2.08 / 2
    loss_seq, _ = value_loss(values, old, returns, mask, clip=None, agg="seq-mean-token-sum")
    close(loss_seq.detach(), 1.04)


def test_value_loss_empty_mask():
    values, old, returns, mask = _vl_inputs()
    loss, stats = value_loss(values, old, returns, torch.zeros_like(mask))
    close(loss.detach(), 0.0)
    assert stats == {"value/clip_fraction": 0.0, "value/mean": 0.0, "value/error": 0.0}


# --------------------------------------------------------------------------- entropy / logprobs


def test_entropy_uniform_is_log_v_in_float32():
    out = entropy_from_logits(torch.zeros(2, 3, 8, dtype=torch.bfloat16))
    assert out.dtype == torch.float32 and out.shape == (2, 3)
    close(out, torch.full((2, 3), math.log(8)))  # log 8 = 2.0794415


def test_entropy_peaked_two_point_large_and_masked_logits():
    # [100, 0, 0, 0]: p ~ (1, 3.7e-44 x 3) -> H ~ 0
    close(entropy_from_logits(torch.tensor([100.0, 0.0, 0.0, 0.0])), 0.0)
    # [0, log 3]: p = (0.25, 0.75): H = 0.25 ln 4 + 0.75 ln(4/3) = 0.3465736 + 0.2157616
    close(entropy_from_logits(torch.tensor([0.0, math.log(3.0)])), 0.5623351)
    # huge equal logits (naive exp overflows) -> log 2 = 0.6931472
    close(entropy_from_logits(torch.tensor([1e4, 1e4])), 0.6931472)
    # -inf logit (masked vocab entry) contributes nothing; gradient stays finite
    x = torch.tensor([0.0, 0.0, float("-inf")], requires_grad=True)
    h = entropy_from_logits(x)
    close(h.detach(), 0.6931472)
    (g,) = torch.autograd.grad(h, x)
    assert torch.isfinite(g).all()


def test_token_logprobs_hand_value_and_distribution():
    # softmax([0, log 3]) = (0.25, 0.75): log 0.75 = -0.2876821, log 0.25 = -1.3862944
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    close(token_logprobs(logits, torch.tensor([[1, 0]])), [[-0.2876821, -1.3862944]])

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 11, generator=g) * 3
    targets = torch.randint(0, 11, (2, 5), generator=g)
    expected = torch.distributions.Categorical(logits=logits).log_prob(targets)
    torch.testing.assert_close(token_logprobs(logits, targets), expected, atol=1e-5, rtol=1e-5)

    out = token_logprobs(logits.bfloat16(), targets)
    assert out.dtype == torch.float32
    expected_bf = torch.distributions.Categorical(logits=logits.bfloat16().float()).log_prob(targets)
    torch.testing.assert_close(out, expected_bf, atol=1e-5, rtol=1e-5)


def test_policy_loss_log_ratio_overflow_is_clamped():
    # old log-prob -100, new -0.5: log r = 99.5, exp overflows float32 to inf. Unclamped, the loss was inf
    # without dual clip and the gradient NaN even where the clip zeroes it (0 * inf in the backward).
    logp = torch.tensor([[-0.5, -0.5, -1.0]], requires_grad=True)
    old = torch.tensor([[-100.0, -100.0, -1.0]])
    mask = torch.tensor([[1, 1, 1]])
    for adv in ([[1.0, -1.0, 1.0]], [[-1.0, -1.0, -1.0]]):
        for dual in (None, 3.0):
            loss, stats = policy_loss(logp, old, torch.tensor(adv), mask, dual_clip=dual)
            (g,) = torch.autograd.grad(loss, logp)
            assert torch.isfinite(loss) and torch.isfinite(g).all(), (adv, dual, loss, g)
            assert stats["kl/old_approx"] == pytest.approx((2 * 0.5 * 20.0**2) / 3)  # the clamped log-ratio
    # A = +1 on the overflowing token: clipped at 1 + 0.2, no gradient through it; the in-range token keeps its own.
    loss, _ = policy_loss(logp, old, torch.tensor([[1.0, 0.0, 1.0]]), mask)
    (g,) = torch.autograd.grad(loss, logp)
    close(loss.detach(), (-1.2 + 0.0 - 1.0) / 3)
    close(g, [[0.0, 0.0, -1.0 / 3]])
    # A < 0, no dual clip: the loss is -A * exp(20) (bounded), not inf.
    loss, _ = policy_loss(logp[:, :1], old[:, :1], torch.tensor([[-1.0]]), mask[:, :1])
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_aggregate_seq_mean_token_sum_norm_is_a_constant_normalizer():
    x = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 0.0, 0.0, 9.0]])
    m = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    # (6 + 4) / (2 sequences x 10 tokens): no per-sequence length normalization (Dr.GRPO; verl's mode)
    close(aggregate(x, m, "seq-mean-token-sum-norm", norm_tokens=10), 0.5)
    # Accumulation: micro-batches with the full batch's num_seqs sum to the whole.
    parts = [
        aggregate(x[i : i + 1], m[i : i + 1], "seq-mean-token-sum-norm", num_seqs=2, norm_tokens=10) for i in (0, 1)
    ]
    close(sum(parts), 0.5)
    with pytest.raises(ValueError, match="needs norm_tokens > 0"):
        aggregate(x, m, "seq-mean-token-sum-norm")
