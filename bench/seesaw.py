"""The seesaw, measured: joint RL vs. single-domain RL, and fixed vs. adaptive domain mixing.

Every configuration trains SmolLM2-135M-Instruct with ``recipes/joint_rl.yaml`` (the real
``jointrl train``, in a subprocess) for the same number of steps with the same prompts per
step and group size, so every run draws the same number of samples:

* ``joint_fixed``: all three ladders, the recipe's fixed domain weights;
* ``joint_adaptive``: the same, ``mixer.mode=adaptive``;
* ``single_<domain>``: only that domain's training file (``mixer.domain_weights={}``).

Every run is scored greedily on all three held-out ladders at its end (its final held-out
evaluation, read per task from its ``rollouts.jsonl``) against one shared evaluation of the base
model (a ``train.steps=0`` run in ``OUT/base``): the base model, recipe and greedy sampling are
the same for every configuration, so each run's own step-0 evaluation would repeat the same
numbers (``train.eval_at_start=false`` skips it: 367-458 s a run on 2 AMD EPYC cores).
Reported, per domain, with paired standard errors over the same
held-out tasks (SE = sample std of the per-task differences / sqrt(n)):

* each run's before -> after change (did the domain improve?);
* joint minus each single-domain run, final rewards (does joint training cost a domain what
  single-domain training on it gains, or does single-domain training on another domain
  cost it: the seesaw);
* adaptive minus fixed, final rewards.

A difference is called out only when it exceeds two standard errors; the rest is reported
as not distinguishable from noise. Writes its section of ``bench/RESULTS.md``
(``--no-write``: print only); ``--from-runs`` re-analyses the runs in ``--out`` without
training; ``--keep-done`` trains only the runs ``--out`` does not hold yet (to go on after an
interruption); ``--archive DIR`` keeps the finished runs' held-out evaluations (``eval.jsonl``,
~150 KB a run, read like ``rollouts.jsonl``), wall times and host in DIR, so that the runs can be
re-analysed or the missing ones added later (copy DIR to ``--out``, then ``--keep-done``).

Several seeds (``--seeds 0,1,2``): every configuration trains once per seed (``run.seed``, run
directories ``OUT/<config>/seed_<S>``), all against the one shared base evaluation (greedy: the same
for every seed). Reported with ``bench/seeds.py``'s statistics: per configuration and domain, the
gain's mean ± sample SD across seeds and how many seeds cleared two paired SE; joint minus each
single-domain run, per seed on the final rewards, as mean ± SD across seeds with a verdict on the
across-seed standard error (SD / sqrt(seeds)): joint loses a domain beyond run-to-run noise only where
that mean is below minus two of them. ``--section-out FILE`` writes the RESULTS.md section to FILE
instead of RESULTS.md (either mode). A run that fails is named with its cause and left out, the others
go on and are reported (exit 3); a failed base run ends the bench. Runs that train pin
``learner.precision: auto`` once for all (``bench/seeds.py``'s ``pinned_precision``).

    .venv/bin/python bench/seesaw.py --steps 8            # base + 5 runs; ~3 h on 2 AMD EPYC cores (base + 4: 2 h 24 min)
    .venv/bin/python bench/seesaw.py --steps 8 --seeds 0,1,2 --configs joint_fixed,single_code,single_terminal,single_tool_call
    .venv/bin/python bench/seesaw.py --steps 1 --configs joint_fixed --eval-limit 6 --no-write   # a quick check
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import add_section_args, cpu_model, section_key_error  # noqa: E402

RECIPE = ROOT / "recipes" / "joint_rl.yaml"
DOMAINS = ("code", "terminal", "tool_call")
TRAIN_FILES = {
    "tool_call": "data/toolcall_ladder.train.jsonl",
    "code": "data/code_ladder.train.jsonl",
    "terminal": "data/terminal_ladder.train.jsonl",
}
CONFIGS = ("joint_fixed", "joint_adaptive", *(f"single_{d}" for d in DOMAINS))


def overrides(config: str) -> list[str]:
    """The ``key=value`` overrides of ``joint_rl.yaml`` that make ``config``."""
    if config == "joint_fixed":
        return []
    if config == "joint_adaptive":
        return ["mixer.mode=adaptive"]
    if config.startswith("single_") and config[len("single_") :] in DOMAINS:
        d = config[len("single_") :]
        return [f"data.train_files=[{TRAIN_FILES[d]}]", "mixer.domain_weights={}"]
    raise ValueError(f"unknown config {config!r}; choose from {', '.join(CONFIGS)}")


# ---------------------------------------------------------------------------- pure analysis


def paired(a: dict[str, float], b: dict[str, float], groups: dict[str, str] | None = None) -> dict[str, float]:
    """Mean of ``b[t] - a[t]`` over the tasks both hold, its standard error, and n.

    SE = sample standard deviation of the differences / sqrt(n) (0 when n < 2: unknown,
    reported as such by :func:`verdict`). Raises ``ValueError`` when no task is shared.

    ``groups`` (task id -> group, e.g. ``task_groups``' templates; a task it lacks is its own group) adds
    ``se_group``, the same mean's standard error clustered by group, and ``groups``, their count G:
    ``sqrt(G / (G - 1) * sum_g (sum_{t in g} (d_t - mean))^2) / n`` (0 when G < 2). Tasks of one template move
    together (a policy learns a template's trick or not), so the per-task SE, which takes the n tasks as
    independent, understates the evaluation's noise when a gain sits in a few templates; with one task per
    group the two are equal.
    """
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError("the two evaluations share no task")
    diffs = [b[t] - a[t] for t in common]
    n = len(diffs)
    mean = sum(diffs) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1) / n) if n > 1 else 0.0
    out = {"diff": mean, "se": se, "n": n, "a": sum(a[t] for t in common) / n, "b": sum(b[t] for t in common) / n}
    if groups is not None:
        sums: dict[str, float] = defaultdict(float)
        for t, x in zip(common, diffs, strict=True):
            sums[groups.get(t, f"task:{t}")] += x - mean
        g = len(sums)
        out["se_group"] = math.sqrt(g / (g - 1) * sum(v * v for v in sums.values())) / n if g > 1 else 0.0
        out["groups"] = g
    return out


def task_groups(files: list[Path]) -> dict[str, str]:
    """Task id -> ``<file>:<meta.template>`` for every task of the JSONL ``files`` that names a template (the
    generated ladders do); tasks without one are left out (each its own group in ``paired``)."""
    out = {}
    for f in files:
        for i, line in enumerate(f.read_text().splitlines()):
            if not line.strip():
                continue
            try:
                task = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{f}:{i + 1}: not JSON ({e.msg})") from None
            template = (task.get("meta") or {}).get("template") if isinstance(task, dict) else None
            if template is not None and "id" in task:
                out[str(task["id"])] = f"{f.name}:{template}"
    return out


def verdict(p: dict[str, float]) -> str:
    """``up`` / ``down`` when the paired difference exceeds two standard errors, else ``noise``."""
    if p["n"] < 2:
        return "n < 2"
    if p["se"] == 0:
        return "no change" if p["diff"] == 0 else ("up" if p["diff"] > 0 else "down")
    z = p["diff"] / p["se"]
    return "up" if z > 2 else "down" if z < -2 else "noise"


Evaluation = dict[str, dict[str, float]]  # {domain: {task_id: reward}}


def eval_steps(rollouts: Path) -> dict[int, Evaluation]:
    """Every held-out evaluation in a run's ``rollouts.jsonl``, by step (the ``split == "eval"``
    records). A sample's value is its task's own score: ``reward`` less what shaping terms added
    (``reward_shaping``, e.g. a length penalty), so that a recipe's shaping does not move its
    held-out numbers. An unscored sample (reward null) counts 0: the trainer's held-out mean leaves it
    out (it is reported in its own metric); here it counts as a failure, the conservative
    reading for a before/after comparison."""
    by_step: dict[int, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for line in rollouts.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if r.get("split") == "eval":
            own = 0.0 if r["reward"] is None else float(r["reward"]) - float(r.get("reward_shaping") or 0.0)
            by_step[int(r["step"])][r["domain"]][r["task_id"]] = own
    return {k: {d: dict(per) for d, per in v.items()} for k, v in by_step.items()}


def eval_rewards(rollouts: Path, base: Evaluation | None = None) -> tuple[Evaluation, Evaluation]:
    """(first, last) held-out evaluation of a run: first = the lowest step (0, the base model),
    last = the highest. A run that skipped its step-0 evaluation (``train.eval_at_start=false``)
    takes ``base`` (the shared base run's) as its first."""
    by_step = eval_steps(rollouts)
    if base is not None and by_step and min(by_step) > 0:
        return base, by_step[max(by_step)]
    if len(by_step) < 2:
        raise ValueError(
            f"{rollouts}: needs held-out evaluations at two steps (or a shared base evaluation), found {sorted(by_step)}"
        )
    return by_step[min(by_step)], by_step[max(by_step)]


def records(run_dir: Path) -> Path:
    """A run's held-out records: its ``rollouts.jsonl``, else the archived ``eval.jsonl``."""
    full = run_dir / "rollouts.jsonl"
    return full if full.is_file() else run_dir / "eval.jsonl"


def archive(out: Path, dest: Path, names: list[str]) -> list[str]:
    """Copy each finished run's held-out records, wall time and host (this machine's CPU model: archive
    where the runs trained) into ``dest/<name>/``; return the names."""
    import platform
    import shutil

    host = cpu_model() or platform.processor() or "unknown"
    kept = []
    for name in names:
        src = out / name
        if not (src / "seesaw_wall_s.txt").is_file():
            continue
        (dest / name).mkdir(parents=True, exist_ok=True)
        lines = [x for x in records(src).read_text().splitlines() if x.strip() and json.loads(x).get("split") == "eval"]
        (dest / name / "eval.jsonl").write_text("\n".join(lines) + "\n")
        shutil.copyfile(src / "seesaw_wall_s.txt", dest / name / "seesaw_wall_s.txt")
        if not (dest / name / "host.txt").is_file():
            (dest / name / "host.txt").write_text(host + "\n")
        kept.append(name)
    return kept


def hosts(out: Path, names: list[str]) -> str:
    """The CPU model(s) the runs in ``out`` trained on: archived ``host.txt`` files, else this machine's."""
    seen = {(out / n / "host.txt").read_text().strip() for n in names if (out / n / "host.txt").is_file()}
    return ", ".join(sorted(seen)) if seen else cpu_model()


def base_eval(rollouts: Path) -> Evaluation:
    """The step-0 evaluation of the shared base run (``train.steps=0``)."""
    by_step = eval_steps(rollouts)
    if 0 not in by_step:
        raise ValueError(f"{rollouts}: the base run holds no step-0 held-out evaluation")
    return by_step[0]


def analyse(runs: dict[str, tuple[dict, dict]]) -> dict[str, Any]:
    """Every comparison the report shows, from ``{config: (first, last)}`` evaluations."""
    out: dict[str, Any] = {"change": {}, "joint_vs_single": {}, "adaptive_vs_fixed": {}}
    for name, (first, last) in runs.items():
        out["change"][name] = {d: paired(first[d], last[d]) for d in DOMAINS if d in first and d in last}
    if "joint_fixed" in runs:
        joint = runs["joint_fixed"][1]
        for name, (_, last) in runs.items():
            if name.startswith("single_"):
                out["joint_vs_single"][name] = {
                    d: paired(last[d], joint[d]) for d in DOMAINS if d in last and d in joint
                }
        if "joint_adaptive" in runs:
            ada = runs["joint_adaptive"][1]
            out["adaptive_vs_fixed"] = {d: paired(joint[d], ada[d]) for d in DOMAINS if d in joint and d in ada}
    return out


def _fmt(p: dict[str, float]) -> str:
    return f"{p['diff']:+.3f} ± {p['se']:.3f} ({verdict(p)})"


def render(result: dict[str, Any], meta: dict[str, Any]) -> str:
    """The Markdown body of the RESULTS.md section."""
    from bench._results import table

    lines = [
        f"Recipe `recipes/joint_rl.yaml`, {meta['steps']} steps per run, {meta['samples']} samples per run "
        f"(prompts/step x group size x steps), held-out = the three `*_ladder.eval.jsonl` files "
        f"(greedy; n tasks per domain in the tables), scored against one shared evaluation of the base model "
        f"({meta['wall_s'].get('base', float('nan')):.0f} s). ± is one paired standard error; a change is called "
        f"up/down only beyond two of them, else noise. Host: {meta.get('host') or 'not recorded'}.",
        "",
        "Before -> after, each run on each domain (held-out mean reward):",
        "",
    ]
    rows = []
    for name, per in result["change"].items():
        rows.append(
            [name, f"{meta['wall_s'].get(name, float('nan')):.0f}"]
            + [
                f"{per[d]['a']:.3f} -> {per[d]['b']:.3f}, {_fmt(per[d])}, n={per[d]['n']}" if d in per else "-"
                for d in DOMAINS
            ]
        )
    lines += [table(["run", "wall s", *DOMAINS], rows), ""]
    if result["joint_vs_single"]:
        lines += ["Joint (fixed) minus single-domain, final held-out reward (positive: joint is better there):", ""]
        rows = [
            [name] + [_fmt(per[d]) if d in per else "-" for d in DOMAINS]
            for name, per in result["joint_vs_single"].items()
        ]
        lines += [table(["vs", *DOMAINS], rows), ""]
    if result["adaptive_vs_fixed"]:
        per = result["adaptive_vs_fixed"]
        lines += [
            "Adaptive minus fixed mixing, final held-out reward:",
            "",
            table(["", *DOMAINS], [["adaptive - fixed"] + [_fmt(per[d]) if d in per else "-" for d in DOMAINS]]),
            "",
        ]
    lines += ["What this supports: " + conclusions(result)]
    return "\n".join(lines)


def conclusions(result: dict[str, Any]) -> str:
    """Plain sentences: only differences beyond two standard errors are claims."""
    said = []
    for name, per in result["change"].items():
        ups = [d for d, p in per.items() if verdict(p) == "up"]
        downs = [d for d, p in per.items() if verdict(p) == "down"]
        said.append(
            f"{name} improved {', '.join(ups) or 'no domain'} beyond 2 SE"
            + (f" and got worse on {', '.join(downs)}" if downs else "")
        )
    for name, per in result["joint_vs_single"].items():
        sig = [f"{d} ({verdict(p)})" for d, p in per.items() if verdict(p) in ("up", "down")]
        said.append(f"joint vs {name}: " + (", ".join(sig) if sig else "no domain differs beyond 2 SE"))
    if result["adaptive_vs_fixed"]:
        sig = [f"{d} ({verdict(p)})" for d, p in result["adaptive_vs_fixed"].items() if verdict(p) in ("up", "down")]
        said.append("adaptive vs fixed: " + (", ".join(sig) if sig else "no domain differs beyond 2 SE"))
    return "; ".join(said) + ". One seed per configuration: run-to-run variance is not in these standard errors."


# ---------------------------------------------------------------------------- several seeds


def analyse_seeds(
    runs: dict[str, dict[int, tuple[Evaluation, Evaluation]]], groups: dict[str, str] | None = None
) -> dict[str, Any]:
    """From ``{config: {seed: (first, last)}}``, with ``bench/seeds.py``'s across-seed statistics:
    ``gains[config][domain]`` (each seed's base -> final; with ``groups``, task id -> template, also the seeds
    beyond two SE clustered by template), ``joint_vs_single[single_config][domain]`` (per seed, joint_fixed's
    final minus the single-domain run's final, over the seeds both hold), and with ``joint_adaptive`` runs the
    same for it (``adaptive_vs_single``) and ``adaptive_vs_fixed[domain]`` (per seed, adaptive's final minus
    fixed's)."""
    from bench.seeds import across

    def minus(b: dict[int, tuple[Evaluation, Evaluation]], a: dict[int, tuple[Evaluation, Evaluation]]) -> dict:
        """Per domain, across the seeds both hold: ``b``'s final minus ``a``'s final, paired by task per seed."""
        common = sorted(set(a) & set(b))
        per = {d: [paired(a[s][1][d], b[s][1][d]) for s in common if d in a[s][1] and d in b[s][1]] for d in DOMAINS}
        return {d: across(ps) for d, ps in per.items() if ps}

    out: dict[str, Any] = {"gains": {}, "joint_vs_single": {}, "adaptive_vs_single": {}, "adaptive_vs_fixed": {}}
    for name, by_seed in runs.items():
        per = {d: [paired(f[d], la[d], groups) for f, la in by_seed.values() if d in f and d in la] for d in DOMAINS}
        out["gains"][name] = {d: across(ps) for d, ps in per.items() if ps}
    for joint_name, key in (("joint_fixed", "joint_vs_single"), ("joint_adaptive", "adaptive_vs_single")):
        if joint_name in runs:
            for name, by_seed in runs.items():
                if name.startswith("single_"):
                    out[key][name] = minus(runs[joint_name], by_seed)
    if "joint_fixed" in runs and "joint_adaptive" in runs:
        out["adaptive_vs_fixed"] = minus(runs["joint_adaptive"], runs["joint_fixed"])
    return out


def render_seeds(result: dict[str, Any], meta: dict[str, Any]) -> str:
    """The Markdown body of the several-seed RESULTS.md section."""
    from bench._results import table
    from bench.seeds import across_verdict, spread_text

    said_as = {
        "down": "{who} loses beyond the seeds' noise",
        "up": "{who} gains beyond the seeds' noise",
        "noise": "within the seeds' noise",
    }

    seeds = ", ".join(str(s) for s in meta["seeds"])
    lines = [
        f"Recipe `recipes/joint_rl.yaml`, seeds {seeds}, {meta['steps']} steps and {meta['samples']} samples per run, "
        f"held-out = the three `*_ladder.eval.jsonl` files (greedy), one shared base evaluation "
        f"({meta['wall_s'].get('base', float('nan')):.0f} s). ± is the sample standard deviation across seeds "
        f"(run-to-run variance); 'k of n > 2 SE' counts the seeds whose gain cleared two paired SE. "
        f"Host: {meta.get('host') or 'not recorded'}.",
        "",
        "Held-out gain (final - base) per configuration, mean ± SD across seeds:",
        "",
    ]

    def cleared(s: dict[str, Any]) -> str:
        by = f"; {s['cleared_group']} by template" if "cleared_group" in s else ""
        return f"{s['cleared']} of {s['k']} > 2 SE{by}"

    rows = [
        [name] + [f"{spread_text(per[d])} ({cleared(per[d])})" if d in per else "-" for d in DOMAINS]
        for name, per in result["gains"].items()
    ]
    lines += [table(["run", *DOMAINS], rows), ""]
    if any("cleared_group" in s for per in result["gains"].values() for s in per.values()):
        lines += [
            "'by template': the seeds whose gain cleared two SE clustered by the held-out tasks' `meta.template` "
            "(tasks of one template move together; `bench/seeds.py`).",
            "",
        ]

    def cells(per: dict[str, Any]) -> list[str]:
        return [f"{spread_text(per[d])} ({across_verdict(per[d])})" if d in per else "-" for d in DOMAINS]

    said = []
    for key, joint, who in (
        ("joint_vs_single", "Joint (fixed)", "joint"),
        ("adaptive_vs_single", "Joint (adaptive)", "joint (adaptive)"),
    ):
        if not result.get(key):
            continue
        lines += [
            f"{joint} minus single-domain, final held-out reward per seed, mean ± SD across seeds "
            "(verdict on the across-seed SE = SD / sqrt(seeds); positive: joint is better):",
            "",
        ]
        rows = []
        for name, per in result[key].items():
            rows.append([name] + cells(per))
            d = name[len("single_") :]
            if d in per:
                v = across_verdict(per[d])
                said.append(f"on {d}, {who} vs {name}: {said_as.get(v, v).format(who=who)}")
        lines += [table(["vs", *DOMAINS], rows), ""]
    if result.get("adaptive_vs_fixed"):
        per = result["adaptive_vs_fixed"]
        lines += [
            "Adaptive minus fixed mixing, final held-out reward per seed, mean ± SD across seeds:",
            "",
            table(["", *DOMAINS], [["adaptive - fixed"] + cells(per)]),
            "",
        ]
        moved = [f"{d} ({across_verdict(p)})" for d, p in per.items() if across_verdict(p) in ("up", "down")]
        said.append(
            "adaptive vs fixed: " + (", ".join(moved) if moved else "no domain differs beyond the seeds' noise")
        )
    lines.append(
        "What this supports: " + ("; ".join(said) or "no joint vs single-domain comparison in these runs") + "."
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- running


class RunFailed(RuntimeError):
    """A ``jointrl train`` run that exited non-zero: its exit code and output (the message shows the last 30 lines)."""

    def __init__(self, config: str, code: int, output: str) -> None:
        tail = "\n".join(output.splitlines()[-30:])
        super().__init__(f"{config}: jointrl train exited {code}:\n{tail}")
        self.code, self.output = code, output


def train(
    config: str,
    out: Path,
    steps: int,
    eval_limit: int,
    extra: list[str],
    at_start: bool = False,
    seed: int | None = None,
) -> float:
    """Run ``jointrl train`` for ``config`` (``base``: no step, only the base model's held-out
    evaluation); return its wall time in seconds. ``at_start``: a step-0 evaluation too; ``seed``:
    ``run.seed`` (None: the recipe's)."""
    cmd = [
        sys.executable,
        "-m",
        "rl.cli.main",
        "train",
        str(RECIPE),
        f"run.output_dir={out}",
        "run.overwrite=true",
        f"train.steps={steps}",
        f"data.eval_limit={eval_limit}",
        "data.eval_limit_per=total",  # as measured: the first N held-out tasks overall
        "run.save_every=0",
        f"train.eval_at_start={str(at_start).lower()}",
        *(overrides(config) if config != "base" else []),
        *extra,
        *([f"run.seed={seed}"] if seed is not None else []),
    ]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RunFailed(config, p.returncode, p.stdout + p.stderr)
    (out / "seesaw_wall_s.txt").write_text(f"{wall:.1f}\n")
    return wall


def run_name(config: str, seed: int | None) -> str:
    """A run's folder under ``--out``: ``config``, or ``config/seed_<S>`` in the several-seed mode."""
    return config if seed is None else f"{config}/seed_{seed}"


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {', '.join(CONFIGS)}")
    ap.add_argument(
        "--eval-limit",
        type=int,
        default=0,
        help="data.eval_limit of each run (0 = every held-out task; the limit takes the first N overall)",
    )
    ap.add_argument("--seeds", default="", help="comma-separated run.seed values: each configuration once per seed")
    ap.add_argument("--out", default=str(ROOT / "runs" / "seesaw"), help="run directories go here")
    ap.add_argument("--from-runs", action="store_true", help="analyse the runs already in --out; train nothing")
    ap.add_argument("--keep-done", action="store_true", help="train only the runs (and base) --out does not hold yet")
    ap.add_argument("--archive", default="", help="keep finished runs' held-out evaluations, wall times, host here")
    ap.add_argument("--no-write", action="store_true", help="print; do not write bench/RESULTS.md")
    ap.add_argument("--section-out", default="", help="write the RESULTS.md section to this file instead")
    add_section_args(ap)
    ap.add_argument("extra", nargs="*", help="more key=value overrides for every run")
    return ap.parse_args(argv)


def job_order(configs: list[str], seeds: list[int | None]) -> list[tuple[str, int | None]]:
    """The (config, seed) runs in training order: the shared base first, then seed by seed, every configuration
    of a seed before the next seed, so that an interrupted bench leaves whole seeds (each one pairs joint with
    every single-domain run) rather than every seed of some configurations and none of others."""
    return [("base", None), *((c, s) for s in seeds for c in configs)]


def _train_all(
    args: argparse.Namespace, out: Path, jobs: list[tuple[str, int | None]]
) -> tuple[dict[str, float], dict[str, str]]:
    """Train each (config, seed) of ``jobs`` that ``--from-runs``/``--keep-done`` leave; (every wall time known,
    ``{run: cause}`` of the runs that failed). A failed run is named and the others go on; a failed base
    (nothing to compare against) ends the bench."""
    from bench.seeds import failure_cause

    wall, failed = {}, {}
    for c, seed in jobs:
        name = run_name(c, seed)
        run_dir = out / name
        done = (run_dir / "seesaw_wall_s.txt").is_file()
        if not args.from_runs and not (args.keep_done and done):
            steps = 0 if c == "base" else args.steps
            print(f"seesaw: training {name} ({steps} steps)...", file=sys.stderr, flush=True)
            try:
                wall[name] = train(c, run_dir, steps, args.eval_limit, args.extra, at_start=c == "base", seed=seed)
            except RunFailed as e:
                if c == "base":
                    raise
                failed[name] = failure_cause(e.output, e.code)
                print(f"seesaw: {RECIPE.name}, {name}: failed: {failed[name]}", file=sys.stderr, flush=True)
        elif done:
            wall[name] = float((run_dir / "seesaw_wall_s.txt").read_text())
    return wall, failed


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        overrides(c)  # validates the name
    if err := section_key_error(args.section_key):
        print(f"seesaw: error: {err}", file=sys.stderr)
        return 2
    seeds: list[int | None] = [None]
    if args.seeds:
        from bench.seeds import SweepError, parse_seeds

        try:
            seeds = list(parse_seeds(args.seeds))
        except SweepError as e:
            print(f"seesaw: error: {e}", file=sys.stderr)
            return 2
    out = Path(args.out)
    from rl.config.recipe import load_recipe

    if not args.from_runs:  # one precision for every run, the base's evaluation included (bench/seeds.py)
        from bench.seeds import pinned_precision

        pinned, note = pinned_precision(load_recipe(RECIPE, args.extra), local=False)
        if note:
            print(f"seesaw: {note}; pinned for every run", file=sys.stderr)
        args.extra = [*args.extra, *pinned]
    jobs = job_order(configs, seeds)
    names = [run_name(c, s) for c, s in jobs]
    wall, failed = _train_all(args, out, jobs)
    jobs = [(c, s) for c, s in jobs if run_name(c, s) not in failed]
    # Runs from before the shared base (each with its own step-0 evaluation) still read.
    if args.archive:
        print(f"seesaw: archived {', '.join(archive(out, Path(args.archive), names))}", file=sys.stderr)
    base = base_eval(records(out / "base")) if records(out / "base").is_file() else None
    evals = {run_name(c, s): eval_rewards(records(out / run_name(c, s)), base) for c, s in jobs if c != "base"}
    # The typed recipe, not the YAML: keys the recipe leaves at their defaults (prompts_per_step) count too.
    cfg = load_recipe(RECIPE, args.extra)
    r = cfg.rollout
    meta = {
        "steps": args.steps,
        "samples": r.prompts_per_step * r.group_size * args.steps,
        "wall_s": wall,
        "host": hosts(out, names),
    }
    if seeds == [None]:
        body = render(analyse({c: evals[c] for c in configs if c in evals}), meta)
        key, title = "seesaw", "Joint vs. single-domain RL, fixed vs. adaptive mixing (`bench/seesaw.py`)"
    else:
        from bench.seeds import eval_groups

        by_seed = {c: {s: evals[n] for s in seeds if (n := run_name(c, s)) in evals} for c in configs}
        groups = eval_groups(RECIPE, cfg)
        body = render_seeds(analyse_seeds({c: v for c, v in by_seed.items() if v}, groups), {**meta, "seeds": seeds})
        key, title = "seesaw_seeds", "Joint vs. single-domain RL over seeds (`bench/seesaw.py --seeds`)"
    key, title = args.section_key or key, args.section_title or title
    if failed:
        body += "\n\nFailed (not in the tables): " + "; ".join(f"{n}: {c}" for n, c in failed.items()) + "."
    print(body)
    from bench._results import section, write_section

    if args.section_out:
        Path(args.section_out).write_text(section(key, title, body))
    elif not args.no_write:
        write_section(key, title, body)
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
