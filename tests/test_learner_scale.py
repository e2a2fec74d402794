"""Activation checkpointing and measured precision of the learner (tiny model, in-process)."""

from __future__ import annotations

import time

import pytest
import torch

from bench import padded_layout
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


def test_activation_checkpointing_gives_the_same_update_with_a_packed_shared_prompt(
    tiny_model_path, tiny_tokenizer, tmp_path
):
    """Also with a shared prompt: packed, a group is one sequence under a mask (no key/value cache a
    recomputed layer could write twice), so checkpointing it recomputes the same values."""
    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2), kl=KLConfig(coef=0.1))
    plain = _learner(tiny_model_path, tmp_path, "a", LearnerConfig(share_prompt=True), algo)
    ckpt = _learner(
        tiny_model_path,
        tmp_path,
        "b",
        LearnerConfig(share_prompt=True, activation_checkpointing=True),
        algo,
    )
    try:
        for lrn in (plain, ckpt):
            use_sgd(lrn)
        batch = make_batch(tiny_tokenizer)
        assert len({tuple(s.input_ids[: s.prompt_len]) for s in batch.samples}) < len(batch.samples), "groups share"
        m1, m2 = plain.step(batch), ckpt.step(make_batch(tiny_tokenizer))
        assert m2["grad/norm"] == pytest.approx(m1["grad/norm"], rel=1e-5)
        pa, pb = params(plain), params(ckpt)
        for k in pa:
            torch.testing.assert_close(pb[k], pa[k], rtol=0, atol=1e-6)
        # The padded layout's prompt cache cannot be recomputed: refused, not wrong.
        padded_layout.use(ckpt)
        with pytest.raises(RuntimeError, match="needs the packed layout"):
            ckpt.step(make_batch(tiny_tokenizer))
    finally:
        plain.shutdown()
        ckpt.shutdown()


def test_recipe_accepts_activation_checkpointing_with_a_shared_prompt(recipe_copy):
    path = recipe_copy("tiny.yaml")
    with pytest.raises(RecipeError, match="learner.precision"):
        load_recipe(path, ["learner.precision=fast"])
    for share in ("true", "false"):
        validate_recipe(
            load_recipe(
                path,
                ["learner.activation_checkpointing=true", f"learner.share_prompt={share}", "learner.precision=auto"],
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


@pytest.fixture
def fake_timing(monkeypatch):
    """matmul_gflops replaced by set rates; counts the timings; the per-process cache emptied around the test."""
    rates = {torch.float32: 100.0, torch.bfloat16: 50.0}
    calls: list[torch.dtype] = []

    def fake(dtype, n=1024, seconds=0.4, device="cpu"):
        calls.append(dtype if n == 1024 else (dtype, n))
        return rates[dtype]

    monkeypatch.setattr(precision, "matmul_gflops", fake)
    precision.timed_choice.cache_clear()
    yield rates, calls
    precision.timed_choice.cache_clear()


def test_the_resolved_precision_is_said_on_stderr_so_stdout_stays_the_commands_output(recipe_copy, fake_timing, capsys):
    """The runtimes' start-up line goes to stderr: ``jointrl eval`` prints its JSON summary on stdout, and a
    caller that parses it (bench/vs_trl.py) must not read the precision line first."""
    cfg = load_recipe(recipe_copy("tiny.yaml"), ["learner.precision=auto", "model.engine_dtype=auto"])
    got = precision.resolve_logged(cfg, "cpu")
    out, err = capsys.readouterr()
    assert got.learner.precision == "manual"
    assert out == "" and err.startswith("jointrl: precision auto: fp32 (matmul fp32 100 GFLOP/s")


def test_engine_dtype_auto_follows_the_learner_timing(recipe_copy, fake_timing):
    rates, calls = fake_timing
    cfg = load_recipe(recipe_copy("tiny.yaml"), ["learner.precision=auto", "model.engine_dtype=auto"])
    got, note = precision.resolve(cfg, "cpu")
    assert (got.model.engine_dtype, got.model.autocast, got.learner.precision) == ("float32", False, "manual")
    assert note == (
        "precision auto: fp32 (matmul fp32 100 GFLOP/s, bf16 50 GFLOP/s); engine_dtype auto: float32; "
        "reference_dtype auto: float32"
    )
    assert got.model.reference_dtype == "float32"
    again, _ = precision.resolve(cfg, "cpu")  # one timing per process: the learner and the engines share it
    # bf16 first on a 256^3 product (not far below fp32's rate here), then timed at 1024^3
    assert again == got and calls == [torch.float32, (torch.bfloat16, 256), torch.bfloat16]
    rates[torch.bfloat16] = 300.0
    precision.timed_choice.cache_clear()
    got, _ = precision.resolve(cfg, "cpu")
    assert (got.model.engine_dtype, got.model.autocast, got.model.reference_dtype) == ("bfloat16", True, "bfloat16")


def test_a_far_slower_bf16_is_settled_by_a_small_product(fake_timing):
    """A CPU without bf16 instructions ran a bf16 1024^3 product in 2.4 s (1 GFLOP/s against fp32's 150): a
    256^3 product decides that without one; a bf16 rate near fp32's is still timed at full size."""
    rates, calls = fake_timing
    rates[torch.bfloat16] = 100.0 / precision._PROBE_MARGIN - 1
    choice = precision.pick(torch.device("cpu"))
    assert not choice.autocast and calls == [torch.float32, (torch.bfloat16, 256)]
    assert choice.bf16_gflops == rates[torch.bfloat16]
    calls.clear()
    precision.timed_choice.cache_clear()
    rates[torch.bfloat16] = 100.0 / precision._PROBE_MARGIN + 1
    assert not precision.pick(torch.device("cpu")).autocast
    assert calls == [torch.float32, (torch.bfloat16, 256), torch.bfloat16]


def test_matmul_rate_comes_back_when_one_product_spends_the_budget():
    """With a budget no timed repeat fits in, one product after the warm-up is timed (once 0 GFLOP/s)."""
    rate = precision.matmul_gflops(torch.float32, n=128, seconds=0.0)
    assert 0.0 < rate < float("inf")


def test_matmul_rate_leaves_out_the_first_products_one_time_costs(monkeypatch):
    """A first bf16 product slower than the probe's whole budget (kernel generation, first-touch pages) is not
    the rate: read from it alone, a fast bf16 path could fall 8x below fp32 and pin fp32 for a whole run."""
    real = torch.autocast
    entered = []

    class SlowFirst:
        def __init__(self, *a, **k):
            self.inner = real(*a, **k)

        def __enter__(self):
            if not entered:
                time.sleep(0.3)  # the first product's one-time cost, over the 0.05 s budget
            entered.append(1)
            return self.inner.__enter__()

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    monkeypatch.setattr(torch, "autocast", SlowFirst)
    rate = precision.matmul_gflops(torch.bfloat16, n=128, seconds=0.05)
    assert len(entered) >= 2, "a product after the warm-up was timed"
    # 2 * 128^3 flops in 0.3 s is 0.014 GFLOP/s; any timed product without the sleep runs far above that
    assert rate > 10 * (2 * 128**3 / 0.3 / 1e9)


def test_reference_dtype_auto_follows_the_learners_precision(tiny_model_path, tmp_path):
    """A bf16 reference on a CPU without fast bf16 ran its forward 4.6x slower than fp32 (SmolLM2, 512
    tokens, AMD EPYC): `auto` runs it at the learner's precision on CPU (bf16 on a GPU, where it is fast);
    a dtype set by hand is kept."""
    import dataclasses

    algo = AlgoConfig(name="grpo", kl=KLConfig(coef=0.1))
    for autocast, set_by_hand, want in (
        (False, "auto", torch.bfloat16 if torch.cuda.is_available() else torch.float32),
        (True, "auto", torch.bfloat16),
        (False, "bfloat16", torch.bfloat16),
    ):
        cfg = dataclasses.replace(MODEL_CFG, autocast=autocast, reference_dtype=set_by_hand)
        lrn = Learner(tiny_model_path, cfg, algo, threads=1, shm_dir=str(tmp_path / f"r{autocast}{set_by_hand}"))
        try:
            assert next(lrn.ref.parameters()).dtype == want
        finally:
            lrn.shutdown()


def test_engine_dtype_auto_without_timing(recipe_copy, fake_timing):
    """GPU: bfloat16 untimed; CPU with a hand-set learner precision: bfloat16 (the former default), untimed;
    no `auto`: the recipe unchanged."""
    _, calls = fake_timing
    cfg = load_recipe(recipe_copy("tiny.yaml"), ["learner.precision=auto", "model.engine_dtype=auto"])
    got, note = precision.resolve(cfg, "gpu")
    assert got.model.engine_dtype == "bfloat16" and got.learner.precision == "auto" and "GPU" in note
    manual = load_recipe(recipe_copy("tiny.yaml"), ["model.engine_dtype=auto"])
    assert precision.resolve(manual, "cpu")[0].model.engine_dtype == "bfloat16"
    plain = load_recipe(recipe_copy("tiny.yaml"))
    assert precision.resolve(plain, "cpu") == (plain, "")
    assert calls == []
    with pytest.raises(RecipeError, match="model.engine_dtype"):
        load_recipe(recipe_copy("tiny.yaml"), ["model.engine_dtype=fp8"])


def test_local_runtime_resolves_auto_once(recipe_copy, tiny_model_path, fake_timing, capsys):
    """The runtime makes `auto` concrete before the engine and the learner exist: the engine's weights are
    float32 when fp32 timed faster, the learner runs fp32 and does not time again; logged once."""
    from rl.driver.local_runtime import LocalRuntime

    _, calls = fake_timing
    cfg = load_recipe(recipe_copy("tiny.yaml"), ["learner.precision=auto", "model.engine_dtype=auto"])
    rt = LocalRuntime(cfg, tiny_model_path)
    rt.start()
    try:
        assert rt.cfg.model.engine_dtype == "float32"
        assert next(rt.worker.engine.model.parameters()).dtype == torch.float32
        assert rt.learner.use_autocast is False and rt.learner.precision_note == ""
        assert calls == [torch.float32, (torch.bfloat16, 256), torch.bfloat16]  # timed once
        assert capsys.readouterr().err.count("engine_dtype auto: float32") == 1  # on stderr
        rt.sync_weights()  # the export in the resolved dtype
    finally:
        rt.stop()


def test_fsdp_always_shards_a_single_learner_with_the_same_update_export_and_resume(
    tiny_model_path, tiny_tokenizer, tmp_path
):
    """``learner.fsdp: always`` at one worker: FSDP2 over a process group of one (the GPU smoke test's path).
    The update, the exported weights and a checkpoint round trip match the unsharded learner's."""
    from safetensors.torch import load_file

    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3), kl=KLConfig(coef=0.1))
    plain = _learner(tiny_model_path, tmp_path, "a", LearnerConfig(share_prompt=True), algo)
    sharded = _learner(tiny_model_path, tmp_path, "b", LearnerConfig(share_prompt=True, fsdp="always"), algo)
    try:
        assert sharded.sharded and not plain.sharded
        assert torch.distributed.is_initialized() and torch.distributed.get_world_size() == 1
        assert all(hasattr(p, "full_tensor") for p in sharded.model.parameters()), "every parameter a DTensor"
        for _ in range(2):  # AdamW, two steps: its state is sharded too
            m1, m2 = plain.step(make_batch(tiny_tokenizer)), sharded.step(make_batch(tiny_tokenizer))
            assert m2["grad/norm"] == pytest.approx(m1["grad/norm"], rel=1e-4)
            assert m2["loss/kl"] == pytest.approx(m1["loss/kl"], rel=1e-4, abs=1e-8)
        a, b = load_file(plain.export_weights("float32")), load_file(sharded.export_weights("float32"))
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=2e-6)
        sharded.save_checkpoint(str(tmp_path / "ckpt"))
        ref = sharded.step(make_batch(tiny_tokenizer))
        sharded.load_checkpoint(str(tmp_path / "ckpt"))
        again = sharded.step(make_batch(tiny_tokenizer))
        assert again["grad/norm"] == pytest.approx(ref["grad/norm"], rel=1e-6)
        assert again["loss/policy"] == pytest.approx(ref["loss/policy"], rel=1e-6, abs=1e-9)
    finally:
        plain.shutdown()
        sharded.shutdown()
    assert not torch.distributed.is_initialized(), "shutdown leaves the process group"


def test_two_ranks_without_a_rendezvous_port_fail_clearly(tiny_model_path, tmp_path):
    """Only a process group of one picks its own port: 2+ ranks each picking one would wait for each other."""
    algo = AlgoConfig(name="grpo")
    with pytest.raises(ValueError, match="rendezvous port"):
        Learner(tiny_model_path, MODEL_CFG, algo, threads=1, shm_dir=str(tmp_path / "x"), world_size=2, dist_port=0)
