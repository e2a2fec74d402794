"""PPO with a critic, REINFORCE++ and KL-in-reward in the learner (tiny model, fp32, no autocast), and
checkpoint/resume of every piece of learner state.

The advantage math itself is tested by hand in test_advantages.py; here the learner's wiring is
checked: outcome on the last policy token, env tokens transparent, KL penalty per token, values
from the critic, whitening over the batch, value targets; and that training and resuming work.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rl.algos.advantages import gae, group_normalized, reinforce_pp, whiten
from rl.algos.batch import Batch, Sample
from rl.config.recipe import AlgoConfig, CriticConfig, KLConfig, LossConfig, OptimConfig, ReturnsConfig, UpdateConfig
from rl.algos.losses import kl
from test_learner import MODEL_CFG, PROMPT_A, PROMPT_B, enc, make_learner  # noqa: F401 - make_learner: the fixture

PPO = AlgoConfig(
    name="ppo", optim=OptimConfig(lr=1e-3), returns=ReturnsConfig(gamma=1.0, lam=0.95), kl=KLConfig(coef=0.0)
)


def hand_batch(tok, rewards=(1.0, -1.0, 0.5)) -> Batch:
    """s1: 3 policy tokens; s2: policy, 2 env tokens, policy (multi-turn); s3: 2 policy tokens."""
    a, b = enc(tok, PROMPT_A), enc(tok, PROMPT_B)
    specs = [(a, [300, 301, 302], [1, 1, 1], 0), (b, [310, 311, 312, 313], [1, 0, 0, 1], 1), (a, [320, 321], [1, 1], 0)]
    samples = [
        Sample(
            p + resp, len(p), mask, [-1.0 if m else 0.0 for m in mask], 0.0, "tool_call", reward=r, group_id=g, uid=i
        )
        for i, ((p, resp, mask, g), r) in enumerate(zip(specs, rewards))
    ]
    return Batch(samples, num_tokens=sum(s.num_tokens for s in samples), num_seqs=3)


def grid(rows: list[list[float]], batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample lists over masked tokens -> ([B, T] values, [B, T] mask)."""
    T = max(len(s.loss_mask) for s in batch.samples)
    g, m = torch.zeros(len(rows), T), torch.zeros(len(rows), T, dtype=torch.bool)
    for i, (row, s) in enumerate(zip(rows, batch.samples)):
        m[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.bool)
        g[i, m[i]] = torch.tensor(row)
    return g, m


def test_ppo_returns_and_advantages_by_hand(make_learner, tiny_tokenizer):
    # Value head initialised to 0, so V = 0; gamma = 1, lam = 0.95, outcome on the last policy token:
    #   A_t = R_t = 0.95^(k) * reward, k = policy tokens after t (env tokens do not count).
    #   s1 (reward 1):    [0.9025, 0.95, 1.0]
    #   s2 (reward -1):   [-0.95, -1.0]          (its 2 env tokens in between are transparent)
    #   s3 (reward 0.5):  [0.475, 0.5]
    # Advantages: whitened over the 7 tokens (mean 1.8775 / 7 = 0.2682143, population std 0.7092):
    #   [0.7831661, 0.8418154, 0.9035515, -1.5041552, -1.5658911, 0.2553228, 0.2861908]
    lrn = make_learner(PPO)
    batch = hand_batch(tiny_tokenizer)
    prep = lrn.prepare(batch)
    assert prep["values"] == [[0.0] * 3, [0.0] * 2, [0.0] * 2]
    flat = lambda rows: [x for r in rows for x in r]  # noqa: E731
    assert flat(prep["returns"]) == pytest.approx([0.9025, 0.95, 1.0, -0.95, -1.0, 0.475, 0.5], abs=1e-6)
    assert flat(prep["adv"]) == pytest.approx(
        [0.7831661, 0.8418154, 0.9035515, -1.5041552, -1.5658911, 0.2553228, 0.2861908], abs=1e-5
    )
    assert "ref" not in prep  # no KL, no reference model
    m = lrn.step(batch)
    assert m["loss/value"] > 0 and m["returns/mean"] == pytest.approx(1.8775 / 7, abs=1e-6)
    assert m["value/mean"] == 0.0  # the values of the (only) update's forward, before it


@pytest.mark.parametrize("critic", ["value_head", "separate"])
def test_ppo_gae_with_critic_values_and_kl_penalty(make_learner, tiny_tokenizer, critic):
    # After one update the critic's values are nonzero; with the KL in the reward the learner's
    # advantages must be whiten(gae(r, V)) with r = -coef * kl(old, ref) per policy token plus the
    # outcome on the last one, and its returns gae's returns.
    algo = dataclasses.replace(
        PPO,
        critic=dataclasses.replace(PPO.critic, model=critic),
        kl=dataclasses.replace(PPO.kl, coef=0.1, kind="k1", in_reward=True),
        returns=dataclasses.replace(PPO.returns, gamma=0.9, lam=0.8),
    )
    lrn = make_learner(algo)
    batch = hand_batch(tiny_tokenizer)
    lrn.step(batch)
    prep = lrn.prepare(batch)
    V, mask = grid(prep["values"], batch)
    assert V[mask].abs().max() > 1e-3
    old, _ = grid(prep["old"], batch)
    ref, _ = grid(prep["ref"], batch)
    r = torch.where(mask, -0.1 * kl(old, ref, "k1"), 0.0)
    assert r[mask].abs().max() > 1e-6  # the policy moved away from the reference
    r[0, 2] += 1.0  # last policy token of each row
    r[1, 3] += -1.0
    r[2, 1] += 0.5
    adv, ret = gae(r, V, mask, 0.9, 0.8)
    want_adv, _ = grid([a[m].tolist() for a, m in zip(whiten(adv, mask), mask)], batch)
    got_adv, _ = grid(prep["adv"], batch)
    got_ret, _ = grid(prep["returns"], batch)
    torch.testing.assert_close(got_adv, want_adv, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_ret, ret, atol=1e-5, rtol=0)


@pytest.mark.parametrize("critic", ["value_head", "separate"])
def test_ppo_critic_learns_the_returns(make_learner, tiny_tokenizer, critic):
    algo = dataclasses.replace(
        PPO,
        critic=dataclasses.replace(PPO.critic, model=critic, lr=1e-3, vf_coef=1.0, value_clip=0.0),
        update=dataclasses.replace(PPO.update, epochs=2, minibatches=2),
    )
    lrn = make_learner(algo)
    batch = hand_batch(tiny_tokenizer)
    ms = [lrn.step(batch) for _ in range(6)]
    assert all(m["learner/updates"] == 4 and math.isfinite(m["grad/norm"]) for m in ms)
    # Value loss ~0.4 at the start (V = 0, returns around +-1): it falls well below half.
    assert max(m["loss/value"] for m in ms[3:]) < 0.5 * ms[0]["loss/value"]
    assert min(m["value/error"] for m in ms[3:]) < 0.25 * ms[0]["value/error"]
    if critic == "separate":
        assert ms[0]["critic/grad_norm"] > 0
        # The separate critic has its own weights: the policy's transformer is not the critic's.
        assert lrn.critic is not None and lrn.critic.trunk is not lrn.model.model
        assert not torch.equal(lrn.critic.trunk.embed_tokens.weight, lrn.model.model.embed_tokens.weight)
    else:
        assert "critic/grad_norm" not in ms[0] and lrn.value_head is not None
        assert lrn.value_head.weight.abs().max() > 0


def test_reinforce_pp_with_kl_in_reward(make_learner, tiny_tokenizer):
    algo = AlgoConfig(
        name="reinforce_pp",
        optim=OptimConfig(lr=1e-3),
        kl=KLConfig(coef=0.2, kind="k3", in_reward=True),
        returns=ReturnsConfig(gamma=0.99),
    )
    lrn = make_learner(algo)
    batch = hand_batch(tiny_tokenizer)
    lrn.step(batch)  # move away from the reference
    prep = lrn.prepare(batch)
    old, mask = grid(prep["old"], batch)
    ref, _ = grid(prep["ref"], batch)
    scores = torch.tensor([1.0, -1.0, 0.5])
    want = reinforce_pp(scores, mask, token_rewards=-0.2 * kl(old, ref, "k3"), gamma=0.99)
    got, _ = grid(prep["adv"], batch)
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=0)
    assert "values" not in prep and "returns" not in prep


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_group_advantages_with_kl_in_reward(make_learner, tiny_tokenizer, name):
    # Sequence-level: reward - coef * sum_t KL, then the group baseline (group 0 = s1, s3; group 1 = s2).
    algo = AlgoConfig(name=name, optim=OptimConfig(lr=1e-3), kl=KLConfig(coef=0.5, kind="k2", in_reward=True))
    lrn = make_learner(algo)
    batch = hand_batch(tiny_tokenizer)
    if name == "rloo":  # RLOO needs two members per group: give s2 a partner
        extra = dataclasses.replace(batch.samples[1], reward=0.25, uid=3)
        batch = Batch(batch.samples + [extra], batch.num_tokens + extra.num_tokens, 4)
    lrn.step(batch)
    m = lrn.step(batch)
    assert "loss/kl" in m and m["kl/mean"] > 0
    prep = lrn.prepare(batch)
    old, mask = grid(prep["old"], batch)
    ref, _ = grid(prep["ref"], batch)
    seq = torch.tensor([s.reward for s in batch.samples]) - 0.5 * torch.where(mask, kl(old, ref, "k2"), 0.0).sum(1)
    want = group_normalized(
        seq,
        torch.tensor([s.group_id for s in batch.samples]),
        std_normalize=name == "grpo",
        leave_one_out=name == "rloo",
    )
    for row, w in zip(prep["adv"], want.tolist()):
        assert row == pytest.approx([w] * len(row), abs=1e-5)


def test_kl_in_reward_is_not_a_loss_term(make_learner, tiny_tokenizer):
    # With the KL in the reward, the loss gradient has no KL term: at the first step (policy ==
    # reference in fp32 and equal rewards in each group) the group advantages are exactly 0, so
    # the gradient is 0 although kl_coef is large (in the loss, k1's gradient would be 5 x grad log p).
    batch = hand_batch(tiny_tokenizer, rewards=(1.0, 1.0, 1.0))
    lrn = make_learner(
        AlgoConfig(
            name="dr_grpo",
            optim=OptimConfig(lr=1e-3),
            loss=LossConfig(norm_tokens=16),
            kl=KLConfig(coef=5.0, kind="k1", in_reward=True),
        )
    )
    lrn.ref.to(torch.float32)  # bf16 reference rounding would make the KL (and the advantages) nonzero
    for p, q in zip(lrn.ref.parameters(), lrn.model.parameters()):
        p.data.copy_(q.data)
    m = lrn.step(batch)
    assert m["kl/mean"] == 0.0 and m["grad/norm"] == 0.0


def _resume_algo(critic: str) -> AlgoConfig:
    return AlgoConfig(
        name="ppo",
        critic=CriticConfig(model=critic, lr=1e-2),
        optim=OptimConfig(lr=3e-3, warmup_steps=1, schedule="cosine", min_lr_ratio=0.1),
        kl=KLConfig(coef=0.05, kind="k1", in_reward=True, target=0.01, horizon=20),
        update=UpdateConfig(epochs=2, minibatches=2),
        loss=LossConfig(entropy_coef=0.01, dual_clip=3.0, clip_high=0.28),
    )


@pytest.mark.parametrize("critic", ["value_head", "separate"])
def test_checkpoint_resume_continues_identically(make_learner, tiny_tokenizer, tmp_path, critic):
    # A: 2 steps, save, 2 more. B: a fresh learner (another seed) loads the checkpoint and takes the
    # same 2 steps. Everything that shapes those steps (weights, critic, AdamW moments, LR schedule
    # position, KL coefficient, minibatch shuffle RNG) must be restored: the weights end equal.
    batches = [
        hand_batch(tiny_tokenizer, rewards=r)
        for r in [(1.0, -1.0, 0.5), (0.0, 1.0, 0.2), (0.3, 0.3, -1.0), (1.0, 0.0, 0.0)]
    ]
    a = make_learner(_resume_algo(critic), seed=0, total_steps=4)
    for b in batches[:2]:
        a.step(b)
    ck = tmp_path / "ck"
    a.save_checkpoint(str(ck))
    ma = [a.step(b) for b in batches[2:]]

    b_ = make_learner(_resume_algo(critic), seed=1, total_steps=4)
    b_.load_checkpoint(str(ck))
    assert (b_.steps_done, b_.updates_done) == (2, 8)
    mb = [b_.step(b) for b in batches[2:]]
    for x, y in zip(ma, mb):
        for k in ("loss/policy", "loss/value", "kl/mean", "kl/coef", "lr", "grad/norm"):
            assert x[k] == y[k], k
    assert ma[0]["kl/coef"] != 0.05 and ma[0]["lr"] != 3e-3  # the controller and the schedule had moved
    sa = dict(a.model.named_parameters()) | {f"critic.{k}": v for k, v in a.critic_module().named_parameters()}
    sb = dict(b_.model.named_parameters()) | {f"critic.{k}": v for k, v in b_.critic_module().named_parameters()}
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")

    # Without the shuffle RNG state the minibatches (and so the weights) would differ.
    c = make_learner(_resume_algo(critic), seed=1, total_steps=4)
    c.load_checkpoint(str(ck))
    c.gen.manual_seed(12345)
    for b in batches[2:]:
        c.step(b)
    assert any(
        not torch.allclose(v, dict(c.model.named_parameters())[k], atol=1e-6) for k, v in a.model.named_parameters()
    )


def test_checkpoint_of_another_critic_is_refused(make_learner, tiny_tokenizer, tmp_path):
    a = make_learner(dataclasses.replace(PPO, critic=dataclasses.replace(PPO.critic, model="value_head")))
    a.step(hand_batch(tiny_tokenizer))
    a.save_checkpoint(str(tmp_path / "ck"))
    b = make_learner(dataclasses.replace(PPO, critic=dataclasses.replace(PPO.critic, model="separate")))
    with pytest.raises(ValueError, match="critic"):
        b.load_checkpoint(str(tmp_path / "ck"))
