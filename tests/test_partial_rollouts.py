"""Partial rollouts (``rollout.partial``) on the in-process HF engine and the tiny model: generations interrupted at
a weight update keep their tokens and resume on the new weights; every token records its policy version.

Why a resumed request equals the uninterrupted one under unchanged weights: greedy picks depend on the logits
only, and the resumed prefill of prompt + kept tokens gives the logits the token-by-token pass gave, up to float32
rounding; sampled picks also need the same random draws, which the HF engine reproduces by skipping the kept
tokens' draws (one exponential per vocabulary entry each). The interrupt lands at a chosen token through
``TripGate``, a gate that closes itself on its n-th check after being armed (the check an interrupt from another
thread would answer), so the tests do not depend on thread timing.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from envs.types import Generation, Message, Sampling, Task, Trajectory
from rollout.episode import run_episodes
from rollout.hf_engine import HFEngine
from rollout.partial import INTERRUPTED, PauseGate, joined, resume_seed

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


class TripGate(PauseGate):
    """Closes itself on its ``n``-th ``requested`` check once ``arm(n)`` has been called, and sets ``tripped``."""

    def __init__(self) -> None:
        super().__init__()
        self.left = 0
        self.tripped = threading.Event()

    def arm(self, n: int) -> None:
        self.tripped.clear()
        self.left = n

    @property
    def requested(self) -> bool:
        if self.left > 0:
            self.left -= 1
            if self.left == 0:
                with self._cond:
                    self._closed = True
                self.tripped.set()
        return self._closed


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    e = HFEngine(tiny_model_path, dtype="float32")
    e.gate = TripGate()
    return e


def _interrupted(engine, prompt, sampling, seed, k):
    """The request stopped after ``k`` tokens (the gate trips at its (k+1)-th check), the gate opened again."""
    engine.gate.arm(k + 1)
    g = engine.generate([prompt], sampling, seeds=[seed])[0]
    engine.gate.resume()
    engine.gate.tripped.clear()
    return g


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.8, 0.9)])
@pytest.mark.parametrize("k", [0, 1, 5])
def test_a_resumed_request_samples_what_the_uninterrupted_one_did(engine, temperature, top_p, k) -> None:
    """Same weights: kept tokens + continuation == the uninterrupted completion (ids exactly, log-probs to float32
    rounding); the continuation's budget is ``max_new_tokens`` minus the kept tokens."""
    s = Sampling(max_new_tokens=14, temperature=temperature, top_p=top_p, max_model_len=256)
    prompt, seed = [5, 9, 2, 7], 1234
    whole = engine.generate([prompt], s, seeds=[seed])[0]
    assert len(whole.token_ids) > k + 1, "the uninterrupted completion runs past the interrupt"
    part = _interrupted(engine, prompt, s, seed, k)
    assert part.finish_reason == INTERRUPTED
    assert part.token_ids == whole.token_ids[:k]
    rest = engine.generate([prompt + part.token_ids], replace(s, max_new_tokens=14 - k), seeds=[seed], offsets=[k])[0]
    assert len(rest.token_ids) <= 14 - k, "the remaining budget is respected"
    joint = joined(part, rest)
    assert joint.token_ids == whole.token_ids
    assert joint.logprobs == pytest.approx(whole.logprobs, abs=1e-4)
    assert joint.finish_reason == whole.finish_reason


def test_a_stop_string_across_the_interrupt_still_ends_the_turn(engine, tiny_tokenizer) -> None:
    """A stop string made of completion tokens 4 and 5, the request interrupted after token 4: the resumed request
    matches the stop string on the kept tokens' text and its own together, and stops after one token."""
    s = Sampling(max_new_tokens=20, temperature=0.0, max_model_len=256)
    prompt = [5, 9, 2, 7]
    free = engine.generate([prompt], s, seeds=[0])[0].token_ids
    dec = tiny_tokenizer.decode
    stop = dec(free[:5])[len(dec(free[:3])) :]
    assert stop and stop not in dec(free[:4]), "the stop string first completes at token 5"
    whole = engine.generate([prompt], s, seeds=[0], stops=[[stop]])[0]
    assert whole.token_ids == free[:5] and whole.finish_reason == "stop"
    part = _interrupted(engine, prompt, s, 0, 4)
    rest = engine.generate([prompt + part.token_ids], replace(s, max_new_tokens=16), [0], [[stop]], offsets=[4])[0]
    assert rest.token_ids == free[4:5] and rest.finish_reason == "stop"
    assert joined(part, rest).logprobs == pytest.approx(whole.logprobs, abs=1e-4)


def test_every_token_records_the_version_of_the_weights_that_sampled_it(engine, tmp_path: Path) -> None:
    """Interrupted at token 4, new weights loaded (version 0 -> 1): the kept tokens are version 0, the continuation
    version 1 and exactly what the new weights sample from prompt + kept tokens."""
    s = Sampling(max_new_tokens=12, temperature=0.0, max_model_len=256)
    prompt = [5, 9, 2, 7]
    engine.gate.set_version(0)
    part = _interrupted(engine, prompt, s, 0, 4)
    assert part.versions == [0] * 4
    old = _perturbed_weights(engine, tmp_path)
    try:
        assert engine.gate.version == 1, "a weight load is one version more"
        rest = engine.generate([prompt + part.token_ids], replace(s, max_new_tokens=8), seeds=[0], offsets=[4])[0]
        fresh = engine.generate([prompt + part.token_ids], replace(s, max_new_tokens=8), seeds=[0])[0]
        assert rest.token_ids == fresh.token_ids and rest.versions == [1] * len(rest.token_ids)
        assert joined(part, rest).versions == [0] * 4 + [1] * len(rest.token_ids)
    finally:
        engine.load_weights(old)
        engine.gate.set_version(0)


def _perturbed_weights(engine, tmp_path: Path) -> str:
    """Load noisy weights into ``engine``; returns a file of its weights before (to restore)."""
    old, new = _weight_files(engine, tmp_path)
    engine.load_weights(new)
    return old


def _weight_files(engine, tmp_path: Path) -> tuple[str, str]:
    """Files of ``engine``'s weights now and of the same weights plus noise."""
    from safetensors.torch import save_file

    sd = {k: v.detach().clone().contiguous() for k, v in engine.model.state_dict().items()}
    old = str(tmp_path / "old.safetensors")
    save_file(sd, old)
    g = torch.Generator().manual_seed(0)
    noisy = {k: v + 0.5 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in sd.items()}
    new = str(tmp_path / "new.safetensors")
    save_file(noisy, new)
    return old, new


# ------------------------------------------------------------------------- episodes


class TalkEnv:
    """Answers every turn with a tool message and ends the episode after turn 3. ``on_step(turn)``: a hook."""

    def __init__(self, on_step=None):
        self.turn, self.actions, self.on_step = 0, [], on_step

    def reset(self, task):
        return list(task.messages)

    def step(self, action):
        self.turn += 1
        self.actions.append(action)
        if self.on_step is not None:
            self.on_step(self.turn)
        if self.turn >= 3:
            return [], True, False, {"reward": 1.0}
        return [Message("tool", f"ok {self.turn}")], False, False, {}

    def close(self):
        pass


TASKS = [Task(id=f"t{i}", domain="talk", messages=(Message("user", f"say {i}"),)) for i in range(2)]
S = Sampling(max_new_tokens=10, temperature=0.0, max_turns=3, max_model_len=512)


def _episodes(engine, tok, on_step=None, sampling=S) -> tuple[list[Trajectory], list[TalkEnv]]:
    envs: list[TalkEnv] = []

    def make(domain):
        envs.append(TalkEnv(on_step))
        return envs[-1]

    trajs = run_episodes(engine, tok, make, TASKS, [0, 1], [11, 12], sampling)
    return trajs, envs


def _in_thread(fn):
    """Run ``fn`` on a thread; returns a function that joins it and gives its result (or raises its error)."""
    box: dict = {}

    def run():
        try:
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["err"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def result():
        t.join(timeout=120)
        assert not t.is_alive(), "the episodes did not finish"
        if "err" in box:
            raise box["err"]
        return box["out"]

    return result


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_multi_turn_episodes_interrupted_mid_turn_resume_as_if_never_stopped(
    engine, tiny_tokenizer, temperature
) -> None:
    """Episodes stopped in their second turn (another thread interrupts, keeps the weights, resumes as version 7)
    end with the trajectories and env actions of uninterrupted episodes; only the versions tell: version 0 up to the
    interrupt, 7 after it, -1 on env tokens."""
    s = replace(S, temperature=temperature)
    engine.gate.set_version(0)
    plain, plain_envs = _episodes(engine, tiny_tokenizer, sampling=s)
    assert all(t.num_turns >= 2 for t in plain), [t.finish_reason for t in plain]

    armed: list[int] = []

    def arm(turn: int) -> None:
        if turn == 1 and not armed:  # trips on the engine's 4th check of turn 2: episode 0 after 3 tokens of it
            armed.append(turn)
            engine.gate.arm(4)

    engine.gate.tripped.clear()
    done = _in_thread(lambda: _episodes(engine, tiny_tokenizer, on_step=arm, sampling=s))
    assert engine.gate.tripped.wait(60), "the interrupt never came"
    engine.gate.interrupt(timeout_s=60)  # already closed by the trip: waits until the engine stopped
    engine.gate.resume(version=7)
    trajs, envs = done()
    for t, p in zip(trajs, plain):
        assert t.response_ids == p.response_ids and t.loss_mask == p.loss_mask
        assert t.logprobs == pytest.approx(p.logprobs, abs=1e-4)
        assert (t.finish_reason, t.num_turns, t.messages) == (p.finish_reason, p.num_turns, p.messages)
        assert len(t.token_versions) == len(t.response_ids)
        assert all((v == -1) == (m == 0) for v, m in zip(t.token_versions, t.loss_mask)), "env tokens: -1"
        assert p.token_versions == [0 if m else -1 for m in p.loss_mask]
    assert [e.actions for e in envs] == [e.actions for e in plain_envs]
    versions = [v for t in trajs for v in t.token_versions if v >= 0]
    assert 0 in versions and 7 in versions, "tokens before and after the interrupt"
    assert min(t.oldest_version for t in trajs) == 0 and max(t.newest_version for t in trajs) == 7
    engine.gate.set_version(0)


def test_an_episode_between_turns_keeps_its_env_call_and_continues_on_the_new_weights(
    engine, tiny_tokenizer, tmp_path: Path
) -> None:
    """Interrupted while its env call runs (the engine is idle): the interrupt returns at once, the env call
    finishes, and the next turn is sampled by the new weights (version 1), the first turn's tokens stay version 0."""
    engine.gate.set_version(0)
    in_env, release = threading.Event(), threading.Event()

    def hold(turn: int) -> None:
        if turn == 1 and not in_env.is_set():
            in_env.set()
            assert release.wait(60)

    one = [TASKS[0]]

    def go():
        envs: list[TalkEnv] = []
        return run_episodes(engine, tiny_tokenizer, lambda d: envs.append(TalkEnv(hold)) or envs[-1], one, [0], [11], S)

    done = _in_thread(go)
    assert in_env.wait(60)
    engine.gate.interrupt(timeout_s=5)  # nothing is generating: returns at once
    old = _perturbed_weights(engine, tmp_path)
    try:
        engine.gate.resume()
        release.set()
        (t,) = done()
    finally:
        engine.load_weights(old)
        engine.gate.set_version(0)
    first = t.loss_mask.index(0)  # the first env token: turn 1 is before it
    assert set(t.token_versions[:first]) == {0}
    assert {v for v, m in zip(t.token_versions[first:], t.loss_mask[first:]) if m} == {1}


def test_the_kept_tokens_are_joined_with_their_versions() -> None:
    a = Generation([1, 2], [-0.1, -0.2], INTERRUPTED, versions=[3, 3])
    b = Generation([4], [-0.4], "stop", versions=[4])
    assert joined(a, b) == Generation([1, 2, 4], [-0.1, -0.2, -0.4], "stop", versions=[3, 3, 4])
    assert joined(a, replace(b, versions=None)).versions is None
    assert joined(None, b) is b
    assert resume_seed(5, 0) == 5 and resume_seed(None, 3) is None and resume_seed(5, 3) != resume_seed(5, 4)


def test_an_interrupt_that_is_not_answered_times_out_and_opens_the_gate() -> None:
    gate = PauseGate()
    gate.enter()  # a call that never checks
    with pytest.raises(TimeoutError, match="did not stop within 0.1 s"):
        gate.interrupt(timeout_s=0.1)
    assert not gate.requested
    gate.exit()
    gate.interrupt(timeout_s=1)
    assert gate.requested
    gate.resume(version=3)
    assert not gate.requested and gate.version == 3


# ------------------------------------------------------------------------- the worker / runtime API, bad input


def test_a_worker_takes_new_weights_while_its_episodes_generate(tiny_model_path, tmp_path: Path) -> None:
    """``LocalRuntime.update_in_flight`` on a ``RolloutWorker`` whose ``generate`` runs on another thread: the
    interrupted turns keep their version-0 tokens and continue on the weights ``receive`` loaded (version 1)."""
    from rl.config.recipe import load_recipe
    from rl.driver.local_runtime import LocalRuntime
    from rollout.pool import RolloutWorker
    from rollout.weights import FileWeights

    hf = HFEngine(tiny_model_path, dtype="float32")
    hf.gate = TripGate()
    worker = RolloutWorker(
        tiny_model_path, [("talk", "test_partial_rollouts.TalkEnv", {})], engine=hf, partial_rollouts=True
    )
    rt = LocalRuntime(load_recipe(RECIPES / "quickstart.yaml"), tiny_model_path)
    rt.worker = worker
    s = replace(S, max_turns=1, max_new_tokens=12)
    _, new = _weight_files(hf, tmp_path)
    hf.gate.arm(6)  # the 6th check: after 5 tokens of the first episode's turn
    done = _in_thread(lambda: worker.generate(TASKS, [0, 1], [11, 12], s))
    assert hf.gate.tripped.wait(60)
    rt.update_in_flight(lambda: worker.receive(FileWeights(new)), version=1)
    a, b = done()
    assert a.token_versions == [0] * 5 + [1] * (len(a.response_ids) - 5)
    assert set(b.token_versions) == {1}, "the second episode had not started: all of it on the new weights"
    assert worker.policy_version() == 1 and a.oldest_version == 0 and b.oldest_version == 1


def test_an_engine_that_cannot_pause_is_refused_naming_the_key(tiny_model_path) -> None:
    from rollout.pool import RolloutWorker

    class Plain:
        def generate(self, prompts, sampling, seeds=None, stops=None):
            raise AssertionError("never reached")

    with pytest.raises(ValueError, match=r"rollout.partial_rollouts: the engine Plain cannot pause"):
        RolloutWorker(tiny_model_path, [], engine=Plain(), partial_rollouts=True)
    RolloutWorker(tiny_model_path, [], engine=Plain())  # without partial rollouts it serves as before


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["rollout.partial_rollouts=true"], "rollout.partial_rollouts: interrupts generations at a weight update"),
        (
            ["rollout.partial_rollouts=true", "rollout.max_staleness=1", "learner.routing_replay=r3"],
            "rollout.partial_rollouts: a resumed turn's routing is recomputed on the new weights",
        ),
    ],
)
def test_partial_rollouts_that_cannot_work_are_refused_naming_the_key(overrides, expected) -> None:
    from rl.config.recipe import RecipeError, load_recipe, validate_recipe

    with pytest.raises(RecipeError, match=expected):
        validate_recipe(load_recipe(RECIPES / "quickstart.yaml", overrides), check_imports=False)


def test_partial_rollouts_with_async_rollouts_validate() -> None:
    from rl.config.recipe import load_recipe
    from rl.config.rules import cross_section_rules

    cfg = load_recipe(RECIPES / "quickstart.yaml", ["rollout.partial_rollouts=true", "rollout.max_staleness=1"])
    assert cfg.rollout.partial_rollouts and not list(cross_section_rules(cfg))


def test_rollouts_jsonl_carries_the_oldest_and_newest_versions(tmp_path: Path) -> None:
    import json

    from rl.driver.logger import RunLogger

    t = Trajectory(
        task=TASKS[0],
        group_id=0,
        prompt_ids=[1],
        response_ids=[5, 6, 7, 8],
        loss_mask=[1, 0, 1, 1],
        logprobs=[-1.0, 0.0, -1.0, -1.0],
        messages=[],
        terminated=True,
        truncated=False,
        finish_reason="stop",
        token_versions=[3, -1, 3, 4],
    )
    assert (t.oldest_version, t.newest_version) == (3, 4)
    assert replace(t, token_versions=None).oldest_version is None
    assert replace(t, token_versions=[-1, -1, -1, -1]).oldest_version is None, "env tokens have no version"
    lg = RunLogger(tmp_path, {}, mode="disabled")
    lg.rollouts(1, "train", [t, replace(t, token_versions=None)])
    lg.close()
    rows = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["oldest_version"], r["newest_version"]) for r in rows] == [(3, 4), (None, None)]


# ------------------------------------------------------------------------- the vLLM engine's streaming, without vLLM running


class FakeLLMEngine:
    """vLLM's ``LLMEngine`` as ``VLLMEngine``'s streaming uses it: ``script[request][k]`` is the request's k-th delta
    of token ids; its last delta finishes it, with ``routed`` as its routed experts. Built with vLLM's own classes."""

    def __init__(self, script: list[list[list[int]]], routed=None) -> None:
        self.script, self.routed = script, routed
        self.rids: list[str] = []
        self.kinds: list = []
        self.sent: dict[str, int] = {}
        self.aborted: list[str] = []

    def add_request(self, rid, prompt, params, lora_request=None) -> None:
        self.rids.append(rid)
        self.kinds.append(params.output_kind)
        self.sent[rid] = 0

    def step(self) -> list:
        from vllm.logprobs import Logprob
        from vllm.outputs import CompletionOutput, RequestOutput

        out = []
        for n, rid in enumerate(self.rids):
            if rid in self.aborted or self.sent[rid] >= len(self.script[n]):
                continue
            ids = self.script[n][self.sent[rid]]
            self.sent[rid] += 1
            done = self.sent[rid] == len(self.script[n])
            lps = [{t: Logprob(logprob=-t / 100)} for t in ids]
            routed = self.routed if done else None
            c = CompletionOutput(0, "", ids, None, lps, routed_experts=routed, finish_reason="stop" if done else None)
            out.append(RequestOutput(rid, None, [1], None, [c], done))
        return out

    def abort_request(self, rids) -> None:
        self.aborted += list(rids)


def _fake_vllm(script, routed=None, layout=None):
    from rollout.engine import VLLMEngine

    e = VLLMEngine.__new__(VLLMEngine)  # no vLLM engine: the streaming bookkeeping alone
    e.llm = type("LLM", (), {"llm_engine": FakeLLMEngine(script, routed)})()
    e._streams, e._parts, e._stream_seq, e._lora, e._routing = {}, {}, 0, None, layout
    e.gate, e._entered = PauseGate(), False
    return e


def test_vllm_streams_deltas_and_an_interrupt_returns_each_requests_tokens_so_far() -> None:
    """Requests streamed as deltas: a finished one is its deltas joined (ids, log-probs, version); at an interrupt
    the next poll aborts the unfinished ones and returns their reported tokens, and the gate is free."""
    from vllm.sampling_params import RequestOutputKind

    e = _fake_vllm([[[10, 11], [12]], [[20], [21], [22], [23]]])
    s = Sampling(max_new_tokens=8, temperature=1.0, max_model_len=64)
    e.gate.set_version(4)
    e.submit(0, [1, 2], s, 7, [])
    e.submit(1, [1, 3], s, 8, [])
    assert e.llm.llm_engine.kinds == [RequestOutputKind.DELTA] * 2
    assert e.poll() == []
    (done,) = e.poll()
    assert done == (0, Generation([10, 11, 12], [-0.1, -0.11, -0.12], "stop", versions=[4, 4, 4]))
    e.gate._closed = True  # an interrupt asked (another thread's interrupt() waits for the poll below)
    assert e.poll() == [(1, Generation([20, 21], [-0.2, -0.21], INTERRUPTED, versions=[4, 4]))]
    assert e.llm.llm_engine.aborted == [e.llm.llm_engine.rids[1]] and not e._streams and not e._parts
    e.gate.interrupt(timeout_s=0.1)  # nothing holds the gate now: returns at once
    e.gate.resume(version=5)
    e.submit(1, [1, 3, 20, 21], s, 8, [], offset=2)  # the resumed request: its own seed
    assert e._parts[e.llm.llm_engine.rids[2]][2] == 5, "its tokens will be the resumed version's"
    e.abort()
    e.gate.interrupt(timeout_s=0.1)  # an abort leaves the gate free too


def test_vllm_streamed_completions_carry_the_routed_experts_of_their_final_output() -> None:
    import numpy as np

    routed = (np.arange(5 * 1 * 2) % 8).reshape(5, 1, 2).astype(np.uint8)  # rows: 1 prompt + 5 generated - 1
    e = _fake_vllm([[[10, 11], [12, 13, 14]]], routed=routed, layout=([0], 8))
    e.submit(0, [1], Sampling(max_new_tokens=8, max_model_len=64), 7, [])
    e.poll()
    ((_, g),) = e.poll()
    assert g.token_ids == [10, 11, 12, 13, 14] and np.array_equal(g.routing, routed)
