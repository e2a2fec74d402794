"""rl.trainer.learner.Learner in-process on the tiny model, in float32 without autocast (exact comparisons)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rl.algos.batch import Batch, Sample
from rl.config.recipe import AlgoConfig, LearnerConfig, LossConfig, ModelConfig, OptimConfig
from rl.trainer.learner import Learner

# A bf16 reference (the former default): from step 1 it differs from the fp32 policy, so KL terms are non-zero.
MODEL_CFG = ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False, reference_dtype="bfloat16")
ALGO = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2))

PROMPT_A = "<|im_start|>user\nweather in Paris<|im_end|>\n<|im_start|>assistant\n"
PROMPT_B = "<|im_start|>user\nconvert 100 USD to EUR<|im_end|>\n<|im_start|>assistant\n"


def enc(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


@pytest.fixture
def make_learner(tiny_model_path, tmp_path):
    made: list[Learner] = []

    def make(
        algo: AlgoConfig = ALGO, seed: int = 0, total_steps: int = 0, learner: LearnerConfig | None = None
    ) -> Learner:
        lrn = Learner(
            tiny_model_path,
            MODEL_CFG,
            algo,
            seed=seed,
            threads=1,
            shm_dir=str(tmp_path / f"shm{len(made)}"),
            total_steps=total_steps,
            learner=learner,
        )
        made.append(lrn)
        return lrn

    yield make
    for lrn in made:
        lrn.shutdown()


def sample(tok, prompt: str, turns: list[tuple[str, int]], adv: float, lp: float = -1.0) -> Sample:
    """A sample whose response is the concatenation of (text, mask) pieces; masked pieces end with EOS."""
    p = enc(tok, prompt)
    resp, mask = [], []
    for text, m in turns:
        ids = enc(tok, text) + ([tok.eos_token_id] if m else [])
        resp += ids
        mask += [m] * len(ids)
    return Sample(
        input_ids=p + resp,
        prompt_len=len(p),
        loss_mask=mask,
        rollout_logprobs=[lp if m else 0.0 for m in mask],
        advantage=adv,
        domain="tool_call",
    )


def make_batch(tok) -> Batch:
    s1 = sample(tok, PROMPT_A, [("get weather Paris", 1)], adv=1.0)
    s2 = sample(
        tok,
        PROMPT_B,
        [("convert", 1), ("\n<|im_start|>tool\nresult 1<|im_end|>\n<|im_start|>assistant\n", 0), ("100 USD", 1)],
        adv=-0.5,
    )
    s3 = sample(tok, PROMPT_A, [("the weather is 20 celsius in Paris today", 1)], adv=0.7)
    n_tok = sum(sum(s.loss_mask) for s in (s1, s2, s3))
    return Batch([s1, s2, s3], num_tokens=n_tok, num_seqs=3)


def params(lrn: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lrn.model.named_parameters()}


def use_sgd(lrn: Learner, lr: float = 1.0) -> None:
    """Plain SGD (an update linear in the gradient) in place of AdamW, with a constant schedule."""
    lrn.opt = torch.optim.SGD(lrn.model.parameters(), lr=lr)
    lrn.sched = torch.optim.lr_scheduler.LambdaLR(lrn.opt, lambda s: 1.0)


def test_step_updates_weights(make_learner, tiny_tokenizer):
    lrn = make_learner()
    tok = tiny_tokenizer
    s1 = sample(tok, PROMPT_A, [("get weather Paris", 1)], adv=1.0)
    s2 = sample(
        tok, PROMPT_B, [("convert", 1), ("\n<|im_start|>tool\nresult 1<|im_end|>\n", 0), ("100 USD", 1)], adv=-0.5
    )
    n1, n2 = sum(s1.loss_mask), sum(s2.loss_mask)
    # 5 more tokens from a zero-advantage sample left out of the compute (see rl/algos/batch.py).
    batch = Batch([s1, s2], num_tokens=n1 + n2 + 5, num_seqs=3)
    before = params(lrn)
    m = lrn.step(batch)
    after = params(lrn)

    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert lrn.steps_done == 1
    # At ratio 1 the clipped loss is -A per masked token, token-mean over the batch's num_tokens:
    # loss = -(1.0 * n1 + (-0.5) * n2) / (n1 + n2 + 5)
    assert m["loss/policy"] == pytest.approx(-(1.0 * n1 - 0.5 * n2) / (n1 + n2 + 5), abs=1e-6)
    assert math.isfinite(m["loss/policy"])
    assert m["grad/norm"] > 0 and math.isfinite(m["grad/norm"])
    assert m["learner/tokens"] == n1 + n2
    assert m["learner/skipped_update"] == 0.0
    assert m["clip/fraction"] == 0.0  # ratio == 1 everywhere
    assert m["entropy/mean"] > 0
    assert "kl/mean" not in m and "loss/kl" not in m


def test_logprob_diff_is_aligned(make_learner, tiny_tokenizer):
    # Give the samples the learner's own logprobs as "engine" logprobs: the reported mean
    # |learner - engine| must be ~0 (it would not be if tokens were paired in the wrong order).
    lrn = make_learner()
    batch = make_batch(tiny_tokenizer)
    samples = []
    for s in batch.samples:
        cont = s.input_ids[s.prompt_len :]
        full = lrn.logprobs(s.input_ids[: s.prompt_len], cont)  # over every response token
        samples.append(dataclasses.replace(s, rollout_logprobs=[lp if m else 0.0 for lp, m in zip(full, s.loss_mask)]))
    m = lrn.step(Batch(samples, batch.num_tokens, batch.num_seqs))
    assert m["rollout/logprob_diff"] < 1e-4
    # And with the engine off by a constant 0.25 on every policy token, the diff is 0.25.
    lrn2 = make_learner()
    shifted = [
        dataclasses.replace(
            s, rollout_logprobs=[lp - 0.25 if mk else 0.0 for lp, mk in zip(s.rollout_logprobs, s.loss_mask)]
        )
        for s in samples
    ]
    m2 = lrn2.step(Batch(shifted, batch.num_tokens, batch.num_seqs))
    assert m2["rollout/logprob_diff"] == pytest.approx(0.25, abs=1e-4)


def _with_engine_logprobs(lrn: Learner, batch: Batch, shift) -> Batch:
    """``batch`` whose engine log-probs are the learner's own plus ``shift(i)`` on policy token i."""
    samples = []
    for s in batch.samples:
        full = lrn.logprobs(s.input_ids[: s.prompt_len], s.input_ids[s.prompt_len :])
        it = iter(range(10**6))
        samples.append(
            dataclasses.replace(
                s, rollout_logprobs=[lp + shift(next(it)) if m else 0.0 for lp, m in zip(full, s.loss_mask)]
            )
        )
    return Batch(samples, batch.num_tokens, batch.num_seqs)


def test_truncated_is_weights_reweight_the_gradient(make_learner, tiny_tokenizer):
    # Engine log-probs log(4) below the learner's on every policy token: each raw weight is 4,
    # truncated to tis_cap = 2, so with plain SGD (no clipping) the update is exactly twice the unweighted one.
    algo = dataclasses.replace(ALGO, optim=dataclasses.replace(ALGO.optim, max_grad_norm=0.0))
    base = make_learner(algo)
    use_sgd(base, lr=0.1)
    batch = _with_engine_logprobs(base, make_batch(tiny_tokenizer), lambda i: -math.log(4.0))
    p0 = params(base)
    m0 = base.step(batch)
    d0 = {k: v - p0[k] for k, v in params(base).items()}
    assert "is/weight_mean" not in m0

    tis = make_learner(dataclasses.replace(algo, loss=dataclasses.replace(algo.loss, tis_cap=2.0)))
    use_sgd(tis, lr=0.1)
    m1 = tis.step(batch)
    d1 = {k: v - p0[k] for k, v in params(tis).items()}
    assert m1["is/weight_mean"] == pytest.approx(2.0, abs=1e-5)
    assert m1["is/truncated_fraction"] == pytest.approx(1.0)
    assert m1["loss/policy"] == pytest.approx(2 * m0["loss/policy"], rel=1e-5)
    for k in d0:
        torch.testing.assert_close(d1[k], 2 * d0[k], atol=1e-6, rtol=1e-4)

    # Engine equal to the learner: weights 1, nothing truncated, the plain update.
    same = make_learner(dataclasses.replace(algo, loss=dataclasses.replace(algo.loss, tis_cap=2.0)))
    use_sgd(same, lr=0.1)
    m2 = same.step(_with_engine_logprobs(same, make_batch(tiny_tokenizer), lambda i: 0.0))
    assert m2["is/weight_mean"] == pytest.approx(1.0, abs=1e-4) and m2["is/truncated_fraction"] == 0.0
    assert m2["loss/policy"] == pytest.approx(m0["loss/policy"], rel=1e-4)


def test_empty_batch_does_not_step(make_learner):
    lrn = make_learner()
    before = params(lrn)
    m = lrn.step(Batch([], 0, 0))
    assert lrn.steps_done == 0
    assert m["grad/norm"] == 0.0 and m["learner/tokens"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in params(lrn).items())


@pytest.mark.parametrize(
    "loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_gradient_accumulation_matches_one_micro_batch(make_learner, tiny_tokenizer, loss_agg):
    batch = make_batch(tiny_tokenizer)
    algo = dataclasses.replace(ALGO, loss=LossConfig(agg=loss_agg, norm_tokens=8))
    small = make_learner(algo, learner=LearnerConfig(micro_batch_tokens=1))  # no two samples fit together
    large = make_learner(algo, learner=LearnerConfig(micro_batch_tokens=1 << 16))  # all in one
    assert len(small.micro_batches(batch.samples)) >= 2
    assert len(large.micro_batches(batch.samples)) == 1
    assert all(torch.equal(a, b) for a, b in zip(params(small).values(), params(large).values()))

    m_small, m_large = small.step(batch), large.step(batch)
    assert m_small["loss/policy"] == pytest.approx(m_large["loss/policy"], abs=1e-6)
    assert m_small["grad/norm"] == pytest.approx(m_large["grad/norm"], rel=1e-5)
    assert m_small["learner/tokens"] == m_large["learner/tokens"] == batch.num_tokens
    ps, pl = dict(small.model.named_parameters()), dict(large.model.named_parameters())
    for k in ps:
        g_s, g_l = ps[k].grad, pl[k].grad  # step() leaves the (clipped) accumulated gradients in place
        torch.testing.assert_close(g_s, g_l, rtol=1e-4, atol=1e-7, msg=lambda m, k=k: f"grad {k}: {m}")
        # Parameters after the AdamW step. Adam's first update is lr * g / (|g| + 1e-8): for
        # |g| >> 1e-8 it is lr * sign(g), insensitive to float summation order; for |g| ~ 1e-9
        # (embedding rows of tokens barely involved, ~0.01% of entries) the 1e-8 relative noise of a
        # different micro-batching is amplified into ~1e-5 differences. Compare where |g| >= 1e-6.
        well = (g_s.abs() >= 1e-6) & (g_l.abs() >= 1e-6)
        torch.testing.assert_close(
            ps[k].detach()[well], pl[k].detach()[well], rtol=0, atol=1e-5, msg=lambda m, k=k: f"param {k}: {m}"
        )


def test_gradient_accumulation_params_with_sgd(make_learner, tiny_tokenizer):
    # The same equality over every parameter entry, with plain SGD in place of AdamW (an update
    # linear in the gradient, so parameters differ by lr * grad noise only).
    batch = make_batch(tiny_tokenizer)
    small = make_learner(ALGO, learner=LearnerConfig(micro_batch_tokens=1))
    large = make_learner(ALGO, learner=LearnerConfig(micro_batch_tokens=1 << 16))
    for lrn in (small, large):
        use_sgd(lrn)
    before = params(small)
    small.step(batch)
    large.step(batch)
    ps, pl = params(small), params(large)
    assert any(not torch.equal(before[k], ps[k]) for k in ps)
    for k in ps:
        torch.testing.assert_close(ps[k], pl[k], rtol=0, atol=1e-5, msg=lambda m, k=k: f"param {k}: {m}")


def test_shared_prompt_matches_full_sequences(make_learner, tiny_tokenizer):
    # Running a group's shared prompt once (KV cache reused by every member) must give the same
    # loss and gradients as running every sample's full sequence.
    tok = tiny_tokenizer
    batch = make_batch(tok)
    # A third PROMPT_A member whose response is a single token (shortest possible continuation).
    one = sample(tok, PROMPT_A, [("", 1)], adv=-0.3)
    batch = Batch(batch.samples + [one], batch.num_tokens + 1, batch.num_seqs + 1)
    shared = make_learner(ALGO, learner=LearnerConfig(share_prompt=True))
    full = make_learner(ALGO, learner=LearnerConfig(share_prompt=False))
    for lrn in (shared, full):
        use_sgd(lrn)
    m_s, m_f = shared.step(batch), full.step(batch)
    assert m_s["loss/policy"] == pytest.approx(m_f["loss/policy"], abs=1e-6)
    assert m_s["entropy/mean"] == pytest.approx(m_f["entropy/mean"], abs=1e-5)
    assert m_s["grad/norm"] == pytest.approx(m_f["grad/norm"], rel=1e-4)
    ps, pf = dict(shared.model.named_parameters()), dict(full.model.named_parameters())
    for k in ps:
        torch.testing.assert_close(ps[k].grad, pf[k].grad, rtol=1e-4, atol=1e-7, msg=lambda m, k=k: f"grad {k}: {m}")
        torch.testing.assert_close(
            ps[k].detach(), pf[k].detach(), rtol=0, atol=1e-5, msg=lambda m, k=k: f"param {k}: {m}"
        )


def test_kl_metrics_only_with_kl(make_learner, tiny_tokenizer):
    batch = make_batch(tiny_tokenizer)
    with_kl = make_learner(dataclasses.replace(ALGO, kl=dataclasses.replace(ALGO.kl, coef=0.1, kind="k3")))
    assert with_kl.ref is not None
    m = with_kl.step(batch)
    assert "kl/mean" in m and "loss/kl" in m
    # The reference is the same checkpoint (in bf16): k3 >= 0 and small at the first step.
    assert 0.0 <= m["kl/mean"] < 0.05 and math.isfinite(m["loss/kl"])
    # A second step: the policy has moved away from the reference, so the KL grows.
    m2 = with_kl.step(batch)
    assert m2["kl/mean"] > m["kl/mean"]

    without = make_learner()
    assert without.ref is None
    m0 = without.step(batch)
    assert "kl/mean" not in m0 and "loss/kl" not in m0


def test_kl_keeps_zero_advantage_samples_trainable(make_learner, tiny_tokenizer):
    # All advantages 0 (what build_batch keeps with a KL term): no policy gradient, so the first
    # step (policy == reference up to bf16 rounding of the reference) must still produce a finite step.
    tok = tiny_tokenizer
    s = sample(tok, PROMPT_A, [("get weather Paris", 1)], adv=0.0)
    lrn = make_learner(dataclasses.replace(ALGO, kl=dataclasses.replace(ALGO.kl, coef=1.0)))
    m = lrn.step(Batch([s], num_tokens=sum(s.loss_mask), num_seqs=1))
    assert m["loss/policy"] == 0.0
    assert math.isfinite(m["grad/norm"]) and lrn.steps_done == 1


def test_export_weights_has_untied_head(make_learner, tiny_tokenizer):
    from safetensors.torch import load_file

    lrn = make_learner()
    emb0 = lrn.model.get_input_embeddings().weight.detach().clone()
    lrn.step(make_batch(tiny_tokenizer))
    emb = lrn.model.get_input_embeddings().weight.detach()
    assert not torch.equal(emb, emb0)  # the step moved the (tied) embeddings

    path = lrn.export_weights(dtype="float32")
    sd = load_file(path)
    assert set(sd) >= {"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"}
    # The tied head is sent, and it is the updated embedding (not a stale copy).
    assert torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"])
    assert torch.equal(sd["lm_head.weight"], emb.cpu())
    for k, v in lrn.model.state_dict().items():
        assert torch.equal(sd[k], v.cpu()), k

    sd16 = load_file(lrn.export_weights())  # default bfloat16, same path (atomically replaced)
    assert sd16["lm_head.weight"].dtype == torch.bfloat16
    assert torch.equal(sd16["lm_head.weight"], emb.cpu().to(torch.bfloat16))


def test_logprobs_match_hf_forward(make_learner, tiny_model_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    tok = tiny_tokenizer
    lrn = make_learner()
    prompt = enc(tok, PROMPT_A)
    cont = enc(tok, "get weather Paris") + [tok.eos_token_id]
    got = lrn.logprobs(prompt, cont)
    assert len(got) == len(cont)

    ref = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + cont])
    with torch.no_grad():
        logits = ref(input_ids=ids).logits[0].float()  # [L, V]
    # Logits at position t predict token t + 1: the continuation's tokens are predicted by
    # positions len(prompt) - 1 ... len(prompt) + len(cont) - 2.
    lp = logits[len(prompt) - 1 : -1].log_softmax(-1)
    want = lp.gather(-1, torch.tensor(cont)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(got), want, atol=1e-5, rtol=0)
    assert all(v < 0 for v in got)


def test_logprobs_of_empty_continuation(make_learner, tiny_tokenizer):
    lrn = make_learner()
    assert lrn.logprobs(enc(tiny_tokenizer, PROMPT_A), []) == []


def test_checkpoint_round_trip(make_learner, tiny_tokenizer, tmp_path):
    batch = make_batch(tiny_tokenizer)
    a = make_learner()
    a.step(batch)
    ck = tmp_path / "ck"
    a.save_checkpoint(str(ck))

    b = make_learner(seed=1)
    assert b.steps_done == 0
    assert any(not torch.equal(x, y) for x, y in zip(params(a).values(), params(b).values()))
    b.load_checkpoint(str(ck))
    assert b.steps_done == 1
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    # Tied head still tied after loading.
    assert b.model.get_output_embeddings().weight.data_ptr() == b.model.get_input_embeddings().weight.data_ptr()

    sa, sb = a.opt.state_dict(), b.opt.state_dict()
    assert sa["state"].keys() == sb["state"].keys() and len(sa["state"]) > 0
    for i in sa["state"]:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.as_tensor(sa["state"][i][key]), torch.as_tensor(sb["state"][i][key])), (i, key)

    # The restored optimizer state makes the next step identical.
    a.step(batch)
    b.step(batch)
    for k, v in params(a).items():
        assert torch.equal(v, params(b)[k]), k
    assert a.steps_done == b.steps_done == 2


# ---------------------------------------------------------------- schedules, KL controller, loss terms


def test_lr_warmup_then_cosine_in_metrics(make_learner, tiny_tokenizer):
    batch = make_batch(tiny_tokenizer)
    lrn = make_learner(
        dataclasses.replace(
            ALGO, optim=dataclasses.replace(ALGO.optim, lr=1e-2, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
        ),
        total_steps=4,
    )
    lrs = [lrn.step(batch)["lr"] for _ in range(5)]
    # 1e-2 x [1/2, 2/2, then 0.1 + 0.9 * 0.5 * (1 + cos(pi * p)), p = (s - 2) / (4 - 2) = 0, 0.5, then 1 (floor)]
    assert lrs == pytest.approx([5e-3, 1e-2, 1e-2, 5.5e-3, 1e-3])
    assert lrn.updates_done == 5


def test_cosine_needs_total_steps(make_learner):
    with pytest.raises(ValueError, match="total"):
        make_learner(dataclasses.replace(ALGO, optim=dataclasses.replace(ALGO.optim, schedule="cosine")))


def test_adaptive_kl_coefficient(make_learner, tiny_tokenizer):
    batch = make_batch(tiny_tokenizer)
    lrn = make_learner(dataclasses.replace(ALGO, kl=dataclasses.replace(ALGO.kl, coef=0.05, target=1e-9, horizon=10)))
    m1 = lrn.step(batch)
    assert m1["kl/coef"] == 0.05 and m1["kl/mean"] > 1e-9
    # kl/mean >> target: error clipped to +0.2, n_steps = 3 sequences: 0.05 * (1 + 0.2 * 3 / 10) = 0.053
    m2 = lrn.step(batch)
    assert m2["kl/coef"] == pytest.approx(0.053)
    assert lrn.kl_ctl.value == pytest.approx(0.053 * 1.06)
    fixed = make_learner(dataclasses.replace(ALGO, kl=dataclasses.replace(ALGO.kl, coef=0.05)))
    fixed.step(batch)
    assert fixed.step(batch)["kl/coef"] == 0.05


def test_entropy_bonus_alone_raises_entropy(make_learner, tiny_tokenizer):
    # Zero advantages and no KL: the only gradient is the entropy bonus's, and it raises the entropy.
    tok = tiny_tokenizer
    s = [sample(tok, PROMPT_A, [("get weather Paris", 1)], adv=0.0), sample(tok, PROMPT_B, [("100 USD", 1)], adv=0.0)]
    batch = Batch(s, num_tokens=sum(x.num_tokens for x in s), num_seqs=2)
    lrn = make_learner(
        dataclasses.replace(
            ALGO, loss=dataclasses.replace(ALGO.loss, entropy_coef=1.0), optim=dataclasses.replace(ALGO.optim, lr=1e-3)
        )
    )
    m1 = lrn.step(batch)
    assert m1["loss/policy"] == 0.0 and m1["grad/norm"] > 0
    assert m1["loss/entropy"] == pytest.approx(m1["entropy/mean"], rel=1e-6)  # token-mean over the same tokens
    m2 = lrn.step(batch)
    m3 = lrn.step(batch)
    assert m3["entropy/mean"] > m2["entropy/mean"] > m1["entropy/mean"] + 3e-3
    no_bonus = make_learner()
    m0 = no_bonus.step(batch)
    assert m0["grad/norm"] == 0.0 and "loss/entropy" not in m0


def test_clip_settings_reach_the_policy_loss(make_learner, tiny_tokenizer, monkeypatch):
    import rl.algos.policy_losses  # the PPO loss object (algo.loss.policy: ppo_clip) calls policy_loss

    seen = []
    real = rl.algos.policy_losses.policy_loss

    def spy(*args, **kw):
        seen.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(rl.algos.policy_losses, "policy_loss", spy)
    lrn = make_learner(
        dataclasses.replace(
            ALGO,
            loss=dataclasses.replace(ALGO.loss, clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg="seq-mean-token-sum"),
        )
    )
    m = lrn.step(make_batch(tiny_tokenizer))
    assert seen and all(
        (k["clip_low"], k["clip_high"], k["dual_clip"], k["agg"]) == (0.2, 0.28, 3.0, "seq-mean-token-sum")
        for k in seen
    )
    assert all((k["num_tokens"], k["num_seqs"]) == (make_batch(tiny_tokenizer).num_tokens, 3) for k in seen)
    assert m["clip/dual_fraction"] == 0.0  # ratio 1 at the single update
    seen.clear()
    make_learner().step(make_batch(tiny_tokenizer))
    assert all(k["dual_clip"] is None for k in seen)  # 0 = off


# ---------------------------------------------------------------- epochs and minibatches


def test_epochs_ratio_uses_old_logprobs_from_before_the_update(make_learner, tiny_tokenizer):
    batch = make_batch(tiny_tokenizer)
    one = make_learner(dataclasses.replace(ALGO, optim=dataclasses.replace(ALGO.optim, lr=3e-2)))
    m1 = one.step(batch)
    assert m1["clip/fraction"] == 0.0 and m1["learner/updates"] == 1
    two = make_learner(
        dataclasses.replace(
            ALGO, optim=dataclasses.replace(ALGO.optim, lr=3e-2), update=dataclasses.replace(ALGO.update, epochs=2)
        )
    )
    old = two.prepare(batch)["old"]
    # The prepare pass's old log-probs are the policy's before any update ...
    for s, lp in zip(batch.samples, old):
        full = two.logprobs(s.input_ids[: s.prompt_len], s.input_ids[s.prompt_len :])
        assert lp == pytest.approx([x for x, m in zip(full, s.loss_mask) if m], abs=1e-5)
    m2 = two.step(batch)
    # ... so the second epoch's ratio is pi_new / pi_old != 1 and the clip acts (it never would
    # if the old log-probs were recomputed each epoch).
    assert m2["learner/updates"] == 2 and m2["clip/fraction"] > 0.05
    assert m2["learner/tokens"] == batch.num_tokens  # per epoch
    assert two.updates_done == 2 and two.steps_done == 1


def _group_batch(tok, skip: bool) -> Batch:
    """Six samples (uids 0-5), two with advantage 0: in Batch.skipped (skip) or computed (not skip)."""
    spec = [
        (PROMPT_A, "get weather Paris", 1.0),
        (PROMPT_A, "weather", 0.0),
        (PROMPT_B, "convert 100 USD", -0.5),
        (PROMPT_B, "the amount is 20", 0.0),
        (PROMPT_A, "Paris today", -0.7),
        (PROMPT_B, "100 EUR", 0.4),
    ]
    samples = []
    for uid, (p, text, adv) in enumerate(spec):
        s = sample(tok, p, [(text, 1)], adv=adv)
        s.uid, s.group_id = uid, 0 if p == PROMPT_A else 1
        samples.append(s)
    n = sum(s.num_tokens for s in samples)
    if not skip:
        return Batch(samples, n, len(samples))
    return Batch(
        [s for s in samples if s.advantage != 0.0], n, len(samples), skipped=[s for s in samples if s.advantage == 0.0]
    )


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_minibatches_skip_zero_advantage_samples_exactly(make_learner, tiny_tokenizer, loss_agg):
    # Two epochs x three shuffled minibatches: leaving the zero-advantage samples out of the compute
    # (Batch.skipped) must give the same three optimizer steps as computing them: they count in their
    # minibatch's denominators and in the shuffle (by uid) all the same.
    algo = dataclasses.replace(
        ALGO,
        update=dataclasses.replace(ALGO.update, epochs=2, minibatches=3),
        loss=dataclasses.replace(ALGO.loss, agg=loss_agg),
    )
    skip, full = make_learner(algo), make_learner(algo)
    for lrn in (skip, full):
        use_sgd(lrn, lr=0.5)
    before = params(skip)
    m_s = skip.step(_group_batch(tiny_tokenizer, skip=True))
    m_f = full.step(_group_batch(tiny_tokenizer, skip=False))
    assert m_s["learner/updates"] == m_f["learner/updates"] == 6
    assert m_s["loss/policy"] == pytest.approx(m_f["loss/policy"], abs=1e-6)
    assert m_s["clip/fraction"] == pytest.approx(m_f["clip/fraction"] * m_f["learner/tokens"] / m_s["learner/tokens"])
    ps, pf = params(skip), params(full)
    assert any(not torch.equal(before[k], ps[k]) for k in ps)
    for k in ps:
        torch.testing.assert_close(ps[k], pf[k], rtol=0, atol=1e-6, msg=lambda m, k=k: f"param {k}: {m}")
    # Ignoring the skipped samples' tokens in the denominators would be a different update.
    wrong = make_learner(algo)
    use_sgd(wrong, lr=0.5)
    b = _group_batch(tiny_tokenizer, skip=False)
    kept = [s for s in b.samples if s.advantage != 0.0]
    wrong.step(Batch(kept, sum(s.num_tokens for s in kept), len(kept)))
    assert max(float((params(wrong)[k] - pf[k]).abs().max()) for k in pf) > 1e-4


def test_minibatch_of_only_skipped_samples_is_an_adamw_step(make_learner, tiny_tokenizer):
    # One computed sample and one skipped, two minibatches: one of them holds only the skipped
    # sample. Computed, its gradient is exactly 0 and AdamW still steps (momentum, weight decay):
    # the skipped version must take that same step, bit for bit.
    tok = tiny_tokenizer
    a = sample(tok, PROMPT_A, [("get weather Paris", 1)], adv=1.0)
    z = sample(tok, PROMPT_B, [("100 USD", 1)], adv=0.0)
    a.uid, z.uid = 0, 1
    n = a.num_tokens + z.num_tokens
    algo = dataclasses.replace(
        ALGO,
        update=dataclasses.replace(ALGO.update, minibatches=2),
        optim=dataclasses.replace(ALGO.optim, weight_decay=0.1),
    )
    skip, full = make_learner(algo), make_learner(algo)
    for _ in range(2):
        ms = skip.step(Batch([a], n, 2, skipped=[z]))
        mf = full.step(Batch([a, z], n, 2))
    assert ms["learner/updates"] == mf["learner/updates"] == 2
    for k, v in params(full).items():
        assert torch.equal(params(skip)[k], v), k


def test_minibatches_need_exact_counts(make_learner, tiny_tokenizer):
    s = sample(tiny_tokenizer, PROMPT_A, [("get weather Paris", 1)], adv=1.0)
    lrn = make_learner(dataclasses.replace(ALGO, update=dataclasses.replace(ALGO.update, minibatches=2)))
    with pytest.raises(ValueError, match="num_tokens"):
        lrn.step(Batch([s], num_tokens=s.num_tokens + 5, num_seqs=2))  # 5 tokens of unknown samples
