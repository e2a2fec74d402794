"""Activation checkpointing and measured precision of the learner (tiny model, in-process)."""

from __future__ import annotations


import pytest
import torch

from rl.config.recipe import AlgoConfig, KLConfig, LearnerConfig, OptimConfig, RecipeError, load_recipe, validate_recipe
from rl.trainer import precision
from rl.trainer.learner import Learner
from test_learner import MODEL_CFG, make_batch, params, use_sgd


def _learner(path, tmp_path, name, learner, algo):
    return Learner(path, MODEL_CFG, algo, threads=1, shm_dir=str(tmp_path / name), learner=learner)


def test_activation_checkpointing_gives_the_same_update(tiny_model_path, tiny_tokenizer, tmp_path):
    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2), kl=KLConfig(coef=0.1))
    plain = _learner(tiny_model_path, tmp_path, "a", LearnerConfig(share_prompt=False), algo)
    ckpt = _learner(
        tiny_model_path, tmp_path, "b", LearnerConfig(share_prompt=False, activation_checkpointing=True), algo
    )
    try:
        assert ckpt.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
        for lrn in (plain, ckpt):
            use_sgd(lrn)
        m1, m2 = plain.step(make_batch(tiny_tokenizer)), ckpt.step(make_batch(tiny_tokenizer))
        assert m2["grad/norm"] == pytest.approx(m1["grad/norm"], rel=1e-5)
        assert m2["loss/kl"] == pytest.approx(m1["loss/kl"], abs=1e-7)
        pa, pb = params(plain), params(ckpt)
        for k in pa:
            torch.testing.assert_close(pb[k], pa[k], rtol=0, atol=1e-6)
    finally:
        plain.shutdown()
        ckpt.shutdown()


def test_activation_checkpointing_refuses_a_shared_prompt(recipe_copy):
    path = recipe_copy("tiny.yaml")
    with pytest.raises(RecipeError, match="learner.activation_checkpointing: needs learner.share_prompt: false"):
        load_recipe(path, ["learner.activation_checkpointing=true", "learner.share_prompt=true"])
    with pytest.raises(RecipeError, match="learner.precision"):
        load_recipe(path, ["learner.precision=fast"])
    validate_recipe(
        load_recipe(
            path, ["learner.activation_checkpointing=true", "learner.share_prompt=false", "learner.precision=auto"]
        ),
        check_imports=False,
    )


def test_precision_auto_picks_the_faster_measured(tiny_model_path, tmp_path):
    c = precision.pick(torch.device("cpu"), seconds=0.1)
    assert c.fp32_gflops > 0 and c.bf16_gflops > 0
    assert c.autocast == (c.bf16_gflops > c.fp32_gflops)
    assert "GFLOP/s" in c.describe()
    lrn = _learner(tiny_model_path, tmp_path, "p", LearnerConfig(precision="auto"), AlgoConfig(name="grpo"))
    try:
        assert lrn.precision_note.startswith("precision auto: ")
        assert lrn.use_autocast == ("bf16 autocast" in lrn.precision_note)
    finally:
        lrn.shutdown()
