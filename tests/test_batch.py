"""rl.algos.batch: build_batch (advantages, exclusions, skipping zero-advantage samples) and rollout_metrics.

Every expected number is a literal worked out by hand (arithmetic in the comments).
"""

from __future__ import annotations

import dataclasses

import pytest

from envs.types import Message, Task, Trajectory
from rl.algos.batch import Batch, Sample, build_batch, rollout_metrics
from rl.config.recipe import AlgoConfig, KLConfig, LossConfig, UpdateConfig

TOL = 1e-5  # GRPO divides by (std + 1e-6): relative error ~2e-6 against the exact value


def traj(
    reward,
    group_id,
    loss_mask,
    *,
    domain="tool_call",
    reward_error=None,
    scores=None,
    truncated=False,
    num_turns=1,
    tid=None,
) -> Trajectory:
    """A hand-made trajectory: prompt [7, 8], one response token per loss_mask entry."""
    n = len(loss_mask)
    task = Task(id=tid or f"t{group_id}", domain=domain, messages=(Message("user", "hi"),))
    return Trajectory(
        task=task,
        group_id=group_id,
        prompt_ids=[7, 8],
        response_ids=[100 + i for i in range(n)],
        loss_mask=list(loss_mask),
        logprobs=[-0.5 if m else 0.0 for m in loss_mask],
        messages=[*task.messages, Message("assistant", "x")],
        terminated=not truncated,
        truncated=truncated,
        finish_reason="length" if truncated else "stop",
        num_turns=num_turns,
        scores=dict(scores or {}),
        reward=reward,
        reward_error=reward_error,
    )


def two_groups() -> list[Trajectory]:
    """Group 0 rewards [1, 0, 0], group 1 rewards [1, 1, 1].

    Policy tokens: a=2, b=2 (one env token in between), c=1, d=3, e=2, f=1 -> 11 in all.
    """
    return [
        traj(1.0, 0, [1, 1]),  # a
        traj(0.0, 0, [1, 0, 1]),  # b
        traj(0.0, 0, [1]),  # c
        traj(1.0, 1, [1, 1, 1]),  # d
        traj(1.0, 1, [1, 1]),  # e
        traj(1.0, 1, [1]),  # f
    ]


def advs(batch: Batch) -> list[float]:
    return [s.advantage for s in batch.samples]


# ------------------------------------------------------------------------- advantages


# Group 0 = [1, 0, 0]: mean 1/3; centred [2/3, -1/3, -1/3].
#   GRPO: unbiased std = sqrt(((2/3)^2 + 2 * (1/3)^2) / (3 - 1)) = sqrt((6/9) / 2) = sqrt(1/3) = 0.5773503
#         -> [0.6666667 / 0.5773503, -0.3333333 / 0.5773503, ...] = [1.1547005, -0.5773503, -0.5773503]
#   Dr.GRPO: centred only -> [0.6666667, -0.3333333, -0.3333333]
#   RLOO: s_i - mean(others) -> [1 - (0 + 0)/2, 0 - (1 + 0)/2, 0 - (1 + 0)/2] = [1.0, -0.5, -0.5]
# Group 1 = [1, 1, 1]: 0 for every sample in every mode.
@pytest.mark.parametrize(
    "name, group0, abs_mean",
    [
        # adv/abs_mean over the 6 samples: (1.1547005 + 2 * 0.5773503) / 6 = 2.3094011 / 6 = 0.3849002
        ("grpo", [1.1547005, -0.5773503, -0.5773503], 0.3849002),
        # (2/3 + 2/3) / 6 = (4/3) / 6 = 0.2222222
        ("dr_grpo", [0.6666667, -0.3333333, -0.3333333], 0.2222222),
        # (1 + 0.5 + 0.5) / 6 = 2 / 6 = 0.3333333
        ("rloo", [1.0, -0.5, -0.5], 0.3333333),
    ],
)
def test_advantages_and_skipping_without_kl(name, group0, abs_mean):
    trajs = two_groups()
    batch, stats = build_batch(trajs, AlgoConfig(name=name, kl=KLConfig(coef=0.0)))
    # Group 1 has advantage exactly 0 and no KL term: its 3 samples are left out of the compute ...
    assert advs(batch) == pytest.approx(group0, abs=TOL)
    assert len(batch.samples) == 3
    # ... but still counted in the loss denominators: tokens 2+2+1+3+2+1 = 11, sequences 6 ...
    assert batch.num_tokens == 11
    assert batch.num_seqs == 6
    # ... and kept in Batch.skipped (d, e, f: uids 3, 4, 5 with 3, 2, 1 tokens) for minibatch counts.
    assert [(s.uid, s.num_tokens) for s in batch.skipped] == [(3, 3), (4, 2), (5, 1)]
    assert [s.uid for s in batch.samples] == [0, 1, 2]
    assert stats["batch/excluded"] == 0.0
    assert stats["batch/samples"] == 3.0
    assert stats["groups/zero_variance_fraction"] == 0.5  # 1 of 2 groups
    assert stats["adv/abs_mean"] == pytest.approx(abs_mean, abs=TOL)


@pytest.mark.parametrize(
    "name, group0",
    [
        ("grpo", [1.1547005, -0.5773503, -0.5773503]),
        ("dr_grpo", [0.6666667, -0.3333333, -0.3333333]),
        ("rloo", [1.0, -0.5, -0.5]),
    ],
)
def test_zero_advantage_samples_kept_with_kl(name, group0):
    batch, stats = build_batch(two_groups(), AlgoConfig(name=name, kl=KLConfig(coef=0.05)))
    # With a KL term a zero-advantage sample still has a gradient: all 6 are kept.
    assert advs(batch) == pytest.approx(group0 + [0.0, 0.0, 0.0], abs=TOL)
    assert len(batch.samples) == 6
    assert stats["batch/samples"] == 6.0
    assert (batch.num_tokens, batch.num_seqs) == (11, 6)


def test_sample_fields():
    trajs = two_groups()
    batch, _ = build_batch(trajs, AlgoConfig(name="dr_grpo"))
    b = batch.samples[1]  # trajectory b: prompt [7, 8], response [100, 101, 102], mask [1, 0, 1]
    assert b == Sample(
        input_ids=[7, 8, 100, 101, 102],
        prompt_len=2,
        loss_mask=[1, 0, 1],
        rollout_logprobs=[-0.5, 0.0, -0.5],
        advantage=pytest.approx(-0.3333333, abs=TOL),
        domain="tool_call",
        reward=0.0,
        group_id=0,
        uid=1,
    )
    assert b.num_tokens == 2
    # Skipped (zero-advantage) samples carry their fields too: d is the first of group 1.
    d = batch.skipped[0]
    assert (d.uid, d.group_id, d.reward, d.advantage, d.num_tokens) == (3, 1, 1.0, 0.0, 3)
    # The sample's lists are copies: mutating them leaves the trajectory alone.
    b.input_ids.append(0)
    b.loss_mask.append(0)
    assert trajs[1].response_ids == [100, 101, 102] and trajs[1].loss_mask == [1, 0, 1]


def test_errored_reward_excluded_and_counted():
    # A 4th member of group 0 whose reward errored: it must not be scored 0 (that would turn
    # group 0 into [1, 0, 0, 0]); the group stays [1, 0, 0] and the sample is counted as excluded.
    trajs = two_groups() + [traj(None, 0, [1, 1, 1, 1], reward_error="toolcall raised ValueError: x")]
    batch, stats = build_batch(trajs, AlgoConfig(name="grpo"))
    assert stats["batch/excluded"] == 1.0
    assert advs(batch) == pytest.approx([1.1547005, -0.5773503, -0.5773503], abs=TOL)
    # Its 4 tokens are not in the denominators: still 11 tokens, 6 sequences.
    assert (batch.num_tokens, batch.num_seqs) == (11, 6)


def test_zero_policy_token_trajectory_excluded():
    # A trajectory with only env tokens (loss_mask all 0) in group 1, with reward 0: kept, it
    # would make group 1 = [1, 1, 1, 0] and give d, e, f nonzero advantages.
    trajs = two_groups() + [traj(0.0, 1, [0, 0])]
    batch, stats = build_batch(trajs, AlgoConfig(name="dr_grpo"))
    assert stats["batch/excluded"] == 1.0
    assert advs(batch) == pytest.approx([0.6666667, -0.3333333, -0.3333333], abs=TOL)
    assert (batch.num_tokens, batch.num_seqs) == (11, 6)
    assert stats["groups/zero_variance_fraction"] == 0.5


def test_rloo_drops_group_reduced_to_one():
    # Group 2 = [0.5 (ok), None (errored)]: one member left, no leave-one-out baseline.
    trajs = two_groups() + [traj(0.5, 2, [1, 1]), traj(None, 2, [1], reward_error="boom")]
    batch, stats = build_batch(trajs, AlgoConfig(name="rloo"))
    # excluded: the errored one + the lone survivor = 2
    assert stats["batch/excluded"] == 2.0
    assert advs(batch) == pytest.approx([1.0, -0.5, -0.5], abs=TOL)
    assert (batch.num_tokens, batch.num_seqs) == (11, 6)  # the survivor's 2 tokens are not counted
    assert stats["groups/zero_variance_fraction"] == 0.5  # over the 2 groups left


def test_grpo_keeps_group_reduced_to_one_with_zero_advantage():
    # GRPO has no such requirement: the lone survivor gets advantage 0 (skipped from the compute
    # without KL) but stays in the denominators: 11 + 2 = 13 tokens, 6 + 1 = 7 sequences.
    trajs = two_groups() + [traj(0.5, 2, [1, 1]), traj(None, 2, [1], reward_error="boom")]
    batch, stats = build_batch(trajs, AlgoConfig(name="grpo"))
    assert stats["batch/excluded"] == 1.0
    assert len(batch.samples) == 3
    assert (batch.num_tokens, batch.num_seqs) == (13, 7)
    assert stats["groups/zero_variance_fraction"] == pytest.approx(2 / 3)  # groups 1 and 2 of 3


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_all_excluded_gives_empty_batch(name):
    trajs = [traj(None, 0, [1], reward_error="e"), traj(1.0, 0, [0]), traj(0.0, 1, [1])]
    batch, stats = build_batch(trajs, AlgoConfig(name=name))
    if name == "rloo":  # the third one is alone in its group
        assert (batch.samples, batch.num_tokens, batch.num_seqs) == ([], 0, 0)
        assert stats["batch/excluded"] == 3.0
    else:  # the third one alone: advantage 0, skipped, but counted
        assert batch.samples == [] and (batch.num_tokens, batch.num_seqs) == (1, 1)
        assert stats["batch/excluded"] == 2.0


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_equal_inexact_rewards_are_a_zero_variance_group(name):
    # Group 1 = [0.2, 0.2, 0.2]: zero variance, so advantage exactly 0 and skipped without KL.
    trajs = two_groups()[:3] + [traj(0.2, 1, [1, 1, 1]), traj(0.2, 1, [1, 1]), traj(0.2, 1, [1])]
    batch, stats = build_batch(trajs, AlgoConfig(name=name))
    assert stats["groups/zero_variance_fraction"] == 0.5
    assert len(batch.samples) == 3
    batch_kl, _ = build_batch(trajs, AlgoConfig(name=name, kl=KLConfig(coef=0.1)))
    assert advs(batch_kl)[3:] == [0.0, 0.0, 0.0]


def test_entropy_bonus_keeps_zero_advantage_samples():
    # An entropy bonus gives every sample a gradient: nothing may be skipped.
    batch, _ = build_batch(two_groups(), AlgoConfig(name="grpo", loss=LossConfig(entropy_coef=0.01)))
    assert len(batch.samples) == 6 and batch.skipped == []


def test_drop_zero_variance_groups():
    batch, stats = build_batch(two_groups(), AlgoConfig(name="grpo", update=UpdateConfig(zero_variance="drop")))
    # Group 1 leaves the batch and its denominators: tokens 2 + 2 + 1 = 5, sequences 3.
    assert (batch.num_tokens, batch.num_seqs) == (5, 3)
    assert [s.group_id for s in batch.samples] == [0, 0, 0] and batch.skipped == []
    assert stats["groups/zero_variance_fraction"] == 0.5
    assert advs(batch) == pytest.approx([1.1547005, -0.5773503, -0.5773503], abs=TOL)


def test_reinforce_pp_batch_normalised_advantages():
    # Scores [1, 0, 0, 1, 1, 1]: mean 4/6 = 0.6666667; population std = sqrt(mean of squared
    # deviations) = sqrt((4 * (1/3)^2 + 2 * (2/3)^2) / 6) = sqrt((4/9 + 8/9) / 6) = sqrt(2/9) = 0.4714045
    # A = (s - mean) / (std + 1e-6): 1 -> 0.3333333 / 0.4714055 = 0.7071053; 0 -> -0.6666667 / 0.4714055 = -1.4142106
    batch, stats = build_batch(two_groups(), AlgoConfig(name="reinforce_pp"))
    assert advs(batch) == pytest.approx([0.7071053, -1.4142106, -1.4142106, 0.7071053, 0.7071053, 0.7071053], abs=TOL)
    assert (batch.num_tokens, batch.num_seqs) == (11, 6) and batch.skipped == []
    assert stats["groups/zero_variance_fraction"] == 0.5  # reported for every algorithm


@pytest.mark.parametrize(
    "algo",
    [
        AlgoConfig(name="ppo"),
        AlgoConfig(name="grpo", kl=KLConfig(coef=0.1, in_reward=True)),
        AlgoConfig(name="reinforce_pp", kl=KLConfig(coef=0.1, in_reward=True)),
    ],
)
def test_learner_side_advantages_carry_rewards_and_groups(algo):
    # PPO and KL-in-reward advantages need the learner's models: build_batch leaves them at 0,
    # keeps every sample (none skipped) and hands over the scalar rewards and group ids.
    batch, stats = build_batch(two_groups(), algo)
    assert advs(batch) == [0.0] * 6 and batch.skipped == []
    assert [s.reward for s in batch.samples] == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert [s.group_id for s in batch.samples] == [0, 0, 0, 1, 1, 1]
    assert [s.uid for s in batch.samples] == [0, 1, 2, 3, 4, 5]
    assert (batch.num_tokens, batch.num_seqs) == (11, 6)
    assert "adv/abs_mean" not in stats


def test_build_batch_does_not_mutate_input():
    trajs = two_groups()
    before = [dataclasses.asdict(t) for t in trajs]
    build_batch(trajs, AlgoConfig(name="grpo", kl=KLConfig(coef=0.1)))
    assert [dataclasses.asdict(t) for t in trajs] == before


# ------------------------------------------------------------------------- rollout_metrics


def metric_trajs() -> list[Trajectory]:
    return [
        # tool_call: rewards 1.0, 0.0, and one errored (its scores must not count)
        traj(1.0, 0, [1, 1], scores={"toolcall": 1.0, "fmt": 0.5}, num_turns=1),
        traj(0.0, 0, [1, 0, 1, 1], scores={"toolcall": 0.0, "fmt": None}, num_turns=2, truncated=True),
        traj(None, 0, [1], scores={"toolcall": 0.9}, reward_error="fmt raised KeyError: 'x'", num_turns=1),
        # code: one sample, reward 0.25
        traj(0.25, 1, [1, 1, 1, 1, 1], domain="code", scores={"tests": 0.25}, num_turns=3),
    ]


EXPECTED_METRICS = {
    "faults/reward_errors": 1.0,
    "reward/mean": 0.4166667,  # (1.0 + 0.0 + 0.25) / 3 = 1.25 / 3
    "reward/tool_call/mean": 0.5,  # (1.0 + 0.0) / 2
    "reward/tool_call/toolcall/mean": 0.5,  # (1.0 + 0.0) / 2; the errored sample's 0.9 is left out
    "reward/tool_call/fmt/mean": 0.5,  # only 0.5 (None skipped)
    "rollout/tool_call/response_len/mean": 2.0,  # policy tokens (2 + 3 + 1) / 3
    "reward/code/mean": 0.25,
    "reward/code/tests/mean": 0.25,
    "rollout/code/response_len/mean": 5.0,
    "rollout/tokens": 11.0,  # 2 + 3 + 1 + 5 (errored samples' tokens were generated too)
    "rollout/response_len/mean": 2.75,  # 11 / 4
    "rollout/truncated_fraction": 0.25,  # 1 of 4
    "rollout/turns/mean": 1.75,  # (1 + 2 + 1 + 3) / 4
}


def test_rollout_metrics():
    m = rollout_metrics(metric_trajs())
    assert set(m) == set(EXPECTED_METRICS)
    for k, v in EXPECTED_METRICS.items():
        assert m[k] == pytest.approx(v, abs=1e-6), k


def test_rollout_metrics_eval_prefix():
    m = rollout_metrics(metric_trajs(), prefix="eval/")
    assert set(m) == {"eval/" + k for k in EXPECTED_METRICS}
    assert m["eval/reward/mean"] == pytest.approx(0.4166667, abs=1e-6)
    assert m["eval/rollout/truncated_fraction"] == 0.25


def test_rollout_metrics_all_errored_has_no_mean():
    m = rollout_metrics([traj(None, 0, [1, 1], reward_error="e")])
    assert m["faults/reward_errors"] == 1.0
    assert "reward/mean" not in m and "reward/tool_call/mean" not in m  # never a silent 0
    assert m["rollout/tokens"] == 2.0


def test_seq_level_domains_weigh_per_sequence():
    """Dr.GRPO on two groups: a long terminal pair and a short code pair. With the terminal
    domain weighted per sequence, each terminal sample's advantage is scaled by
    mean tokens / own tokens: mean = (2+2+6+6)/4 = 4, so terminal (6 tokens) x 4/6."""
    from envs.types import Message, Task, Trajectory
    from rl.config.recipe import AlgoConfig

    def tr(domain, g, reward, n):
        t = Task(id=f"{domain}{g}", domain=domain, messages=(Message("user", "q"),))
        return Trajectory(
            task=t,
            group_id=g,
            prompt_ids=[1],
            response_ids=[2] * n,
            loss_mask=[1] * n,
            logprobs=[-1.0] * n,
            messages=[],
            terminated=True,
            truncated=False,
            finish_reason="stop",
            reward=reward,
        )

    trajs = [tr("code", 0, 1.0, 2), tr("code", 0, 0.0, 2), tr("terminal", 1, 1.0, 6), tr("terminal", 1, 0.0, 6)]
    algo = AlgoConfig(name="dr_grpo")
    plain, _ = build_batch(trajs, algo)
    weighted, _ = build_batch(trajs, algo, seq_level_domains=("terminal",))
    # Dr.GRPO: r - group mean = +-0.5 everywhere.
    assert [s.advantage for s in plain.samples] == [0.5, -0.5, 0.5, -0.5]
    assert [s.advantage for s in weighted.samples] == pytest.approx([0.5, -0.5, 0.5 * 4 / 6, -0.5 * 4 / 6])


def test_zero_advantage_samples_train_with_the_aux_term():
    """A zero-advantage sample has the auxiliary loss's gradient (algo.loss.aux_coef): it is not skipped then."""
    trajs = [traj(1.0, 0, [1, 1]), traj(1.0, 0, [1])]  # one group, equal rewards: advantages exactly 0
    off, _ = build_batch(trajs, AlgoConfig(name="grpo"))
    on, _ = build_batch(trajs, AlgoConfig(name="grpo", loss=LossConfig(aux_coef=0.01)))
    assert (len(off.samples), len(off.skipped)) == (0, 2)
    assert (len(on.samples), len(on.skipped)) == (2, 0)
    assert (on.num_tokens, on.num_seqs) == (off.num_tokens, off.num_seqs) == (3, 2)


def test_a_loss_with_a_term_of_its_own_trains_zero_advantage_samples(tmp_path, monkeypatch):
    """Only a loss that declares every term proportional to the advantage lets build_batch skip A = 0 samples."""
    (tmp_path / "own_term_losses.py").write_text(
        "from rl.algos.policy_losses import PolicyLoss\n"
        "class WithOwnTerm(PolicyLoss):\n"
        "    def __call__(self, x):\n"
        "        return -x.aggregate(x.advantages * x.logp) - 0.01 * x.aggregate(x.logp), {}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    trajs = [traj(1.0, 0, [1, 1]), traj(1.0, 0, [1])]
    own, _ = build_batch(trajs, AlgoConfig(name="grpo", loss=LossConfig(policy="own_term_losses.WithOwnTerm")))
    assert (len(own.samples), len(own.skipped)) == (2, 0)
    for name in ("ppo_clip", "gspo", "cispo"):
        b, _ = build_batch(trajs, AlgoConfig(name="grpo", loss=LossConfig(policy=name)))
        assert (len(b.samples), len(b.skipped)) == (0, 2), name
