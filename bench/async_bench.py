"""Synchronous vs bounded-staleness streamed training on an agentic workload with long-tailed tool latency.

The workload (issue #43 item 5): the tool-call ladder in sessions of ``--turns`` requests (default 3; ``--tasks
chain``, the default: ``rl.data.tasks.toolcall_gen.write_chain_files`` writes them into the work folder, training
sessions from the ladder's training tasks, held-out ones from its held-out tasks), one request a turn, each turn
pre-started as its ladder task is and scored against its own request (``ToolCallReward`` per turn, averaged), with
``max_turns`` 3 (env and rollout), where every tool call first sleeps a seeded lognormal time, median 0.5 s,
sigma 1.0, capped at 20 s (the env option ``tool_latency``, envs/toolcall_latency.py; keyed by task, episode seed,
turn and call, so every arm sees the same latency for the same sample). The sleeps run on env worker threads
(``rollout.env_workers``, set above the episodes in flight), so other episodes keep generating while one waits.
``--tasks ladder`` trains on the recipe's own tasks (the quickstart's ladder: one request, one turn, one latency
draw per call); ``--tasks tools`` on recipes/data/toolcall_tasks.{train,eval}.jsonl (calls- and answer-mode tasks,
scored by ``ToolCallReward`` and ``ToolAnswerReward``), whose answer-mode episodes run up to 3 turns with the
simulated tools; its held-out set is 12 tasks.

Runs ``jointrl train`` (the real CLI: Ray actors, vLLM engine, learner, reward service) once per arm, in one
invocation, same recipe, seed, steps and samples per step: synchronous (``rollout.max_staleness=0``), then for
each k >= 1 of ``--staleness`` the stream without and with ``rollout.partial_rollouts`` (streamed arms use
``algo.loss.tis_cap`` for the policy lag). Per arm, from ``metrics.jsonl`` over all training steps: samples/s
(samples over the steps' summed time), mean step time, idle fractions (each ``async/idle_s/*`` over the step
time; derived from the step timings for the synchronous arm, which logs none), staleness (mean, max), dropped
groups; and from ``rollouts.jsonl`` the
held-out reward after the last step, paired per task against the synchronous arm's (bench/seesaw.py's
``paired``). The goal line: max_staleness 2 (the better of without and with partial rollouts is not chosen: each
is judged) reaches >= 1.4x the synchronous samples/s with held-out reward within 2 SE of synchronous.
Writes its section of bench/RESULTS.md (``--no-write``: print only).

    .venv/bin/python bench/async_bench.py [--recipe recipes/quickstart.yaml] [--steps 10] [--staleness 0,1,2,4]
    .venv/bin/python bench/async_bench.py --staleness 0,1 --no-partial --steps 2 --eval-limit 4 --no-write  # a check
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import cpu_model, write_section  # noqa: E402
from bench.seesaw import eval_steps, paired  # noqa: E402
from bench.seeds import pinned_precision  # noqa: E402
from rl.config.recipe import load_recipe  # noqa: E402
from rl.data.tasks.toolcall_gen import write_chain_files  # noqa: E402

GOAL_STALENESS = 2
GOAL_SPEEDUP = 1.4
GOAL_SE = 2.0
# ``--tasks tools``: the shipped tool tasks, answer-mode ones multi-turn with simulated tools, and both scorers
TOOLS_TASKS = [
    "data.train_files=[data/toolcall_tasks.train.jsonl]",
    "data.eval_files=[data/toolcall_tasks.eval.jsonl]",
    "rewards=[{cls: rewards.toolcall.ToolCallReward, domains: [tool_call]},"
    " {cls: rewards.toolcall.ToolAnswerReward, domains: [tool_call]}]",
]


# RESULTS.md section per task set: (key, title)
SECTIONS = {
    "chain": ("async_sessions", "Synchronous vs bounded-staleness streamed, 3-request tool-call sessions"),
    "ladder": ("async", "Synchronous vs bounded-staleness streamed, long-tailed tool latency"),
    "tools": ("async_tools", "Synchronous vs bounded-staleness streamed, multi-turn tool tasks"),
}
TASKS_LABEL = {
    "chain": " with --tasks chain: sessions of {turns} tool-call ladder requests, one a turn",
    "ladder": "",
    "tools": " with --tasks tools",
}


@dataclass(frozen=True)
class Arm:
    """One run of the bench: its folder name, ``rollout.max_staleness`` and whether partial rollouts are on."""

    name: str
    k: int
    partial: bool


def arms(ks: list[int], partial: bool = True) -> list[Arm]:
    """sync first, then for each k >= 1 the stream without and (``partial``) with partial rollouts."""
    out = [Arm("sync", 0, False)]
    for k in ks:
        if k > 0:
            out.append(Arm(f"k{k}", k, False))
            if partial:
                out.append(Arm(f"k{k}-partial", k, True))
    return out


def workload(args: argparse.Namespace) -> list[str]:
    """``key=value`` overrides that make the workload (the same for every arm)."""
    latency = f"{{median_s: {args.median_s}, sigma: {args.sigma}, cap_s: {args.cap_s}, seed: {args.seed}}}"
    ov = [
        f"rollout.envs=[{{domain: tool_call, cls: envs.toolcall.ToolCallEnv, kwargs: "
        f'{{max_turns: {args.turns}, tool_latency: {latency}}}, stop: ["</tool_call>"]}}]',
        f"rollout.max_turns={args.turns}",
        f"rollout.env_workers={args.env_workers or args.prompts * args.group}",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.group_size={args.group}",
        f"run.seed={args.seed}",
        f"train.steps={args.steps}",
        "train.eval_every=0",
        "train.eval_at_start=false",
        f"data.eval_limit={args.eval_limit}",
        "run.save_every=0",
        "run.overwrite=true",
        "wandb.mode=disabled",
    ]
    return ov + (TOOLS_TASKS if args.tasks == "tools" else [])


def chain_files(out: Path, turns: int, seed: int) -> list[str]:
    """Write the ladder's sessions of ``turns`` requests into ``out`` (train and held-out); the data overrides.
    100 held-out sessions, the count its sections in bench/RESULTS.md were measured with (drawn from the ladder's
    held-out tasks, 300 since the seed sweeps needed a smaller paired SE; this bench compares arms side by side)."""
    train, held = write_chain_files(out, length=turns, n_eval=100, seed=seed)
    return [f"data.train_files=[{train}]", f"data.eval_files=[{held}]"]


def arm_overrides(arm: Arm, tis_cap: float) -> list[str]:
    ov = [f"rollout.max_staleness={arm.k}", f"rollout.partial_rollouts={str(arm.partial).lower()}"]
    return ov + ([f"algo.loss.tis_cap={tis_cap}"] if arm.k else [])


class RunFailed(RuntimeError):
    """A ``jointrl train`` run that exited non-zero: its command, exit code and the tail of its output."""


def train(recipe: str, out: Path, overrides: list[str]) -> float:
    """One ``jointrl train`` run into ``out``; its wall time. Raises :class:`RunFailed` when it fails."""
    cmd = [sys.executable, "-m", "rl.cli.main", "train", recipe, f"run.output_dir={out}", *overrides]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RunFailed(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    (out / "bench_wall_s.txt").write_text(f"{wall:.1f}\n")
    return wall


def _idle(x: dict[str, Any]) -> dict[str, float]:
    """One step's idle fractions: each ``async/idle_s/*`` over the step time. The synchronous loop logs none: there
    the engines wait out all but the generation and the learner all but its update (from the step's timings)."""
    step = max(x["timing/step_s"], 1e-9)
    idle = {k.removeprefix("async/idle_s/"): v for k, v in x.items() if k.startswith("async/idle_s/")}
    if not idle:
        generate = x.get("timing/generate_s", x.get("timing/rollout_s", 0.0))
        idle = {"engines": max(step - generate, 0.0), "learner": max(step - x.get("timing/learner_s", 0.0), 0.0)}
    return {k: v / step for k, v in idle.items()}


def summarize(run_dir: Path, samples_per_step: int) -> dict[str, Any]:
    """An arm's numbers from its ``metrics.jsonl``, over all its training steps: samples/s = samples per step x
    steps / the steps' summed time (a streamed run's first step overlaps nothing and its last ones may find their
    groups already generated: over all steps both count), mean step time, mean idle fractions (:func:`_idle`),
    staleness (mean of the per-step means, largest), dropped groups (summed)."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    recs = [x for x in recs if x.get("step", 0) >= 1 and "timing/step_s" in x]
    if not recs:
        raise ValueError(f"{run_dir}/metrics.jsonl: no training step")
    total_s = sum(x["timing/step_s"] for x in recs)
    idles = [_idle(x) for x in recs]
    return {
        "steps": len(recs),
        "step_s": total_s / len(recs),
        "samples_per_s": samples_per_step * len(recs) / total_s if total_s > 0 else 0.0,
        "idle": {k: statistics.mean(i.get(k, 0.0) for i in idles) for k in sorted({k for i in idles for k in i})},
        "staleness": statistics.mean(x.get("rollout/staleness", 0.0) for x in recs),
        "staleness_max": max(x.get("async/staleness_max", 0.0) for x in recs),
        "dropped": sum(x.get("async/dropped_groups", 0.0) for x in recs),
    }


def heldout(run_dir: Path) -> dict[str, float]:
    """The last held-out evaluation of a run, ``{domain/task_id: reward}`` (bench/seesaw.py's reading)."""
    by_step = eval_steps(run_dir / "rollouts.jsonl")
    if not by_step:
        raise ValueError(f"{run_dir}/rollouts.jsonl: no held-out evaluation")
    last = by_step[max(by_step)]
    return {f"{d}/{t}": r for d, per in last.items() for t, r in per.items()}


def compare(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each arm against ``sync``: samples/s ratio and the paired held-out difference (``paired``: diff, se, n)."""
    base = runs["sync"]
    out = {}
    for name, r in runs.items():
        ratio = r["samples_per_s"] / base["samples_per_s"] if base["samples_per_s"] > 0 else 0.0
        out[name] = {"speedup": ratio, "heldout": paired(base["heldout"], r["heldout"])}
    return out


def goal(arm_list: list[Arm], cmp: dict[str, dict[str, Any]]) -> list[str]:
    """One line per max_staleness-2 arm: whether it reaches the issue's goal (>= 1.4x synchronous samples/s,
    held-out reward within 2 paired SE of synchronous), and why not."""
    lines = []
    for arm in (a for a in arm_list if a.k == GOAL_STALENESS):
        c = cmp[arm.name]
        p = c["heldout"]
        fast = c["speedup"] >= GOAL_SPEEDUP
        close = p["n"] >= 2 and abs(p["diff"]) <= GOAL_SE * p["se"]  # se 0: only an exact tie is within
        why = [] if fast else [f"samples/s {c['speedup']:.2f}x < {GOAL_SPEEDUP}x"]
        why += [] if close else [f"held-out {p['diff']:+.3f} +- {p['se']:.3f} not within {GOAL_SE:g} SE"]
        state = "met" if fast and close else "not met (" + "; ".join(why) + ")"
        lines.append(
            f"{arm.name}: {c['speedup']:.2f}x synchronous samples/s, held-out {p['diff']:+.3f} +- {p['se']:.3f} "
            f"(n={p['n']}): goal {state}"
        )
    return lines or [f"no max_staleness {GOAL_STALENESS} arm ran: goal not evaluated"]


def render(arm_list: list[Arm], runs: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    """The Markdown body of the RESULTS.md section."""
    cmp = compare(runs)
    idle_names = sorted({k for r in runs.values() for k in r["idle"]})
    head = "| arm | max_staleness | partial | samples/s | x sync | step s | " + "".join(
        f"idle {n} | " for n in idle_names
    )
    head += "staleness mean (max) | dropped groups | held-out | vs sync +- SE | wall s |"
    rows = []
    for arm in arm_list:
        r, c = runs[arm.name], cmp[arm.name]
        p = c["heldout"]
        idle = "".join(f"{r['idle'].get(n, 0.0):.0%} | " for n in idle_names)
        rows.append(
            f"| {arm.name} | {arm.k} | {'yes' if arm.partial else 'no'} | {r['samples_per_s']:.2f} | "
            f"{c['speedup']:.2f} | {r['step_s']:.1f} | {idle}{r['staleness']:.2f} ({r['staleness_max']:.0f}) | "
            f"{r['dropped']:.0f} | {p['b']:.3f} | {p['diff']:+.3f} +- {p['se']:.3f} | {r.get('wall_s', 0.0):.0f} |"
        )
    sep = "|" + "---|" * (head.count("|") - 1) + "\n"
    return (
        f"Workload: `{meta['recipe']}`, tool-call env with `tool_latency` {meta['latency']} per call, "
        f"max_turns {meta['turns']}; {meta['steps']} steps x {meta['samples_per_step']} samples each arm, seed "
        f"{meta['seed']}; streamed arms `algo.loss.tis_cap={meta['tis_cap']}`. Samples/s over all steps' summed "
        f"time; idle fractions are means over steps (sync: derived from its step timings); held-out: the last evaluation ({meta['eval_limit']} tasks, greedy), paired per "
        f"task against sync.{meta.get('precision', '')} Host: {meta['host']}.\n\n"
        + head
        + "\n"
        + sep
        + "\n".join(rows)
        + "\n\n"
        + "\n".join(f"**{x}**" for x in goal(arm_list, cmp))
        + "\n"
    )


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "quickstart.yaml"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=8, help="rollout.prompts_per_step")
    ap.add_argument("--group", type=int, default=8, help="rollout.group_size")
    ap.add_argument("--turns", type=int, default=3, help="max_turns of the env and the rollout")
    ap.add_argument("--median-s", type=float, default=0.5)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--cap-s", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0, help="run.seed and the latency seed")
    ap.add_argument("--env-workers", type=int, default=0, help="rollout.env_workers (0: prompts x group)")
    ap.add_argument("--eval-limit", type=int, default=60, help="held-out tasks evaluated after the last step")
    ap.add_argument(
        "--tasks",
        choices=["chain", "ladder", "tools"],
        default="chain",
        help="chain: sessions of --turns ladder requests, one a turn; ladder: the recipe's tasks (the quickstart's "
        "tool-call ladder, one turn); tools: the shipped calls- and answer-mode tool tasks (multi-turn)",
    )
    ap.add_argument("--tis-cap", type=float, default=2.0)
    ap.add_argument("--staleness", default="0,1,2,4", help="rollout.max_staleness values, comma-separated; 0 first")
    ap.add_argument("--no-partial", action="store_true", help="streamed arms without partial rollouts only")
    ap.add_argument("--work-dir", default="", help="keep run folders here (default: a temp dir, removed)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    ap.add_argument(
        "--section",
        default="",
        help="RESULTS.md section to write (default: the task set's own); another key keeps that section and writes "
        "a new one beside it, titled with the arms' max_staleness values",
    )
    ap.add_argument(
        "--from-runs",
        action="store_true",
        help="train nothing: report the arms an earlier invocation finished in --work-dir (the others as not run)",
    )
    args = ap.parse_args(argv)
    ks = [int(k) for k in args.staleness.split(",")]
    if not ks or ks[0] != 0 or any(k < 0 for k in ks):
        ap.error(f"--staleness: comma-separated values >= 0 starting with 0 (the baseline), got {args.staleness}")
    for name in ("steps", "prompts", "group", "turns", "eval_limit"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.from_runs and not args.work_dir:
        ap.error("--from-runs needs --work-dir (the folder the runs are in)")
    args.ks = ks
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    arm_list = arms(args.ks, partial=not args.no_partial)
    base_ov = workload(args)
    runs: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="jointrl-async-bench-") as tmp:
        root = Path(args.work_dir) if args.work_dir else Path(tmp)
        missing: dict[str, str] = {}
        if args.from_runs:
            runs, missing, precision = from_runs(root, arm_list, args.prompts * args.group)
        else:
            if args.tasks == "chain":
                base_ov = base_ov + chain_files(root / "tasks", args.turns, args.seed)
            # precision auto times matmuls at each run's start: timed once here and pinned, so arms differ only by
            # arm
            pinned, precision = pinned_precision(load_recipe(args.recipe, base_ov), local=False)
            base_ov = base_ov + pinned
        for arm in [] if args.from_runs else arm_list:
            out = root / arm.name
            try:
                wall = train(args.recipe, out, base_ov + arm_overrides(arm, args.tis_cap))
                runs[arm.name] = {**summarize(out, args.prompts * args.group), "heldout": heldout(out), "wall_s": wall}
            except (RunFailed, ValueError) as e:  # one failed arm is named; the others are still reported
                failed[arm.name] = str(e).splitlines()[0][:300]
                print(f"{arm.name} FAILED: {e}", file=sys.stderr, flush=True)
                if arm.k == 0:
                    raise SystemExit("the synchronous arm failed: nothing to compare against") from e
                continue
            print(arm.name, f"{runs[arm.name]['samples_per_s']:.2f} samples/s, wall {wall:.0f} s", flush=True)
    meta = {
        "recipe": os.path.relpath(args.recipe, ROOT) + TASKS_LABEL[args.tasks].format(turns=args.turns),
        "latency": f"median {args.median_s} s, sigma {args.sigma}, cap {args.cap_s} s",
        "turns": args.turns,
        "steps": args.steps,
        "samples_per_step": args.prompts * args.group,
        "seed": args.seed,
        "tis_cap": args.tis_cap,
        "eval_limit": args.eval_limit,
        "host": cpu_model() or "unknown CPU",
        "precision": f" Precision pinned for every arm: {precision}." if precision else "",
    }
    body = render([a for a in arm_list if a.name in runs], runs, meta)
    body += "".join(f"\nArm {n} failed: {why}\n" for n, why in failed.items())
    body += "".join(f"\nArm {n} not run: {why}\n" for n, why in missing.items())
    print(body)
    if not args.no_write:
        write_section(*section(args), body)
    return 1 if failed else 0


def section(args: argparse.Namespace) -> tuple[str, str]:
    """``(key, title)`` of the RESULTS.md section this invocation writes: the task set's own, or ``--section``'s key
    with the task set's title and the max_staleness values run, so a run of some arms never overwrites another's."""
    key, title = SECTIONS[args.tasks]
    if not args.section or args.section == key:
        return key, title
    return args.section, f"{title}, max_staleness {', '.join(map(str, args.ks))}"


def from_runs(root: Path, arm_list: list[Arm], samples_per_step: int) -> tuple[dict, dict, str]:
    """``(runs, not_run, precision)`` from the arm folders an earlier invocation left in ``root`` (``--from-runs``):
    an arm whose run finished (its ``bench_wall_s.txt`` written) is read as a fresh one would be; any other is named
    as not run; the precision is the sync arm's resolved ``model`` dtypes."""
    runs, not_run = {}, {}
    for arm in arm_list:
        out = root / arm.name
        if not (out / "bench_wall_s.txt").is_file():
            not_run[arm.name] = f"no finished run in {out}"
            if arm.k == 0:
                raise SystemExit(f"--from-runs: {out} holds no finished synchronous run: nothing to compare against")
            continue
        wall = float((out / "bench_wall_s.txt").read_text())
        runs[arm.name] = {**summarize(out, samples_per_step), "heldout": heldout(out), "wall_s": wall}
    import yaml

    model = (yaml.safe_load((root / "sync" / "recipe.resolved.yaml").read_text()) or {}).get("model", {})
    precision = (
        f"engine {model.get('engine_dtype')}, learner {model.get('learner_dtype')}"
        f"{' + bf16 autocast' if model.get('autocast') else ''}, reference {model.get('reference_dtype')} (the sync "
        "run's recipe.resolved.yaml)"
    )
    return runs, not_run, precision


if __name__ == "__main__":
    raise SystemExit(main())
