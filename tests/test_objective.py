"""rl.algos.objective.objective: the learner's whole objective as a pure function, against its terms summed here."""

from __future__ import annotations

import pytest
import torch

from rl.algos.losses import aggregate, kl, policy_loss, value_loss
from rl.algos.objective import ObjectiveInputs, Terms, objective
from rl.algos.policy_losses import LossInputs, get_policy_loss
from rl.config.recipe import LossConfig


def _inputs(terms: Terms) -> ObjectiveInputs:
    g = torch.Generator().manual_seed(0)
    B, T = 3, 5
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:, 0] = True
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    values = torch.randn(B, T, generator=g, dtype=torch.float64).requires_grad_(True)
    pol = LossInputs(
        logp=logp,
        old_logp=logp.detach() + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64),
        advantages=torch.randn(B, T, generator=g, dtype=torch.float64),
        mask=mask,
        agg="seq-mean-token-mean",
        num_tokens=float(mask.sum()),
        num_seqs=4.0,
    )
    return ObjectiveInputs(
        policy=pol,
        terms=terms,
        ref_logp=logp.detach() - 0.2 * torch.rand(B, T, generator=g, dtype=torch.float64),
        entropy=torch.rand(B, T, generator=g, dtype=torch.float64).requires_grad_(True),
        values=values,
        old_values=values.detach() + 0.1,
        returns=torch.randn(B, T, generator=g, dtype=torch.float64),
    )


@pytest.mark.parametrize("in_reward", [False, True])
def test_objective_is_the_sum_of_its_terms(in_reward):
    terms = Terms(kl_coef=0.05, kl_kind="k3", kl_in_reward=in_reward, entropy_coef=0.01, vf_coef=0.5, value_clip=0.2)
    x = _inputs(terms)
    total, st = objective(x, get_policy_loss(LossConfig()))
    p = x.policy
    pl, _ = policy_loss(
        p.logp, p.old_logp, p.advantages, p.mask, agg=p.agg, num_tokens=p.num_tokens, num_seqs=p.num_seqs
    )
    kl_loss = aggregate(kl(p.logp, x.ref_logp, "k3"), p.mask, p.agg, num_seqs=p.num_seqs)
    ent = aggregate(x.entropy, p.mask, p.agg, num_seqs=p.num_seqs)
    vl, vst = value_loss(x.values, x.old_values, x.returns, p.mask, clip=0.2, agg=p.agg, num_seqs=p.num_seqs)
    want = pl + (0 if in_reward else 0.05 * kl_loss) - 0.01 * ent + 0.5 * vl
    assert float(total) == pytest.approx(float(want), rel=1e-12)
    (g1, g2) = torch.autograd.grad(total, (p.logp, x.values))
    (w1, w2) = torch.autograd.grad(want, (p.logp, x.values))
    assert torch.allclose(g1, w1) and torch.allclose(g2, w2)
    assert st.policy_loss == pytest.approx(float(pl)) and st.kl_loss == pytest.approx(float(kl_loss))
    assert st.value_error == pytest.approx(vst["value/error"])
    assert set(st.policy) == {"clip/fraction"}


def test_terms_off_are_not_computed():
    x = _inputs(Terms())
    bare = ObjectiveInputs(policy=x.policy, terms=Terms())
    total, st = objective(bare, get_policy_loss(LossConfig()))
    assert (st.kl_loss, st.entropy_loss, st.value_loss) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="old_values and returns"):
        objective(ObjectiveInputs(policy=x.policy, terms=Terms(), values=x.values), get_policy_loss(LossConfig()))
