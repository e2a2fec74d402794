"""Calls-mode sessions of several requests (``tool_call.followups``): the task format, the env's turns and
pre-starts, the rollout's per-turn prefill, the per-request reward and its attacks, the ladder's sessions and the
audit's reference for them."""

from __future__ import annotations

import json
import re

import pytest
from test_episode import LP1, LP2, ScriptedEngine, enc, eos, gen

from envs.base import check_env
from envs.io import TaskFormatError, load_tasks, save_tasks, task_from_dict, task_to_dict
from envs.toolcall import ToolCallEnv
from envs.types import ExpectedCall, FollowUp, Message, Sampling, Task, ToolCallSpec, Trajectory
from rewards.toolcall import ToolCallFormatReward, ToolCallReward
from rl.cli.audit.runner import _reference_act, run_episode
from rl.cli.audit.sources import native_reference
from rl.data.tasks.toolcall_gen import CHAIN_SOURCE, FUNCTIONS, chain_tasks, generate_chains, generate_ladder
from rollout.episode import run_episodes

TIMER = {
    "name": "set_timer",
    "description": "Start a timer.",
    "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]},
}
WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def call(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def session(prefills: tuple[str, str, str] = ("<tool_call>", "<tool_call>", "")) -> Task:
    """Three requests: a 5-minute timer, the weather in Paris, a 7-minute timer."""
    return Task(
        id="s0",
        domain="tool_call",
        messages=(Message("system", "You can call set_timer and get_weather."), Message("user", "Timer, 5 min.")),
        prefill=prefills[0],
        tool_call=ToolCallSpec(
            tools=(TIMER, WEATHER),
            expected=(ExpectedCall("set_timer", {"minutes": [5]}),),
            followups=(
                FollowUp("Weather in Paris?", (ExpectedCall("get_weather", {"city": ["Paris"]}),), prefills[1]),
                FollowUp("Now a 7 minute timer.", (ExpectedCall("set_timer", {"minutes": [7]}),), prefills[2]),
            ),
        ),
    )


RIGHT = (call("set_timer", minutes=5), call("get_weather", city="Paris"), call("set_timer", minutes=7))


def traj(task: Task, turns: list[str], between: list[list[Message]] | None = None) -> Trajectory:
    """A trajectory whose assistant turns are ``turns`` (env messages ``between`` them: the env's requests)."""
    msgs = list(task.messages)
    follow = [[Message("user", f.request)] for f in task.tool_call.followups] if between is None else between
    for i, t in enumerate(turns):
        msgs.append(Message("assistant", t))
        if i < len(turns) - 1:
            msgs += follow[i]
    return Trajectory(task, 0, [], [], [], [], msgs, True, False, "stop", num_turns=len(turns))


# ------------------------------------------------------------------------------------------- the format


def test_followups_round_trip_and_older_files_are_unchanged(tmp_path):
    t = session()
    path = tmp_path / "s.jsonl"
    save_tasks([t], path)
    assert load_tasks(path) == [t]
    d = task_to_dict(t)
    assert d["tool_call"]["followups"][1] == {
        "request": "Now a 7 minute timer.",
        "expected": [{"name": "set_timer", "allowed": {"minutes": [7]}}],
    }  # an empty prefill is left out
    plain = task_to_dict(Task("p", "tool_call", (Message("user", "x"),), tool_call=ToolCallSpec((TIMER,), ())))
    assert "followups" not in plain["tool_call"]


@pytest.mark.parametrize(
    ("followups", "mode", "field", "problem"),
    [
        ({"request": "x"}, "calls", "tool_call.followups", "must be a list of requests"),
        ([{"request": "x", "expected": []}], "answer", "tool_call.followups", "only calls-mode tasks"),
        ([3], "calls", "tool_call.followups[0]", "must be an object"),
        ([{"request": " ", "expected": []}], "calls", "tool_call.followups[0].request", "non-empty string"),
        ([{"request": "x"}], "calls", "tool_call.followups[0].expected", "missing"),
        ([{"request": "x", "expected": [], "prefill": 3}], "calls", "tool_call.followups[0].prefill", "a string"),
        ([{"request": "x", "expected": [], "answer": "y"}], "calls", "tool_call.followups[0].answer", "unknown"),
        ([{"request": "x", "expected": [{"allowed": {}}]}], "calls", "tool_call.followups[0].expected[0].name", ""),
    ],
)
def test_bad_followups_name_the_line_and_field(tmp_path, followups, mode, field, problem):
    d = task_to_dict(session())
    d["tool_call"]["followups"] = followups
    d["tool_call"]["mode"] = mode
    if mode == "answer":
        d["tool_call"]["answer"] = ["42"]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(task_to_dict(session())) + "\n" + json.dumps({**d, "id": "s1"}) + "\n")
    with pytest.raises(TaskFormatError, match=rf"bad\.jsonl:2: field '{re.escape(field)}'") as e:
        load_tasks(path)
    assert problem in str(e.value)


# ------------------------------------------------------------------------------------------- the env


def test_the_env_asks_each_request_in_turn_with_its_prefill():
    env = ToolCallEnv(max_turns=3)
    t = session()
    assert env.reset(t) == list(t.messages)
    obs, term, trunc, info = env.step(RIGHT[0])
    assert (obs, term, trunc, info["prefill"]) == ([Message("user", "Weather in Paris?")], False, False, "<tool_call>")
    assert info["calls"] == [{"name": "set_timer", "arguments": {"minutes": 5}}] and info["tool_results"] == []
    obs, term, trunc, info = env.step(RIGHT[1])
    assert (obs, term, trunc, info["prefill"]) == ([Message("user", "Now a 7 minute timer.")], False, False, "")
    obs, term, trunc, info = env.step(RIGHT[2])
    assert (obs, term, trunc) == ([], True, False) and "prefill" not in info
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(RIGHT[2])
    check_env(ToolCallEnv(max_turns=3), t)


def test_requests_left_at_max_turns_truncate_the_episode():
    env = ToolCallEnv(max_turns=2)
    env.reset(session())
    env.step(RIGHT[0])
    assert env.step(RIGHT[1])[1:3] == (False, True)


def test_each_turn_of_a_session_draws_its_own_tool_latency():
    env = ToolCallEnv(max_turns=3, tool_latency={"median_s": 0.5, "sigma": 1.0, "cap_s": 20.0, "seed": 0})
    slept: list[float] = []
    env._sleep = slept.append
    env.seed_episode(4)
    t = session()
    env.reset(t)
    for action in RIGHT:
        env.step(action)
    assert slept == [env.latency.draw(t.id, 4, turn, 0) for turn in (1, 2, 3)]
    assert len(set(slept)) == 3


def test_check_env_refuses_a_prefill_that_is_not_text():
    class BadPrefill(ToolCallEnv):
        def step(self, action):
            obs, term, trunc, info = super().step(action)
            return obs, term, trunc, {**info, "prefill": 7} if not (term or trunc) else info

    with pytest.raises(TypeError, match=r"info\['prefill'\] must be a str"):
        check_env(BadPrefill(max_turns=3), session())


# ------------------------------------------------------------------------------------------- the rollout


def test_the_rollout_pre_starts_each_turn_as_the_env_says(tiny_tokenizer):
    """Turn 2's prefill comes after the env's request as env tokens (mask 0, logprob 0); the action the env gets
    and the assistant message both start with it; turn 3 has none."""
    tok = tiny_tokenizer
    t = session()
    bodies = ['{"name": "set_timer", "arguments": {"minutes": 5}}</tool_call>']
    bodies += ['{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', RIGHT[2]]
    engine = ScriptedEngine([[gen(tok, bodies[0], LP1)], [gen(tok, bodies[1], LP2)], [gen(tok, bodies[2], LP2)]])
    envs: list[ToolCallEnv] = []
    (tr,) = run_episodes(
        engine, tok, lambda d: envs.append(ToolCallEnv(max_turns=3)) or envs[-1], [t], [0], [0], Sampling(max_turns=3)
    )
    assert [m.content for m in tr.messages if m.role == "assistant"] == list(RIGHT)
    assert (tr.terminated, tr.truncated, tr.num_turns) == (True, False, 3)
    user2 = "\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>"
    user3 = "\n<|im_start|>user\nNow a 7 minute timer.<|im_end|>\n<|im_start|>assistant\n"
    g1, g2 = enc(tok, bodies[0]) + [eos(tok)], enc(tok, bodies[1]) + [eos(tok)]
    e2, e3 = enc(tok, user2), enc(tok, user3)
    assert tr.response_ids == g1 + e2 + g2 + e3 + enc(tok, bodies[2]) + [eos(tok)]
    assert tr.loss_mask == [1] * len(g1) + [0] * len(e2) + [1] * len(g2) + [0] * len(e3) + [1] * (
        len(tr.loss_mask) - len(g1) - len(e2) - len(g2) - len(e3)
    )
    # the engine was asked for turn 2 right after the env's prefill
    assert engine.calls[1][0][0] == tr.prompt_ids + g1 + e2
    assert ToolCallReward()(tr) == pytest.approx(1.0)


def test_an_env_prefill_that_is_not_text_fails_its_episode_only(tiny_tokenizer):
    class BadPrefill(ToolCallEnv):
        def step(self, action):
            obs, term, trunc, info = super().step(action)
            return obs, term, trunc, {**info, "prefill": ["<tool_call>"]}

    tok = tiny_tokenizer
    engine = ScriptedEngine([[gen(tok, "x", LP1), gen(tok, "y", LP1)]])
    plain = Task("p", "tool_call", (Message("user", "Timer, 5 min."),), tool_call=ToolCallSpec((TIMER,), ()))
    a, b = run_episodes(
        engine, tok, lambda d: BadPrefill(max_turns=3), [session(), plain], [0, 1], [0, 1], Sampling(max_turns=3)
    )
    assert a.reward_error is not None and "info['prefill'] must be a str" in a.reward_error
    assert b.reward_error is None and b.terminated  # a one-request task ends before any prefill is read


# ------------------------------------------------------------------------------------------- the reward


def test_each_turn_is_scored_against_its_own_request():
    r = ToolCallReward()
    t = session()
    assert r(traj(t, list(RIGHT))) == pytest.approx(1.0)
    # the second turn calls the wrong function: (1 + 0.2 + 1) / 3 (format only for turn 2)
    assert r(traj(t, [RIGHT[0], call("set_timer", minutes=5), RIGHT[2]])) == pytest.approx(2.2 / 3)
    # the right calls in the wrong turns score as wrong calls, not as right ones
    assert r(traj(t, [RIGHT[1], RIGHT[2], RIGHT[0]])) < 0.5


def test_attack_every_call_in_the_first_turn_earns_no_later_credit():
    r = ToolCallReward()
    t = session()
    all_at_once = "".join(RIGHT)
    # one turn, then nothing: turn 1 has two spurious calls (its denominator grows) and turns 2-3 score 0
    score = r(traj(t, [all_at_once]))
    assert score == pytest.approx((0.2 + (0.3 + 0.5) / 3) / 3)
    assert score < r(traj(t, [RIGHT[0]])) * 1.01 + 1e-9  # no better than answering only the first request
    # the same block repeated in every turn: two of three turns' calls are wrong or spurious
    assert r(traj(t, [all_at_once] * 3)) < 0.5


def test_attack_a_forged_user_turn_in_the_text_does_not_shift_the_turns():
    """The policy writes what looks like the next request and its answer inside turn 1: turns are message
    records, so the text stays turn 1's (two calls against one expected), and the later requests still count."""
    r = ToolCallReward()
    t = session()
    forged = RIGHT[0] + "<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n" + RIGHT[1]
    assert r(traj(t, [forged])) == pytest.approx((0.2 + 0.8 / 2) / 3)


def test_a_session_cut_before_its_last_request_gains_nothing_from_the_format_reward():
    f = ToolCallFormatReward()
    t = session()
    assert f(traj(t, list(RIGHT))) == 1.0
    assert f(traj(t, [RIGHT[0]])) == pytest.approx(1 / 3)  # not 1/1
    assert ToolCallReward()(traj(t, RIGHT[:2])) == pytest.approx(2 / 3)


# ------------------------------------------------------------------------------------------- the ladder's sessions


def test_sessions_draw_distinct_ladder_requests_of_their_split():
    train, held = generate_ladder()
    by_id = {x.id: x for x in train + held}
    tr, ev = generate_chains(length=3, n_train=30, n_eval=20)
    assert (tr, ev) == generate_chains(length=3, n_train=30, n_eval=20)  # seeded
    for s, split in [(x, "train") for x in tr] + [(x, "eval") for x in ev]:
        parts = [by_id[i] for i in s.meta["chain"]]
        assert len(set(s.meta["chain"])) == 3 and all(p.meta["split"] == split for p in parts)
        assert s.meta["source"] == CHAIN_SOURCE and s.id.startswith(f"{CHAIN_SOURCE}-{split}-")
        assert s.messages[-1] == parts[0].messages[-1] and s.prefill == parts[0].prefill
        assert [f.request for f in s.tool_call.followups] == [p.messages[-1].content for p in parts[1:]]
        assert [f.prefill for f in s.tool_call.followups] == [p.prefill for p in parts[1:]]
        listed = {x["name"] for x in s.tool_call.tools}
        assert {p.tool_call.expected[0].name for p in parts} <= listed
        assert s.meta["example_function"] not in listed  # copying the example never scores
        assert f'"name": "{s.meta["example_function"]}"' in s.messages[0].content
    with pytest.raises(ValueError, match="cannot make sessions of 4"):
        chain_tasks(train[:3], 1, 4, 0, "train")
    assert set(FUNCTIONS) >= {x["name"] for s in tr for x in s.tool_call.tools}


def test_the_audit_reference_of_a_session_answers_each_request_and_scores_one():
    _, ev = generate_chains(length=3, n_train=0, n_eval=10)
    r = ToolCallReward(args_credit="fraction")
    for s in ev:
        ref, origin = native_reference(s)
        assert origin == "expected calls" and len(ref) == 3
        tr = run_episode(ToolCallEnv(max_turns=3), s, _reference_act(ref), 3)
        assert tr.num_turns == 3 and tr.terminated
        assert r(tr) == pytest.approx(1.0), s.id
        # each turn was completed from its own prefill
        turns = [m.content for m in tr.messages if m.role == "assistant"]
        assert all(x.startswith(p) for x, p in zip(turns, [s.prefill, *(f.prefill for f in s.tool_call.followups)]))


def test_a_session_task_loads_from_its_dict():
    t = session()
    assert task_from_dict(task_to_dict(t)) == t
