"""Tests for rl.algos.advantages against hand-computed values (arithmetic in the comments)."""

import pytest
import torch

from rl.algos.advantages import gae, group_normalized, reinforce_pp, whiten


def close(actual, expected, atol=1e-5):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# --------------------------------------------------------------------------- gae


def test_gae_gamma_lam_one_is_return_to_go_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # gamma = lam = 1, V(after end) = 0: A_t = sum_{k>=t} r_k - V_t
    # returns = [1, 1, 1]; adv = [1 - 0.5, 1 - 0.6, 1 - 0.7]
    close(adv, [[0.5, 0.4, 0.3]])
    close(ret, [[1.0, 1.0, 1.0]])


def test_gae_discounted_ragged_batch():
    # gamma = 0.9, lam = 0.8 -> gamma * lam = 0.72
    rewards = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 3.0, 5.0, 7.0]])
    values = torch.tensor([[0.5, 1.0, 0.0, 0.0], [1.0, 2.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # ragged: padding at the end
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # row 0:
    #   t=2: delta = 2 + 0.9*0   - 0.0 = 2.0          A2 = 2.0
    #   t=1: delta = 0 + 0.9*0.0 - 1.0 = -1.0         A1 = -1.0 + 0.72*2.0  = 0.44
    #   t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4          A0 = 1.4 + 0.72*0.44  = 1.7168
    #   returns = A + V = [2.2168, 1.44, 2.0, 0]
    # row 1 (padding rewards 5, 7 and values 9, 9 ignored):
    #   t=1: delta = 3 + 0.9*0   - 2.0 = 1.0          A1 = 1.0
    #   t=0: delta = 0 + 0.9*2.0 - 1.0 = 0.8          A0 = 0.8 + 0.72*1.0   = 1.52
    #   returns = [2.52, 3.0, 0, 0]
    close(adv, [[1.7168, 0.44, 2.0, 0.0], [1.52, 1.0, 0.0, 0.0]])
    close(ret, [[2.2168, 1.44, 2.0, 0.0], [2.52, 3.0, 0.0, 0.0]])


def test_gae_skips_mid_sequence_env_tokens():
    # row 0: multi-turn, position 2 is an env token (mask 0) with junk reward / value.
    # row 1: same response tokens without the env token, padded at the end.
    rewards = torch.tensor([[0.0, 0.0, 7.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.2, 0.4, 9.0, 0.6], [0.2, 0.4, 0.6, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # row 0, masked tokens 0, 1, 3 (token 1 links to token 3):
    #   t=3: delta = 1 + 0       - 0.6 = 0.4          A3 = 0.4
    #   t=1: delta = 0 + 0.9*0.6 - 0.4 = 0.14         A1 = 0.14 + 0.72*0.4   = 0.428
    #   t=0: delta = 0 + 0.9*0.4 - 0.2 = 0.16         A0 = 0.16 + 0.72*0.428 = 0.46816
    #   returns = A + V = [0.46816+0.2, 0.428+0.4, 0, 0.4+0.6] = [0.66816, 0.828, 0, 1.0]
    close(adv[0], [0.46816, 0.428, 0.0, 0.4])
    close(ret[0], [0.66816, 0.828, 0.0, 1.0])
    # row 1 is the same three tokens, contiguous
    close(adv[1], [0.46816, 0.428, 0.4, 0.0])
    close(ret[1], [0.66816, 0.828, 1.0, 0.0])


def test_gae_has_no_grad():
    values = torch.tensor([[0.5, 0.6]], requires_grad=True)
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), values, torch.ones(1, 2), gamma=1.0, lam=0.95)
    assert not adv.requires_grad and not ret.requires_grad


# --------------------------------------------------------------------------- group_normalized

# ids 7 -> scores [1, 3, 5]: mean 3, deviations [-2, 0, 2], sum sq 8, unbiased var 8/2 = 4, std 2
# ids 3 -> scores [2, 4]:    mean 3, deviations [-1, 1],    sum sq 2, unbiased var 2/1 = 2, std 1.41421
# (population std would be 1.63299 and 1: the GRPO values below distinguish the two.)
SCORES = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
IDS = torch.tensor([7, 3, 7, 3, 7])  # unsorted, non-contiguous


def test_grpo_unbiased_std_unsorted_ids():
    adv = group_normalized(SCORES, IDS)
    # [-2/2, -1/1.41421, 0/2, 1/1.41421, 2/2]
    close(adv, [-1.0, -0.7071068, 0.0, 0.7071068, 1.0])


def test_dr_grpo_mean_only():
    adv = group_normalized(SCORES, IDS, std_normalize=False)
    close(adv, [-2.0, -1.0, 0.0, 1.0, 2.0])


def test_rloo_leave_one_out():
    adv = group_normalized(SCORES, IDS, leave_one_out=True)
    # 1 - mean(3, 5) = -3;  2 - 4 = -2;  3 - mean(1, 5) = 0;  4 - 2 = 2;  5 - mean(1, 3) = 3
    close(adv, [-3.0, -2.0, 0.0, 2.0, 3.0])
    # std_normalize is ignored by RLOO
    close(group_normalized(SCORES, IDS, std_normalize=False, leave_one_out=True), [-3.0, -2.0, 0.0, 2.0, 3.0])


def test_single_member_group_grpo_zero_rloo_raises():
    scores = torch.cat([SCORES, torch.tensor([9.0])])
    ids = torch.cat([IDS, torch.tensor([11])])
    close(group_normalized(scores, ids), [-1.0, -0.7071068, 0.0, 0.7071068, 1.0, 0.0])
    close(group_normalized(scores, ids, std_normalize=False), [-2.0, -1.0, 0.0, 1.0, 2.0, 0.0])
    with pytest.raises(ValueError, match="11"):
        group_normalized(scores, ids, leave_one_out=True)


def test_grpo_constant_group_and_large_negative_ids():
    scores = torch.tensor([0.5, 0.5, 1.0, 0.0])
    ids = torch.tensor([-4, -4, 10**12, 10**12])
    # group -4: all equal -> 0; group 1e12: mean 0.5, unbiased std sqrt(0.5) = 0.70711 -> +-0.70711
    close(group_normalized(scores, ids), [0.0, 0.0, 0.7071068, -0.7071068])


# --------------------------------------------------------------------------- reinforce_pp


def test_reinforce_pp_outcome_only_batch_normalized():
    scores = torch.tensor([1.0, 3.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = reinforce_pp(scores, mask)
    # mean 2, population std sqrt(((-1)^2 + 1^2) / 2) = 1 -> [-1, +1] / (1 + 1e-6)
    # broadcast onto masked tokens only
    close(adv, [[-1.0, -1.0, 0.0], [1.0, 0.0, 0.0]])


def test_reinforce_pp_with_token_rewards_return_to_go_then_whiten():
    scores = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    token_rewards = torch.tensor([[-0.1, -0.2, 5.0], [0.0, -0.1, -0.1]])  # 5.0 is padding: ignored
    adv = reinforce_pp(scores, mask, token_rewards=token_rewards, gamma=0.5)
    # rewards: row 0 [-0.1, -0.2 + 1 (outcome on last masked)] = [-0.1, 0.8]
    #          row 1 [0, -0.1, -0.1 + 0]
    # return-to-go, gamma 0.5:
    #   row 0: G1 = 0.8,  G0 = -0.1 + 0.5*0.8 = 0.3
    #   row 1: G2 = -0.1, G1 = -0.1 + 0.5*(-0.1) = -0.15, G0 = 0 + 0.5*(-0.15) = -0.075
    # masked tokens [0.3, 0.8, -0.075, -0.15, -0.1]: sum 0.775, mean 0.155
    # deviations [0.145, 0.645, -0.23, -0.305, -0.255]
    # squares 0.021025 + 0.416025 + 0.0529 + 0.093025 + 0.065025 = 0.648; /5 = 0.1296; std 0.36
    # -> [0.145, 0.645 | -0.23, -0.305, -0.255] / 0.36
    close(adv, [[0.4027778, 1.7916667, 0.0], [-0.6388889, -0.8472222, -0.7083333]])


# --------------------------------------------------------------------------- whiten

# masked entries [2, 4, 4, 4 | 5, 5, 7, 9]: mean 5,
# population var (9 + 1 + 1 + 1 + 0 + 0 + 4 + 16) / 8 = 4, std 2
W_VALUES = torch.tensor([[2.0, 4.0, 4.0, 4.0, 1000.0], [5.0, 5.0, 7.0, 9.0, -1000.0]])
W_MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]])


def test_whiten_shift_mean():
    out = whiten(W_VALUES, W_MASK)
    # (x - 5) / 2
    close(out, [[-1.5, -0.5, -0.5, -0.5, 0.0], [0.0, 0.0, 1.0, 2.0, 0.0]])


def test_whiten_keep_mean():
    out = whiten(W_VALUES, W_MASK, shift_mean=False)
    # (x - 5) / 2 + 5
    close(out, [[3.5, 4.5, 4.5, 4.5, 0.0], [5.0, 5.0, 6.0, 7.0, 0.0]])


def test_whiten_empty_mask_is_zero_not_nan():
    out = whiten(W_VALUES, torch.zeros_like(W_MASK))
    close(out, torch.zeros(2, 5))


# --------------------------------------------------------------------------- reduce_sum (data-parallel statistics)


def test_whiten_reduce_sum_gives_whole_batch_statistics():
    # Shard 0 holds x = [1, 2, (pad)], shard 1 holds [6] (the other half of a batch [1, 2, 6]).
    # Whole batch: mean 3, population var ((1-3)^2 + (2-3)^2 + (6-3)^2) / 3 = (4 + 1 + 9) / 3 = 14/3,
    # std sqrt(14/3) = 2.1602469 -> shard 0 whitened: [-2 / 2.1602469, -1 / 2.1602469, 0] = [-0.9258201, -0.4629100, 0]
    x0, m0 = torch.tensor([[1.0, 2.0, 99.0]]), torch.tensor([[1, 1, 0]])
    # Shard 1's partial sums: [sum x, count] = [6, 1], then [sum (x - mu)^2] = [(6 - 3)^2].
    shard1 = iter([torch.tensor([6.0, 1.0]), torch.tensor([9.0])])
    close(whiten(x0, m0, eps=0.0, reduce_sum=lambda t: t + next(shard1)), [[-0.9258201, -0.4629100, 0.0]])
    # Identity reduce: the local result, bit for bit.
    x = torch.tensor([[0.3, -1.2, 2.5], [4.0, 0.0, 0.7]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert torch.equal(whiten(x, m, reduce_sum=lambda t: t), whiten(x, m))


def test_reinforce_pp_reduce_sum_duplicated_batch():
    # A "second shard" identical to the first doubles every partial sum, leaving mean and
    # (population) variance unchanged: the result must equal the local one, in both variants.
    scores = torch.tensor([1.0, 0.0, 0.5])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    double = lambda t: 2 * t  # noqa: E731
    close(reinforce_pp(scores, mask, reduce_sum=double), reinforce_pp(scores, mask), atol=1e-6)
    tok = torch.tensor([[-0.1, 0.2, 0.0], [0.3, 0.0, 0.0], [0.0, -0.2, 0.1]])
    close(
        reinforce_pp(scores, mask, token_rewards=tok, reduce_sum=double),
        reinforce_pp(scores, mask, token_rewards=tok),
        atol=1e-6,
    )
    # And a reduce that adds a different shard changes the result (the hook is used): shard 1 = one
    # score 3.0 -> mean (1 + 0 + 0.5 + 3) / 4 = 1.125; population var = (0.015625 + 1.265625 + 0.390625
    # + 3.515625) / 4 = 1.296875, std 1.1388041; A(1.0) = -0.125 / 1.1388051 = -0.1097642
    extra = iter([torch.tensor([3.0, 1.0]), torch.tensor([(3.0 - 1.125) ** 2])])
    out = reinforce_pp(scores, mask, reduce_sum=lambda t: t + next(extra))
    close(out[0], [-0.1097642, -0.1097642, 0.0])
