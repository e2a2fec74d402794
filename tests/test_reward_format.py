"""rewards.format: OverlongPenalty (DAPO soft overlong punishment), CutTurnPenalty and the re-exported format rewards."""

from __future__ import annotations

import pytest

from envs.types import ExpectedCall, Message, Task, ToolCallSpec, Trajectory
from rewards.format import CodeFormatReward, CutTurnPenalty, OverlongPenalty, ToolCallFormatReward
from rewards.service import RewardFnSpec, RewardScorer


def traj(
    n_tokens: int, domain: str = "tool_call", text: str = "x", env_tokens: int = 0, task: Task | None = None
) -> Trajectory:
    task = task or Task(id="t", domain=domain, messages=(Message("user", "q"),))
    mask = [1] * n_tokens + [0] * env_tokens
    return Trajectory(
        task=task,
        group_id=0,
        prompt_ids=[1],
        response_ids=[5] * len(mask),
        loss_mask=mask,
        logprobs=[0.0] * len(mask),
        messages=[*task.messages, Message("assistant", text)],
        terminated=True,
        truncated=False,
        finish_reason="stop",
    )


@pytest.mark.parametrize(
    "n, want",
    [
        (1, 0.0),
        (50, 0.0),
        (96, 0.0),  # <= max - buffer = 96: no penalty
        (100, -0.5 * 4 / 32),
        (112, -0.5 * 16 / 32),  # linear over the 32-token buffer, penalty 0.5
        (128, -0.5),
        (129, -0.5),
        (10_000, -0.5),  # at and past max_tokens
    ],
)
def test_overlong_soft_penalty(n, want):
    assert OverlongPenalty(max_tokens=128, buffer_tokens=32, penalty=0.5)(traj(n)) == pytest.approx(want)


def test_overlong_hard_step_without_buffer():
    p = OverlongPenalty(max_tokens=10, buffer_tokens=0)
    assert [p.score_length(n) for n in (9, 10, 11)] == [0.0, 0.0, -1.0]


def test_overlong_counts_policy_tokens_only_and_needs_tokens():
    p = OverlongPenalty(max_tokens=10, buffer_tokens=5)
    assert p(traj(5, env_tokens=100)) == 0.0  # env (tool output) tokens are not the policy's
    no_tokens = traj(0)
    assert p(no_tokens) is None  # a recorded completion without token info: does not apply


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0, "buffer_tokens": 0},
        {"max_tokens": 10, "buffer_tokens": 11},
        {"max_tokens": 10, "buffer_tokens": -1},
        {"max_tokens": 10.0, "buffer_tokens": 1},
        {"max_tokens": 10, "buffer_tokens": 1, "penalty": -1},
        {"max_tokens": 10, "buffer_tokens": 1, "penalty": float("nan")},
    ],
)
def test_overlong_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        OverlongPenalty(**kwargs)


def _tool_task() -> Task:
    """A tool-call task whose right answer is ``f()``."""
    return Task(
        id="t",
        domain="tool_call",
        messages=(Message("user", "q"),),
        prefill="<tool_call>",
        tool_call=ToolCallSpec(tools=({"name": "f"},), expected=(ExpectedCall("f", {}),)),
    )


def test_overlong_is_a_shaping_term_for_every_domain():
    p = OverlongPenalty(max_tokens=10, buffer_tokens=5)
    assert p.domains == ("*",) and p.shaping is True
    task = _tool_task()
    scorer = RewardScorer(
        [
            RewardFnSpec("rewards.toolcall.ToolCallReward"),
            RewardFnSpec("rewards.format.OverlongPenalty", weight=0.5, kwargs={"max_tokens": 10, "buffer_tokens": 5}),
        ]
    )
    good_long = traj(20, task=task, text='<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    no_spec = traj(20, domain="terminal")
    a, b = scorer.score([good_long, no_spec])
    assert a.reward == pytest.approx(1.0 - 0.5) and a.scores == {"toolcall": 1.0, "overlong": -1.0}
    # Only the penalty applied to the terminal sample: it is not scored (an error, not -0.5).
    assert b.reward is None and "no reward function scored this 'terminal' sample" in b.reward_error
    # shaping=False makes it count as a reward on its own.
    scorer2 = RewardScorer(
        [
            RewardFnSpec(
                "rewards.format.OverlongPenalty", kwargs={"max_tokens": 10, "buffer_tokens": 5, "shaping": False}
            )
        ]
    )
    assert scorer2.score([no_spec])[0].reward == -1.0


def cut(n_cut: int | None, **kw) -> Trajectory:
    import dataclasses

    return dataclasses.replace(traj(20, **kw), cut_turns=n_cut)


def test_cut_turn_penalty_reads_the_rollouts_record_of_cut_turns():
    p = CutTurnPenalty(penalty=0.5)
    assert (p.name, p.domains, p.shaping) == ("cut_turn", ("*",), True)
    assert [p(cut(n)) for n in (0, 1, 3)] == [0.0, -0.5, -0.5]
    # No record (a completion scored by `jointrl score`): does not apply, rather than "not cut".
    assert p(cut(None)) is None and p(traj(20)) is None
    # The episode's length does not matter, only whether a turn hit the limit: the text cannot earn or dodge it.
    assert CutTurnPenalty()(cut(0, text="```python\n" + "x = 1\n" * 500)) == 0.0


@pytest.mark.parametrize("penalty", [-0.1, float("inf"), float("nan"), True, "0.5"])
def test_cut_turn_penalty_bad_arguments(penalty):
    with pytest.raises(ValueError, match="penalty"):
        CutTurnPenalty(penalty=penalty)


def test_cut_turn_penalty_shapes_the_reward_and_is_kept_apart():
    """Added to the domain's score (a failed-and-cut sample now scores below a failed one that stopped, so a
    group of failures has variance), recorded in ``reward_shaping``; alone it scores nothing."""
    task = _tool_task()
    scorer = RewardScorer(
        [RewardFnSpec("rewards.toolcall.ToolCallReward"), RewardFnSpec("rewards.format.CutTurnPenalty")]
    )
    good = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    stopped, rambled, good_cut, other = scorer.score(
        [
            cut(0, task=task, text="no"),
            cut(1, task=task, text="no"),
            cut(1, task=task, text=good),
            cut(1, domain="terminal"),
        ]
    )
    assert (stopped.reward, stopped.reward_shaping) == (0.0, 0.0)
    assert (rambled.reward, rambled.reward_shaping) == (-0.5, -0.5)
    assert good_cut.reward == pytest.approx(0.5) and good_cut.reward_shaping == -0.5
    assert good_cut.task_reward == 1.0  # the task's own score
    assert (stopped.task_reward, rambled.task_reward) == (0.0, 0.0)
    assert other.reward is None and other.reward_shaping == 0.0 and "cut_turn is a shaping term" in other.reward_error


def test_format_rewards_are_reexported():
    from rewards.code import CodeFormatReward as C
    from rewards.toolcall import ToolCallFormatReward as T

    assert CodeFormatReward is C and ToolCallFormatReward is T
