"""Learner steps with and without transparent huge pages (``learner.huge_pages``), side by side.

torch reads ``THP_MEM_ALLOC_ENABLE`` once, at its first allocation, so each setting needs its own
process: this script starts one child per setting (``--child``), each builds the learner of
``bench/learner_floor.py`` (SmolLM2, the quickstart-shaped batch, the quickstart's KL term, fp32),
runs a warm-up step and then ``--steps`` timed steps, and reports per step: wall time, the process's
system and user CPU time, minor page faults and resident memory after the step (the learner trims
the heap after each step, so the next step faults its memory in again). The children run one after
the other, alternating ``--rounds`` times, on the same batches.

    python bench/huge_pages.py --steps 2 --rounds 2 [--results]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(steps: int) -> None:
    import resource

    sys.path.insert(0, str(ROOT))
    import torch

    from bench.learner_floor import _batch
    from rl.config.recipe import AlgoConfig, KLConfig, LearnerConfig, ModelConfig, OptimConfig
    from rl.trainer import memory
    from rl.trainer.hub import resolve_model
    from rl.trainer.learner import Learner

    torch.set_num_threads(os.cpu_count() or 1)
    shape = argparse.Namespace(prompts=8, group=8, prompt_len=254, resp_len=64)
    path = resolve_model("embedded:smollm2-135m-instruct")
    cfg = ModelConfig(path=path, learner_dtype="float32", autocast=False)
    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-6), kl=KLConfig(coef=0.02))
    lrn = Learner(path, cfg, algo, threads=torch.get_num_threads(), learner=LearnerConfig(precision="manual"))
    lrn.step(_batch(len(lrn.tokenizer), shape))  # warm-up: AdamW state exists after it
    for i in range(steps):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        lrn.step(_batch(len(lrn.tokenizer), shape, seed=1 + i))
        wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        row = {
            "wall_s": wall,
            "sys_s": r1.ru_stime - r0.ru_stime,
            "user_s": r1.ru_utime - r0.ru_utime,
            "minor_faults": r1.ru_minflt - r0.ru_minflt,
            "rss_mb": memory.rss_bytes() / 1e6,
        }
        print("ROW " + json.dumps(row), flush=True)
    lrn.shutdown()


def run(setting: str, steps: int) -> list[dict[str, float]]:
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": setting}
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--steps", str(steps)], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"child THP_MEM_ALLOC_ENABLE={setting} failed:\n{out.stderr[-3000:]}")
    return [json.loads(line[4:]) for line in out.stdout.splitlines() if line.startswith("ROW ")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="timed steps per child")
    ap.add_argument("--rounds", type=int, default=2, help="children per setting, alternating")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--results", action="store_true", help="append the table to bench/RESULTS.md")
    args = ap.parse_args(argv)
    if args.child:
        child(args.steps)
        return 0
    rows: dict[str, list[dict[str, float]]] = {"1": [], "0": []}
    for _ in range(args.rounds):
        for setting in rows:
            rows[setting] += run(setting, args.steps)
    lines = [
        "| THP_MEM_ALLOC_ENABLE | step s | system CPU s | user CPU s | minor faults | RSS after MB |",
        "|---|---|---|---|---|---|",
    ]
    for setting, rs in rows.items():
        cols = [", ".join(f"{r[k]:{fmt}}" for r in rs) for k, fmt in
                (("wall_s", ".1f"), ("sys_s", ".1f"), ("user_s", ".1f"), ("minor_faults", ",.0f"), ("rss_mb", ".0f"))]  # fmt: skip
        lines.append(f"| {setting} | " + " | ".join(cols) + " |")
    best = {s: min(r["wall_s"] for r in rs) for s, rs in rows.items()}
    lines += ["", f"fastest step with huge pages / without: {best['1'] / best['0']:.2f}"]
    text = "\n".join(lines)
    print(text)
    if args.results:
        load = os.getloadavg()
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(
                f"\n## huge_pages ({os.cpu_count()} cores, load {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the end)\n\n"
                f"`python bench/huge_pages.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n{text}\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
