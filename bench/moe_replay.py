"""Routing replay, measured: the tiny MoE recipe trained with ``learner.routing_replay`` none, r2 and r3 side by side.

Each arm is a real ``jointrl train recipes/tiny_moe.yaml --local learner.routing_replay=<arm> run.seed=S``
(``bench/seeds.py``'s ``run_seed``: a subprocess, or ``--in-process``) into ``OUT/<arm>/seed_<S>``, its output in
``OUT/<arm>/logs/seed_<S>.log``. Every arm runs in the in-process runtime with the HF engine (``--local``): r3
needs the engine's routing, which only the HF engine reports on CPU (vLLM's routed-experts output needs a GPU,
docs/moe.md), so all three arms run there for a like-for-like comparison. The arms share the seeds, the recipe,
the step count and the precision (``learner.precision: auto`` timed once here and pinned for every run,
``bench/seeds.py``'s ``pinned_precision``); runs go seed by seed, arm after arm within a seed, so a change in the
host's load falls on every arm alike. With one seed the first step's rollouts are the same in every arm (same
weights, same sampling seeds): replay changes only the update, so the arms part from step 2 on.

Reported per arm, from each run's ``metrics.jsonl`` (train steps; mean over the steps, then over seeds):

* ``async/mismatch_kl``: the engine/learner log-prob mismatch (k3 KL per policy token, prepare pass);
* ``rollout/logprob_diff``: the mean absolute engine/learner log-prob gap per policy token;
* ``moe/routing_disagreement``: the share of token-layer selections whose experts differ between the
  engine's routing and the learner's old-log-prob pass (0 under r3 by construction);
* ``reward/mean``: the training reward, mean over all steps and over the last ``--last`` steps, and step 1's;
* ``timing/step_s``: the median step time, and the run's wall time (start-up and evaluations included).

Outputs, in ``--out`` (default ``runs/moe_replay``): ``replay.json`` (every number, every failure) and
``RESULTS-section.md`` (a section for ``bench/RESULTS.md``; ``--write`` replaces it there). A run that fails is
named with its cause and left out of the tables; the others go on (exit 3). Bad input (exit 2, nothing
trained): an unknown arm, a repeated arm or seed, a recipe that does not load, or replay on a dense model.

    .venv/bin/python bench/moe_replay.py --steps 12                     # three arms, seed 0
    .venv/bin/python bench/moe_replay.py --steps 2 --seeds 0 --in-process --no-eval   # a quick check
    .venv/bin/python bench/moe_replay.py --from-runs --steps 12         # re-analyse runs/moe_replay
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.seeds import (  # noqa: E402
    INTERRUPTED,
    SeedRun,
    SweepError,
    finished,
    parse_seeds,
    pinned_precision,
    run_seed,
    seed_dir,
)

RECIPE = ROOT / "recipes" / "tiny_moe.yaml"
ARMS = ("none", "r2", "r3")
KEYS = {  # column -> metrics.jsonl key, averaged over a run's train steps
    "mismatch_kl": "async/mismatch_kl",
    "logprob_diff": "rollout/logprob_diff",
    "disagreement": "moe/routing_disagreement",
}
NO_EVAL = ["data.eval_files=[]", "train.eval_at_start=false"]


@dataclass
class ArmRun:
    """One (arm, seed) run and what its metrics give; ``stats`` is empty for a failed run."""

    arm: str
    run: SeedRun
    stats: dict[str, float | None] = field(default_factory=dict)


# ---------------------------------------------------------------------------- statistics


def train_records(run_dir: Path) -> list[dict[str, Any]]:
    """The train steps' records of a run's ``metrics.jsonl`` (those holding ``reward/mean``), by step."""
    from rl.cli.report import read_metrics

    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{path}: no metrics.jsonl")
    recs = [r for r in read_metrics(path) if _num(r.get("reward/mean")) is not None]
    if not recs:
        raise ValueError(f"{path}: no train step (no reward/mean)")
    return recs


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def run_stats(recs: list[dict[str, Any]], last: int) -> dict[str, float | None]:
    """One run's numbers from its train records: the mean over steps of each ``KEYS`` metric (None where never
    logged), the reward's mean over all steps, over the last ``last`` steps and at the first step, the median
    step time, and the number of steps."""
    out: dict[str, float | None] = {}
    for col, key in KEYS.items():
        out[col] = _mean([v for r in recs if (v := _num(r.get(key))) is not None])
    rewards = [float(r["reward/mean"]) for r in recs]
    out["reward"] = _mean(rewards)
    out["reward_last"] = _mean(rewards[-max(last, 1) :])
    out["reward_first"] = rewards[0]
    times = [v for r in recs if (v := _num(r.get("timing/step_s"))) is not None]
    out["step_s"] = statistics.median(times) if times else None
    out["steps"] = float(len(recs))
    return out


def arm_summary(runs: list[ArmRun]) -> dict[str, dict[str, Any]]:
    """Per arm, over its finished seeds: each statistic's mean (None where no seed has it), its sample SD across
    seeds (None for one seed), the seeds counted and the mean wall time."""
    out: dict[str, dict[str, Any]] = {}
    for arm in dict.fromkeys(r.arm for r in runs):
        ok = [r for r in runs if r.arm == arm and r.stats]
        cols = sorted({k for r in ok for k in r.stats})
        summary: dict[str, Any] = {"seeds": len(ok)}
        for c in cols:
            xs = [v for r in ok if (v := r.stats.get(c)) is not None]
            summary[c] = _mean(xs)
            summary[c + "_sd"] = statistics.stdev(xs) if len(xs) > 1 else None
        walls = [r.run.wall_s for r in ok if r.run.wall_s is not None]
        summary["wall_s"] = _mean(walls)
        out[arm] = summary
    return out


# ---------------------------------------------------------------------------- report


def _fmt(v: float | None, digits: int = 3, sd: float | None = None) -> str:
    if v is None:
        return "-"
    text = f"{v:.{digits}g}" if abs(v) < 1e-2 and v != 0 else f"{v:.{digits}f}"
    return text + (f" ± {sd:.{digits}g}" if sd is not None else "")


def render(summary: dict[str, dict[str, Any]], runs: list[ArmRun], meta: dict[str, Any]) -> str:
    """The Markdown body of the bench's RESULTS.md section."""
    from bench._results import table

    lines = [
        f"Recipe `{meta['recipe']}`{' with ' + ' '.join(f'`{o}`' for o in meta['overrides']) if meta['overrides'] else ''}, "
        f"{meta['steps']} steps per run, seeds {', '.join(str(s) for s in meta['seeds'])}, every arm in the in-process "
        "runtime with the HF engine (`jointrl train --local`: r3 needs the engine's routing, which only the HF engine "
        "reports on CPU), runs interleaved seed by seed. Per run: the mean over its train steps; per arm: the mean "
        f"over seeds (± the SD across seeds where there are several). Last = the last {meta['last']} steps. "
        f"{meta['precision'] + ' ' if meta.get('precision') else ''}Host: {meta['host']}.",
        "",
    ]
    head = [
        "arm",
        "seeds",
        "async/mismatch_kl",
        "rollout/logprob_diff",
        "moe/routing_disagreement",
        "reward step 1",
        "reward, all steps",
        "reward, last steps",
        "step s (median)",
        "wall s",
    ]
    rows = []
    for arm, s in summary.items():
        rows.append(
            [
                arm,
                str(s["seeds"]),
                *(_fmt(s.get(c), 3, s.get(c + "_sd")) for c in ("mismatch_kl", "logprob_diff", "disagreement")),
                _fmt(s.get("reward_first")),
                _fmt(s.get("reward"), 3, s.get("reward_sd")),
                _fmt(s.get("reward_last"), 3, s.get("reward_last_sd")),
                _fmt(s.get("step_s"), 3),
                f"{s['wall_s']:.0f}" if s.get("wall_s") is not None else "-",
            ]
        )
    lines += [table(head, rows), ""]
    failed = [r for r in runs if not r.stats]
    if failed:
        lines += [
            "Failed (not in the table): " + "; ".join(f"{r.arm} seed {r.run.seed}: {r.run.cause}" for r in failed),
            "",
        ]
    lines.append("What this shows: " + conclusions(summary))
    return "\n".join(lines)


def conclusions(summary: dict[str, dict[str, Any]]) -> str:
    """Plain sentences on the table: each arm's mismatch and disagreement against ``none``'s (an arm equal to it
    on every one of them is said to be), and a training reward that never moved off 0."""
    base = summary.get("none", {})
    said = []
    for arm, s in summary.items():
        if arm == "none" or not s["seeds"] or not base.get("seeds"):
            continue
        if all(s.get(c) == base.get(c) for c in (*KEYS, "reward")):
            said.append(f"{arm}'s mismatch, routing disagreement and reward equal none's exactly")
            continue
        parts = []
        for col, key in KEYS.items():
            a, b = s.get(col), base.get(col)
            if a is not None and b:
                parts.append(f"{key} {a / b:.2f}x none's")
        said.append(f"{arm}: " + (", ".join(parts) or "no metric to compare with none's"))
    rewards = [v for s in summary.values() for c in ("reward", "reward_first") if (v := s.get(c)) is not None]
    if rewards and all(v == 0 for v in rewards):
        said.append("the training reward is 0 in every arm: the runs measure the mismatch, not learning")
    if max((s["seeds"] for s in summary.values()), default=0) == 1:
        said.append("one seed: no run-to-run spread")
    return ("; ".join(said) or "nothing to compare") + "."


# ---------------------------------------------------------------------------- running


def check(recipe: Path, arms: list[str], overrides: list[str], steps: int) -> Any:
    """The recipe under each arm's override, loaded and validated, and the model checked for replay (a dense model
    is refused naming ``learner.routing_replay``); ``SweepError`` naming the recipe, the arm and the cause. The
    first arm's recipe is returned (for the pinned precision)."""
    from rl.config.recipe import RecipeError, load_recipe, validate_recipe
    from rl.driver.loop import prepare_model

    bad = [a for a in arms if a not in ARMS]
    if bad:
        raise SweepError(f"--arms: unknown arm {bad[0]!r}; choose from {', '.join(ARMS)}")
    if len(set(arms)) != len(arms):
        raise SweepError("--arms: an arm is given twice")
    for o in overrides:
        if o.split("=", 1)[0].strip() in ("learner.routing_replay", "run.seed", "train.steps"):
            raise SweepError(f"override {o!r}: the bench sets it (--arms, --seeds, --steps)")
    first = None
    for arm in arms:
        try:
            cfg = load_recipe(recipe, [*overrides, f"train.steps={steps}", f"learner.routing_replay={arm}"])
            validate_recipe(cfg)
            prepare_model(cfg)
        except RecipeError as e:
            raise SweepError(f"{recipe}, arm {arm}: {e}") from None
        first = first or cfg
    return first


def run_all(
    recipe: Path, arms: list[str], seeds: list[int], out: Path, overrides: list[str], in_process: bool, keep: bool
) -> list[ArmRun]:
    """Every (arm, seed) run, seed by seed and arm after arm (``keep``: a finished run in ``out`` is kept). A run
    interrupted (Ctrl-C: exit 130) starts no further run; those come back failed, ``not run``."""
    runs: list[ArmRun] = []
    for seed in seeds:
        for arm in arms:
            if any(r.run.exit_code == INTERRUPTED for r in runs):
                runs.append(ArmRun(arm, SeedRun(seed, str(seed_dir(out / arm, seed)), "failed", cause="not run")))
                continue
            prior = finished(out / arm, seed) if keep else None
            arm_over = [*overrides, f"learner.routing_replay={arm}"]
            runs.append(ArmRun(arm, prior or run_seed(recipe, seed, out / arm, arm_over, True, in_process)))
    return runs


def analyse(runs: list[ArmRun], last: int) -> None:
    """Fill each finished run's ``stats``; a run whose metrics do not read becomes failed, with the cause."""
    for r in runs:
        if r.run.status == "failed":
            continue
        try:
            r.stats = run_stats(train_records(Path(r.run.run_dir)), last)
        except (OSError, ValueError) as e:
            r.run.status, r.run.cause = "failed", f"its metrics do not read: {e}"


SWITCHES = {
    "--in-process": "each run in this process (no interpreter start-up)",
    "--no-eval": "skip the held-out evaluations (start and end)",
    "--keep-done": "keep the runs in --out that finished; train the rest",
    "--from-runs": "analyse the runs in --out; train nothing",
    "--write": "also replace the section in bench/RESULTS.md",
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=str(RECIPE), help="an MoE recipe (default recipes/tiny_moe.yaml)")
    ap.add_argument("--arms", default=",".join(ARMS), help="learner.routing_replay values, e.g. none,r3")
    ap.add_argument("--seeds", default="0", help="comma-separated integer seeds (every arm runs each)")
    ap.add_argument("--steps", type=int, default=12, help="train.steps of every run")
    ap.add_argument("--last", type=int, default=0, help="steps in the 'last steps' reward (default: a third)")
    ap.add_argument("--out", default="", help="folder of the runs (default runs/moe_replay)")
    for flag, text in SWITCHES.items():
        ap.add_argument(flag, action="store_true", help=text)
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    return ap.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    recipe = Path(args.recipe).resolve()
    out = Path(args.out or ROOT / "runs" / "moe_replay").resolve()
    shown = [*(NO_EVAL if args.no_eval else []), *args.overrides]  # every run's, as the section names them
    overrides = [*shown, f"train.steps={args.steps}"]
    try:
        if args.steps < 1:
            raise SweepError(f"--steps must be >= 1, got {args.steps}")
        seeds, arms = parse_seeds(args.seeds), [a.strip() for a in args.arms.split(",") if a.strip()]
        cfg = check(recipe, arms, shown, args.steps)
    except SweepError as e:
        print(f"moe_replay: error: {e}", file=sys.stderr)
        return 2
    pinned, note = ([], "") if args.from_runs else pinned_precision(cfg, True)
    if args.from_runs:
        runs = [
            ArmRun(a, finished(out / a, s) or SeedRun(s, str(seed_dir(out / a, s)), "failed", cause="no finished run"))
            for s in seeds
            for a in arms
        ]
    else:
        runs = run_all(recipe, arms, seeds, out, [*pinned, *overrides], args.in_process, args.keep_done)
    last = args.last or max(args.steps // 3, 1)
    analyse(runs, last)
    meta = {
        "recipe": os.path.relpath(recipe, ROOT) if recipe.is_relative_to(ROOT) else str(recipe),
        "overrides": shown,
        "steps": args.steps,
        "seeds": seeds,
        "last": last,
        "precision": f"Precision pinned for every run: {note}." if note else "",
    }
    return report(out, runs, meta, args.write)


def report(out: Path, runs: list[ArmRun], meta: dict[str, Any], write: bool) -> int:
    """Write ``replay.json`` and ``RESULTS-section.md`` (and the RESULTS.md section with ``write``), print the
    table; 0 when every run finished, 130 when the bench was interrupted, else 3."""
    from bench._results import cpu_model, section, write_section

    meta["host"] = cpu_model() or "unknown"
    summary = arm_summary(runs)
    body = render(summary, runs, meta)
    title = "MoE routing replay: none / r2 / r3 on the tiny MoE (`bench/moe_replay.py`)"
    out.mkdir(parents=True, exist_ok=True)
    (out / "RESULTS-section.md").write_text(section("moe_replay", title, body))
    if write:
        write_section("moe_replay", title, body)
    rows = [{"arm": r.arm, **asdict(r.run), "stats": r.stats} for r in runs]
    (out / "replay.json").write_text(json.dumps({"meta": meta, "runs": rows, "summary": summary}, indent=1) + "\n")
    print(body)
    print(f"moe_replay: wrote {out / 'RESULTS-section.md'}, {out / 'replay.json'}", file=sys.stderr)
    if any(r.run.exit_code == INTERRUPTED for r in runs):
        return INTERRUPTED
    return 3 if any(not r.stats for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
