"""Routing replay on a sharded learner: the tiny MoE on 2 FSDP2 ranks (gloo, CPU) under ``learner.routing_replay``
none, r2 and r3 (docs/moe.md).

Each decoder layer is its own FSDP unit, the fused 3-D expert tensors (``mlp.experts.gate_up_proj``,
``down_proj``) sharded along the experts; each rank's update forces exactly the experts recorded for its shard
(r2: its own prepare pass's, r3: the samples'); and the 2-rank step equals the 1-rank step on the same batch
(SGD, fp32: loss, grad norm and routing metrics to rel 1e-5, gradients to rtol 1e-4 / atol 1e-7, weights to
atol 1e-5, the tolerances of the dense model's test in test_dp.py).
"""

from __future__ import annotations

import pytest
import torch

from conftest import gloo_ranks
from rl.algos.batch import Batch, Sample
from rl.config.recipe import AlgoConfig, LearnerConfig, ModelConfig, OptimConfig
from rl.trainer import moe
from rl.trainer.learner import Learner
from rl.trainer.sharding import shard_batch
from test_dp import _state, _use_sgd
from test_moe_replay import spy_forward

MODES = ("none", "r2", "r3")
ALGO = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3, max_grad_norm=0.0))
CHECKED = ("loss/policy", "grad/norm", "moe/layer_0/entropy", "moe/layer_1/max_mean", "moe/routing_disagreement")


def _mcfg(path: str) -> ModelConfig:
    return ModelConfig(path=path, learner_dtype="float32", autocast=False)


def _batch() -> Batch:
    """Four groups (one sample alone), each sample with an "engine" routing (2 layers, top-2 of 8; a group's
    members share their prompt's rows, as one engine ran the same prompt for each)."""
    g = torch.Generator().manual_seed(5)
    groups = [
        ([5, 6, 7], [[40, 41, 42, 43], [60, 61]], [1.0, -1.0]),
        ([9, 10], [[50, 51, 52], [53, 54]], [0.5, -0.5]),
        ([11, 12, 13, 14], [[70, 71], [72, 73, 74]], [-0.8, 0.8]),
        ([15, 16], [[80, 81, 82]], [0.3]),
    ]
    samples = []
    for gid, (prompt, responses, advs) in enumerate(groups):
        shared = None
        for resp, adv in zip(responses, advs):
            n = len(prompt) + len(resp)
            s = Sample(prompt + resp, len(prompt), [1] * len(resp), [-1.0] * len(resp), adv,
                       ("code", "tool")[gid % 2], group_id=gid, uid=len(samples))  # fmt: skip
            r = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(n * 2)]).reshape(n, 2, 2)
            s.routing = r.to(torch.uint8)
            if shared is None:
                shared = s.routing[: len(prompt)]
            s.routing[: len(prompt)] = shared
            samples.append(s)
    return Batch(
        samples, num_tokens=sum(s.num_tokens for s in samples), num_seqs=len(samples), domains=("code", "tool")
    )


def _forced_exactly(lrn: Learner, calls: list) -> tuple[int, bool]:
    """(forwards that forced routing, whether each ran exactly the forced experts). A sharded rank may add
    one-token dummy calls after its real ones (``rl.trainer.fsdp.Lockstep``); those route on their own."""
    forced_calls, exact = 0, True
    for samples, forced, ran in calls:
        if forced is None:
            continue
        forced_calls += 1
        want = moe.gather(forced, lrn.fwd.rows(samples), (2, 2)).long()
        exact &= ran.shape[0] >= want.shape[0] and torch.equal(ran[: want.shape[0]], want)
    return forced_calls, exact


def test_meta_start_builds_fused_experts_from_per_expert_weights() -> None:
    """A sharded learner's meta start (``learner.meta_init``) reads each parameter by name; the checkpoint holds
    per-expert weights (``mlp.experts.<e>.gate_proj.weight`` ...) where the model has fused 3-D tensors, so they
    are built from those: the same tensors transformers' own loading gives."""
    from transformers import AutoModelForCausalLM

    from rl.trainer.hub import resolve_model
    from rl.trainer.models import _causal_lm, fill_from_checkpoint

    path = resolve_model("embedded:tiny-moe")
    meta = _causal_lm(path, torch.float32, torch.device("cpu"), meta=True)
    assert meta.model.layers[0].mlp.experts.gate_up_proj.device.type == "meta"
    fill_from_checkpoint(meta, path, torch.device("cpu"))
    want = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    got = meta.state_dict()
    assert got.keys() == want.keys() and "model.layers.1.mlp.experts.down_proj" in got
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def _rank(rank: int, ports: list[int], path: str, out: str) -> None:
    """One of 2 sharded learners (torch.multiprocessing): per mode one SGD step on its shard of ``_batch()``."""
    from torch.distributed.fsdp import FSDPModule

    results = {}
    for mode, port in zip(MODES, ports):
        lrn = Learner(path, _mcfg(path), ALGO, threads=1, rank=rank, world_size=2, dist_port=port,
                      shm_dir=f"{out}/{mode}{rank}", learner=LearnerConfig(routing_replay=mode))  # fmt: skip
        _use_sgd(lrn)
        layers = lrn.model.model.layers
        experts = [(layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj) for layer in layers]
        sharded = all(isinstance(layer, FSDPModule) for layer in layers) and all(
            hasattr(p, "to_local") and p.to_local().shape[0] == p.shape[0] // 2 and p.dim() == 3
            for pair in experts
            for p in pair
        )
        calls = spy_forward(lrn)
        shard = shard_batch(_batch(), 2)[rank]
        m = lrn.step(shard)
        forced, exact = _forced_exactly(lrn, calls)
        r3_is_samples = all(
            f is s.routing for samples, fr, _ in calls if fr is not None and mode == "r3" for s, f in zip(samples, fr)
        )
        state = _state(lrn)  # a collective: every rank gathers
        results[mode] = dict(metrics=m, state=state if rank == 0 else None, sharded=sharded, forced=forced,
                             exact=exact, r3_is_samples=r3_is_samples, samples=len(shard.samples))  # fmt: skip
        lrn.shutdown()
    torch.save(results, f"{out}/rank{rank}.pt")


@pytest.mark.slow
@gloo_ranks
def test_moe_replay_on_two_fsdp_ranks_equals_one_learner(tmp_path) -> None:
    import torch.multiprocessing as mp

    from rl.trainer.collectives import free_port
    from rl.trainer.hub import resolve_model

    path = resolve_model("embedded:tiny-moe")
    mp.spawn(_rank, args=([free_port() for _ in MODES], path, str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for mode in MODES:
        got = [r[mode] for r in ranks]
        assert all(g["sharded"] for g in got), mode  # per-layer units, experts split 4 + 4 over the ranks
        assert all(g["samples"] > 0 for g in got), mode  # both ranks computed part of the batch
        assert all(g["exact"] for g in got), mode
        if mode == "none":
            assert all(g["forced"] == 0 for g in got)
        else:  # every rank forced routing in its update forwards (r2 after its own prepare pass)
            assert all(g["forced"] > 0 for g in got), mode
            assert all(g["r3_is_samples"] for g in got)
        one = Learner(path, _mcfg(path), ALGO, threads=1, shm_dir=str(tmp_path / f"one_{mode}"),
                      learner=LearnerConfig(routing_replay=mode))  # fmt: skip
        try:
            _use_sgd(one)
            m1 = one.step(_batch())
            want = _state(one)
        finally:
            one.shutdown()
        m2 = got[0]["metrics"]
        assert m2["learner/updates"] == m1["learner/updates"] == 1
        for k in CHECKED:
            assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-7), (mode, k)
        if mode == "r3":
            assert m1["moe/routing_disagreement"] == 0.0
        state = got[0]["state"]
        assert state.keys() == want.keys() and "grad.model.layers.0.mlp.experts.gate_up_proj" in want
        for k, v in want.items():
            tol = dict(rtol=1e-4, atol=1e-7) if k.startswith("grad.") else dict(rtol=0, atol=1e-5)
            torch.testing.assert_close(state[k], v, **tol, msg=lambda msg, k=k, mode=mode: f"{mode} {k}: {msg}")
