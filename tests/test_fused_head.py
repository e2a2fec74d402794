"""The fused lm_head path of rl.trainer.logits against the plain formulas it replaces."""

from __future__ import annotations

import pytest
import torch

from rl.algos.losses import entropy_from_logits, token_logprobs
from rl.trainer import logits as L
from rl.trainer.logits import head_logprobs


def _plain(head: torch.nn.Linear, h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = head(h)
    return token_logprobs(x, t), entropy_from_logits(x.detach())


@pytest.mark.parametrize("n", [1, 63, 64, 65, 300])  # around the block of rows, and over the no-grad buffer
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_fused_equals_plain_values_and_grads(n: int, dtype: torch.dtype, tol: float):
    torch.manual_seed(n)
    head = torch.nn.Linear(24, 97, bias=False).to(dtype)
    head.weight.data.mul_(4.0)  # peaked distributions, large logits
    h = torch.randn(n, 24, dtype=dtype, requires_grad=True)
    t = torch.randint(0, 97, (n,))
    g = torch.randn(n, dtype=dtype)
    lp_f, ent_f = head_logprobs(head, h, t, entropy="value")
    assert lp_f.dtype == dtype and ent_f is not None
    gh_f, gw_f = torch.autograd.grad(lp_f, (h, head.weight), g)
    lp_p, ent_p = _plain(head, h, t)
    gh_p, gw_p = torch.autograd.grad(lp_p, (h, head.weight), g)
    for a, b in [(lp_f, lp_p), (ent_f, ent_p), (gh_f, gh_p), (gw_f, gw_p)]:
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    with torch.no_grad():  # the blocked no-grad path
        lp_n, ent_n = head_logprobs(head, h, t, entropy="value")
        lp_0, ent_0 = head_logprobs(head, h, t)
    torch.testing.assert_close(lp_n, lp_p, atol=tol, rtol=tol)
    torch.testing.assert_close(ent_n, ent_p, atol=tol, rtol=tol)
    assert ent_0 is None and torch.equal(lp_0, lp_n)


def test_fused_under_bf16_autocast_matches_the_autocast_linear():
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 80, bias=False)
    h = torch.randn(40, 32, requires_grad=True)
    t = torch.randint(0, 80, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp_f, _ = head_logprobs(head, h, t)
        lp_p, _ = _plain(head, h, t)
    assert lp_f.dtype == torch.float32
    torch.testing.assert_close(lp_f, lp_p, atol=1e-5, rtol=1e-5)  # the same bf16 logits, then float32
    gf = torch.autograd.grad(lp_f.sum(), (h, head.weight))
    gp = torch.autograd.grad(lp_p.sum(), (h, head.weight))
    for a, b in zip(gf, gp):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
        assert a.dtype == torch.float32  # the float32 parameters get float32 grads, as through autocast


def test_only_a_plain_bias_free_linear_is_fused(monkeypatch):
    used = []
    real = L._FusedHead.apply
    monkeypatch.setattr(L._FusedHead, "apply", lambda *a: used.append(1) or real(*a))
    h = torch.randn(5, 8, requires_grad=True)
    t = torch.randint(0, 11, (5,))
    head_logprobs(torch.nn.Linear(8, 11, bias=False), h, t)
    assert used == [1]
    head_logprobs(torch.nn.Linear(8, 11, bias=True), h, t)  # a bias: the plain path
    head_logprobs(lambda x: x @ torch.ones(8, 11), h, t)  # any callable: the plain path
    head_logprobs(torch.nn.Linear(8, 11, bias=False), h, t, entropy="grad")  # a differentiated entropy
    assert used == [1]


def test_fused_backward_runs_once():
    head = torch.nn.Linear(8, 11, bias=False)
    h = torch.randn(5, 8, requires_grad=True)
    lp, _ = head_logprobs(head, h, torch.randint(0, 11, (5,)))
    lp.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="differentiated once"):
        lp.sum().backward()


def test_fused_rejects_mismatched_targets():
    with pytest.raises(ValueError, match="targets has shape"):
        head_logprobs(torch.nn.Linear(8, 11, bias=False), torch.randn(5, 8), torch.zeros(4, dtype=torch.long))


def test_bf16_kept_softmax_keeps_the_gradient_of_a_near_certain_target():
    """Under bf16 autocast the kept softmax is bf16, where p = 0.999 rounds to 1 and 1 - p to 0; the target's
    own gradient g (1 - p_t) comes from the float32 log-prob instead. The reference: the unfused path's
    float32 softmax of the same bf16 logits, its gradient rounded to bf16 for the matmuls (as the fused
    path's is)."""
    torch.manual_seed(0)
    n, hdim, v = 8, 16, 50
    head = torch.nn.Linear(hdim, v, bias=False)
    h = torch.randn(n, hdim)
    t = torch.randint(0, v, (n,))
    with torch.no_grad():  # rows 0-3: the target's logit far above the rest (p_t ~ 0.99-0.999)
        head.weight.mul_(0.1)
        for i in range(4):
            head.weight[t[i]] += h[i] * (10.0 + 0.5 * i) / h[i].pow(2).sum()
    h.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = head_logprobs(head, h, t)
    p_t = lp.detach().exp()
    assert (p_t[:4] > 0.98).all() and (p_t[1:4] > 0.997).all() and (p_t[:4] < 0.9999).all()
    gh = torch.autograd.grad(lp.sum(), h)[0]
    hb, wb = h.detach().bfloat16(), head.weight.detach().bfloat16()
    x = (hb @ wb.t()).float()
    d = torch.nn.functional.one_hot(t, v).float() - x.softmax(-1)  # d logp_t / d logits, float32
    want = (d.bfloat16() @ wb).float()
    torch.testing.assert_close(gh, want, atol=2e-3, rtol=2e-2)
    # the near-certain rows' gradients are small ((1 - p_t) w_t - ...): compared row by row, relative to their size
    err = (gh[:4] - want[:4]).norm(dim=-1) / want[:4].norm(dim=-1)
    assert (want[:4].norm(dim=-1) > 0).all() and (err < 0.05).all(), err
