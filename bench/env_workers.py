"""Env calls on threads (``rollout.env_workers``): one rollout's env time, one at a time vs. at once.

Runs ``rollout.episode.run_episodes`` over the shipped terminal and code ladder tasks with a
scripted engine (no model: it answers every task with its reference solution, so that each
episode runs its real sandboxed setup, command or unit tests, and check), for each setting
of ``env_workers``, side by side in one process, and reports the wall time of each and its
ratio to one at a time. The env verdicts must agree across settings (exit 1 otherwise).
What it does not measure: generation (the engine answers at once), so in a real step the
saving is this env time's share of the rollout.

    .venv/bin/python bench/env_workers.py --tasks 32 --workers 1,2,4 --rounds 2
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import cpu_model  # noqa: E402
from envs.base import resolve  # noqa: E402
from envs.io import load_tasks  # noqa: E402
from envs.types import Generation, Sampling, Task  # noqa: E402
from rollout.episode import run_episodes  # noqa: E402
from rollout.pool import usable_cpus  # noqa: E402

ENVS = {"terminal": ("envs.terminal.TerminalEnv", {"max_turns": 1}), "code": ("envs.code.CodeEnv", {"max_turns": 1})}


def reference(t: Task) -> str:
    """The task's reference solution as the policy's turn, after the task's prefill."""
    full = f"```bash\n{t.terminal.solution}\n```" if t.domain == "terminal" else f"```python\n{t.code.solution}```"
    return full[len(t.prefill) :] if full.startswith(t.prefill) else full


class ReferenceEngine:
    """Answers prompt i with ``texts[i]`` (no sampling): only the envs take time."""

    def __init__(self, tok, texts: list[str]):
        self.tok, self.texts = tok, texts

    def generate(self, prompts, sampling, seeds=None, stops=None):
        assert len(prompts) == len(self.texts)
        out = []
        for text in self.texts:
            ids = list(self.tok(text, add_special_tokens=False)["input_ids"]) + [self.tok.eos_token_id]
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=32, help="tasks per domain (terminal and code ladders, held-out)")
    ap.add_argument("--workers", default="1,2,4", help="env_workers settings to time, in this order")
    ap.add_argument("--rounds", type=int, default=2, help="each setting's best of this many rollouts")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from rl.trainer.hub import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("embedded:tiny"))
    data = ROOT / "recipes" / "data"
    tasks = [t for f in ("terminal_ladder", "code_ladder") for t in load_tasks(data / f"{f}.eval.jsonl")[: args.tasks]]
    n = len(tasks)
    workers = [int(x) for x in args.workers.split(",")]

    def rollout(w: int, ts: list[Task]) -> list:
        return run_episodes(
            ReferenceEngine(tok, [reference(t) for t in ts]),
            tok,
            lambda d: resolve(ENVS[d][0])(**ENVS[d][1]),
            ts,
            list(range(len(ts))),
            list(range(len(ts))),
            Sampling(max_turns=1),
            env_workers=w,
        )

    rollout(1, tasks[:1] + tasks[-1:])  # warm-up: the sandbox's one-time probes and seccomp filter
    timings: dict[int, float] = {}
    verdicts = {}
    for _ in range(args.rounds):  # settings interleaved, best of the rounds
        for w in workers:
            t0 = time.perf_counter()
            trajs = rollout(w, tasks)
            timings[w] = min(timings.get(w, float("inf")), time.perf_counter() - t0)
            verdicts[w] = [(t.env_reward, [m.content for m in t.messages]) for t in trajs]
    print(
        f"{n} episodes ({args.tasks} terminal + {args.tasks} code), host {cpu_model() or platform.processor()}, "
        f"{usable_cpus()} CPUs"
    )
    first = next(iter(timings))
    for w, s in timings.items():
        print(f"env_workers={w}: {s:.2f} s ({timings[first] / s:.2f}x env_workers={first})")
    same = all(v == verdicts[first] for v in verdicts.values())
    print("verdicts and observations identical across settings" if same else "VERDICTS DIFFER across settings")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
