"""Stop strings per domain (``rollout.envs[].stop``): a policy turn ends at its action's end.

The recipe key reaches the engines through ``Recipe.rollout.stops()``; ``run_episodes``
passes each episode's domain strings with every generate call; both engines end a completion
at the token whose text completes a stop string and keep every sampled token (so the
trajectory's tokens stay exactly the sampled ones). A turn ended so is not truncated, and the
template's end-of-turn tokens come in as env tokens (loss mask 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from envs.types import Generation, Message, Sampling, Task
from rl.config.recipe import RecipeError, load_recipe
from rollout.episode import render, run_episodes

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def enc(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


@dataclass
class StopEngine:
    """Returns ``texts[k]`` (tokenized, no EOS, finish "stop") on call k; records the stops it was given."""

    tok: object
    texts: list[str]
    stops_seen: list[list[list[str]] | None] = field(default_factory=list)

    def generate(self, prompts, sampling, seeds=None, stops=None):
        ids = enc(self.tok, self.texts[len(self.stops_seen)])
        self.stops_seen.append(stops)
        return [Generation(ids, [-0.1] * len(ids), "stop")] * len(prompts)


class TwoTurnEnv:
    """Records actions; answers turn 1 with a tool message, ends on turn 2."""

    def __init__(self, actions: list[str]):
        self.actions = actions

    def reset(self, task):
        return list(task.messages)

    def step(self, action):
        self.actions.append(action)
        if len(self.actions) >= 2:
            return [], True, False, {}
        return [Message("tool", "ok")], False, False, {}

    def close(self):
        pass


def _task(domain: str) -> Task:
    return Task(id=domain, domain=domain, messages=(Message("user", "go"),))


def test_stop_strings_reach_the_engine_by_domain_and_end_turns_honestly(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    turn1, turn2 = "call(a)</x>", "done</x>"
    engine = StopEngine(tok, [turn1, turn2])
    actions: list[str] = []
    (t,) = run_episodes(
        engine,
        tok,
        lambda d: TwoTurnEnv(actions),
        [_task("scripted")],
        [0],
        [0],
        Sampling(max_new_tokens=32, max_turns=3, max_model_len=512),
        {"scripted": ["</x>"], "other": ["never"]},
    )
    assert engine.stops_seen == [[["</x>"]], [["</x>"]]], "the episode's domain strings, on every call"
    assert actions == [turn1, turn2], "the env sees the action with its stop string"
    assert (t.terminated, t.truncated, t.finish_reason, t.num_turns) == (True, False, "stop", 2)
    # No EOS was sampled: the template's end of turn 1 (and the tool message) are env tokens.
    policy = [i for i, m in zip(t.response_ids, t.loss_mask) if m]
    assert policy == enc(tok, turn1) + enc(tok, turn2)
    text = tok.decode(t.prompt_ids + t.response_ids, skip_special_tokens=False)
    assert render(tok, t.messages, add_generation_prompt=False).startswith(text)
    assert "<|im_end|>" in tok.decode([i for i, m in zip(t.response_ids, t.loss_mask) if not m])


def _first_new_text(tok, ids: list[int]) -> tuple[int, str]:
    """The first k >= 2 whose token adds text not seen before it: (k, that added text)."""
    for k in range(2, len(ids) + 1):
        before, now = tok.decode(ids[: k - 1]), tok.decode(ids[:k])
        added = now[len(before) :]
        if now.startswith(before) and added.strip() and added not in before:
            return k, added
    raise AssertionError(f"no token adds new text in {ids}")


def test_hf_engine_stops_at_the_token_completing_a_stop_string(tiny_model_path, tiny_tokenizer) -> None:
    from rollout.hf_engine import HFEngine

    engine = HFEngine(tiny_model_path, dtype="float32")
    s = Sampling(max_new_tokens=16, temperature=1.0, max_model_len=256)
    free = engine.generate([[1, 2, 3]], s, seeds=[5])[0]
    k, added = _first_new_text(tiny_tokenizer, free.token_ids)
    stopped = engine.generate([[1, 2, 3], [1, 2, 3]], s, seeds=[5, 5], stops=[[added], []])
    assert stopped[0].token_ids == free.token_ids[:k] and stopped[0].finish_reason == "stop"
    assert stopped[0].logprobs == pytest.approx(free.logprobs[:k])
    assert stopped[1].token_ids == free.token_ids, "stops are per request"


@pytest.mark.slow
def test_vllm_engine_stops_at_the_token_completing_a_stop_string(tiny_model_path, tiny_tokenizer) -> None:
    from rollout.engine import VLLMEngine

    engine = VLLMEngine(tiny_model_path, dtype="float32", max_model_len=512, kv_cache_gib=0.25)
    try:
        s = Sampling(max_new_tokens=16, temperature=1.0, max_model_len=512)
        free = engine.generate([[1, 2, 3]], s, seeds=[5])[0]
        k, added = _first_new_text(tiny_tokenizer, free.token_ids)
        stopped = engine.generate([[1, 2, 3], [1, 2, 3]], s, seeds=[5, 5], stops=[[added], []])
    finally:
        engine.shutdown()
    assert stopped[0].token_ids == free.token_ids[:k] and stopped[0].finish_reason == "stop"
    assert stopped[0].logprobs == pytest.approx(free.logprobs[:k], abs=1e-5)
    assert stopped[1].token_ids == free.token_ids, "stops are per request"


def test_recipe_stop_strings_are_checked_and_mapped_by_domain() -> None:
    cfg = load_recipe(RECIPES / "joint_rl.yaml")
    assert cfg.rollout.stops() == {"tool_call": ["</tool_call>"], "code": ["\n```\n"], "terminal": ["\n```\n"]}
    assert load_recipe(RECIPES / "quickstart.yaml", ["rollout.envs=[{domain: tool_call}]"]).rollout.stops() == {}
    with pytest.raises(RecipeError, match=r"rollout\.envs\.0\.stop: entry 1 must be a non-empty string"):
        load_recipe(RECIPES / "quickstart.yaml", ['rollout.envs=[{domain: tool_call, stop: ["</x>", ""]}]'])
