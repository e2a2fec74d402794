"""Synchronous vs bounded-staleness streamed training, side by side in one invocation.

Runs ``jointrl train`` (the real CLI: Ray actors, vLLM engine, learner, reward service)
once per ``--staleness`` value on the same recipe and seed: ``rollout.max_staleness=0`` (synchronous)
and each k >= 1 (with ``algo.loss.tis_cap`` for the policy lag). Reports, from each run's ``metrics.jsonl``:
mean ``timing/step_s`` over steps 2..N (step 1 cannot overlap anything), the time the loop
waited for episodes, the generation time, the engines' idle time, the mean and largest staleness, dropped
groups, and the train reward of the first and last thirds of the run; then each streamed run's step time
over the synchronous one's (the issue's goal: <= 0.75).
Held-out evaluation is off (``data.eval_files=[]``) so that it does not dilute the step times.

Default: recipes/quickstart.yaml (SmolLM2-135M, 8 prompts x 8, 64 new tokens), 8 steps each.
Appends/replaces its section of ``bench/RESULTS.md``.

    .venv/bin/python bench/async_bench.py [--recipe recipes/quickstart.yaml] [--steps 8] [--tis-cap 2.0] \
        [--staleness 0,1,2]
    GPU (one H200-class GPU; not run here): the same command on a GPU machine, with a GPU recipe
    (the engine and learner then share the GPU: the placement decides).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import write_section  # noqa: E402


def run(recipe: str, out: Path, steps: int, overrides: list[str]) -> tuple[list[dict], float]:
    exe = Path(sys.executable).with_name("jointrl")
    cmd = [
        str(exe),
        "train",
        recipe,
        f"run.output_dir={out}",
        f"train.steps={steps}",
        "data.eval_files=[]",
        "wandb.mode=disabled",
        "run.rollouts_every=0",
        *overrides,
    ]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [x for x in recs if x["step"] >= 1], wall


def summarize(recs: list[dict]) -> dict[str, float]:
    later = [x for x in recs if x["step"] >= 2]
    third = max(len(recs) // 3, 1)
    return {
        "step_s": statistics.mean(x["timing/step_s"] for x in later),
        "wait_s": statistics.mean(x["timing/rollout_s"] for x in later),
        "generate_s": statistics.mean(x.get("timing/generate_s", x["timing/rollout_s"]) for x in later),
        "learner_s": statistics.mean(x["timing/learner_s"] for x in later),
        "reward_first": statistics.mean(x.get("reward/mean", 0.0) for x in recs[:third]),
        "reward_last": statistics.mean(x.get("reward/mean", 0.0) for x in recs[-third:]),
        "staleness": statistics.mean(x.get("rollout/staleness", 0.0) for x in later),
        "staleness_max": max(x.get("async/staleness_max", 0.0) for x in later),
        "engine_idle_s": statistics.mean(x.get("async/idle_s/engines", 0.0) for x in later),
        "dropped": sum(x.get("async/dropped_groups", 0.0) for x in recs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "quickstart.yaml"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--tis-cap", type=float, default=2.0)
    ap.add_argument("--staleness", default="0,1", help="rollout.max_staleness values, comma-separated; 0 first")
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = ap.parse_args()
    if args.steps < 3:
        raise SystemExit("--steps must be >= 3 (step 1 is excluded from the timings)")
    ks = [int(k) for k in args.staleness.split(",")]
    if not ks or ks[0] != 0 or any(k < 0 for k in ks):
        raise SystemExit(
            f"--staleness: comma-separated values >= 0 starting with 0 (the baseline), got {args.staleness}"
        )
    res: dict[str, dict[str, float]] = {}
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="jointrl-async-bench-") as tmp:
        for k in ks:
            name = "sync" if k == 0 else f"k={k}"
            extra = [f"rollout.max_staleness={k}"] + ([f"algo.loss.tis_cap={args.tis_cap}"] if k else [])
            recs, walls[name] = run(args.recipe, Path(tmp) / name, args.steps, extra)
            res[name] = summarize(recs)
            print(name, {k: round(v, 3) for k, v in res[name].items()}, f"wall {walls[name]:.0f} s", flush=True)
    ratios = ", ".join(f"{n}: {r['step_s'] / res['sync']['step_s']:.2f}" for n, r in res.items() if n != "sync")
    rows = "\n".join(
        f"| {n} | {r['step_s']:.2f} | {r['wait_s']:.2f} | {r['generate_s']:.2f} | {r['learner_s']:.2f} | "
        f"{r['engine_idle_s']:.2f} | {r['staleness']:.2f} (max {r['staleness_max']:.0f}) | {r['dropped']:.0f} | "
        f"{r['reward_first']:.3f} -> {r['reward_last']:.3f} | {walls[n]:.0f} |"
        for n, r in res.items()
    )
    body = (
        f"Recipe `{os.path.relpath(args.recipe, ROOT)}`, {args.steps} steps each, same seed; step times are means "
        f"over steps 2..{args.steps}; streamed runs use `algo.loss.tis_cap={args.tis_cap}`.\n\n"
        "| mode | step s | waited for episodes s | generating s | learner s | engines idle s | staleness | "
        "dropped groups | train reward first third -> last third | wall s |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
        + rows
        + f"\n\n**streamed / sync step time: {ratios}** (goal <= 0.75)\n"
    )
    print(body)
    if not args.no_write:
        write_section("async", "Synchronous vs bounded-staleness streamed (bench/async_bench.py)", body)


if __name__ == "__main__":
    main()
