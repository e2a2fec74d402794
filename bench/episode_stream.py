"""Multi-turn rollouts: episodes streamed through the engine vs. advanced turn by turn together.

One flagship-shaped rollout (``recipes/joint_rl.yaml``: its envs, stop strings, sampling, group
size; ``--groups`` tasks drawn from its training files by the mixer's domain weights, the same
tasks and seeds for every arm) on one vLLM engine with the recipe's engine settings, for three
arms side by side in one process, interleaved over ``--rounds`` rounds:

- ``turns, tty stdin``: what rollouts did before: every running episode's turn in one
  ``generate``, then the env steps; the terminal's commands read the session's tty (a command
  waiting for input holds the whole batch until ``command_timeout_s``);
- ``turns``: the same with the terminal's commands reading ``/dev/null`` (``TerminalEnv(stdin="null")``,
  the default now);
- ``streamed``: each episode's next turn joins the engine's running batch as soon as its env
  has answered (``VLLMEngine.submit``/``poll``, what ``run_episodes`` does with a streaming engine).

For each arm: the rollout's wall time (median over rounds), policy tokens sampled, tokens/s,
mean turns and mean env reward (a check that the arms ran the same episodes; sampling differs
only where batch composition changes bf16 rounding), and the ratio of each arm's time to the
streamed one, written to bench/RESULTS.md (``--no-write``: printed only).

    .venv/bin/python bench/episode_stream.py --groups 8 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class TurnsOnly:
    """The engine with its batched ``generate`` only: ``run_episodes`` then advances episodes turn by turn."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine.generate(*args, **kwargs)


def draw(cfg: Any, groups: int, seed: int) -> list:
    """``groups`` tasks drawn by the recipe's domain weights (largest remainder), each ``group_size`` times."""
    from envs.io import load_tasks
    from rl.data.mixer import largest_remainder

    by_domain: dict[str, list] = {}
    for f in cfg.data.train_files:
        path = f if os.path.exists(f) else ROOT / "recipes" / f
        for t in load_tasks(path):
            by_domain.setdefault(t.domain, []).append(t)
    domains = list(by_domain)
    weights = [cfg.mixer.domain_weights.get(d, 1.0) for d in domains]
    counts = dict(zip(domains, largest_remainder(groups, weights)))
    rng = random.Random(seed)
    tasks = []
    for d in sorted(counts):
        for t in rng.sample(by_domain[d], counts[d]):
            tasks += [t] * cfg.rollout.group_size
    return tasks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "joint_rl.yaml"))
    ap.add_argument("--groups", type=int, default=8, help="tasks per rollout (each x the recipe's group size)")
    ap.add_argument("--rounds", type=int, default=3, help="rollouts per arm, interleaved (the median is reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true", help="print only; do not write bench/RESULTS.md")
    args = ap.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")

    from bench._results import cpu_model, table, write_section
    from envs.base import resolve
    from envs.types import Sampling
    from rl.config.recipe import load_recipe
    from rl.driver.local_runtime import LocalRuntime
    from rl.trainer.hub import resolve_model
    from rollout.episode import run_episodes

    cfg = load_recipe(args.recipe)
    rt = LocalRuntime(cfg, resolve_model(cfg.model.path), engine="vllm", learner=False)
    rt.start()
    worker = rt._worker()
    r = cfg.rollout
    sampling = Sampling(r.max_new_tokens, r.temperature, r.top_p, r.max_turns, r.max_model_len)
    tasks = draw(cfg, args.groups, args.seed)
    seeds = [args.seed * 100_003 + i for i in range(len(tasks))]
    specs = {e.domain: (resolve(e.cls), dict(e.kwargs)) for e in r.envs}

    def make_env(stdin: str):
        def make(domain: str) -> Any:
            cls, kw = specs[domain]
            return cls(**(kw | {"stdin": stdin} if domain == "terminal" else kw))

        return make

    arms = {
        "turns, tty stdin": (TurnsOnly(worker.engine), "terminal"),
        "turns": (TurnsOnly(worker.engine), "null"),
        "streamed": (worker.engine, "null"),
    }
    runs: dict[str, list[tuple[float, list]]] = {a: [] for a in arms}
    run_episodes(worker.engine, worker.tokenizer, make_env("null"), tasks[:2], [0, 0], seeds[:2], sampling, r.stops())
    try:
        for k in range(args.rounds):
            order = list(arms) if k % 2 == 0 else list(reversed(arms))
            for a in order:
                engine, stdin = arms[a]
                t0 = time.perf_counter()
                trajs = run_episodes(
                    engine,
                    worker.tokenizer,
                    make_env(stdin),
                    tasks,
                    [i // r.group_size for i in range(len(tasks))],
                    seeds,
                    sampling,
                    r.stops(),
                    env_workers=worker.env_workers,
                )
                runs[a].append((time.perf_counter() - t0, trajs))
                print(f"round {k} {a}: {runs[a][-1][0]:.1f} s", flush=True)
    finally:
        rt.stop()

    base = statistics.median(s for s, _ in runs["streamed"])
    rows = []
    for a, rs in runs.items():
        med = statistics.median(s for s, _ in rs)
        toks = statistics.mean(sum(sum(t.loss_mask) for t in trajs) for _, trajs in rs)
        turns = statistics.mean(t.num_turns for _, trajs in rs for t in trajs)
        rew = statistics.mean((t.env_reward or 0.0) for _, trajs in rs for t in trajs)
        times = ", ".join(f"{s:.1f}" for s, _ in rs)
        rows.append(
            [
                a,
                times,
                f"{med:.1f}",
                f"{toks:.0f}",
                f"{toks / med:.0f}",
                f"{turns:.2f}",
                f"{rew:.3f}",
                f"{med / base:.2f}",
            ]
        )
    counts = {d: sum(t.domain == d for t in tasks) // r.group_size for d in sorted({t.domain for t in tasks})}
    head = (
        f"{len(tasks)} episodes ({', '.join(f'{d} {n}' for d, n in counts.items())} tasks x group {r.group_size}), "
        f"recipe {os.path.relpath(args.recipe, ROOT)}, engine dtype {rt.cfg.model.engine_dtype}, "
        f"host {cpu_model()}, {os.cpu_count()} CPUs"
    )
    hdr = [
        "arm",
        "rollout s (each round)",
        "median s",
        "policy tokens",
        "tokens/s",
        "turns",
        "env reward",
        "time / streamed",
    ]
    body = head + "\n\n" + table(hdr, rows)
    print(body)
    if not args.no_write:
        write_section(
            "episode_stream", "Multi-turn rollouts: streamed vs. turn by turn (`bench/episode_stream.py`)", body
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
