"""Does a later turn fix a failing answer? Each multi-turn training episode's first and last answers scored alone.

Reads finished run folders (``rollouts.jsonl`` and ``recipe.resolved.yaml``; e.g. the ``seed_<S>`` folders of a
``bench/seeds.py`` sweep). For every train-split episode of ``--domain`` (default ``code``) that ran more than one
turn, the episode's assistant turns are split apart and its first and last answers are each scored alone, on the
training task, by the recipe's reward functions for that domain (``rewards.service.RewardScorer``, the trainer's
own; code runs again in the reward's sandbox, nothing is taken from the env). An env that gives test feedback and
another try (``envs.code.CodeEnv`` with ``max_turns`` > 1) only earns its later turns if the last answer beats the
first; this counts how often it does.

Per run and over all runs it prints: the domain's train episodes; those that ran more than one turn; of those, the
last answer above / below / equal to the first; their mean first and last score; the rescored last answer against
the score the run logged (they differ only where a sandbox run is not reproducible, e.g. a timeout); the share of
the domain's response text in turns after the first; and the domain's share of the policy tokens sampled in
training episodes (``response_tokens``). The held-out evaluation records are not read.

Where a turn ends: ``turn_chars`` in each record (the logger writes it: the characters of each assistant turn of
``response``, which joins them by one newline). Records written before that field existed are split where a second
line opening a ```` ```python ```` fence starts (a code turn closes its one block, the recipe's stop string, so the
next fence opens the next turn); such a record whose first turn opened no block at the start, or whose first turn
holds two python fences, is split wrong or not at all, and the output says how many records were split each way.

    .venv/bin/python bench/code_turns.py --sweep runs/seeds/joint_rl [--json out.json]
    .venv/bin/python bench/code_turns.py runs/joint_rl
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.seed_divergence import _jsonl, run_dirs  # noqa: E402

_PY_FENCE = re.compile(r"(?m)^```python[ \t]*$")


def split_turns(record: dict[str, Any]) -> tuple[list[str], str]:
    """The assistant turns of one ``rollouts.jsonl`` record and how they were found: ``"turn_chars"`` (exact),
    ``"fence"`` (a record without it, split at each line that opens a ```` ```python ```` fence after the first) or
    ``"one"`` (no second fence: one turn as far as can be told)."""
    response = str(record.get("response") or "")
    sizes = record.get("turn_chars")
    if isinstance(sizes, list) and all(isinstance(n, int) and n >= 0 for n in sizes):
        if sum(sizes) + max(len(sizes) - 1, 0) != len(response):
            raise ValueError(f"turn_chars {sizes} do not add up to the response's {len(response)} characters")
        turns, start = [], 0
        for n in sizes:
            turns.append(response[start : start + n])
            start += n + 1
        return turns, "turn_chars"
    starts = [m.start() for m in _PY_FENCE.finditer(response)]
    cuts = [s for s in starts if s > 0]
    if starts and starts[0] == 0 and cuts:
        bounds = [0, *cuts, len(response) + 1]
        # the logger joined turns by one newline: the character before each later turn is that newline
        return [response[a : b - 1] for a, b in zip(bounds, bounds[1:])], "fence"
    return [response], "one"


@dataclass
class Episode:
    """One multi-turn train episode: its task, its first and last answers, and what the run logged for it."""

    task_id: str
    first: str
    last: str
    logged: float | None  # the reward the run logged for the episode (its last answer), shaping terms left out
    first_score: float | None = None
    last_score: float | None = None


@dataclass
class RunTurns:
    """One run folder's episodes of the domain, as this analysis counts them."""

    label: str
    recipe: Path
    episodes: int = 0  # train episodes of the domain
    multi: list[Episode] = field(default_factory=list)
    split_by: dict[str, int] = field(default_factory=dict)  # how each record's turns were found
    chars_first: int = 0  # response characters in first turns (all episodes of the domain)
    chars_later: int = 0  # ... in later turns (the joining newlines left out)
    tokens_domain: int = 0  # policy tokens of the domain's train episodes
    tokens_all: int = 0  # policy tokens of every train episode


def load_run(path: Path, domain: str) -> RunTurns:
    """A run folder's train episodes of ``domain``; ``ValueError`` naming the file (and line) that is missing or
    does not read."""
    path = Path(path)
    rollouts, recipe = path / "rollouts.jsonl", path / "recipe.resolved.yaml"
    for p in (rollouts, recipe):
        if not p.is_file():
            raise ValueError(f"{path}: no {p.name} (a run folder holds rollouts.jsonl and recipe.resolved.yaml)")
    out = RunTurns(path.name, recipe)
    for n, r in _jsonl(rollouts):
        if r.get("split") != "train":
            continue
        tokens = int(r.get("response_tokens") or 0)
        out.tokens_all += tokens
        if r.get("domain") != domain:
            continue
        out.episodes += 1
        out.tokens_domain += tokens
        try:
            turns, how = split_turns(r)
        except ValueError as e:
            raise ValueError(f"{rollouts}:{n}: {e}") from None
        out.split_by[how] = out.split_by.get(how, 0) + 1
        out.chars_first += len(turns[0])
        out.chars_later += sum(len(t) for t in turns[1:])
        if len(turns) < 2:
            continue
        if r.get("reward_error"):
            continue  # a harness failure: the run logged no score of the policy's answer
        reward = r.get("reward")
        logged = None if reward is None else float(reward) - float(r.get("reward_shaping") or 0.0)
        out.multi.append(Episode(str(r.get("task_id")), turns[0], turns[-1], logged))
    return out


def resolved_recipe(path: Path):
    """The recipe a run folder's ``recipe.resolved.yaml`` holds. Its relative paths (task files) are read from the
    folder of the recipe it was resolved from (its ``source``), or, where that folder is gone (a worktree
    removed), from this checkout's ``recipes/``, where the shipped recipes' data lives."""
    import yaml

    from rl.config.recipe import recipe_from_dict

    raw = yaml.safe_load(path.read_text()) or {}
    source = raw.pop("source", None)
    base = Path(source).parent if source and Path(source).parent.is_dir() else ROOT / "recipes"
    return recipe_from_dict(raw, base)


def score_run(run: RunTurns, domain: str) -> None:
    """Score each multi-turn episode's first and last answer alone with the recipe's reward functions for
    ``domain``, on the task from the recipe's training files: the weighted sum of their scores without shaping
    terms (``Trajectory.task_reward``), the reward the run optimized for the task."""
    from envs.types import Message
    from rewards.service import reward_specs
    from rl.cli.common import check_reward_specs, load_task_file, make_scorer
    from rl.cli.score import Completion, build_trajectories
    from rl.config.recipe import resolve_path

    cfg = resolved_recipe(run.recipe)
    specs = reward_specs(cfg.rewards)
    specs = [s for s in specs if not s.domains or domain in s.domains]
    if not specs:
        raise ValueError(f"{run.recipe}: no reward function for domain {domain!r}")
    check_reward_specs(specs, where=f"{run.recipe}: ")
    files = [resolve_path(cfg, f) for f in cfg.data.train_files]
    for f in files:
        if not f.exists():
            raise ValueError(f"{run.recipe}: data.train_files: {f} does not exist")
    tasks = {t.id: t for f in files for t in load_task_file(str(f)) if t.domain == domain}
    missing = sorted({e.task_id for e in run.multi} - set(tasks))
    if missing:
        raise ValueError(f"{run.recipe}: task {missing[0]!r} is in no training file of the recipe")
    scorer = make_scorer(specs, timeout_s=None, where=f"{run.recipe}: ")
    # Each answer as a recorded completion of its task, the path `jointrl score` takes: the first answer alone (the
    # prefill put back if it lacks it), the last one after the first (the rewards score the last assistant turn;
    # the prefill belongs to the first). Distinct sample numbers keep the two records of one episode apart.
    records = []
    for k, e in enumerate(run.multi):
        records.append(Completion(f"{run.label}:{k}:first", e.task_id, 2 * k, e.first, None, None))
        turns = [Message("assistant", e.first), Message("assistant", e.last)]
        records.append(Completion(f"{run.label}:{k}:last", e.task_id, 2 * k + 1, None, turns, None))
    trajs, _ = build_trajectories(list(tasks.values()), records, "the recipe's training files")
    scored = scorer.score(trajs)
    for k, e in enumerate(run.multi):
        e.first_score, e.last_score = scored[2 * k].task_reward, scored[2 * k + 1].task_reward


def summary(label: str, runs: list[RunTurns]) -> dict[str, Any]:
    """The numbers of one row: counts, means and shares over ``runs``' episodes."""
    eps = [e for r in runs for e in r.multi]
    both = [e for e in eps if e.first_score is not None and e.last_score is not None]
    logged = [e for e in both if e.logged is not None]
    chars = sum(r.chars_first + r.chars_later for r in runs)
    tokens_all = sum(r.tokens_all for r in runs)

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    split_by: dict[str, int] = {}
    for r in runs:
        for k, v in r.split_by.items():
            split_by[k] = split_by.get(k, 0) + v
    return {
        "label": label,
        "episodes": sum(r.episodes for r in runs),
        "multi_turn": len(eps),
        "scored": len(both),
        "last_above_first": sum(e.last_score > e.first_score for e in both),
        "last_below_first": sum(e.last_score < e.first_score for e in both),
        "equal": sum(e.last_score == e.first_score for e in both),
        "mean_first": mean([e.first_score for e in both]),
        "mean_last": mean([e.last_score for e in both]),
        "last_differs_from_logged": sum(abs(e.last_score - e.logged) > 1e-9 for e in logged),
        "later_turn_text_share": sum(r.chars_later for r in runs) / chars if chars else None,
        "domain_token_share": sum(r.tokens_domain for r in runs) / tokens_all if tokens_all else None,
        "split_by": split_by,
    }


def render(rows: list[dict[str, Any]], domain: str) -> str:
    def f(x: float | None, pct: bool = False) -> str:
        return "-" if x is None else (f"{100 * x:.0f}%" if pct else f"{x:.3f}")

    head = (
        f"| run | {domain} train episodes | more than one turn | last > first | last < first | equal "
        "| mean first | mean last | last != logged | later-turn text | domain's policy tokens | split by |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        how = ", ".join(f"{k} {v}" for k, v in sorted(r["split_by"].items()))
        lines.append(
            f"| {r['label']} | {r['episodes']} | {r['multi_turn']} | {r['last_above_first']} | "
            f"{r['last_below_first']} | {r['equal']} | {f(r['mean_first'])} | {f(r['mean_last'])} | "
            f"{r['last_differs_from_logged']} | {f(r['later_turn_text_share'], True)} | "
            f"{f(r['domain_token_share'], True)} | {how} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="run folders (rollouts.jsonl, recipe.resolved.yaml)")
    ap.add_argument("--sweep", default="", help="a bench/seeds.py --out folder: its seed_* runs")
    ap.add_argument("--domain", default="code", help="the domain whose multi-turn episodes to score (default code)")
    ap.add_argument("--json", default="", help="also write every row to this file")
    args = ap.parse_args(argv)
    dirs = run_dirs(args.runs, args.sweep)
    if not dirs:
        print("code_turns: error: no run folder given (runs or --sweep)", file=sys.stderr)
        return 2
    try:
        runs = [load_run(p, args.domain) for p in dirs]
        for r in runs:
            if r.multi:
                score_run(r, args.domain)
    except ValueError as e:
        print(f"code_turns: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a recipe that no longer loads, a task file gone: say which
        print(f"code_turns: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    labels = [r.label for r in runs]
    for r in runs:  # two folders of one name (two sweeps' seed_0): tell them apart by their parent
        if labels.count(r.label) > 1:
            r.label = f"{r.recipe.parent.parent.name}/{r.label}"
    rows = [summary(r.label, [r]) for r in runs]
    if len(runs) > 1:
        rows.append(summary("all", runs))
    print(render(rows, args.domain))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
