"""The simulated tool latency of the async bench's workload (envs/toolcall_latency.py, ToolCallEnv.tool_latency)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from envs.toolcall import ToolCallEnv
from envs.toolcall_latency import ToolLatency
from envs.types import Generation, Message, Sampling, Task, ToolCallSpec

CALL = '<tool_call>{"name": "set_timer", "arguments": {"minutes": 3}}</tool_call>'


def _task(mode: str = "calls", tid: str = "t0") -> Task:
    tools = [{"name": "set_timer", "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}}}]
    return Task(
        id=tid,
        domain="tool_call",
        messages=[Message("user", "Set a timer for 3 minutes.")],
        tool_call=ToolCallSpec(tools=tuple(tools), expected=(), mode=mode),
    )


def test_draws_are_lognormal_with_the_median_and_capped():
    lat = ToolLatency(median_s=0.5, sigma=1.0, cap_s=20.0, seed=0)
    xs = [lat.draw("task", s, 1, 0) for s in range(4000)]
    assert abs(statistics.median(xs) - 0.5) < 0.05
    assert max(xs) <= 20.0 and min(xs) > 0
    assert sum(x > 5.0 for x in xs) > 0  # the long tail (P(z > ln 10) ~ 1 %)
    assert lat.draw("task", 7, 2, 1) == lat.draw("task", 7, 2, 1)
    capped = ToolLatency(median_s=0.5, sigma=3.0, cap_s=2.0)
    assert max(capped.draw("task", s, 1, 0) for s in range(2000)) == 2.0


def test_draws_depend_on_every_part_of_the_key():
    lat = ToolLatency()
    base = lat.draw("a", 1, 1, 0)
    others = [lat.draw("b", 1, 1, 0), lat.draw("a", 2, 1, 0), lat.draw("a", 1, 2, 0), lat.draw("a", 1, 1, 1)]
    others.append(ToolLatency(seed=1).draw("a", 1, 1, 0))
    assert all(x != base for x in others)
    assert ToolLatency(sigma=0.0).draw("a", 1, 1, 0) == 0.5


@pytest.mark.parametrize(
    "option, words",
    [
        ({"median": 0.5}, "unknown key(s) ['median']"),
        ({"sigma": -1}, "tool_latency.sigma"),
        ({"median_s": 5, "cap_s": 1}, "above tool_latency.cap_s"),
        ({"seed": 1.5}, "tool_latency.seed"),
        ({"cap_s": float("inf")}, "tool_latency.cap_s"),
        ([0.5], "must be a mapping"),
    ],
)
def test_a_bad_option_names_its_key(option, words):
    with pytest.raises(ValueError) as exc:
        ToolCallEnv(tool_latency=option)
    assert words in str(exc.value)


def _slept(env: ToolCallEnv) -> list[float]:
    out: list[float] = []
    env._sleep = out.append
    return out


def test_the_env_sleeps_the_draw_of_its_episode_and_turn():
    opt = {"median_s": 0.5, "sigma": 1.0, "cap_s": 20.0, "seed": 3}
    env = ToolCallEnv(tool_latency=opt)
    slept = _slept(env)
    env.seed_episode(42)
    env.reset(_task())
    *_, info = env.step(CALL + CALL)
    want = ToolLatency(**opt)
    assert slept == [pytest.approx(want.draw("t0", 42, 1, 0) + want.draw("t0", 42, 1, 1))]
    assert info["tool_latency_s"] == pytest.approx(slept[0])
    # answer mode: turn 2 of the same episode draws turn 2's time; a final answer sleeps nothing
    env = ToolCallEnv(max_turns=3, tool_latency=opt)
    slept = _slept(env)
    env.seed_episode(42)
    env.reset(_task("answer"))
    env.step(CALL)
    env.step(CALL)
    *_, info = env.step("It is set.")
    assert slept == [pytest.approx(want.draw("t0", 42, 1, 0)), pytest.approx(want.draw("t0", 42, 2, 0))]
    assert "tool_latency_s" not in info


def test_without_the_option_nothing_sleeps():
    env = ToolCallEnv(max_turns=2)
    slept = _slept(env)
    env.reset(_task("answer"))
    *_, info = env.step(CALL)
    assert slept == [] and "tool_latency_s" not in info


def test_a_bad_tool_latency_fails_at_validate_time_naming_its_key(tmp_path, capsys):
    from rl.cli.main import main

    envs = "rollout.envs=[{domain: tool_call, kwargs: {max_turns: 3, tool_latency: {median_s: 0.5, %s}}}]"
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml"
    base = ["validate", str(recipe), f"run.output_dir={tmp_path / 'run'}"]
    assert main([*base, envs % "sigma: -1"]) == 2
    err = capsys.readouterr().err
    assert "rollout.envs.0.kwargs.tool_latency: sigma must be a finite number >= 0, got -1" in err
    assert main([*base, envs % "sigma: 1.0"]) == 0


class _CallingEngine:
    """Every prompt gets the same tool call (tokens of ``CALL``)."""

    def __init__(self, tok):
        self.ids = list(tok(CALL, add_special_tokens=False)["input_ids"])

    def generate(self, prompts, sampling, seeds=None, stops=None):
        return [Generation(token_ids=self.ids, logprobs=[-0.1] * len(self.ids), finish_reason="stop") for _ in prompts]


def test_the_episode_loop_keys_the_latency_by_each_episode_seed(tiny_tokenizer):
    """rollout.episode tells each env its episode's seed before reset: the two samples of one task draw their
    own latencies, and the same seeds draw the same ones again."""
    from rollout.episode import run_episodes

    opt = {"median_s": 0.5, "sigma": 1.0, "cap_s": 20.0, "seed": 0}

    def once() -> list[float]:
        envs: list[ToolCallEnv] = []
        slept: list[list[float]] = []

        def make(domain):
            env = ToolCallEnv(tool_latency=opt)
            slept.append(_slept(env))
            envs.append(env)
            return env

        engine = _CallingEngine(tiny_tokenizer)
        trajs = run_episodes(engine, tiny_tokenizer, make, [_task()] * 2, [0, 0], [11, 12], Sampling())
        assert [t.reward_error for t in trajs] == [None, None] and [t.terminated for t in trajs] == [True, True]
        assert [e._episode_seed for e in envs] == [11, 12]
        return [x for per_env in slept for x in per_env]

    first = once()
    want = ToolLatency(**opt)
    assert first == [pytest.approx(want.draw("t0", 11, 1, 0)), pytest.approx(want.draw("t0", 12, 1, 0))]
    assert once() == first


class _StreamingEngine:
    """A streaming engine (``submit``/``poll``/``abort``): turn 1 of every episode is ``CALL``, turn 2 a plain answer;
    each request is ready at the next poll. Logs ``(key, turn, time)`` of each submission."""

    def __init__(self, tok):
        self.call = list(tok(CALL, add_special_tokens=False)["input_ids"])
        self.answer = list(tok("It is set.", add_special_tokens=False)["input_ids"])
        self.pending: dict[int, list[int]] = {}
        self.log: list[tuple[int, int, float]] = []

    def submit(self, key, prompt, sampling, seed, stop, offset=0):
        turn = seed % 7919
        self.log.append((key, turn, time.monotonic()))
        self.pending[key] = self.call if turn == 0 else self.answer

    def poll(self):
        time.sleep(0.01)
        done, self.pending = list(self.pending.items()), {}
        return [(k, Generation(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop")) for k, ids in done]

    def abort(self):
        self.pending.clear()

    def generate(self, prompts, sampling, seeds=None, stops=None):
        raise AssertionError("a streaming engine is driven through submit/poll")


def test_a_tool_sleep_does_not_hold_the_other_episodes(tiny_tokenizer):
    """Episode 0's tool call sleeps 1 s on an env thread; episode 1's next turn goes to the engine meanwhile."""
    from rollout.episode import run_episodes

    returned: dict[int, float] = {}

    def make(domain):
        env = ToolCallEnv(max_turns=2, tool_latency={"median_s": 0.5})
        me = len(returned)
        returned[me] = 0.0

        def sleep(s: float) -> None:
            time.sleep(1.0 if me == 0 else 0.0)
            returned[me] = time.monotonic()

        env._sleep = sleep
        return env

    engine = _StreamingEngine(tiny_tokenizer)
    tasks = [_task("answer", "slow"), _task("answer", "fast")]
    trajs = run_episodes(engine, tiny_tokenizer, make, tasks, [0, 1], [5, 6], Sampling(max_turns=2), env_workers=2)
    assert [t.num_turns for t in trajs] == [2, 2] and all(t.reward_error is None for t in trajs)
    second_turn = {key: at for key, turn, at in engine.log if turn == 1}
    assert second_turn[1] < returned[0]  # episode 1 generated its 2nd turn while episode 0's tool still slept
    assert second_turn[0] >= returned[0]
