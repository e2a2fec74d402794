"""Data-parallel learner: 2 Ray learner actors (gloo, CPU) give the same update as one learner on the same batch.

fp32 without autocast. Besides the weights (Adam is nearly blind to a gradient's scale, so they
alone would not catch a mean-instead-of-sum all-reduce), the gradients themselves, the pre-clip
grad norm and the batch metrics (loss, KL, value loss, token counts) must match.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rl.algos.batch import Batch, Sample
from rl.config.recipe import AlgoConfig, CriticConfig, KLConfig, LossConfig, OptimConfig
from rl.trainer.distributed import shard_batch
from rl.trainer.learner import Learner
from test_learner import MODEL_CFG, PROMPT_A, PROMPT_B, enc

PROMPT_C = "<|im_start|>user\nset a timer for 10 minutes<|im_end|>\n<|im_start|>assistant\n"


def dp_batch(tok, skip: bool) -> Batch:
    """Three groups (A: 3 members, B: 2, C: 3), rewards with variance except group C (all 0.5)."""
    rows = [(PROMPT_A, "get weather Paris", 1.0, 1.2), (PROMPT_A, "weather", 0.0, -0.6), (PROMPT_A, "Paris 20", 0.2, -0.6),
            (PROMPT_B, "convert 100 USD", 1.0, 0.7), (PROMPT_B, "the amount", 0.0, -0.7),
            (PROMPT_C, "timer 10", 0.5, 0.0), (PROMPT_C, "set timer minutes 10", 0.5, 0.0), (PROMPT_C, "ok", 0.5, 0.0)]
    samples = []
    prompts = {PROMPT_A: 0, PROMPT_B: 1, PROMPT_C: 2}
    for uid, (p, text, reward, adv) in enumerate(rows):
        pi = enc(tok, p)
        resp = enc(tok, text) + [tok.eos_token_id]
        samples.append(Sample(pi + resp, len(pi), [1] * len(resp), [-1.0] * len(resp), adv, "tool_call",
                              reward=reward, group_id=prompts[p], uid=uid))
    n = sum(s.num_tokens for s in samples)
    if skip:
        return Batch([s for s in samples if s.advantage != 0], n, len(samples), [s for s in samples if s.advantage == 0])
    return Batch(samples, n, len(samples))


def test_shard_batch_whole_groups_balanced(tiny_tokenizer):
    b = dp_batch(tiny_tokenizer, skip=True)
    shards = shard_batch(b, 2)
    assert all((s.num_tokens, s.num_seqs) == (b.num_tokens, b.num_seqs) for s in shards)  # global denominators
    groups = [{x.group_id for x in s.samples + s.skipped} for s in shards]
    assert groups[0].isdisjoint(groups[1]) and groups[0] | groups[1] == {0, 1, 2}
    # Group C is all skipped (no compute cost): the costly groups A and B are split between the shards.
    assert {0, 1} - groups[0] and {0, 1} - groups[1]
    assert sorted(x.uid for s in shards for x in s.samples + s.skipped) == list(range(8))
    assert [x.uid for x in shards[0].samples] == sorted(x.uid for x in shards[0].samples)
    assert len(shard_batch(b, 4)) == 4 and shard_batch(b, 4)[3].samples == []  # more shards than groups: empty ones


@pytest.fixture(scope="module")
def ray2():
    import ray

    # The actors import this module (for _state, run through __ray_call__).
    path = os.pathsep.join(p for p in [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")] if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}})
    yield ray
    ray.shutdown()


def _state(lrn: Learner) -> dict[str, torch.Tensor]:
    out = {k: v.detach().clone() for k, v in lrn.model.named_parameters()}
    out |= {f"grad.{k}": v.grad.detach().clone() for k, v in lrn.model.named_parameters() if v.grad is not None}
    crit = lrn._critic_module()
    if crit is not None:
        out |= {f"critic.{k}": v.detach().clone() for k, v in crit.named_parameters()}
    return out


def _use_sgd(lrn: Learner) -> None:
    """SGD in place of AdamW (also on the critic): an update linear in the gradient."""
    lrn.opt = torch.optim.SGD([p for g in lrn.opt.param_groups for p in g["params"]], lr=0.5)
    lrn.sched = torch.optim.lr_scheduler.LambdaLR(lrn.opt, lambda s: 1.0)
    if lrn.critic is not None:
        lrn.critic_opt = torch.optim.SGD(lrn.critic.parameters(), lr=0.5)
        lrn.critic_sched = torch.optim.lr_scheduler.LambdaLR(lrn.critic_opt, lambda s: 1.0)


# case: (algo, skip zero-advantage samples, optimizer)
CASES = {
    # GRPO with the KL loss, an entropy bonus, seq-mean aggregation: every sample computed.
    "grpo_kl": (AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3), kl=KLConfig(coef=0.1),
                           loss=LossConfig(entropy_coef=0.01, agg="seq-mean-token-mean")), False, "sgd"),
    # Dr.GRPO without KL: group C is skipped (in Batch.skipped), so one shard computes a single group;
    # its own aggregation, seq-mean-token-sum-norm, over a constant of 16 tokens.
    "dr_grpo_skip": (AlgoConfig(name="dr_grpo", optim=OptimConfig(lr=1e-3), loss=LossConfig(norm_tokens=16)), True, "sgd"),
    # PPO, separate critic, KL in the reward: advantages whitened over the whole batch across the ranks.
    "ppo_kl_reward": (AlgoConfig(name="ppo", optim=OptimConfig(lr=1e-3), kl=KLConfig(coef=0.05, kind="k1", in_reward=True),
                                 critic=CriticConfig(model="separate")), False, "sgd"),
    # The default AdamW: its first step is ~lr * sign(g), so entries whose gradient is ~0 flip with float
    # summation-order noise; weights are compared where |g| >= 1e-6, and the replicas must stay identical.
    "grpo_adamw": (AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3), kl=KLConfig(coef=0.1)), False, "adamw"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_learners_equal_one(ray2, tiny_model_path, tiny_tokenizer, tmp_path, case):
    from rl.trainer.distributed import LearnerGroup

    algo, skip, optimizer = CASES[case]
    single = Learner(tiny_model_path, MODEL_CFG, algo, threads=1,
                     shm_dir=str(tmp_path / "one"))
    group = LearnerGroup(2, tiny_model_path, MODEL_CFG, algo, threads=2, shm_dir=str(tmp_path / "dp"), num_cpus=1)
    try:
        group.ready()
        if optimizer == "sgd":
            _use_sgd(single)
            ray2.get([a.__ray_call__.remote(_use_sgd) for a in group.actors])
        steps = 2 if optimizer == "sgd" else 1  # two steps: the replicas stay in step with the single learner
        for step in range(steps):
            batch = dp_batch(tiny_tokenizer, skip)
            m1 = single.step(batch)
            m2 = group.step(batch)
            assert m2["learner/updates"] == m1["learner/updates"] == 1
            for k in ("loss/policy", "loss/kl", "kl/mean", "loss/value", "returns/mean", "entropy/mean", "loss/entropy",
                      "critic/grad_norm"):
                if k in m1:
                    assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-6), (step, k)
            assert m2["learner/tokens"] == m1["learner/tokens"] == sum(s.num_tokens for s in batch.samples)
            assert m2["grad/norm"] == pytest.approx(m1["grad/norm"], rel=1e-5), step
            assert m2["lr"] == m1["lr"]
        ranks = ray2.get([a.__ray_call__.remote(_state) for a in group.actors])
        want = _state(single)
        assert ranks[0].keys() == want.keys() and any(k.startswith("grad.") for k in want)
        for k, v in want.items():
            assert torch.equal(ranks[0][k], ranks[1][k]), f"replicas differ in {k}"
            got = ranks[0][k]
            if k.startswith("grad."):
                torch.testing.assert_close(got, v, rtol=1e-4, atol=1e-7, msg=lambda m, k=k: f"{k}: {m}")
            elif optimizer == "sgd" or k.startswith("critic."):
                torch.testing.assert_close(got, v, rtol=0, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
            else:
                well = want[f"grad.{k}"].abs() >= 1e-6
                torch.testing.assert_close(got[well], v[well], rtol=0, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
        # rank 0 exports the weights the engines get
        import ray
        from safetensors.torch import load_file

        sd = load_file(ray.get(group.actors[0].export_weights.remote("float32")))
        assert torch.equal(sd["model.norm.weight"], ranks[0]["model.norm.weight"])
    finally:
        group.kill()
        single.shutdown()
