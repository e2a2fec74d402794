"""Sharded learner: 2 Ray learner actors (FSDP2 over gloo, CPU) give the same update as one learner on the same batch.

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
from rl.config.recipe import AlgoConfig, CriticConfig, KLConfig, LearnerConfig, LoraConfig, LossConfig, OptimConfig
from rl.trainer.sharding import shard_batch
from rl.trainer.learner import Learner
from test_learner import MODEL_CFG, PROMPT_A, PROMPT_B, enc
from conftest import gloo_ranks

PROMPT_C = "<|im_start|>user\nset a timer for 10 minutes<|im_end|>\n<|im_start|>assistant\n"


def dp_batch(tok, skip: bool) -> Batch:
    """Three groups (A: 3 members, B: 2, C: 3), rewards with variance except group C (all 0.5)."""
    rows = [
        (PROMPT_A, "get weather Paris", 1.0, 1.2),
        (PROMPT_A, "weather", 0.0, -0.6),
        (PROMPT_A, "Paris 20", 0.2, -0.6),
        (PROMPT_B, "convert 100 USD", 1.0, 0.7),
        (PROMPT_B, "the amount", 0.0, -0.7),
        (PROMPT_C, "timer 10", 0.5, 0.0),
        (PROMPT_C, "set timer minutes 10", 0.5, 0.0),
        (PROMPT_C, "ok", 0.5, 0.0),
    ]
    samples = []
    prompts = {PROMPT_A: 0, PROMPT_B: 1, PROMPT_C: 2}
    for uid, (p, text, reward, adv) in enumerate(rows):
        pi = enc(tok, p)
        resp = enc(tok, text) + [tok.eos_token_id]
        samples.append(
            Sample(
                pi + resp,
                len(pi),
                [1] * len(resp),
                [-1.0] * len(resp),
                adv,
                "tool_call",
                reward=reward,
                group_id=prompts[p],
                uid=uid,
            )
        )
    n = sum(s.num_tokens for s in samples)
    if skip:
        return Batch(
            [s for s in samples if s.advantage != 0], n, len(samples), [s for s in samples if s.advantage == 0]
        )
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
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}},
    )
    yield ray
    ray.shutdown()


def _full(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter or gradient gathered in full (a collective: every rank calls it)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _state(lrn: Learner) -> dict[str, torch.Tensor]:
    out = {k: _full(v) for k, v in lrn.model.named_parameters()}
    out |= {f"grad.{k}": _full(v.grad) for k, v in lrn.model.named_parameters() if v.grad is not None}
    crit = lrn.critic_module()
    if crit is not None:
        out |= {f"critic.{k}": v.detach().clone() for k, v in crit.named_parameters()}
    return out


def _local_numel(lrn: Learner) -> int:
    """Elements of the policy's parameters held by this rank (its shards)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in lrn.model.parameters())


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
    "grpo_kl": (
        AlgoConfig(
            name="grpo",
            optim=OptimConfig(lr=1e-3),
            kl=KLConfig(coef=0.1),
            loss=LossConfig(entropy_coef=0.01, agg="seq-mean-token-mean"),
        ),
        False,
        "sgd",
    ),
    # Dr.GRPO without KL: group C is skipped (in Batch.skipped), so one shard computes a single group;
    # its own aggregation, seq-mean-token-sum-norm, over a constant of 16 tokens.
    "dr_grpo_skip": (
        AlgoConfig(name="dr_grpo", optim=OptimConfig(lr=1e-3), loss=LossConfig(norm_tokens=16)),
        True,
        "sgd",
    ),
    # PPO, separate critic, KL in the reward: advantages whitened over the whole batch across the ranks.
    "ppo_kl_reward": (
        AlgoConfig(
            name="ppo",
            optim=OptimConfig(lr=1e-3),
            kl=KLConfig(coef=0.05, kind="k1", in_reward=True),
            critic=CriticConfig(model="separate"),
        ),
        False,
        "sgd",
    ),
    # The default AdamW: its first step is ~lr * sign(g), so entries whose gradient is ~0 flip with float
    # summation-order noise; weights are compared where |g| >= 1e-6, and the replicas must stay identical.
    "grpo_adamw": (AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3), kl=KLConfig(coef=0.1)), False, "adamw"),
    # Small micro-batches, group C skipped: the ranks run different numbers of micro-batches and of
    # shared-prompt trunk calls, so the sharded ranks must pad with dummy calls to stay in step.
    "grpo_uneven_micro": (
        AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3), kl=KLConfig(coef=0.1)),
        True,
        "sgd",
        LearnerConfig(micro_batch_tokens=24),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_learners_equal_one(ray2, tiny_model_path, tiny_tokenizer, tmp_path, case):
    from rl.driver.actors.learners import LearnerGroup

    algo, skip, optimizer, *lcfg = CASES[case]
    learner = lcfg[0] if lcfg else None
    single = Learner(tiny_model_path, MODEL_CFG, algo, threads=1, shm_dir=str(tmp_path / "one"), learner=learner)
    group = LearnerGroup(
        2, tiny_model_path, MODEL_CFG, algo, threads=2, shm_dir=str(tmp_path / "dp"), num_cpus=1, learner=learner
    )
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
            for k in (
                "loss/policy",
                "loss/kl",
                "kl/mean",
                "loss/value",
                "returns/mean",
                "entropy/mean",
                "loss/entropy",
                "critic/grad_norm",
            ):
                if k in m1:
                    assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-6), (step, k)
            assert m2["learner/tokens"] == m1["learner/tokens"] == sum(s.num_tokens for s in batch.samples)
            assert m2["grad/norm"] == pytest.approx(m1["grad/norm"], rel=1e-5), step
            assert m2["lr"] == m1["lr"]
        # The policy (and reference) are sharded: each rank holds about half of every sharded parameter.
        local = ray2.get([a.__ray_call__.remote(_local_numel) for a in group.actors])
        full = sum(p.numel() for p in single.model.parameters())
        assert all(n <= 0.55 * full for n in local), (local, full)
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
        from safetensors.torch import load_file

        sd = load_file(group.export_weights("float32"))
        assert torch.equal(sd["model.norm.weight"], ranks[0]["model.norm.weight"])
    finally:
        group.kill()
        single.shutdown()


def test_sharded_checkpoint_resume(ray2, tiny_model_path, tiny_tokenizer, tmp_path):
    """2 sharded learners: save (each rank its shard), resume into 2 fresh ones: the next step is the
    same as without the restart; the checkpoint's HF folder holds the full policy; one learner resumes
    the 2-rank checkpoint (resharded) to the same weights and optimizer state."""
    from transformers import AutoModelForCausalLM

    from rl.driver.actors.learners import LearnerGroup

    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3), kl=KLConfig(coef=0.1))
    ck = tmp_path / "ck"
    a = LearnerGroup(2, tiny_model_path, MODEL_CFG, algo, threads=2, shm_dir=str(tmp_path / "a"), num_cpus=1)
    try:
        a.step(dp_batch(tiny_tokenizer, False))
        a.save_checkpoint(str(ck), export_dtype="float32")  # with the HF export (a run's last checkpoint)
        saved = ray2.get([x.__ray_call__.remote(_state) for x in a.actors])[0]
        m_a = a.step(dp_batch(tiny_tokenizer, True))
        after = ray2.get([x.__ray_call__.remote(_state) for x in a.actors])[0]
    finally:
        a.kill()
    assert sorted(f.name for f in ck.iterdir()) == ["dcp", "learner_state.pt", "model", "rng_rank1.pt"]
    hf = AutoModelForCausalLM.from_pretrained(ck / "model", dtype=torch.float32)
    for k, v in hf.named_parameters():
        assert torch.equal(v.detach(), saved[k]), k
    b = LearnerGroup(2, tiny_model_path, MODEL_CFG, algo, seed=7, threads=2, shm_dir=str(tmp_path / "b"), num_cpus=1)
    try:
        b.load_checkpoint(str(ck))
        m_b = b.step(dp_batch(tiny_tokenizer, True))
        got = ray2.get([x.__ray_call__.remote(_state) for x in b.actors])[0]
    finally:
        b.kill()
    assert m_b["loss/policy"] == m_a["loss/policy"] and m_b["grad/norm"] == m_a["grad/norm"]
    for k, v in after.items():
        assert torch.equal(got[k], v), k
    one = Learner(tiny_model_path, MODEL_CFG, algo, threads=1, shm_dir=str(tmp_path / "one"))
    try:
        one.load_checkpoint(str(ck))
        assert one.steps_done == 1
        for k, v in one.model.named_parameters():
            assert torch.equal(v.detach(), saved[k]), k
        assert all(s["step"] == 1 for s in one.opt.state_dict()["state"].values())
    finally:
        one.shutdown()


def rank_learner(path: str, rank: int, port: int, out: str, algo: AlgoConfig, learner: LearnerConfig) -> Learner:
    """Rank ``rank`` of 2 sharded learners in a torch.multiprocessing worker (gloo on ``port``, no Ray)."""
    return Learner(
        path,
        MODEL_CFG,
        algo,
        threads=1,
        rank=rank,
        world_size=2,
        dist_port=port,
        shm_dir=f"{out}/shm{rank}",
        learner=learner,
    )


def _lora_rank(rank: int, port: int, path: str, out: str) -> None:
    """One of 2 sharded LoRA learners (torch.multiprocessing, no Ray): two SGD steps, then its gathered state."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    lrn = rank_learner(path, rank, port, out, LORA_ALGO, LORA_LEARNER)
    _use_sgd(lrn)
    metrics = [lrn.step(shard_batch(dp_batch(tok, skip), 2)[rank]) for skip in (False, True)]
    state = _state(lrn)
    exported = lrn.export_weights("float32")
    if rank == 0:
        from safetensors.torch import load_file

        torch.save({"state": state, "metrics": metrics, "export": load_file(exported)}, f"{out}/rank0.pt")
    lrn.shutdown()


LORA_ALGO = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3), kl=KLConfig(coef=0.1))
LORA_LEARNER = LearnerConfig(lora=LoraConfig(rank=4, alpha=8.0))


@pytest.mark.slow
@gloo_ranks
def test_sharded_lora_equals_one_learner(tiny_model_path, tiny_tokenizer, tmp_path):
    """LoRA on 2 FSDP ranks (adapters sharded with their layers; the KL reference is the base with
    adapters disabled) takes the same two updates as LoRA on one learner, and exports the same merged weights."""
    import torch.multiprocessing as mp

    from rl.trainer.collectives import free_port

    mp.spawn(_lora_rank, args=(free_port(), tiny_model_path, str(tmp_path)), nprocs=2)
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)
    one = Learner(tiny_model_path, MODEL_CFG, LORA_ALGO, threads=1, shm_dir=str(tmp_path / "one"), learner=LORA_LEARNER)
    try:
        _use_sgd(one)
        metrics = [one.step(dp_batch(tiny_tokenizer, skip)) for skip in (False, True)]
        for m1, m2 in zip(metrics, got["metrics"]):
            for k in ("loss/policy", "loss/kl", "kl/mean", "grad/norm"):
                assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-7), k
        want = _state(one)
        assert want.keys() == got["state"].keys() and any(".lora_B." in k for k in want)
        for k, v in want.items():
            torch.testing.assert_close(got["state"][k], v, rtol=0, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
        from safetensors.torch import load_file

        mine = load_file(one.export_weights("float32"))
        assert mine.keys() == got["export"].keys()
        for k, v in mine.items():
            torch.testing.assert_close(got["export"][k], v, rtol=0, atol=1e-6)
    finally:
        one.shutdown()


def _malloc(lrn: Learner) -> tuple[str, bool]:
    from rl.trainer import memory

    return memory.allocator(), lrn.trim_after_step


@pytest.mark.parametrize("choice, autocast", [("auto", True), ("auto", False), ("system", True)])
def test_learner_actor_runs_the_recipes_malloc(ray2, tiny_model_path, tmp_path, choice, autocast):
    """``learner.allocator`` reaches the actor's process (LD_PRELOAD in its runtime env, read when Ray starts
    the worker): under ``auto`` jemalloc where installed for a bf16 autocast learner and glibc for an fp32 one
    (``memory.resolve_allocator``); glibc under ``system``. Neither trims after a step (``learner.hold_memory``)."""
    import dataclasses

    from rl.config.recipe import LearnerConfig
    from rl.trainer import memory
    from rl.driver.actors.learners import LearnerGroup

    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3))
    cfg = dataclasses.replace(MODEL_CFG, autocast=autocast)  # no step runs: the precision only picks the malloc
    group = LearnerGroup(
        1, tiny_model_path, cfg, algo, threads=1, shm_dir=str(tmp_path), learner=LearnerConfig(allocator=choice)
    )
    try:
        got = ray2.get(group.actors[0].__ray_call__.remote(_malloc))
    finally:
        group.kill()
    want = "jemalloc" if choice == "auto" and autocast and memory.jemalloc_path() else "glibc"
    assert tuple(got) == (want, False)  # learner.hold_memory (default): no trim after a step under either
