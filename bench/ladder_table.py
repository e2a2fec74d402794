"""Per-domain and per-rung table of the measured difficulty in task-ladder files.

    python bench/ladder_table.py recipes/data/*_ladder.train.jsonl

reads the tasks that carry ``meta.base_pass_rate`` (written by ``jointrl difficulty``) and
prints, per file and rung and for the whole file: n measured, the fraction with
``0 < pass rate < 1`` (a group of samples on such a task has reward variance: learning
signal) with its binomial standard error ``sqrt(f (1 - f) / n)``, the fractions never and
always solved, mean pass@1 and mean reward (partial credit). Unmeasured tasks are counted
apart. It measures nothing itself.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.io import load_tasks  # noqa: E402 - after the path insert


def _row(label: str, tasks: list) -> str:
    n = len(tasks)
    rates = [float(t.meta["base_pass_rate"]) for t in tasks]
    rewards = [t.meta["base_pass"]["mean_reward"] for t in tasks if t.meta["base_pass"].get("mean_reward") is not None]
    f = sum(0 < r < 1 for r in rates) / n
    se = math.sqrt(f * (1 - f) / n)
    never = sum(r == 0 for r in rates) / n
    always = sum(r == 1 for r in rates) / n
    mean_reward = sum(rewards) / len(rewards) if rewards else float("nan")
    return (
        f"| {label} | {n} | {f:.2f} +- {se:.2f} | {never:.2f} | {always:.2f} | "
        f"{sum(rates) / n:.3f} | {mean_reward:.3f} |"
    )


def table(path: Path) -> str:
    tasks = load_tasks(path)
    measured = [t for t in tasks if isinstance(t.meta.get("base_pass_rate"), (int, float))]
    head = [
        f"{path.name}: {len(measured)} of {len(tasks)} tasks measured",
        "",
        "| rung | n | 0 < p < 1 (+- SE) | never | always | mean pass@1 | mean reward |",
        "|---|---|---|---|---|---|---|",
    ]
    if not measured:
        return "\n".join(head[:1])
    rungs = sorted({t.meta.get("rung") for t in measured}, key=str)
    rows = [_row(str(r), [t for t in measured if t.meta.get("rung") == r]) for r in rungs]
    return "\n".join([*head, *rows, _row("all", measured)])


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    for p in argv:
        print(table(Path(p)))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
