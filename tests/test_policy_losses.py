"""rl.algos.policy_losses: the registry, PPO clip on it unchanged, GSPO and CISPO against computations
written here independently (plain loops in float64), a user loss from docs/algorithms.md through the learner,
and a harness failure left out of the batch and the loss."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rl.algos.batch import Batch, Sample
from rl.algos.losses import policy_loss
from rl.algos.policy_losses import (
    LOSSES,
    LossInputs,
    PolicyLoss,
    PolicyLossError,
    get_policy_loss,
    loss_class,
)
from rl.config.recipe import AlgoConfig, LossConfig, ModelConfig, OptimConfig, cross_section_rules, load_recipe

REPO = Path(__file__).resolve().parents[1]


def _inputs(seed: int = 0, agg: str = "token-mean", engine: bool = False) -> LossInputs:
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 6
    mask = torch.rand(B, T, generator=g) > 0.25
    mask[3] = False  # a sequence with no policy token
    mask[:3, 0] = True
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.7, 0.4, 2.0], dtype=torch.float64)[:, None].expand(B, T)
    eng = old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64) if engine else None
    return LossInputs(
        logp=logp,
        old_logp=old,
        advantages=adv,
        mask=mask,
        agg=agg,
        num_tokens=float(mask.sum()) + 3,  # more tokens in the minibatch than in this micro-batch
        num_seqs=5.0,
        engine_logp=eng,
    )


def _grad(loss: torch.Tensor, x: LossInputs) -> torch.Tensor:
    (gr,) = torch.autograd.grad(loss, x.logp)
    return gr


def test_ppo_clip_is_policy_loss_unchanged():
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0, tis_cap=2.0)
    x = _inputs(engine=True, agg="seq-mean-token-mean")
    loss, stats = get_policy_loss(cfg)(x)
    from rl.algos.losses import truncated_is_weights

    w, ist = truncated_is_weights(x.old_logp, x.engine_logp, x.mask, 2.0)
    ref, pst = policy_loss(
        x.logp, x.old_logp, x.advantages, x.mask, 0.2, 0.28, 3.0, "seq-mean-token-mean", x.num_tokens, x.num_seqs, w
    )
    assert float(loss) == float(ref)
    assert stats == {
        "clip/fraction": pst["clip/fraction"],
        "clip/dual_fraction": pst["clip/dual_fraction"],
        "is/weight_mean": ist["is/weight_mean"],
        "is/truncated_fraction": ist["is/truncated_fraction"],
    }
    assert get_policy_loss(LossConfig()).stat_names == ("clip/fraction",)
    assert get_policy_loss(LossConfig()).needs == frozenset(), "no TIS: the engine's log-probs are not needed"


def test_gspo_matches_an_independent_computation():
    cfg = LossConfig(policy="gspo", clip_low=0.1, clip_high=0.15)
    x = _inputs(seed=1)
    loss, stats = get_policy_loss(cfg)(x)
    want, n_clip_tok, n_tok = torch.zeros((), dtype=torch.float64), 0, 0
    for i in range(x.logp.shape[0]):
        toks = [t for t in range(x.logp.shape[1]) if x.mask[i, t]]
        if not toks:
            continue
        s = torch.exp(sum(x.logp[i, t] - x.old_logp[i, t] for t in toks) / len(toks))
        a = float(x.advantages[i, 0])
        unclipped, clipped = -a * s, -a * torch.clamp(s, 0.9, 1.15)
        want = want + torch.maximum(unclipped, clipped)
        n_tok += len(toks)
        n_clip_tok += len(toks) * bool(clipped > unclipped)
    want = want / 5.0  # num_seqs of the minibatch
    assert float(loss) == pytest.approx(float(want), rel=1e-12)
    assert torch.allclose(_grad(loss, x), _grad(want, x), atol=1e-12)
    assert stats["clip/fraction"] == pytest.approx(n_clip_tok / n_tok)
    assert 0 < n_clip_tok < n_tok, "the data exercise both branches"


def test_cispo_matches_an_independent_computation():
    cfg = LossConfig(policy="cispo", clip_high=0.2)
    x = _inputs(seed=2)
    loss, stats = get_policy_loss(cfg)(x)
    want, capped = torch.zeros((), dtype=torch.float64), 0
    for i, t in x.mask.nonzero().tolist():
        r = math.exp(float(x.logp[i, t] - x.old_logp[i, t]))
        capped += r > 1.2
        want = want - min(r, 1.2) * float(x.advantages[i, t]) * x.logp[i, t]  # the weight is a constant
    want = want / x.num_tokens  # token-mean over the minibatch's tokens
    assert float(loss) == pytest.approx(float(want), rel=1e-12)
    assert torch.allclose(_grad(loss, x), _grad(want, x), atol=1e-12)
    assert stats == {"clip/fraction": pytest.approx(capped / int(x.mask.sum()))}
    assert 0 < capped < int(x.mask.sum())
    # every token keeps a gradient, capped or not (PPO's clip zeroes the clipped ones)
    assert bool((_grad(get_policy_loss(cfg)(x)[0], x)[x.mask] != 0).all())


def test_registry_names_and_errors(tmp_path, monkeypatch):
    assert {"ppo_clip", "gspo", "cispo"} <= set(LOSSES)
    with pytest.raises(PolicyLossError, match="unknown policy loss 'nope'"):
        loss_class("nope")
    with pytest.raises(PolicyLossError, match="cannot import"):
        loss_class("no_such_module_xyz.Loss")
    (tmp_path / "not_a_loss.py").write_text("class L:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PolicyLossError, match="not a subclass"):
        loss_class("not_a_loss.L")
    with pytest.raises(PolicyLossError, match="kwargs do not match") as e:
        get_policy_loss(LossConfig(policy="gspo", kwargs={"beta": 1}))
    assert e.value.key == "algo.loss.kwargs"


def _doc_example() -> tuple[str, dict]:
    """The python and yaml blocks of docs/algorithms.md's "Your own policy loss"."""
    import yaml

    text = (REPO / "docs" / "algorithms.md").read_text().split("## Your own policy loss", 1)[1]
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    return code, yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])


def test_user_loss_from_the_docs(tmp_path, monkeypatch, tiny_model_path, recipe_copy):
    code, snippet = _doc_example()
    assert len(code.strip().splitlines()) <= 50
    (tmp_path / "my_losses.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    loss_cfg = snippet["algo"]["loss"]
    # the recipe loads it (validation builds the object)
    cfg = load_recipe(
        recipe_copy("tiny.yaml"),
        [
            f"algo.loss.policy={loss_cfg['policy']}",
            "algo.loss.kwargs={" + ", ".join(f"{k}: {v}" for k, v in loss_cfg["kwargs"].items()) + "}",
        ],
    )
    obj = get_policy_loss(cfg.algo.loss)
    assert isinstance(obj, PolicyLoss) and type(obj).__name__ == loss_cfg["policy"].rsplit(".", 1)[1]
    assert not [k for k, _ in cross_section_rules(cfg) if k.startswith("algo.loss")]
    bad = load_recipe(recipe_copy("tiny.yaml"), ["algo.loss.policy=my_losses.Nothing"])
    assert [k for k, _ in cross_section_rules(bad)] == ["algo.loss.policy"]
    bad = load_recipe(recipe_copy("tiny.yaml"), ["algo.loss.kwargs={cap: 2}"])
    assert [k for k, _ in cross_section_rules(bad)] == ["algo.loss.kwargs"], "ppo_clip takes no kwargs"

    # and the learner trains with it: its stat is logged, the weights move
    from rl.trainer.learner import Learner

    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2), loss=cfg.algo.loss)
    lrn = Learner(
        tiny_model_path,
        ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False),
        algo,
        threads=1,
        shm_dir=str(tmp_path / "shm"),
    )
    try:
        before = {k: v.detach().clone() for k, v in lrn.model.named_parameters()}
        m = lrn.step(_batch())
        assert any(not torch.equal(before[k], v) for k, v in lrn.model.named_parameters())
        for k in obj.stat_names:
            assert math.isfinite(m[k])
    finally:
        lrn.shutdown()


def _batch() -> Batch:
    s1 = Sample([1, 2, 3, 40, 41, 42], 3, [1, 1, 1], [-1.0] * 3, 1.0, "tool_call", uid=0)
    s2 = Sample([1, 2, 3, 50, 51], 3, [1, 1], [-1.0] * 2, -0.5, "tool_call", uid=1)
    return Batch([s1, s2], num_tokens=5, num_seqs=2)


def _traj(reward, response: list[int], reward_error: str | None = None):
    from envs.types import Message, Task, Trajectory

    task = Task(id="t0", domain="tool_call", messages=(Message("user", "hi"),))
    n = len(response)
    return Trajectory(
        task, 0, [1, 2, 3], response, [1] * n, [-1.0] * n, [], True, False, "stop", reward=reward,
        reward_error=reward_error,
    )  # fmt: skip


def test_a_harness_failure_leaves_the_batch_and_the_loss(tmp_path, tiny_model_path):
    """A harness failure (reward_error "harness: ...", with or without a reward beside it) is dropped by
    build_batch: the batch, its group's baseline and the learner's loss are those of the episodes without it;
    scored 0 instead, it would have moved the baseline and the loss."""
    from rl.algos.batch import build_batch
    from rl.trainer.learner import Learner

    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2, max_grad_norm=0.0))
    mcfg = ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False)
    ok = [_traj(1.0, [40, 41, 42]), _traj(0.0, [50, 51]), _traj(0.25, [60])]
    why = "harness: tool_call env step raised RecursionError: maximum recursion depth exceeded"
    batches = {
        "without": build_batch(ok, algo)[0],
        "failed": build_batch(ok + [_traj(None, [70, 71], why)], algo)[0],
        "failed_with_a_reward": build_batch(ok + [_traj(1.0, [70, 71], why)], algo)[0],
        "scored_0": build_batch(ok + [_traj(0.0, [70, 71])], algo)[0],
    }
    want = batches["without"]
    for name in ("failed", "failed_with_a_reward"):
        b = batches[name]
        assert [(s.input_ids, s.advantage) for s in b.samples] == [(s.input_ids, s.advantage) for s in want.samples]
        assert (b.num_tokens, b.num_seqs, b.skipped) == (want.num_tokens, want.num_seqs, []) == (6, 3, [])
    out = {}
    for name, batch in batches.items():
        lrn = Learner(tiny_model_path, mcfg, algo, threads=1, shm_dir=str(tmp_path / name))
        try:
            out[name] = lrn.step(batch)["loss/policy"]
        finally:
            lrn.shutdown()
    assert out["failed"] == out["failed_with_a_reward"] == out["without"]
    assert out["scored_0"] != pytest.approx(out["without"], abs=1e-3)


def test_a_loss_that_needs_the_reference_gets_one(tmp_path, tiny_model_path, monkeypatch):
    """needs = {"ref_logprobs"} without a KL term: the learner keeps a reference and passes its log-probs."""
    (tmp_path / "ref_losses.py").write_text(
        "from rl.algos.policy_losses import PolicyLoss\n"
        "class RefPull(PolicyLoss):\n"
        "    needs = frozenset({'ref_logprobs'})\n"
        "    seen = []\n"
        "    @property\n"
        "    def stat_names(self):\n"
        "        return ('ref/gap',)\n"
        "    def __call__(self, x):\n"
        "        RefPull.seen.append(x.ref_logp is not None and x.engine_logp is None and x.entropy is None)\n"
        "        gap = x.aggregate(x.logp - x.ref_logp)\n"
        "        return -x.aggregate(x.advantages * x.logp) + 0.1 * gap, {'ref/gap': float(gap)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from rl.trainer.learner import Learner

    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2), loss=LossConfig(policy="ref_losses.RefPull"))
    mcfg = ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False)
    lrn = Learner(tiny_model_path, mcfg, algo, threads=1, shm_dir=str(tmp_path / "shm"))
    try:
        assert lrn.has_ref and lrn.ref is not None
        m = lrn.step(_batch())
        import ref_losses

        assert ref_losses.RefPull.seen and all(ref_losses.RefPull.seen)
        assert m["ref/gap"] == pytest.approx(0.0, abs=1e-6)  # the policy is the reference before its first update
        assert m["kl/coef"] == 0.0
    finally:
        lrn.shutdown()
