"""The packed shared-prompt layout (rl.trainer.packing) against the padded one it replaces."""

from __future__ import annotations

import pytest
import torch

from bench import padded_layout
from rl.algos.batch import Batch, Sample
from rl.config.recipe import AlgoConfig, LearnerConfig, ModelConfig, OptimConfig
from rl.trainer import packing
from rl.trainer.learner import Learner

MODEL_CFG = ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False)


def _s(prompt: list[int], resp: list[int], mask: list[int] | None = None, adv: float = 1.0, gid: int = 0) -> Sample:
    mask = mask if mask is not None else [1] * len(resp)
    return Sample(prompt + resp, len(prompt), mask, [-1.0] * len(resp), adv, "t", group_id=gid)


def test_pack_layout_positions_mask_and_gather_index():
    a = [5, 6, 7]
    members = [_s(a, [10, 11, 12]), _s(a, [20]), _s(a, [13, 14], mask=[0, 1])]
    pk = packing.pack(members, rows_b=[0, 2, 3], T=3)
    # the prompt, then each response minus its last token (the 1-token response adds none)
    assert pk.input_ids.tolist() == [[5, 6, 7, 10, 11, 13]]
    assert pk.position_ids.tolist() == [[0, 1, 2, 3, 4, 3]]  # each response restarts after the prompt
    m = pk.mask[0, 0]
    assert m[5].tolist() == [True, True, True, False, False, True]  # sees the prompt and itself, not response 1
    assert m[4].tolist() == [True, True, True, True, True, False]
    assert m[1].tolist() == [True, True, False, False, False, False]  # the prompt is causal
    # every masked token, in (sample, position) order: its predicting hidden state, target and grid index
    assert pk.cols.tolist() == [2, 3, 4, 2, 5]
    assert pk.targets.tolist() == [10, 11, 12, 20, 14]
    assert pk.index.tolist() == [0, 1, 2, 6, 10]
    assert packing.packed_length(members) == 6


def test_pack_rejects_an_empty_or_unshared_prompt():
    with pytest.raises(ValueError, match="empty prompt"):
        packing.pack([_s([], [1, 2])], [0], T=2)
    with pytest.raises(ValueError, match="share one prompt"):
        packing.pack([_s([1, 2], [3]), _s([1, 4], [3])], [0, 1], T=1)


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
    padded_layout.use(made[1])  # the padded layout, moved to the bench that compares it
    yield made
    for lrn in made:
        lrn.shutdown()


def test_packed_equals_padded_logprobs_loss_and_grads(pair):
    packed, padded = pair
    batch = _batch(len(packed.tokenizer))
    with torch.no_grad():
        lp_k, t_k = packed.fwd.logprobs(packed.model, batch.samples)
        lp_d, t_d = padded.fwd.logprobs(padded.model, batch.samples)
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


def test_packed_groups_look_up_their_embeddings_in_one_call(pair):
    """One embedding call per packed forward, whatever the number of groups: its backward builds the
    vocabulary-sized embedding gradient once (one fresh [V, H] tensor), not once per group."""
    packed, _ = pair
    batch = _batch(len(packed.tokenizer))
    calls = []
    hook = packed.model.get_input_embeddings().register_forward_hook(lambda m, i, o: calls.append(tuple(o.shape)))
    try:
        with torch.no_grad():
            packed.fwd.logprobs(packed.model, batch.samples)
    finally:
        hook.remove()
    groups = {}
    for s in batch.samples:
        groups.setdefault(s.group_id, []).append(s)
    assert len(groups) == 3 and len(calls) == 1
    assert calls[0][1] == sum(packing.packed_length(g) for g in groups.values())  # every group's packed tokens


def test_packed_micro_batches_count_packed_tokens(pair):
    packed, padded = pair
    batch = _batch(len(packed.tokenizer), seed=1)
    groups = {}
    for s in batch.samples:
        groups.setdefault(s.group_id, []).append(s)
    budget = 2 * max(packing.packed_length(g) for g in groups.values())
    for lrn in pair:
        lrn.lcfg = LearnerConfig(micro_batch_tokens=budget)
    micros = packed.micro_batches(batch.samples)
    assert sorted(id(s) for mb in micros for s in mb) == sorted(id(s) for s in batch.samples)
    for mb in micros:
        by = {}
        for s in mb:
            by.setdefault(s.group_id, []).append(s)
        assert sum(packing.packed_length(g) for g in by.values()) <= budget
        assert packed.fwd.trunk_calls(mb) == len(by)  # one packed call per group
        assert padded.fwd.trunk_calls(mb) == 2 * len(by)  # padded: the prompt, then the responses
    # padded, each group costs its members padded to the longest: more tokens, no fewer micro-batches
    assert len(micros) <= len(padded.micro_batches(batch.samples))


def test_pack_additive_mask_matches_the_boolean_one():
    members = [_s([5, 6], [7, 8, 9]), _s([5, 6], [1, 2])]
    b = packing.pack(members, [0, 1], T=3).mask
    f = packing.pack(members, [0, 1], T=3, mask_dtype=torch.float32).mask
    assert f.dtype == torch.float32
    assert torch.equal(f == 0, b)
    assert torch.all(f[~b] == torch.finfo(torch.float32).min)
