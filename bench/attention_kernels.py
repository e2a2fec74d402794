"""PyTorch's CPU flash attention against attention through batched matmuls, at the learner's shapes.

The packed shared-prompt layout (``rl.trainer.packed_attention``) runs two attention parts per decoder
layer: every row against the prompt's keys (top-left causal: ``--rows`` queries, ``--prompt`` keys) and each
response segment against its own keys (causal, ``--segments`` padded segments of ``--seg-rows`` rows). Its
backward already takes batched matmuls for short segments (``_MATH_ROWS``). This times, side by side in one
run, the forward and backward of each part through the flash kernel and through matmuls with the softmax in
float32 (scores from float32 inputs, or from ``--dtype`` inputs rounded to it), and the largest output
difference from the flash kernel. Defaults: SmolLM2-135M's heads (9 x 64) and bench/learner_floor.py's batch.

    python bench/attention_kernels.py
"""

from __future__ import annotations

import argparse
import time

import torch


def math_forward(q, k, v, mask, scale: float, fp32_scores: bool):
    """(out, lse) of attention with ``mask`` (True = hidden) through matmuls, the softmax in float32."""
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) if fp32_scores else torch.matmul(q, k.transpose(-1, -2))
    s = s.float().mul_(scale).masked_fill_(mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.matmul(s.sub_(lse.unsqueeze(-1)).exp_().to(q.dtype), v), lse


def math_backward(do, q, k, v, o, lse, mask, scale: float, fp32_scores: bool):
    """(dq, dk, dv): the flash backward's formulas through matmuls (as ``packed_attention._causal_backward``)."""
    delta = (do.float() * o.float()).sum(-1, keepdim=True)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) if fp32_scores else torch.matmul(q, k.transpose(-1, -2))
    pr = s.float().mul_(scale).sub_(lse.unsqueeze(-1)).exp_().masked_fill_(mask, 0.0)
    dv = torch.matmul(pr.to(q.dtype).transpose(-1, -2), do)
    ds = pr.mul_(torch.matmul(do, v.transpose(-1, -2)).float().sub_(delta)).mul_(scale).to(q.dtype)
    return torch.matmul(ds, k), torch.matmul(ds.transpose(-1, -2), q), dv


def ms(f, reps: int) -> float:
    for _ in range(3):
        f()
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t0) / reps * 1e3


def time_part(q, k, v, mask, scale: float, reps: int) -> tuple[list[float], list[float], list[float]]:
    """ms per forward and per backward: flash, matmuls with fp32 scores, matmuls with scores in the inputs'
    dtype; and each matmul path's largest output difference from the flash kernel."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    back = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    o, lse = flash(q, k, v, 0.0, True, scale=scale)[:2]
    do = torch.randn_like(q)
    fwd = [ms(lambda: flash(q, k, v, 0.0, True, scale=scale), reps)]
    bwd = [ms(lambda: back(do, q, k, v, o, lse, 0.0, True, scale=scale), reps)]
    diffs = []
    for fp32 in (True, False):
        fwd.append(ms(lambda fp32=fp32: math_forward(q, k, v, mask, scale, fp32), reps))
        bwd.append(ms(lambda fp32=fp32: math_backward(do, q, k, v, o, lse, mask, scale, fp32), reps))
        diffs.append((math_forward(q, k, v, mask, scale, fp32)[0].float() - o.float()).abs().max().item())
    return fwd, bwd, diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=254)
    ap.add_argument("--rows", type=int, default=635, help="part 1's queries: the prompt's rows and the responses'")
    ap.add_argument("--segments", type=int, default=8)
    ap.add_argument("--seg-rows", type=int, default=63)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dt, h, d = getattr(torch, args.dtype), args.heads, args.head_dim
    scale = d**-0.5
    parts = {
        f"part 1: {args.rows} rows x {args.prompt} prompt keys (top-left causal)": (
            (1, h, args.rows, d),
            (1, h, args.prompt, d),
            torch.ones(args.rows, args.prompt, dtype=torch.bool).triu_(1),
        ),
        f"part 2: {args.segments} segments x {args.seg_rows} rows (causal)": (
            (args.segments, h, args.seg_rows, d),
            (args.segments, h, args.seg_rows, d),
            torch.ones(args.seg_rows, args.seg_rows, dtype=torch.bool).triu_(1),
        ),
    }
    print(f"{args.dtype}, {args.threads} threads, {args.reps} timed calls each (ms per call)\n")
    print("| part | pass | flash ms | matmuls, fp32 scores ms | matmuls, scores in the inputs' dtype ms |")
    print("|---|---|---|---|---|")
    for name, (qs, ks, mask) in parts.items():
        q, k, v = torch.randn(qs, dtype=dt), torch.randn(ks, dtype=dt), torch.randn(ks, dtype=dt)
        fwd, bwd, diffs = time_part(q, k, v, mask, scale, args.reps)
        print(f"| {name} | forward | {fwd[0]:.2f} | {fwd[1]:.2f} | {fwd[2]:.2f} |")
        print(f"| {name} | backward | {bwd[0]:.2f} | {bwd[1]:.2f} | {bwd[2]:.2f} |")
        print(f"| {name} | max abs output diff vs flash | 0 | {diffs[0]:.4f} | {diffs[1]:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
