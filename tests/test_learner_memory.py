"""rl.trainer.memory (glibc malloc_trim / mallinfo2) and the learner's trim after each step."""

from __future__ import annotations

import ctypes

import pytest

from rl.algos.batch import Batch, Sample
from rl.config.recipe import AlgoConfig, ModelConfig, OptimConfig
from rl.trainer import memory
from rl.trainer.learner import Learner

glibc = pytest.mark.skipif(not memory.available(), reason="malloc_trim is glibc's")


@glibc
def test_trim_returns_freed_heap_pages_to_the_os():
    """Freed blocks below the mmap threshold stay resident until ``trim``: the learner's growth in miniature.

    One block allocated last stays live, so the heap's top is not free and glibc cannot shrink it on
    its own; only ``malloc_trim`` hands back the free pages below it. Fails when ``trim`` is a no-op.
    """
    libc = memory._libc()
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block, n = 64 * 1024, 1600  # 100 MiB in 64 KiB blocks: below glibc's default 128 KiB mmap threshold
    ptrs = [libc.malloc(block) for _ in range(n)]
    assert all(ptrs)
    for p in ptrs:
        ctypes.memset(p, 1, block)  # resident
    keep = libc.malloc(block)
    for p in ptrs:
        libc.free(p)
    try:
        held = memory.stats()
        before = memory.rss_bytes()
        assert memory.trim() is True
        after = memory.rss_bytes()
        if held is not None:  # glibc >= 2.33: the freed blocks were counted as free but held
            assert held["free_held"] >= 0.9 * n * block
        assert before - after >= 0.8 * n * block, (before, after)
    finally:
        libc.free(keep)


def test_trim_and_stats_are_no_ops_without_glibc(monkeypatch):
    memory._libc.cache_clear()
    monkeypatch.setattr(memory.platform, "libc_ver", lambda: ("", ""))
    try:
        assert memory.available() is False
        assert memory.trim() is False
        assert memory.stats() is None
    finally:
        memory._libc.cache_clear()


def _batch(tok) -> Batch:
    p = list(tok("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
    samples = [
        Sample(p + [11 + j, 12, 13], len(p), [1, 1, 1], [-1.0] * 3, (-1.0) ** j, "t", group_id=0, uid=j)
        for j in range(2)
    ]
    return Batch(samples, sum(s.num_tokens for s in samples), len(samples))


@pytest.mark.parametrize("on", [True, False])
def test_learner_trims_after_each_step_unless_switched_off(tiny_model_path, tmp_path, monkeypatch, on):
    calls = []
    cfg = ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False)
    lrn = Learner(
        tiny_model_path, cfg, AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3)), threads=1, shm_dir=str(tmp_path)
    )
    # counted from here: the trim after loading has its own test (test_learner_trims_after_loading_the_models)
    monkeypatch.setattr(memory, "trim", lambda: calls.append(1) or True)
    try:
        lrn.trim_after_step = on
        for _ in range(2):
            lrn.step(_batch(lrn.tokenizer))
        assert len(calls) == (2 if on else 0)
    finally:
        lrn.shutdown()


def test_learner_reports_its_resident_memory_after_a_step(tiny_model_path, tmp_path):
    cfg = ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False)
    lrn = Learner(
        tiny_model_path, cfg, AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3)), threads=1, shm_dir=str(tmp_path)
    )
    try:
        got = lrn.step(_batch(lrn.tokenizer))["memory/learner_rss_gb"] * 1e9
        now = memory.rss_bytes()
        assert got > 0 and abs(got - now) <= 0.1 * now, (got, now)  # this process's, read at the step's end
    finally:
        lrn.shutdown()


@pytest.mark.skipif(memory.allocator() != "glibc", reason="hold() tunes glibc's malloc")
def test_a_step_over_the_hold_budget_trims(tiny_model_path, tmp_path, monkeypatch):
    """Held (glibc), a step that ends above the budget trims and says so in ``memory/trimmed``."""
    cfg = ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False)
    lrn = Learner(
        tiny_model_path, cfg, AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3)), threads=1, shm_dir=str(tmp_path)
    )
    try:
        assert isinstance(lrn.hold_budget, memory.HoldBudget) and not lrn.trim_after_step
        calls = []
        monkeypatch.setattr(memory, "trim", lambda: calls.append(1) or True)
        for _ in range(2):  # the first two steps set the level
            assert lrn.step(_batch(lrn.tokenizer))["memory/trimmed"] == 0.0 and not calls
        lrn.hold_budget.level = 1 << 20  # as if the run had settled at 1 MiB: this process is far above it
        assert lrn.step(_batch(lrn.tokenizer))["memory/trimmed"] == 1.0 and calls == [1]
    finally:
        lrn.shutdown()


def test_learner_trims_after_loading_the_models(tiny_model_path, tmp_path, monkeypatch):
    """The pages freed while loading (and, sharded, the full copy each rank drops) go back before the first step."""
    calls = []
    monkeypatch.setattr(memory, "trim", lambda: calls.append(1) or True)
    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2))
    lrn = Learner(
        tiny_model_path,
        ModelConfig(path="embedded:tiny", learner_dtype="float32", autocast=False),
        algo,
        threads=1,
        shm_dir=str(tmp_path / "s"),
    )
    try:
        assert len(calls) == 1
    finally:
        lrn.shutdown()
