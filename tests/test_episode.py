"""rollout.episode.run_episodes with a scripted engine, a scripted multi-turn env and the tiny tokenizer.

The chat texts below are written out by hand from the ChatML template of ``embedded:tiny``
(``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, ``<|im_start|>assistant\\n`` as the
generation prompt); token ids are the tiny tokenizer's encoding of those literal texts.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from envs.toolcall import ToolCallEnv, format_tools_system_prompt
from envs.types import ExpectedCall, Generation, Message, Sampling, Task, ToolCallSpec
from rewards.toolcall import ToolCallReward
from rollout.episode import render, run_episodes

SYS = "You are terse."
PREFILL = "Answer:"
T1 = " get weather Paris"  # turn 1 of the policy (after the prefill)
T2 = "the weather is 20 celsius"  # turn 2
LP1, LP2 = -0.5, -0.25  # the engine's logprob of every token of turn 1 / turn 2

PROMPT_TEXT = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nweather in Paris<|im_end|>\n"
    "<|im_start|>assistant\n"
)
# What the template adds between the end of turn 1 (its EOS) and the start of turn 2.
ENV_TEXT = "\n<|im_start|>tool\nresult 1<|im_end|>\n<|im_start|>assistant\n"
# The final conversation rendered with add_generation_prompt=False.
FINAL_TEXT = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nweather in Paris<|im_end|>\n"
    "<|im_start|>assistant\nAnswer: get weather Paris<|im_end|>\n"
    "<|im_start|>tool\nresult 1<|im_end|>\n"
    "<|im_start|>assistant\nthe weather is 20 celsius<|im_end|>\n"
)


def enc(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def eos(tok) -> int:
    return tok.convert_tokens_to_ids("<|im_end|>")


def gen(tok, text: str, lp: float, finish: str = "stop") -> Generation:
    """The engine's output for ``text``: its tokens (+ EOS when it stopped), logprob ``lp`` each."""
    ids = enc(tok, text) + ([eos(tok)] if finish == "stop" else [])
    return Generation(token_ids=ids, logprobs=[lp] * len(ids), finish_reason=finish)


@dataclass
class ScriptedEngine:
    """Call k of generate() returns script[k] (one Generation per prompt); records the calls."""

    script: list[list[Generation]]
    calls: list[tuple[list[list[int]], Sampling, list[int] | None]] = field(default_factory=list)
    raise_on_call: int | None = None

    def generate(self, prompts, sampling, seeds=None, stops=None):
        k = len(self.calls)
        self.calls.append(([list(p) for p in prompts], sampling, list(seeds) if seeds is not None else None))
        if self.raise_on_call == k:
            raise RuntimeError("engine died")
        out = self.script[k]
        assert len(out) == len(prompts), f"call {k}: {len(prompts)} prompts, script has {len(out)}"
        return out


class ScriptedEnv:
    """Multi-turn: observation Message("tool", "result N") after turn N; terminates on turn
    ``task.meta["terminate_on"]`` (default 2) with no observation and info reward 0.5."""

    def __init__(self, registry: list):
        self.actions: list[str] = []
        self.closed = 0
        self.turn = 0
        self.terminate_on = 2
        registry.append(self)

    def reset(self, task):
        self.terminate_on = task.meta.get("terminate_on", 2)
        return list(task.messages)

    def step(self, action):
        self.turn += 1
        self.actions.append(action)
        if self.turn >= self.terminate_on:
            return [], True, False, {"reward": 0.5}
        return [Message("tool", f"result {self.turn}")], False, False, {}

    def close(self):
        self.closed += 1


def task(tid="t0", prefill=PREFILL, **meta) -> Task:
    return Task(
        id=tid,
        domain="scripted",
        messages=(Message("system", SYS), Message("user", "weather in Paris")),
        prefill=prefill,
        meta=dict(meta),
    )


def run(tok, engine, tasks, sampling, envs=None, seeds=None):
    envs = [] if envs is None else envs
    return run_episodes(
        engine,
        tok,
        lambda domain: ScriptedEnv(envs),
        tasks,
        list(range(len(tasks))),
        seeds or [3] * len(tasks),
        sampling,
    ), envs


# ------------------------------------------------------------------------- multi-turn tokens


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's own tokenizer and chat template, read from the embedded GGUF."""
    from transformers import AutoTokenizer

    from rl.trainer.hub import smollm2_gguf

    gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.fixture(params=["tiny", "smollm2"])
def chat_tokenizer(request):
    return request.getfixturevalue("tiny_tokenizer" if request.param == "tiny" else "smollm2_tokenizer")


def test_multi_turn_tokens_masks_and_conformance(chat_tokenizer):
    tok = chat_tokenizer
    # Episode 0 runs 2 turns; episode 1 terminates after turn 1 (so call 2 has one prompt only).
    engine = ScriptedEngine([[gen(tok, T1, LP1), gen(tok, " done", LP1)], [gen(tok, T2, LP2)]])
    trajs, envs = run(tok, engine, [task("t0"), task("t1", terminate_on=1)], Sampling(max_turns=3), seeds=[3, 4])
    t = trajs[0]

    prompt = enc(tok, PROMPT_TEXT + PREFILL)
    t1 = enc(tok, T1) + [eos(tok)]
    env = enc(tok, ENV_TEXT)
    t2 = enc(tok, T2) + [eos(tok)]
    assert eos(tok) == 2 and len(env) > 0

    assert t.prompt_ids == prompt
    assert t.response_ids == t1 + env + t2
    assert t.loss_mask == [1] * len(t1) + [0] * len(env) + [1] * len(t2)
    assert t.logprobs == [LP1] * len(t1) + [0.0] * len(env) + [LP2] * len(t2)
    assert t.num_policy_tokens == len(t1) + len(t2)

    # The engine continued turn 2 from the exact tokens so far, for the running episode only.
    assert engine.calls[0][0] == [prompt, prompt]
    assert engine.calls[1][0] == [prompt + t1 + env]
    assert len(engine.calls) == 2

    # The env saw the prefill on turn 1 only, and the decoded text without the EOS.
    assert envs[0].actions == ["Answer: get weather Paris", "the weather is 20 celsius"]
    assert t.messages == [
        Message("system", SYS),
        Message("user", "weather in Paris"),
        Message("assistant", "Answer: get weather Paris"),
        Message("tool", "result 1"),
        Message("assistant", "the weather is 20 celsius"),
    ]
    assert t.completion == "Answer: get weather Paris\nthe weather is 20 celsius"
    assert (t.terminated, t.truncated, t.finish_reason, t.num_turns, t.env_reward) == (True, False, "stop", 2, 0.5)
    assert (t.task.id, t.group_id) == ("t0", 0)

    # CONFORMANCE. The template renders the final conversation (add_generation_prompt=False) as
    # FINAL_TEXT. The episode's tokens stop at the last turn's EOS, while the template puts a
    # "\n" after every <|im_end|>, the last one included. So we check:
    #  (1) render(final messages) == FINAL_TEXT (the messages are what the tokens say);
    #  (2) decode(prompt_ids + response_ids), special tokens kept, == FINAL_TEXT minus its last "\n";
    #  (3) token level: encode(FINAL_TEXT) == prompt_ids + response_ids + encode("\n"), i.e. the
    #      episode's tokens are exactly the canonical tokenization of the conversation (holds here
    #      because every seam, prefill/turn, turn/EOS, EOS/env text, falls on a pre-token boundary).
    assert render(tok, t.messages, add_generation_prompt=False) == FINAL_TEXT
    assert tok.decode(t.prompt_ids + t.response_ids, skip_special_tokens=False) == FINAL_TEXT[:-1]
    assert enc(tok, FINAL_TEXT) == t.prompt_ids + t.response_ids + enc(tok, "\n")

    # Episode 1: one turn, terminated by the env.
    u = trajs[1]
    assert u.response_ids == enc(tok, " done") + [eos(tok)]
    assert u.loss_mask == [1] * len(u.response_ids)
    assert (u.terminated, u.truncated, u.finish_reason, u.num_turns) == (True, False, "stop", 1)
    assert envs[1].actions == ["Answer: done"]
    assert [e.closed for e in envs] == [1, 1]


def test_without_prefill(tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine([[gen(tok, "hello", LP1)]])
    (t,), envs = run(tok, engine, [task(prefill="", terminate_on=1)], Sampling(max_turns=1))
    assert t.cut_turns == 0  # ended at EOS
    assert t.prompt_ids == enc(tok, PROMPT_TEXT)
    assert envs[0].actions == ["hello"]
    assert tok.decode(t.prompt_ids + t.response_ids) == PROMPT_TEXT + "hello<|im_end|>"


# ------------------------------------------------------------------------- episode ends


def test_length_cut_final_turn_is_truncated(tiny_tokenizer):
    # The env ends the episode on a turn cut by max_new_tokens (no EOS): truncated, not terminated.
    tok = tiny_tokenizer
    engine = ScriptedEngine([[gen(tok, T1, LP1, finish="length")]])
    (t,), envs = run(tok, engine, [task(terminate_on=1)], Sampling(max_turns=3))
    assert (t.terminated, t.truncated, t.finish_reason, t.num_turns, t.cut_turns) == (False, True, "length", 1, 1)
    assert t.response_ids == enc(tok, T1)
    assert t.loss_mask == [1] * len(enc(tok, T1))
    assert len(engine.calls) == 1
    assert envs[0].closed == 1


def test_length_cut_turn_does_not_end_a_multi_turn_episode(tiny_tokenizer):
    # Turn 1 is cut (no EOS); the env goes on, so the template's closing <|im_end|> and the
    # observation come as env tokens (mask 0) and turn 2 runs.
    tok = tiny_tokenizer
    engine = ScriptedEngine([[gen(tok, T1, LP1, finish="length")], [gen(tok, T2, LP2)]])
    (t,), envs = run(tok, engine, [task(terminate_on=2)], Sampling(max_turns=3))
    t1, t2 = enc(tok, T1), enc(tok, T2) + [eos(tok)]
    env = [eos(tok)] + enc(tok, ENV_TEXT)
    assert t.response_ids == t1 + env + t2
    assert t.loss_mask == [1] * len(t1) + [0] * len(env) + [1] * len(t2)
    assert (t.terminated, t.truncated, t.finish_reason, t.num_turns) == (True, False, "stop", 2)
    # The episode ended well, but its first turn was cut: recorded (rewards.format.CutTurnPenalty reads it).
    assert t.cut_turns == 1
    assert envs[0].actions == ["Answer: get weather Paris", "the weather is 20 celsius"]


class FinalizingEnv(ScriptedEnv):
    """Scores itself in finalize() when the rollout ends the episode first."""

    finalized = 0

    def finalize(self):
        FinalizingEnv.finalized += 1
        return {"reward": 0.25}


def test_rollout_ending_calls_finalize(tiny_tokenizer):
    tok = tiny_tokenizer
    envs: list = []
    engine = ScriptedEngine([[gen(tok, T1, LP1)]])
    (t,) = run_episodes(
        engine, tok, lambda d: FinalizingEnv(envs), [task(terminate_on=5)], [0], [1], Sampling(max_turns=1)
    )
    assert (t.truncated, t.finish_reason, t.env_reward) == (True, "max_turns", 0.25)
    assert FinalizingEnv.finalized == 1 and envs[0].closed == 1


def test_max_turns_is_truncated(tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine([[gen(tok, T1, LP1)], [gen(tok, T2, LP2)]])
    (t,), _ = run(tok, engine, [task(terminate_on=5)], Sampling(max_turns=2))
    assert (t.terminated, t.truncated, t.finish_reason, t.num_turns) == (False, True, "max_turns", 2)
    t1, env, t2 = enc(tok, T1) + [eos(tok)], enc(tok, ENV_TEXT), enc(tok, T2) + [eos(tok)]
    # No env tokens after the last turn: the episode ends on the policy's EOS.
    assert t.response_ids == t1 + env + t2
    assert t.loss_mask == [1] * len(t1) + [0] * len(env) + [1] * len(t2)
    assert t.messages[-1] == Message("tool", "result 2")  # the env's last observation is kept as a message
    assert len(engine.calls) == 2


def test_env_terminated_on_first_turn(tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine([[gen(tok, T1, LP1)]])
    (t,), _ = run(tok, engine, [task(terminate_on=1)], Sampling(max_turns=4))
    assert (t.terminated, t.truncated, t.finish_reason, t.num_turns) == (True, False, "stop", 1)
    assert t.response_ids == enc(tok, T1) + [eos(tok)]


# ------------------------------------------------------------------------- env lifecycle


def test_envs_closed_when_engine_raises(tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine([[gen(tok, T1, LP1)] * 3], raise_on_call=1)  # dies on turn 2
    envs: list[ScriptedEnv] = []
    with pytest.raises(RuntimeError, match="engine died"):
        run(tok, engine, [task("a"), task("b"), task("c")], Sampling(max_turns=3), envs=envs)
    assert len(envs) == 3
    assert [e.closed for e in envs] == [1, 1, 1]


def test_envs_closed_when_engine_raises_on_first_call(tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine([], raise_on_call=0)
    envs: list[ScriptedEnv] = []
    with pytest.raises(RuntimeError, match="engine died"):
        run(tok, engine, [task("a"), task("b")], Sampling(max_turns=1), envs=envs)
    assert [e.closed for e in envs] == [1, 1]


def test_envs_closed_when_make_env_fails(tiny_tokenizer):
    tok = tiny_tokenizer
    envs: list[ScriptedEnv] = []

    def make_env(domain):
        if len(envs) == 2:
            raise OSError("no sandbox left")
        return ScriptedEnv(envs)

    with pytest.raises(OSError):
        run_episodes(
            ScriptedEngine([]), tok, make_env, [task("a"), task("b"), task("c")], [0, 1, 2], [0, 1, 2], Sampling()
        )
    assert [e.closed for e in envs] == [1, 1]


# ------------------------------------------------------------------------- the real tool-call env


class RecordingToolCallEnv(ToolCallEnv):
    def __init__(self, log: list):
        super().__init__()
        self.log = log
        self.closed = 0

    def step(self, action):
        self.log.append(action)
        return super().step(action)

    def close(self):
        self.closed += 1
        super().close()


def test_toolcall_env_single_turn_with_prefill(tiny_tokenizer):
    tok = tiny_tokenizer
    weather = {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    tc_task = Task(
        id="tc",
        domain="tool_call",
        messages=(Message("system", "tools"), Message("user", "weather in Paris")),
        prefill="<tool_call>",
        tool_call=ToolCallSpec(tools=(weather,), expected=(ExpectedCall("get_weather", {"city": ["Paris"]}),)),
    )
    body = '{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    engine = ScriptedEngine([[gen(tok, body, LP1)]])
    actions: list[str] = []
    made: list[RecordingToolCallEnv] = []

    def make_env(domain):
        assert domain == "tool_call"
        made.append(RecordingToolCallEnv(actions))
        return made[-1]

    (t,) = run_episodes(engine, tok, make_env, [tc_task], [0], [0], Sampling(max_turns=1))
    assert actions == ['<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>']
    assert actions[0].startswith(tc_task.prefill)
    # The prefill is part of the prompt, not of the policy's tokens. The tiny model's ChatML template
    # ignores tools=, and the system message does not list get_weather: the schemas are written after it.
    system = "tools\n\n" + format_tools_system_prompt([weather])
    assert t.prompt_ids == enc(
        tok,
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nweather in Paris<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>",
    )
    assert t.response_ids == enc(tok, body) + [eos(tok)]
    assert (t.terminated, t.truncated, t.finish_reason, t.num_turns) == (True, False, "stop", 1)
    assert t.completion == actions[0]
    # 0.2 (format) + 0.3 (name) + 0.5 (arguments) = 1.0
    assert ToolCallReward()(t) == pytest.approx(1.0)
    assert made[0].closed == 1


def test_max_model_len_stops_before_env_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    prompt, t1, env = enc(tok, PROMPT_TEXT + PREFILL), enc(tok, T1) + [eos(tok)], enc(tok, ENV_TEXT)
    # The next turn's prompt would be prompt + t1 + env; leave it no room (max_model_len = that length).
    limit = len(prompt) + len(t1) + len(env)
    engine = ScriptedEngine([[gen(tok, T1, LP1)]])
    (t,), envs = run(tok, engine, [task(terminate_on=2)], Sampling(max_turns=3, max_model_len=limit))
    assert (t.terminated, t.truncated, t.finish_reason, t.num_turns) == (False, True, "max_model_len", 1)
    assert t.response_ids == t1  # the observation's tokens are not appended
    assert len(engine.calls) == 1
    assert envs[0].closed == 1


def test_special_token_mid_turn_is_a_template_mismatch(tiny_tokenizer):
    tok = tiny_tokenizer
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    ids = enc(tok, " get") + [im_start] + enc(tok, "weather") + [eos(tok)]
    turn = Generation(token_ids=ids, logprobs=[LP1] * len(ids), finish_reason="stop")
    engine = ScriptedEngine([[turn], [gen(tok, T2, LP2)]])
    (t,), envs = run(tok, engine, [task(terminate_on=2)], Sampling(max_turns=3))
    # Either the episode stops as a template mismatch (what episode.py's guard is written for) ...
    if t.finish_reason == "template_mismatch":
        assert t.truncated and not t.terminated and t.response_ids == ids
        return
    # ... or, if it continues, its tokens must still spell the conversation the env saw.
    final = render(tok, t.messages, add_generation_prompt=False)
    assert tok.decode(t.prompt_ids + t.response_ids, skip_special_tokens=False) == final[:-1]


# ------------------------------------------------------------------------- env calls on threads


class SlowEnv(ScriptedEnv):
    """ScriptedEnv whose reset/step/finalize each take ``delay`` seconds; records how many env calls
    were in flight at once and whether an env was closed while one of its calls ran."""

    lock = threading.Lock()
    inflight = 0
    peak = 0
    closed_while_busy = 0

    def __init__(self, registry: list, delay: float = 0.15, fail_on: str = ""):
        super().__init__(registry)
        self.delay, self.fail_on, self.busy = delay, fail_on, False
        self.finalized = 0

    def _call(self, fn, *args):
        cls = SlowEnv
        with cls.lock:
            cls.inflight += 1
            cls.peak = max(cls.peak, cls.inflight)
        self.busy = True
        try:
            time.sleep(self.delay)
            return fn(*args)
        finally:
            self.busy = False
            with cls.lock:
                cls.inflight -= 1

    def reset(self, task):
        return self._call(super().reset, task)

    def step(self, action):
        if self.fail_on and self.fail_on in action:
            raise RuntimeError("sandbox broke")
        return self._call(super().step, action)

    def finalize(self):
        self.finalized += 1
        return self._call(lambda: {"reward": 0.75})

    def close(self):
        SlowEnv.closed_while_busy += self.busy
        super().close()


@pytest.fixture
def slow_env():
    SlowEnv.inflight = SlowEnv.peak = SlowEnv.closed_while_busy = 0
    return SlowEnv


def _slow_run(tok, n, workers, max_turns=2, fail_on=""):
    envs: list[SlowEnv] = []
    turns = [[gen(tok, T1, LP1)] * n, [gen(tok, T2, LP2)] * n]
    engine = ScriptedEngine(turns[:max_turns])
    t0 = time.perf_counter()
    trajs = run_episodes(
        engine,
        tok,
        lambda d: SlowEnv(envs, fail_on=fail_on),
        [task(f"t{i}", terminate_on=5) for i in range(n)],
        list(range(n)),
        list(range(n)),
        Sampling(max_turns=max_turns),
        env_workers=workers,
    )
    return trajs, envs, time.perf_counter() - t0


def test_env_calls_of_different_episodes_run_at_once_with_the_same_trajectories(tiny_tokenizer, slow_env):
    """6 episodes x (reset, 2 steps, finalize at max_turns) of 0.15 s each: 3.6 s one at a time, ~0.6 s on
    6 threads; the trajectories are the same either way."""
    tok = tiny_tokenizer
    serial, envs1, t_serial = _slow_run(tok, 6, workers=1)
    assert slow_env.peak == 1 and t_serial >= 6 * 4 * 0.15
    slow_env.peak = 0
    threaded, envs6, t_threaded = _slow_run(tok, 6, workers=6)
    assert slow_env.peak >= 4, "the episodes' env calls were in flight together (6 at once when nothing else runs)"
    assert t_threaded < t_serial / 2
    assert threaded == serial
    assert [t.env_reward for t in threaded] == [0.75] * 6 and all(t.finish_reason == "max_turns" for t in threaded)
    assert all(
        e.finalized == 1 and e.closed == 1 and e.actions == ["Answer: get weather Paris", T2.strip()] for e in envs6
    )
    assert slow_env.closed_while_busy == 0


def test_an_env_call_that_raises_ends_its_episode_only_as_a_harness_failure(tiny_tokenizer, slow_env):
    """Episode 1's step raises: it ends there with a recorded harness failure (no exception out of the
    rollout); episodes 0 and 2 run their second turn and are finalized; every env is closed, none while busy."""
    tok = tiny_tokenizer
    envs: list[SlowEnv] = []
    engine = ScriptedEngine(
        [[gen(tok, T1, LP1), gen(tok, " boom", LP1), gen(tok, T1, LP1)], [gen(tok, T2, LP2), gen(tok, T2, LP2)]]
    )
    trajs = run_episodes(
        engine,
        tok,
        lambda d: SlowEnv(envs, fail_on="boom"),
        [task(f"t{i}", terminate_on=5) for i in range(3)],
        [0, 1, 2],
        [0, 1, 2],
        Sampling(max_turns=2),
        env_workers=3,
    )
    assert [e.closed for e in envs] == [1, 1, 1]
    assert slow_env.closed_while_busy == 0, "no env was closed while another thread was inside it"
    assert [len(e.actions) for e in envs] == [2, 0, 2], "the other episodes ran on to their end"
    ok0, bad, ok2 = trajs
    assert bad.reward_error == "harness: scripted env step raised RuntimeError: sandbox broke"
    assert bad.sandbox_events == ["harness_error"] and bad.finish_reason == "harness_error"
    assert not bad.terminated and not bad.truncated and bad.num_turns == 1
    assert all(t.reward_error is None and t.env_reward == 0.75 and t.num_turns == 2 for t in (ok0, ok2))


def test_rollout_worker_takes_env_workers_from_the_recipe(tiny_model_path, monkeypatch):
    """``rollout.env_workers`` reaches ``run_episodes``; 0 means one thread per CPU the worker may use."""
    import os

    import rollout.pool as pool
    from rl.config.recipe import RecipeError, load_recipe

    seen = {}
    monkeypatch.setattr(pool, "run_episodes", lambda *a, **kw: seen.update(kw) or [])
    w = pool.RolloutWorker(tiny_model_path, [], engine=object())
    assert w.env_workers == pool.usable_cpus() == len(os.sched_getaffinity(0))
    w = pool.RolloutWorker(tiny_model_path, [], engine=object(), env_workers=3)
    w.generate([], [], [], Sampling())
    assert seen["env_workers"] == 3
    recipes = Path(__file__).resolve().parents[1] / "recipes"
    assert load_recipe(recipes / "quickstart.yaml", ["rollout.env_workers=1"]).rollout.env_workers == 1
    with pytest.raises(RecipeError, match="rollout.env_workers"):
        load_recipe(recipes / "quickstart.yaml", ["rollout.env_workers=-1"])


def test_real_sandboxed_envs_on_threads_score_as_one_at_a_time(tiny_tokenizer):
    """Terminal and code ladder tasks (bubblewrap sandboxes: setup, command, check; unit tests), half
    answered with the reference solution and half wrongly: the same observations and env verdicts on
    4 threads as one at a time."""
    from envs.base import resolve
    from envs.io import load_tasks
    from rewards.code import CodeTestsReward

    tok = tiny_tokenizer
    data = Path(__file__).resolve().parents[1] / "recipes" / "data"
    tasks = load_tasks(data / "terminal_ladder.eval.jsonl")[:4] + load_tasks(data / "code_ladder.eval.jsonl")[:4]

    def answer(t: Task, i: int) -> str:
        """The reference solution (even i) or a wrong one (odd i), after the task's prefill."""
        if i % 2:
            return " --help\n```" if t.domain == "terminal" else "    return None\n```"
        full = f"```bash\n{t.terminal.solution}\n```" if t.domain == "terminal" else f"```python\n{t.code.solution}```"
        assert full.startswith(t.prefill), t.id
        return full[len(t.prefill) :]

    envs = {
        "terminal": ("envs.terminal.TerminalEnv", {"max_turns": 1}),
        "code": ("envs.code.CodeEnv", {"max_turns": 1}),
    }

    def episodes(workers: int):
        engine = ScriptedEngine([[gen(tok, answer(t, i), LP1) for i, t in enumerate(tasks)]])
        n = len(tasks)
        return run_episodes(
            engine,
            tok,
            lambda d: resolve(envs[d][0])(**envs[d][1]),
            tasks,
            list(range(n)),
            list(range(n)),
            Sampling(max_turns=1),
            env_workers=workers,
        )

    serial, threaded = episodes(1), episodes(4)
    assert [t.env_reward for t in serial] == [t.env_reward for t in threaded]
    assert [t.messages for t in serial] == [t.messages for t in threaded]
    assert [t.env_reward for t in threaded[:4]] == [1.0, 0.0, 1.0, 0.0], "terminal verdicts"
    assert [CodeTestsReward()(t) for t in threaded[4:]] == [1.0, 0.0, 1.0, 0.0], "code verdicts"


# ------------------------------------------------------------------------- streamed episodes


class StreamingEngine:
    """A streaming engine (``submit``/``poll``/``abort``) whose reply to a request depends on its turn
    only (``seed % 7919``: run_episodes seeds turn k of an episode with seed ``s * 7919 + k``); the
    reply to turn k of episode ``key`` is ready ``latency(key, k)`` polls after its submission.
    ``generate`` answers the same replies at once, so the same engine can run either way."""

    def __init__(self, replies, latency=lambda key, turn: 1, fail_on_poll: int | None = None, poll_s: float = 0.0):
        self.replies, self.latency, self.fail_on_poll, self.poll_s = replies, latency, fail_on_poll, poll_s
        self.clock = 0
        self.pending: dict[int, tuple[int, Generation]] = {}  # key -> (ready at, reply)
        self.log: list[tuple] = []  # ("submit" | "done", key, turn, clock)
        self.aborted: list[int] = []

    def generate(self, prompts, sampling, seeds=None, stops=None):
        return [self.replies[s % 7919] for s in seeds]

    def submit(self, key, prompt, sampling, seed, stop):
        assert key not in self.pending, "one request per episode at a time"
        turn = seed % 7919
        self.pending[key] = (self.clock + self.latency(key, turn), self.replies[turn])
        self.log.append(("submit", key, turn, self.clock))

    def poll(self):
        time.sleep(self.poll_s)
        self.clock += 1
        if self.clock == self.fail_on_poll:
            raise RuntimeError("engine core died")
        done = [(k, g) for k, (at, g) in sorted(self.pending.items()) if at <= self.clock]
        for k, _ in done:
            del self.pending[k]
            self.log.append(("done", k, None, self.clock))
        return done

    def abort(self):
        self.aborted += list(self.pending)
        self.pending.clear()


class TurnsOnly:
    def __init__(self, engine):
        self.generate = engine.generate


def _streams(tok, engine, n_turns, workers=1, env=ScriptedEnv, **env_kw):
    envs: list = []
    trajs = run_episodes(
        engine,
        tok,
        lambda d: env(envs, **env_kw),
        [task(f"t{i}", terminate_on=k) for i, k in enumerate(n_turns)],
        list(range(len(n_turns))),
        [3 + i for i in range(len(n_turns))],
        Sampling(max_turns=3),
        env_workers=workers,
    )
    return trajs, envs


@pytest.mark.parametrize("workers", [1, 3])
def test_streamed_episodes_are_the_episodes_run_in_turns(tiny_tokenizer, workers):
    """Episodes of 1, 2, 3 turns and one the rollout ends at max_turns: the same trajectories and env
    calls streamed as turn by turn; every request of an episode is its own turn, seeded by its turn."""
    tok = tiny_tokenizer
    replies = [gen(tok, T1, LP1), gen(tok, T2, LP2), gen(tok, " more", LP2)]
    lat = {0: 3, 1: 1, 2: 5, 3: 2}
    engine = StreamingEngine(replies, latency=lambda key, turn: lat[key] + turn)
    streamed, envs_s = _streams(tok, engine, [1, 2, 3, 5], workers)
    in_turns, envs_t = _streams(tok, TurnsOnly(engine), [1, 2, 3, 5], workers)
    assert streamed == in_turns
    assert [e.actions for e in envs_s] == [e.actions for e in envs_t]
    assert [t.num_turns for t in streamed] == [1, 2, 3, 3]
    assert streamed[3].finish_reason == "max_turns" and streamed[3].truncated
    submits = [(k, turn) for kind, k, turn, _ in engine.log if kind == "submit"]
    assert sorted(submits) == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2)]
    assert not engine.pending and not engine.aborted and [e.closed for e in envs_s] == [1, 1, 1, 1]


def test_a_streamed_episode_moves_on_while_another_is_still_generating(tiny_tokenizer):
    """Episode 1's first turn takes 20 polls; episode 0 runs its three turns (1 poll each) in the meantime."""
    tok = tiny_tokenizer
    replies = [gen(tok, T1, LP1), gen(tok, T2, LP2), gen(tok, " more", LP2)]
    engine = StreamingEngine(replies, latency=lambda key, turn: 20 if key == 1 else 1)
    trajs, envs = _streams(tok, engine, [3, 1])
    ep0_done = [clock for kind, k, _, clock in engine.log if kind == "done" and k == 0]
    ep1_done = [clock for kind, k, _, clock in engine.log if kind == "done" and k == 1]
    assert len(ep0_done) == 3 and ep1_done == [20] and max(ep0_done) < 20
    assert engine.clock == 20, "the whole rollout took as long as its longest turn, not the sum of turns"
    assert [t.num_turns for t in trajs] == [3, 1]


def test_a_streamed_env_error_ends_its_episode_only_while_the_others_go_on(tiny_tokenizer, slow_env):
    """Episode 0 fails in its second turn's env step while episode 1 is still generating and episode 2 is in
    its env: no request is dropped, the others go on; episode 1 (then 2) fails the same way later."""
    tok = tiny_tokenizer
    replies = [gen(tok, T1, LP1), gen(tok, " boom", LP2), gen(tok, T2, LP2)]
    lat = {0: 1, 1: 50, 2: 1}  # polls of 10 ms: episode 1's first turn takes 0.5 s, the others' env calls 0.15 s
    engine = StreamingEngine(replies, latency=lambda key, turn: lat[key], poll_s=0.01)
    trajs, envs = _streams(tok, engine, [5, 5, 5], workers=3, env=SlowEnv, fail_on="boom")
    assert not engine.aborted and not engine.pending
    assert slow_env.closed_while_busy == 0, "no env was closed while another thread was inside it"
    assert [e.closed for e in envs] == [1, 1, 1]
    assert all(t.num_turns == 2 and "raised RuntimeError: sandbox broke" in t.reward_error for t in trajs)


def test_a_streamed_engine_error_closes_every_env(tiny_tokenizer, slow_env):
    tok = tiny_tokenizer
    engine = StreamingEngine([gen(tok, T1, LP1)] * 3, latency=lambda key, turn: 2, fail_on_poll=3)
    with pytest.raises(RuntimeError, match="engine core died"):
        _streams(tok, engine, [5, 5], workers=2, env=SlowEnv)
    assert not engine.pending and slow_env.closed_while_busy == 0
