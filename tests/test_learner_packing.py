"""The packed shared-prompt layout (rl.trainer.packing) against the padded one it replaces."""

from __future__ import annotations

import pytest
import torch

from rl.algos.batch import Batch, Sample
from rl.config.recipe import AlgoConfig, LearnerConfig, ModelConfig, OptimConfig
from rl.trainer import packing
from rl.trainer.learner import Learner

MODEL_CFG = ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False)


def _s(prompt: list[int], resp: list[int], mask: list[int] | None = None, adv: float = 1.0, gid: int = 0) -> Sample:
    mask = mask if mask is not None else [1] * len(resp)
    return Sample(prompt + resp, len(prompt), mask, [-1.0] * len(resp), adv, "t", group_id=gid)


def test_pack_layout_positions_mask_and_gather_index():
    a, b = [5, 6, 7], [8, 9]
    samples = [_s(a, [10, 11, 12]), _s(b, [20]), _s(a, [13, 14], mask=[0, 1])]
    pk = packing.pack(samples, T=3, pad_id=0)
    # row 0: prompt a, then responses 1 and 3 minus their last token; row 1: prompt b (its response has 1 token)
    assert pk.input_ids.tolist() == [[5, 6, 7, 10, 11, 13], [8, 9, 0, 0, 0, 0]]
    assert pk.position_ids[0].tolist() == [0, 1, 2, 3, 4, 3]  # each response restarts after the prompt
    m = pk.mask[0, 0]
    assert m[5].tolist() == [True, True, True, False, False, True]  # sees the prompt and itself, not response 1
    assert m[4].tolist() == [True, True, True, True, True, False]
    assert pk.mask[1, 0, 3].tolist() == [True, True, True, True, False, False]  # a pad: prompt + pads, causal
    # every masked token, row-major (sample, position): its predicting hidden state, target and grid index
    assert list(zip(pk.rows.tolist(), pk.cols.tolist())) == [(0, 2), (0, 3), (0, 4), (1, 1), (0, 5)]
    assert pk.targets.tolist() == [10, 11, 12, 20, 14]
    assert pk.index.tolist() == [0, 1, 2, 3, 7]
    assert pk.computed_tokens == 12
    assert packing.row_lengths(samples) == [6, 2]


def test_pack_rejects_an_empty_prompt():
    with pytest.raises(ValueError, match="empty prompt"):
        packing.pack([_s([], [1, 2])], T=2, pad_id=0)


def _batch(vocab: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    samples = []
    for gid in range(3):
        prompt = torch.randint(10, vocab, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g).tolist()
        for j in range(4):
            n = int(torch.randint(1, 9, (1,), generator=g))
            resp = torch.randint(10, vocab, (n,), generator=g).tolist()
            mask = [1] * n
            if n > 3:
                mask[1] = 0  # an environment token inside the response
            samples.append(_s(prompt, resp, mask, adv=(-1.0) ** j * (0.5 + j), gid=gid))
    return Batch(samples, sum(s.num_tokens for s in samples), len(samples))


@pytest.fixture
def pair(tiny_model_path, tmp_path):
    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2))
    made = [
        Learner(tiny_model_path, MODEL_CFG, algo, threads=1, shm_dir=str(tmp_path / f"s{i}"), learner=LearnerConfig())
        for i in range(2)
    ]
    made[1].pack_responses = False
    yield made
    for lrn in made:
        lrn.shutdown()


def test_packed_equals_padded_logprobs_loss_and_grads(pair):
    packed, padded = pair
    batch = _batch(len(packed.tokenizer))
    with torch.no_grad():
        lp_k, t_k = packed._response_logprobs(packed.model, batch.samples)
        lp_d, t_d = padded._response_logprobs(padded.model, batch.samples)
    assert torch.equal(t_k, t_d)
    torch.testing.assert_close(lp_k, lp_d, rtol=0, atol=1e-5)
    for lrn in pair:
        lrn.opt = torch.optim.SGD(lrn.model.parameters(), lr=0.0)  # keep the grads, leave the weights
        lrn.sched = torch.optim.lr_scheduler.LambdaLR(lrn.opt, lambda s: 1.0)
    m_k, m_d = packed.step(batch), padded.step(batch)
    assert m_k["loss/policy"] == pytest.approx(m_d["loss/policy"], abs=1e-6)
    assert m_k["entropy/mean"] == pytest.approx(m_d["entropy/mean"], abs=1e-5)
    gk, gd = dict(packed.model.named_parameters()), dict(padded.model.named_parameters())
    for k in gk:
        torch.testing.assert_close(gk[k].grad, gd[k].grad, rtol=1e-4, atol=1e-7, msg=lambda m, k=k: f"grad {k}: {m}")


def test_packed_micro_batches_count_rows_times_longest_row(pair):
    packed, padded = pair
    batch = _batch(len(packed.tokenizer), seed=1)
    rows = packing.row_lengths(batch.samples)
    budget = 2 * max(rows)
    for lrn in pair:
        lrn.lcfg = LearnerConfig(micro_batch_tokens=budget)
    micros = packed._micro_batches(batch.samples)
    assert sorted(s.uid for mb in micros for s in mb) == sorted(s.uid for s in batch.samples)
    for mb in micros:
        r = packing.row_lengths(mb)
        assert len(r) * max(r) <= budget
        assert packing.pack(mb, 9, 0).computed_tokens == len(r) * max(r)
    # the padded layout counts each group padded to its longest response: more tokens, no fewer micro-batches
    assert len(micros) <= len(padded._micro_batches(batch.samples))
