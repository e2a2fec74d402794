"""Learner steps under the memory settings of a learner process, side by side: transparent huge pages
(``learner.huge_pages``), the malloc (``learner.allocator``: jemalloc or glibc) and whether the learner keeps
a step's freed memory for the next step (``learner.hold_memory``) or hands it back after each step.

torch reads ``THP_MEM_ALLOC_ENABLE`` once, at its first allocation, and ``LD_PRELOAD`` is read when a
process starts, so each setting needs its own process: this script starts one child per setting
(``--child``), each builds the learner of ``bench/learner_floor.py`` (SmolLM2, the quickstart-shaped
batch; by default the quickstart's KL term and fp32, ``--kl-coef``, ``--autocast``), runs a warm-up step
and then ``--steps`` timed steps, and reports per step: wall time, the process's system and user CPU
time, minor page faults and resident memory after the step (with ``--hold-memory off`` the learner
trims the heap after each step, so the next step faults its memory in again). The children run one
after the other, alternating ``--rounds`` times, on the same batches.

    python bench/huge_pages.py --steps 2 --rounds 2 [--results]
    python bench/huge_pages.py --huge-pages 1 --allocators jemalloc,system --autocast auto --kl-coef 0
    python bench/huge_pages.py --huge-pages 1 --allocators system --hold-memory on,off --steps 2 --rounds 1

``auto`` is what a learner actor gets at that precision (``rl.trainer.memory.resolve_allocator``: glibc for
an fp32 learner), so compare ``jemalloc,system`` to see both mallocs.
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


def child(steps: int, autocast: str = "off", kl_coef: float = 0.02, hold: bool = True) -> None:
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
    cfg = ModelConfig(path=path, learner_dtype="float32", autocast=autocast == "on")
    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-6), kl=KLConfig(coef=kl_coef))
    prec = "auto" if autocast == "auto" else "manual"
    learner = LearnerConfig(precision=prec, hold_memory=hold)
    lrn = Learner(path, cfg, algo, threads=torch.get_num_threads(), learner=learner)
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
            "malloc": memory.allocator(),
        }
        print("ROW " + json.dumps(row), flush=True)
    lrn.shutdown()


def run(thp: str, alloc: str, steps: int, extra: list[str], fp32: bool) -> list[dict[str, float]]:
    from _actor_env import with_allocator

    env = {**with_allocator(alloc, dict(os.environ), fp32), "THP_MEM_ALLOC_ENABLE": thp}
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--steps", str(steps), *extra], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"child THP_MEM_ALLOC_ENABLE={thp}, allocator {alloc} failed:\n{out.stderr[-3000:]}")
    return [json.loads(line[4:]) for line in out.stdout.splitlines() if line.startswith("ROW ")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="timed steps per child")
    ap.add_argument("--rounds", type=int, default=2, help="children per setting, alternating")
    ap.add_argument("--huge-pages", default="1,0", help="THP_MEM_ALLOC_ENABLE values to compare")
    ap.add_argument(
        "--allocators", default="system", help="learner.allocator values to compare (auto, jemalloc, system)"
    )
    ap.add_argument(
        "--hold-memory",
        default="on",
        help="learner.hold_memory values to compare (on: keep for the next step, off: trim)",
    )
    ap.add_argument("--hold", choices=["on", "off"], default="on", help=argparse.SUPPRESS)  # the child's
    ap.add_argument("--autocast", choices=["auto", "on", "off"], default="off", help="bf16 autocast (auto: timed)")
    ap.add_argument("--kl-coef", type=float, default=0.02)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--results", action="store_true", help="append the table to bench/RESULTS.md")
    args = ap.parse_args(argv)
    if args.child:
        child(args.steps, args.autocast, args.kl_coef, args.hold == "on")
        return 0
    holds = [h.strip() for h in args.hold_memory.split(",") if h.strip()]
    if not holds or any(h not in ("on", "off") for h in holds):
        ap.error(f"--hold-memory: {args.hold_memory!r} (comma-separated on, off)")
    settings = [
        (t.strip(), a.strip(), h) for h in holds for a in args.allocators.split(",") for t in args.huge_pages.split(",")
    ]
    rows: dict[tuple[str, str, str], list[dict[str, float]]] = {s: [] for s in settings}
    from _actor_env import fp32_learner

    fp32 = fp32_learner(args.autocast) if any(s[1] == "auto" for s in settings) else False  # what `auto` follows
    for _ in range(args.rounds):
        for thp, alloc, hold in settings:
            extra = ["--autocast", args.autocast, "--kl-coef", str(args.kl_coef), "--hold", hold]
            rows[(thp, alloc, hold)] += run(thp, alloc, args.steps, extra, fp32)
    lines = [
        "| THP_MEM_ALLOC_ENABLE | malloc | hold_memory | step s | system CPU s | user CPU s | minor faults "
        "| RSS after MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (thp, alloc, hold), rs in rows.items():
        cols = [", ".join(f"{r[k]:{fmt}}" for r in rs) for k, fmt in
                (("wall_s", ".1f"), ("sys_s", ".1f"), ("user_s", ".1f"), ("minor_faults", ",.0f"), ("rss_mb", ".0f"))]  # fmt: skip
        lines.append(f"| {thp} | {rs[0]['malloc'] if rs else alloc} | {hold} | " + " | ".join(cols) + " |")
    best = {s: min(r["wall_s"] for r in rs) for s, rs in rows.items()}
    first = settings[0]
    lines += [""] + [
        f"fastest step, THP {s[0]} / {s[1]} / hold {s[2]} against THP {first[0]} / {first[1]} / hold {first[2]}: "
        f"{best[s] / best[first]:.2f}"
        for s in settings[1:]
    ]
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
