"""Learner throughput: tokens/s of one learner step (forward + backward + optimizer step) on this machine.

Builds a synthetic GRPO batch (random prompt and response token ids, ``--samples`` samples in
groups of ``--group-size`` sharing a prompt, nonzero advantages) and times
``rl.trainer.learner.Learner.step`` on it, in-process, with the prompt-shared forward on and off side
by side on the same batch and weights (``--share-prompt both``, the default), then prints the
on/off ratio. Throughput counts the batch's tokens (prompt + response of every sample, as one
unshared forward would run them) per second of wall time of the whole step; ``policy tok/s``
counts the response tokens only.

Writes nothing but stdout (the learner's weight-export folder is a temp dir, removed at exit;
the embedded model is converted into its cache on first use, as for any run).

    .venv/bin/python bench/learner_bench.py --model embedded:smollm2-135m-instruct \\
        --samples 16 --group-size 8 --prompt-len 256 --response-len 64 --steps 3

``--device cuda`` runs the same on a GPU (fp32 master weights, bf16 autocast; the step's
``float()`` metrics synchronise the GPU, so wall times are complete). Not run: no GPU was
available to this work (see bench/README.md).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _device  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default="embedded:smollm2-135m-instruct",
        help="embedded:smollm2-135m-instruct | embedded:tiny | a local HF folder",
    )
    p.add_argument("--samples", type=int, default=16, help="samples per batch")
    p.add_argument("--group-size", type=int, default=8, help="samples per prompt (a GRPO group)")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=3, help="timed steps per mode (after --warmup untimed ones)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="learner master weights")
    p.add_argument("--autocast", default="on", choices=["on", "off"], help="bf16 autocast for forward/backward")
    p.add_argument("--share-prompt", default="both", choices=["on", "off", "both"])
    p.add_argument("--micro-batch-tokens", type=int, default=4096)
    p.add_argument("--kl-coef", type=float, default=0.0, help="> 0 adds the frozen reference's forward")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    p.add_argument("--seed", type=int, default=0)
    _device.add_argument(p)
    return p.parse_args(argv)


def make_batch(args: argparse.Namespace, vocab: int):
    from rl.algos.batch import Batch, Sample

    rng = random.Random(args.seed)
    samples = []
    for uid in range(args.samples):
        g = uid // args.group_size
        prng = random.Random(args.seed * 7919 + g)  # one prompt per group
        prompt = [prng.randrange(10, vocab) for _ in range(args.prompt_len)]
        resp = [rng.randrange(10, vocab) for _ in range(args.response_len)]
        samples.append(
            Sample(
                prompt + resp,
                len(prompt),
                [1] * len(resp),
                [-1.0] * len(resp),
                advantage=rng.choice([-1.0, 1.0]) * rng.uniform(0.2, 1.5),
                domain="bench",
                reward=0.0,
                group_id=g,
                uid=uid,
            )
        )
    n = sum(s.num_tokens for s in samples)
    return Batch(samples, num_tokens=n, num_seqs=len(samples))


def run_mode(args: argparse.Namespace, model_path: str, share: bool) -> dict[str, float]:
    import torch

    from rl.config.recipe import AlgoConfig, KLConfig, LearnerConfig, ModelConfig, OptimConfig
    from rl.trainer.learner import Learner

    mcfg = ModelConfig(path=args.model, learner_dtype=args.dtype, autocast=args.autocast == "on")
    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-6), kl=KLConfig(coef=args.kl_coef))
    with tempfile.TemporaryDirectory(prefix="jointrl-bench-") as shm:
        lrn = Learner(
            model_path,
            mcfg,
            algo,
            seed=args.seed,
            threads=args.threads,
            shm_dir=shm,
            learner=LearnerConfig(micro_batch_tokens=args.micro_batch_tokens, share_prompt=share),
        )
        batch = make_batch(args, lrn.model.config.vocab_size)
        for _ in range(args.warmup):
            lrn.step(batch)
        times, computes = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            m = lrn.step(batch)
            times.append(time.perf_counter() - t0)
            computes.append(m["timing/learner_compute_s"])
        micro = len(lrn.micro_batches(batch.samples))
        del lrn
        torch.set_num_threads(args.threads or os.cpu_count() or 1)
    total = sum(len(s.input_ids) for s in batch.samples)
    t = statistics.median(times)
    return {
        "step_s": t,
        "tok_s": total / t,
        "policy_tok_s": batch.num_tokens / t,
        "micro_batches": micro,
        "tokens": total,
        "min_s": min(times),
        "max_s": max(times),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.samples < 1 or args.group_size < 1 or args.prompt_len < 1 or args.response_len < 1 or args.steps < 1:
        print("samples, group-size, prompt-len, response-len and steps must be >= 1", file=sys.stderr)
        return 2
    device = _device.select(args.device)  # the Learner takes the GPU whenever torch sees one
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    from rl.trainer.hub import resolve_model

    model_path = resolve_model(args.model)
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.share_prompt]
    print(
        f"learner bench: {args.model}  samples={args.samples} (groups of {args.group_size})  "
        f"prompt={args.prompt_len} response={args.response_len} tokens  dtype={args.dtype} autocast={args.autocast}  "
        f"torch threads={args.threads or os.cpu_count()}  kl_coef={args.kl_coef}  torch {torch.__version__}  "
        f"device={torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu'}"
    )
    print(
        f"one step = forward + backward + AdamW step over the batch; median of {args.steps} timed steps "
        f"after {args.warmup} warmup"
    )
    print(
        f"{'share_prompt':>12} {'step s':>8} {'min s':>7} {'max s':>7} {'tokens/s':>10} {'policy tok/s':>13} "
        f"{'micro-batches':>13}"
    )
    res = {}
    for share in modes:
        r = run_mode(args, model_path, share)
        res[share] = r
        print(
            f"{'on' if share else 'off':>12} {r['step_s']:8.2f} {r['min_s']:7.2f} {r['max_s']:7.2f} {r['tok_s']:10.0f} "
            f"{r['policy_tok_s']:13.0f} {r['micro_batches']:13d}",
            flush=True,
        )
    if len(res) == 2:
        print(
            f"share_prompt on/off throughput ratio: {res[True]['tok_s'] / res[False]['tok_s']:.2f}x "
            f"({res[True]['tokens']} tokens per batch)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
