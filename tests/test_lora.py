"""LoRA through peft on the tiny model, in-process, float32 without autocast.

Only the adapters change and hold optimizer state; the engines' export is base + (alpha/r) B A
computed by hand; the KL reference is the base with adapters disabled (no second copy);
checkpoints hold the adapters and resume exactly; bad target modules are refused by name.
"""

from __future__ import annotations


import pytest
import torch
from safetensors.torch import load_file

from rl.config.recipe import AlgoConfig, KLConfig, LearnerConfig, LoraConfig, OptimConfig, RecipeError
from rl.trainer import lora
from rl.trainer.learner import Learner
from test_learner import ALGO, MODEL_CFG, make_batch, make_learner  # noqa: F401 - make_learner: the fixture

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
LORA_LEARNER = LearnerConfig(lora=LORA)


def kl_algo(coef: float) -> AlgoConfig:
    return AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2), kl=KLConfig(coef=coef))


@pytest.fixture
def make(make_learner):
    """LoRA learners on the tiny model (``test_learner.make_learner`` with ``learner.lora`` set)."""
    return lambda algo=ALGO, seed=0: make_learner(algo, seed, learner=LORA_LEARNER)


def _named(lrn: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lrn.model.named_parameters()}


def test_only_adapters_train(make, tiny_tokenizer):
    lrn = make()
    trainable = {k for k, v in lrn.model.named_parameters() if v.requires_grad}
    assert trainable and all(".lora_A." in k or ".lora_B." in k for k in trainable)
    # 3 target kinds x 2 layers x (A, B)
    assert len(trainable) == 12
    before = _named(lrn)
    m = lrn.step(make_batch(tiny_tokenizer))
    assert m["learner/updates"] == 1
    after = _named(lrn)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and changed <= trainable
    # B starts at 0, so A has no gradient in the first step: only B moves; from the second step on both do.
    assert all(".lora_B." in k for k in changed)
    lrn.step(make_batch(tiny_tokenizer))
    after2 = _named(lrn)
    changed = {k for k in before if not torch.equal(before[k], after2[k])}
    assert changed == trainable
    state = lrn.opt.state_dict()["state"]
    n_adapter = sum(v.numel() for k, v in lrn.model.named_parameters() if v.requires_grad)
    n_state = sum(s["exp_avg"].numel() for s in state.values())
    assert n_state == n_adapter  # optimizer state for the adapters only
    assert n_adapter < 0.05 * sum(v.numel() for v in lrn.model.parameters())


def test_export_is_base_plus_scaled_ba(make, tiny_tokenizer, tiny_model_path):
    from transformers import AutoModelForCausalLM

    lrn = make()
    for _ in range(2):
        lrn.step(make_batch(tiny_tokenizer))
    sd = load_file(lrn.export_weights("float32"))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
    assert set(sd) == set(base) | {"lm_head.weight"}
    scale = LORA.alpha / LORA.rank
    params = dict(lrn.model.named_parameters())
    for name in base:
        mod = name.rsplit(".", 1)[0]
        if mod.split(".")[-1] in LORA.target_modules and name.endswith(".weight"):
            a = params[f"{mod}.lora_A.default.weight"].detach().cpu()  # the learner's device may be a GPU
            b = params[f"{mod}.lora_B.default.weight"].detach().cpu()
            want = base[name] + scale * (b @ a)
            assert not torch.equal(sd[name], base[name]), name
            torch.testing.assert_close(sd[name], want, rtol=0, atol=1e-6)
        else:
            assert torch.equal(sd[name], base[name]), name


def test_kl_reference_is_the_base_without_a_copy(make, tiny_tokenizer):
    lrn = make(kl_algo(0.1))
    assert lrn.ref is None and lrn.has_ref
    m1 = lrn.step(make_batch(tiny_tokenizer))
    assert m1["kl/mean"] == 0.0  # B = 0 at start: the policy is the base
    m2 = lrn.step(make_batch(tiny_tokenizer))
    assert m2["kl/mean"] > 0.0
    # the reference forward (adapters disabled) leaves the adapters enabled afterwards
    batch = make_batch(tiny_tokenizer)
    s = batch.samples[0]
    with lrn._reference() as ref:
        base_lp = Learner.logprobs(lrn, s.input_ids[: s.prompt_len], s.input_ids[s.prompt_len :])
        assert ref is lrn.model
    now = lrn.logprobs(s.input_ids[: s.prompt_len], s.input_ids[s.prompt_len :])
    assert base_lp != now


def test_checkpoint_holds_adapters_and_resumes(make, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    a = make()
    a.step(make_batch(tiny_tokenizer))
    ck = tmp_path / "ck"
    a.save_checkpoint(str(ck), export_dtype="float32")  # with the HF export (a run's last checkpoint)
    assert (ck / "adapter" / "adapter_config.json").is_file()
    exported = load_file(a.export_weights("float32"))
    hf = AutoModelForCausalLM.from_pretrained(ck / "model", dtype=torch.float32)
    for k, v in hf.state_dict().items():
        assert torch.equal(v, exported[k]), k  # the HF folder is the merged policy
    import torch.distributed.checkpoint as dcp

    keys = set(dcp.FileSystemReader(str(ck / "dcp")).read_metadata().state_dict_metadata)
    model_keys = {k for k in keys if k.startswith("model.")}
    assert model_keys and all(".lora_" in k for k in model_keys), sorted(k for k in model_keys if ".lora_" not in k)
    b = make(seed=3)
    b.load_checkpoint(str(ck))
    a.step(make_batch(tiny_tokenizer))
    b.step(make_batch(tiny_tokenizer))
    pa, pb = _named(a), _named(b)
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k


def test_bad_target_modules_are_named(tiny_model_path):
    with pytest.raises(RecipeError, match=r"learner\.lora\.target_modules: \['c_attn'\]"):
        lora.check_targets(tiny_model_path, LoraConfig(rank=4, target_modules=["q_proj", "c_attn"]))
    lora.check_targets(tiny_model_path, LORA)  # fine
    lora.check_targets(tiny_model_path, LoraConfig(rank=0, target_modules=["nope"]))  # off: not checked
