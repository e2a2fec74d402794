"""How far one learner step is from the host's matmul floor.

One quickstart-shaped learner step (``--prompts`` groups of ``--group`` completions, a
``--prompt-len``-token prompt and responses of up to ``--resp-len`` tokens; random token ids,
GRPO, ``--kl-coef``) on one model (default SmolLM2-135M), in one run:

1. FLOPs of the step, counted from the passes the learner runs (``Learner.needs_prepare``,
   ``learner.share_prompt``, the reference only with a KL term): per token through the decoder,
   ``2 x N_layer_params`` for a forward and twice that for a backward, plus attention's
   ``4 x layers x H x context`` per token (scores and values); ``lm_head`` only at response
   positions (``2 x H x V`` each, three times with its backward). Forward passes: the policy
   (and the prepare pass's old log-probs when the step needs one) and the reference; backward:
   the policy's.
2. The host's matmul rate at the precision the step uses (``rl.trainer.precision.matmul_gflops``:
   fp32, or bf16 under autocast), measured in the same run before and after every step (the host
   is shared: one measurement can land beside another job); the floor uses the median, and the
   table's header gives the min and max.
3. The learner step's wall time (after one warm-up step), and the ratio step / floor, for each
   shared-prompt layout of ``--layouts`` side by side in the same process (``packed``: a group's
   prompt and responses in one trunk call without padding, ``rl.trainer.packing``, the learner's
   default; ``padded``: a prompt call, then the responses padded to the group's longest), their
   timed steps alternating over ``--rounds`` rounds on the same batches. The FLOPs are the same for
   both: they count the tokens that count (a shared prompt once, no padding).
4. A second rate, beside (never instead of) the square one: the host's rate on the step's own
   GEMM shapes (``shape_gflops``: each linear layer's forward and its two backward products at
   the token counts a trunk call runs, and ``lm_head`` at a micro-batch's response tokens), with
   the floor and ratio it gives: how much of the gap is small matmuls running below the host's
   square-matmul rate. Each layout has its own shapes (packed: one call of a group's packed length),
   timed right after each of its steps (the median is used).
5. With ``--profile``, one more step under ``torch.profiler``: the ops that took the step's time
   (self CPU time), grouped into matmul, attention, optimizer and the rest, and the top ops.

It does not count elementwise work (norms, activations, softmax), so the floor is a lower bound.
Run it under the shared heavy-job lock; ``--results`` appends the table to bench/RESULTS.md.
"""

from __future__ import annotations

import os as _os

# What a learner actor gets (learner.huge_pages, the default: rl.trainer.memory.learner_env); torch
# reads it at its first allocation, so it is set before torch is imported. THP_MEM_ALLOC_ENABLE=0 in the
# environment measures 4 KB pages instead.
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

if __name__ == "__main__":  # the learner actor's malloc (learner.allocator; --allocator): read at exec
    from _actor_env import reexec_with_allocator

    reexec_with_allocator()

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import padded_layout  # noqa: E402  (the padded layout compared with packed)
from bench.learner_memory import _batch  # noqa: E402  (the same synthetic quickstart batch)


def step_flops(cfg: dict, samples: list, *, share_prompt: bool, backward: bool = True) -> float:
    """FLOPs of one pass of the policy over ``samples`` (forward, plus backward when ``backward``)."""
    h, i, layers, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    kv = h * cfg.get("num_key_value_heads", heads) // heads
    per_layer = h * h * 2 + 2 * h * kv + 3 * h * i  # q, o; k, v; gate, up, down
    mult = 3 if backward else 1  # backward = 2 x forward
    tokens = 0.0
    attn = 0.0
    seen: set = set()
    for s in samples:
        key = tuple(s.input_ids[: s.prompt_len])
        if share_prompt and key in seen:
            run = range(s.prompt_len, len(s.input_ids))  # the prompt ran once for the group
        else:
            run = range(len(s.input_ids))
            seen.add(key)
        tokens += len(run)
        attn += sum(pos + 1 for pos in run)
    resp_tokens = sum(s.num_tokens for s in samples)
    body = 2 * per_layer * layers * tokens + 4 * layers * h * attn
    head = 2 * h * v * resp_tokens
    return mult * (body + head)


def _gemm_shapes(cfg: dict, samples: list, micro_resp_tokens: int, packed: bool) -> list[tuple[int, int, int, float]]:
    """(M, K, N, weight) of the step's matmuls, forward-shaped and both backward-shaped: each linear
    layer at the token counts of a shared-prompt trunk call, weighted by how many such calls the step
    makes, and ``lm_head`` at a micro-batch's response tokens. Packed (the learner's layout; padded: ``bench/padded_layout.py``): one
    call per group of its packed length (``rl.trainer.packing``); padded: the prompt, then the group's
    responses padded to its longest (M: the groups' mean)."""
    from rl.trainer.packing import packed_length, prompt_groups

    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    kv = h * cfg.get("num_key_value_heads", heads) // heads
    gs = [[samples[b] for b in g] for g in prompt_groups(samples)]
    if packed:
        calls = [round(sum(packed_length(g) for g in gs) / len(gs))]
    else:
        resp = [len(g) * (max(len(s.input_ids) - s.prompt_len for s in g) - 1) for g in gs]
        calls = [round(sum(g[0].prompt_len for g in gs) / len(gs)), round(sum(resp) / len(resp))]
    linears = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]  # q, k, v, o, gate, up, down
    out = []
    for m in calls:
        for k, n in linears:
            out += [(m, k, n, 1.0), (m, n, k, 1.0), (k, m, n, 1.0)]  # y = xW; dx = dy W^T; dW = x^T dy
    out += [(micro_resp_tokens, h, v, 1.0), (micro_resp_tokens, v, h, 1.0), (h, micro_resp_tokens, v, 1.0)]
    return out


def shape_gflops(shapes: list[tuple[int, int, int, float]], seconds: float = 2.0, dtype=None) -> float:
    """Rate over ``shapes`` (total FLOPs / total best time) in ``dtype`` (default fp32; the step's
    precision: bf16 under autocast), each timed for its share of ``seconds``."""
    import torch

    dtype = dtype or torch.float32
    flops = tsum = 0.0
    for m, k, n, w in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        a @ b  # warm-up
        best, end = float("inf"), time.perf_counter() + seconds / len(shapes)
        while True:
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
            if time.perf_counter() > end:
                break
        flops += w * 2 * m * k * n
        tsum += w * best
    return flops / tsum / 1e9


_GROUPS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "attention": ("aten::_scaled_dot_product", "aten::_flash_attention", "aten::_efficient_attention"),
}


def profile_step(lrn, batch, top: int = 15) -> list[str]:
    """One learner step under ``torch.profiler`` (CPU): self time by op group and the top ops (markdown lines)."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        lrn.step(batch)
    wall = time.perf_counter() - t0
    ev = prof.key_averages()
    self_s = {e.key: e.self_cpu_time_total / 1e6 for e in ev}
    opt = sum(e.cpu_time_total for e in ev if e.key.startswith("Optimizer.step#")) / 1e6
    group = {g: sum(t for k, t in self_s.items() if k.startswith(names)) for g, names in _GROUPS.items()}
    total = sum(t for k, t in self_s.items() if k.startswith("aten::"))
    lines = [
        f"profiled step: {wall:.2f} s wall under the profiler; self CPU time of aten ops {total:.2f} s "
        "(summed over threads' ops as the profiler records them)",
        "",
        "| group | self s | share of aten self time |",
        "|---|---|---|",
    ]
    for g, t in group.items():
        lines.append(f"| {g} | {t:.2f} | {t / total:.0%} |")
    lines.append(f"| AdamW step (total, all its ops) | {opt:.2f} | {opt / total:.0%} |")
    rest = total - sum(group.values())
    lines += [f"| everything else | {rest:.2f} | {rest / total:.0%} |", "", "top ops by self CPU time:", ""]
    lines += ["| op | calls | self s | share |", "|---|---|---|---|"]
    for e in sorted(ev, key=lambda e: -e.self_cpu_time_total)[:top]:
        lines.append(
            f"| {e.key} | {e.count} | {e.self_cpu_time_total / 1e6:.2f} | {e.self_cpu_time_total / 1e6 / total:.0%} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=254)
    ap.add_argument("--resp-len", type=int, default=64)
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--autocast", choices=["on", "off", "auto"], default="auto")
    ap.add_argument(
        "--learner-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="model.learner_dtype: bfloat16 (with --autocast off) measures a step with no casts at all",
    )
    ap.add_argument("--share-prompt", choices=["on", "off"], default="on")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--profile", action="store_true", help="one more step under torch.profiler: where the time goes")
    ap.add_argument(
        "--layouts",
        default="packed,padded",
        help="shared-prompt layouts timed side by side: packed (the learner's), padded (bench/padded_layout.py)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="timed steps per layout (alternating)")
    ap.add_argument(
        "--allocator",
        choices=["auto", "jemalloc", "system"],
        default="auto",
        help="malloc, as learner.allocator (auto: jemalloc where installed, as a learner actor gets)",
    )
    ap.add_argument("--results", action="store_true")
    args = ap.parse_args(argv)
    bad = [x for x in args.layouts.split(",") if x.strip() not in ("packed", "padded")]
    if bad or args.rounds < 1:
        ap.error(f"--layouts: {', '.join(bad)} (choose packed, padded)" if bad else "--rounds must be >= 1")
    import torch

    from rl.config.recipe import AlgoConfig, KLConfig, LearnerConfig, ModelConfig, OptimConfig
    from rl.trainer import memory, precision
    from rl.trainer.hub import resolve_model
    from rl.trainer.learner import Learner

    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    prec = "auto" if args.autocast == "auto" else "manual"
    cfg = ModelConfig(
        path=path,
        learner_dtype=args.learner_dtype,
        autocast=args.autocast == "on",
        reference_dtype="bfloat16" if args.learner_dtype == "bfloat16" else "auto",  # auto: fp32 without autocast
    )
    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-6), kl=KLConfig(coef=args.kl_coef))
    learner = LearnerConfig(share_prompt=args.share_prompt == "on", precision=prec)
    lrn = Learner(path, cfg, algo, threads=args.threads, learner=learner)
    batch = _batch(len(lrn.tokenizer), args)
    conf = lrn.model.config.to_dict()
    flops = step_flops(conf, batch.samples, share_prompt=learner.share_prompt)
    passes = ["policy fwd+bwd"]
    if lrn.needs_prepare:
        flops += step_flops(conf, batch.samples, share_prompt=learner.share_prompt, backward=False)
        passes.append("prepare fwd")
    if lrn.has_ref:
        flops += step_flops(conf, batch.samples, share_prompt=learner.share_prompt, backward=False)
        passes.append("reference fwd")
    bf16 = lrn.use_autocast or args.learner_dtype == "bfloat16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    rates: list[float] = []  # the square-matmul rate, measured before and after every step (a shared host)

    def measure_rate() -> None:
        rates.append(precision.matmul_gflops(dtype, seconds=1.0) * 1e9)

    measure_rate()
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    rows, micros = [], {}
    for lay in layouts:  # each layout's own GEMM shapes and a warm-up step (AdamW state exists after the first)
        padded_layout.use(lrn, lay != "packed")
        micros[lay] = lrn.micro_batches(batch.samples)
        micro_resp = max(sum(s.num_tokens for s in mb) for mb in micros[lay])
        shapes = _gemm_shapes(conf, batch.samples, micro_resp, not padded_layout.is_padded(lrn))
        rows.append([lay, shapes, [], []])  # layout, its GEMM shapes, its shape rates, its timed steps
        lrn.step(batch)
        measure_rate()
    for rnd in range(args.rounds):  # the layouts' timed steps alternate, on the same batches
        for row in rows:
            padded_layout.use(lrn, row[0] != "packed")
            t0 = time.perf_counter()
            lrn.step(_batch(len(lrn.tokenizer), args, seed=1 + rnd))
            row[3].append(time.perf_counter() - t0)
            measure_rate()
            row[2].append(shape_gflops(row[1], dtype=dtype) * 1e9)  # this layout's shape rate, right after its step
    rate = statistics.median(rates)
    floor = flops / rate
    prof = []
    if args.profile:
        padded_layout.use(lrn, layouts[0] != "packed")
        prof = [f"profiled layout: {layouts[0]}", ""] + profile_step(lrn, _batch(len(lrn.tokenizer), args, seed=99))
    table = []
    for lay, _, srates, walls in rows:
        wall = min(walls)
        srate = statistics.median(srates) if srates else 0.0
        sfloor = flops / srate if srate else float("nan")
        table.append(
            f"| {lay} | {' + '.join(passes)} | {flops / 1e12:.3f} | {rate / 1e9:.0f} | {floor:.2f} | "
            f"{', '.join(f'{w:.2f}' for w in walls)} | {wall / floor:.2f} | {srate / 1e9:.0f} | {sfloor:.2f} | "
            f"{wall / sfloor:.2f} | {len(micros[lay])} |"
        )
    text = "\n".join(
        [
            f"learner_floor: {args.model}, batch {args.prompts}x{args.group}, prompt {args.prompt_len}, responses <= "
            f"{args.resp_len}, kl_coef {args.kl_coef}, share_prompt {args.share_prompt}, "
            f"{'bf16 autocast' if lrn.use_autocast else 'bf16 weights' if bf16 else 'fp32'} "
            f"({lrn.precision_note or 'manual'}), "
            f"torch threads {torch.get_num_threads()}, attention {lrn.model.config._attn_implementation}, "
            f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE')}, malloc {memory.allocator()}, "
            f"{args.rounds} timed step(s) per layout, alternating (ratios use the fastest); square-matmul rate "
            f"(1024^3) measured {len(rates)} times between the steps: median {rate / 1e9:.0f}, min "
            f"{min(rates) / 1e9:.0f}, max {max(rates) / 1e9:.0f} GFLOP/s (the floor uses the median)",
            "",
            "| layout | passes | TFLOP | matmul GFLOP/s | floor s | step s | step / floor "
            "| GFLOP/s on the step's GEMM shapes | floor s at that rate | step / that floor | micro-batches |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        + table
        + ([""] + prof if prof else [])
    )
    print(text)
    if args.results:
        import subprocess

        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(
                f"\n## learner_floor ({model}, {os.cpu_count()} cores)\n\n"
                f"`python bench/learner_floor.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n"
                + text
                + "\n"
            )
    lrn.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
