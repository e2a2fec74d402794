"""Start-up that scales (``learner.meta_init``, ``learner.cpu_offload``; ``rl.trainer.models``).

A sharded learner built on the meta device and filled slice by slice from the safetensors files takes the
same first step as one that loads the whole model (same metrics, same updated weights); LoRA adapters start
the same on both paths; CPU offload (FSDP2's ``CPUOffloadPolicy``, unpinned on a CPU host) gives the same update
as without it, at 1 rank and at 2 (gloo); on an unsharded learner it is refused naming the key.
"""

from __future__ import annotations

import pytest
import torch
from conftest import gloo_ranks
from test_learner import MODEL_CFG, make_batch

from rl.config.recipe import AlgoConfig, KLConfig, LearnerConfig, LoraConfig, OptimConfig
from rl.trainer.learner import Learner

ALGO = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3), kl=KLConfig(coef=0.1))
KEYS = ("loss/policy", "loss/kl", "kl/mean", "grad/norm")


def _first_step(path, tok, tmp_path, name, **knobs):
    """(initial full weights, first step's metrics, updated full weights) of a learner with ``fsdp: always``."""
    lrn = Learner(
        path, MODEL_CFG, ALGO, threads=1, shm_dir=str(tmp_path / name), learner=LearnerConfig(fsdp="always", **knobs)
    )
    try:
        assert lrn.sharded and all(hasattr(p, "full_tensor") for p in lrn.model.parameters())
        assert not any(p.device.type == "meta" for p in lrn.model.parameters())
        full = {k: v.full_tensor().detach().clone() for k, v in lrn.model.named_parameters()}
        ref = {k: v.full_tensor().detach().clone() for k, v in lrn.ref.named_parameters()} if lrn.ref else {}
        buffers = {k: v.detach().clone() for k, v in lrn.model.named_buffers()}
        m = lrn.step(make_batch(tok))
        after = {k: v.full_tensor().detach().clone() for k, v in lrn.model.named_parameters()}
        return {"init": full, "ref": ref, "buffers": buffers}, m, after
    finally:
        lrn.shutdown()


def _same(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("lora", [False, True])
def test_meta_start_gives_the_same_first_step(tiny_model_path, tiny_tokenizer, tmp_path, lora):
    """meta_init (the default) against the whole-model load: same weights (and rotary buffers) before the step,
    same metrics and same updated weights after it; with LoRA the same adapters."""
    knobs = {"lora": LoraConfig(rank=4, alpha=8.0)} if lora else {}
    s_full, m_full, a_full = _first_step(tiny_model_path, tiny_tokenizer, tmp_path, "full", meta_init=False, **knobs)
    s_meta, m_meta, a_meta = _first_step(tiny_model_path, tiny_tokenizer, tmp_path, "meta", meta_init=True, **knobs)
    for part in ("init", "ref", "buffers"):
        _same(s_full[part], s_meta[part])
    assert any(k.endswith("inv_freq") for k in s_meta["buffers"]), "the rotary frequencies are real buffers"
    if lora:
        assert any(".lora_A." in k for k in s_meta["init"])
        assert all(v.abs().sum() > 0 for k, v in s_meta["init"].items() if ".lora_A." in k)
    for k in KEYS:
        assert m_meta[k] == pytest.approx(m_full[k], rel=1e-6, abs=1e-9), k
    _same(a_full, a_meta, atol=1e-7)
    assert any(not torch.equal(a_meta[k], s_meta["init"][k]) for k in a_meta), "the step changed the weights"


def test_meta_start_reads_the_checkpoint_not_a_random_init(tiny_model_path, tmp_path):
    """The meta-built weights are the checkpoint's, tensor for tensor (not the config's random init)."""
    from safetensors.torch import load_file

    from rl.trainer import models

    model = models._causal_lm(tiny_model_path, torch.float32, torch.device("cpu"), meta=True)
    assert all(p.device.type == "meta" for p in model.parameters())
    models.fill_from_checkpoint(model, tiny_model_path, torch.device("cpu"))
    want = load_file(f"{tiny_model_path}/model.safetensors")
    got = dict(model.named_parameters())
    for k, v in want.items():
        if k in got:
            torch.testing.assert_close(got[k], v.float(), rtol=0, atol=0)


def test_meta_start_names_a_parameter_missing_from_the_files(tiny_model_path, tmp_path):
    """A checkpoint without one of the model's weights: the error names the parameter and the folder."""
    import shutil

    from safetensors.torch import load_file, save_file

    from rl.trainer import models

    bad = tmp_path / "bad"
    shutil.copytree(tiny_model_path, bad)
    sd = load_file(str(bad / "model.safetensors"))
    gone = next(k for k in sd if "layers.0.mlp" in k)
    del sd[gone]
    save_file(sd, str(bad / "model.safetensors"), metadata={"format": "pt"})
    model = models._causal_lm(str(bad), torch.float32, torch.device("cpu"), meta=True)
    with pytest.raises(KeyError, match=gone.replace(".", r"\.")):
        models.fill_from_checkpoint(model, str(bad), torch.device("cpu"))


def test_cpu_offload_where_it_cannot_run_is_refused(tiny_model_path, tmp_path, recipe_copy):
    """On an unsharded learner ``learner.cpu_offload`` fails naming the key: at validate time and when a learner
    is built directly. A sharded one on CPU is accepted (it runs: the tests below)."""
    from rl.config.recipe import RecipeError, load_recipe, validate_recipe

    with pytest.raises(ValueError, match=r"learner\.cpu_offload: .*not sharded"):
        Learner(tiny_model_path, MODEL_CFG, ALGO, threads=1, learner=LearnerConfig(cpu_offload=True))
    cfg = load_recipe(recipe_copy(), ["learner.cpu_offload=true"])
    with pytest.raises(RecipeError, match=r"learner\.cpu_offload.*not sharded"):
        validate_recipe(cfg)
    validate_recipe(
        load_recipe(recipe_copy(), ["learner.cpu_offload=true", "learner.fsdp=always", "cluster.device=cpu"])
    )


def test_cpu_offload_gives_the_same_update(tiny_model_path, tiny_tokenizer, tmp_path):
    """The first step with parameters, gradients and optimizer state offloaded (a process group of one; on CPU
    unpinned) equals the step without."""
    s0, m0, a0 = _first_step(tiny_model_path, tiny_tokenizer, tmp_path, "plain")
    s1, m1, a1 = _first_step(tiny_model_path, tiny_tokenizer, tmp_path, "offload", cpu_offload=True)
    _same(s0["init"], s1["init"])
    for k in KEYS:
        assert m1[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-8), k
    _same(a0, a1, atol=1e-6)


def _offload_rank(rank: int, port: int, path: str, out: str, offload: bool) -> None:
    """One of 2 FSDP learners (gloo): one AdamW step on its half of the same batch; rank 0 saves the metrics and
    the full weights before and after."""
    from transformers import AutoTokenizer

    from rl.trainer.sharding import shard_batch
    from test_dp import dp_batch, rank_learner

    tok = AutoTokenizer.from_pretrained(path)
    lrn = rank_learner(path, rank, port, out, ALGO, LearnerConfig(cpu_offload=offload))
    try:
        before = {k: v.full_tensor().detach().clone() for k, v in lrn.model.named_parameters()}
        m = lrn.step(shard_batch(dp_batch(tok, False), 2)[rank])
        after = {k: v.full_tensor().detach().clone() for k, v in lrn.model.named_parameters()}
        where = {p.to_local().device.type for p in lrn.model.parameters()}
        if rank == 0:
            torch.save({"m": m, "before": before, "after": after, "where": where}, f"{out}/rank0.pt")
    finally:
        lrn.shutdown()


@pytest.mark.slow
@gloo_ranks
def test_cpu_offload_gives_the_same_update_on_two_ranks(tiny_model_path, tmp_path):
    """2 FSDP ranks over gloo, the same batch: the AdamW update with CPU offload equals the one without (metrics
    to float rounding, weights within 1e-6), the offloaded shards on the CPU."""
    import torch.multiprocessing as mp

    from rl.trainer.collectives import free_port

    runs = {}
    for offload in (False, True):
        d = tmp_path / ("offload" if offload else "plain")
        d.mkdir()
        mp.spawn(_offload_rank, args=(free_port(), tiny_model_path, str(d), offload), nprocs=2)
        runs[offload] = torch.load(d / "rank0.pt", weights_only=False)
    plain, off = runs[False], runs[True]
    assert off["where"] == {"cpu"}
    _same(plain["before"], off["before"])
    for k in KEYS:
        assert off["m"][k] == pytest.approx(plain["m"][k], rel=1e-5, abs=1e-8), k
    _same(plain["after"], off["after"], atol=1e-6)
    assert any(not torch.equal(off["after"][k], off["before"][k]) for k in off["after"]), "the step changed weights"
