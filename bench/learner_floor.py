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
   fp32, or bf16 under autocast), measured in the same run.
3. The learner step's wall time (after one warm-up step), and the ratio step / floor.

It does not count elementwise work (norms, activations, softmax), so the floor is a lower bound.
Run it under the shared heavy-job lock; ``--results`` appends the table to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=254)
    ap.add_argument("--resp-len", type=int, default=64)
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--autocast", choices=["on", "off", "auto"], default="auto")
    ap.add_argument("--share-prompt", choices=["on", "off"], default="on")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--results", action="store_true")
    args = ap.parse_args(argv)
    import torch

    from rl.config.recipe import AlgoConfig, KLConfig, LearnerConfig, ModelConfig, OptimConfig
    from rl.trainer import precision
    from rl.trainer.hub import resolve_model
    from rl.trainer.learner import Learner

    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    prec = "auto" if args.autocast == "auto" else "manual"
    cfg = ModelConfig(path=path, learner_dtype="float32", autocast=args.autocast == "on")
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
    dtype = torch.bfloat16 if lrn.use_autocast else torch.float32
    rate = precision.matmul_gflops(dtype, seconds=1.0) * 1e9
    lrn.step(batch)  # warm-up
    t0 = time.perf_counter()
    lrn.step(_batch(len(lrn.tokenizer), args, seed=1))
    wall = time.perf_counter() - t0
    floor = flops / rate
    text = "\n".join(
        [
            f"learner_floor: {args.model}, batch {args.prompts}x{args.group}, prompt {args.prompt_len}, responses <= "
            f"{args.resp_len}, kl_coef {args.kl_coef}, share_prompt {args.share_prompt}, "
            f"{'bf16 autocast' if lrn.use_autocast else 'fp32'} ({lrn.precision_note or 'manual'})",
            "",
            "| passes | TFLOP | matmul GFLOP/s | floor s | step s | step / floor |",
            "|---|---|---|---|---|---|",
            f"| {' + '.join(passes)} | {flops / 1e12:.3f} | {rate / 1e9:.0f} | {floor:.2f} | {wall:.2f} | {wall / floor:.2f} |",
        ]
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
