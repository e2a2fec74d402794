"""How much learning signal per-argument credit adds to tool-call rewards, from runs already made.

GRPO learns only from groups whose samples' rewards differ. ``rewards.toolcall.ToolCallReward``
gives argument credit all-or-nothing by default (``args_credit: all``, BFCL's exact match);
``args_credit: fraction`` gives the share of the call's arguments that are right. This bench
re-scores the tool-call samples a run logged (``rollouts.jsonl``; the response text as the
policy wrote it) under both settings and reports, per split:

* groups (one task's ``group_size`` samples of one step) whose rewards vary, under each;
* the mean reward under each, and how many samples get a fractional argument credit;
* whether re-scoring under the run's own setting reproduces the logged rewards (it must:
  otherwise the re-scoring is not of the same thing, and the bench says so and exits 1).

It trains nothing: what a run would learn with the other setting is for a training run to
show. Tasks are looked up by id in the task files given (default: every shipped tool-call file).

    .venv/bin/python bench/toolcall_credit.py runs/seesaw/single_tool_call/rollouts.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.io import load_tasks  # noqa: E402
from envs.types import Task  # noqa: E402
from rewards.toolcall import ToolCallReward  # noqa: E402

DEFAULT_TASK_FILES = sorted(str(p) for p in (ROOT / "recipes" / "data").glob("toolcall_*.jsonl"))


def rescore(records: list[dict], tasks: dict[str, Task], kwargs: dict) -> dict[str, dict[str, float]]:
    """Per split: groups, groups with reward variance under each setting, mean rewards, fractional
    samples, and mismatches between the logged reward and the re-scored one (run's setting)."""
    logged_mode = kwargs.get("args_credit", "all")
    scorers = {m: ToolCallReward(**{**kwargs, "args_credit": m}) for m in ("all", "fraction")}
    groups: dict[tuple[str, int, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in records:
        task = tasks.get(r["task_id"])
        if r.get("domain") != "tool_call" or task is None or task.tool_call is None:
            continue
        expected = list(task.tool_call.expected)
        s = {m: fn.score(r["response"], expected) for m, fn in scorers.items()}
        key = (r["split"], int(r["step"]), int(r["group"]))
        for m, v in s.items():
            groups[key][m].append(v)
        o = out[r["split"]]
        o["samples"] += 1
        o["mean_all"] += s["all"]
        o["mean_fraction"] += s["fraction"]
        o["fractional_samples"] += s["fraction"] != s["all"]
        if r.get("reward") is not None and abs(float(r["reward"]) - s[logged_mode]) > 1e-9:
            o["mismatches"] += 1
    for (split, _, _), per in groups.items():
        o = out[split]
        o["groups"] += 1
        for m in ("all", "fraction"):
            o[f"groups_with_variance_{m}"] += len(per[m]) > 1 and statistics.pstdev(per[m]) > 0
    for o in out.values():
        o["mean_all"] /= o["samples"]
        o["mean_fraction"] /= o["samples"]
    return {k: dict(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rollouts", nargs="+", help="rollouts.jsonl files of finished runs")
    ap.add_argument("--tasks", nargs="*", default=DEFAULT_TASK_FILES, help="task files holding the runs' task ids")
    ap.add_argument(
        "--reward-kwargs",
        default='{"format_weight": 0.2, "name_weight": 0.3, "args_weight": 0.5}',
        help="the runs' ToolCallReward kwargs (JSON; args_credit among them if set)",
    )
    args = ap.parse_args(argv)
    tasks = {t.id: t for f in args.tasks for t in load_tasks(f)}
    kwargs = json.loads(args.reward_kwargs)
    bad = 0
    for path in args.rollouts:
        records = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
        for split, o in sorted(rescore(records, tasks, kwargs).items()):
            g = o.get("groups", 0)
            print(
                f"{path} [{split}]: {int(o['samples'])} samples, {int(g)} groups; groups with reward variance: "
                f"all-or-nothing {int(o['groups_with_variance_all'])}/{int(g)}, "
                f"per-argument {int(o['groups_with_variance_fraction'])}/{int(g)}; mean reward "
                f"{o['mean_all']:.3f} vs {o['mean_fraction']:.3f}; {int(o['fractional_samples'])} samples with "
                f"fractional argument credit; {int(o.get('mismatches', 0))} logged rewards not reproduced"
            )
            bad += int(o.get("mismatches", 0))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
