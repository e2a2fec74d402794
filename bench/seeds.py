"""Seed sweep: one recipe trained once per seed; held-out gains per domain, per seed and across seeds.

Each seed is a real ``jointrl train RECIPE run.seed=S`` (``--local``: the in-process runtime) into
``OUT/seed_<S>``, its output in ``OUT/logs/seed_<S>.log``. The seed changes everything the framework
draws at random: the mixer's data order, every sample's sampling seed (vLLM and the HF engine), and the
learner's torch seed (LoRA initialization, dropout, minibatch shuffles; a value head starts at zero,
nothing random). From each run's ``rollouts.jsonl`` (``bench/seesaw.py``'s ``eval_rewards``/``paired``:
an unscored held-out sample counts 0) it reports, per domain:

* per seed: the base (step-0) and final held-out mean over the same tasks, the paired gain and its
  standard error (sample SD of the per-task differences / sqrt(n)) and the gain in SE;
* across seeds: mean and sample standard deviation (n - 1) of the gains, how many seeds cleared two
  paired SE, how many ended below their base;
* where held-out tasks share a template (``meta.template`` in the recipe's eval files, as the generated
  ladders do): each gain's SE clustered by template and the seeds clearing two of those. Tasks of one
  template move together (a small policy learns a template's trick or not), so a gain carried by one or two
  templates of a dozen is less sure than the per-task SE, which counts every task as independent, says.
  The report then lists where the gains sit: each held-out template that moved in some seed, its mean change
  per seed.

The paired SE holds only the evaluation's task sampling; run-to-run variance is in the across-seed SD.

Outputs, in ``--out`` (default ``runs/seeds/<recipe name>``): ``sweep.json`` (every number, every
failure), ``RESULTS-section.md`` (the sweep's section of ``bench/RESULTS.md``, to paste; ``--write``
replaces it in RESULTS.md itself) and ``report.html`` (a held-out curve per domain, one line per seed,
``rl.cli.report.write_seed_report``).

Fair comparison: ``learner.precision: auto`` picks fp32 or bf16 by timing matmuls at start-up, so
seeds on a loaded host could train at different precisions. A CPU sweep times once here and pins the
result (``learner.precision=manual`` and the dtypes) for every seed, so seeds differ only by the seed.

Reproducibility, the same seed twice: on the in-process runtime (HF engine, fp32) a seed's run repeats
its samples token for token and its step metrics to float rounding (tests/test_seeds_e2e.py checks the
first step). On vLLM each request's seed fixes its sampling, but batch composition and bf16 kernels
move logits by rounding, so a near-tie can sample another token and the runs drift apart: equal in
distribution, not bit for bit; that is the spread the across-seed SD measures. Terminal tasks that
draw a token from ``/dev/urandom`` in their setup differ on every run by design.

Bad input (exit 2, nothing trained): a seed list that is not distinct integers, a recipe that does not
load or validate, one without ``data.eval_files``, ``train.eval_at_start=false`` or ``run.seed`` among
the overrides. A seed whose run fails is reported as ``recipe, seed, cause`` and the sweep goes on;
the finished seeds are analysed and reported; the exit code is then 3. Ctrl-C starts no further seed:
the run under way checkpoints its last step and stops, the finished seeds are reported, exit 130.

    .venv/bin/python bench/seeds.py recipes/joint_rl.yaml --seeds 0,1,2             # one after another
    .venv/bin/python bench/seeds.py recipes/joint_rl.yaml --seeds 0,1,2 --parallel 3 # three at once
    .venv/bin/python bench/seeds.py recipes/tiny.yaml --seeds 0,1 --local --in-process train.steps=2

``--parallel N`` runs N seeds at a time, each its own ``jointrl train`` process: with Ray each starts
its own local Ray cluster and its own engines and learner, so N runs need N times the cores and memory
of one (``run.threads`` and ``cluster`` among the overrides share them out); on a 2-core host keep 1.
``--in-process`` (with ``--local``, one at a time) runs each seed in this process: no interpreter and
torch start-up per seed, for small models and tests. ``--keep-done`` keeps seeds whose run finished
(``DONE``) and trains the rest; ``--from-runs`` only analyses ``--out``; with ``--base RUN`` too, against
RUN's step-0 evaluation for runs that skipped their own, so that ``bench/seesaw.py``'s runs of one
configuration read as a sweep (``--out OUT/joint_fixed --base OUT/base``). ``--shared-base`` evaluates the
base model once (``OUT/base``, a ``train.steps=0`` run, before the first seed) and trains every seed with
``train.eval_at_start=false``, each read against that evaluation: greedy, of the same model on the same
files, it is the same for every seed (two Ray + vLLM evaluations of the flagship's base differed on one
task of 900), and on the flagship it is about 30% of a run (340-370 s of 1080-1330 s, AMD EPYC). A seed's
wall then leaves the base evaluation out; the report names it.

A bench script rather than a ``jointrl`` subcommand: its statistics are ``bench/seesaw.py``'s (the
product's packages import nothing of ``bench/``, tests/test_layering.py), its output is a section of
``bench/RESULTS.md`` (``bench/_results.py``), and each seed is a plain ``jointrl train``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import add_section_args, section_key_error  # noqa: E402
from bench.seesaw import eval_rewards, paired, records, task_groups, verdict  # noqa: E402

Evaluation = dict[str, dict[str, float]]  # {domain: {task_id: reward}}
INTERRUPTED = 130  # jointrl train's exit code after Ctrl-C / SIGTERM


class SweepError(Exception):
    """Bad input to the sweep; the message names the recipe, the seed or the flag."""


@dataclass
class SeedRun:
    """One seed's run: ``status`` is ``done`` (trained now), ``kept`` (finished before, ``--keep-done``,
    ``--from-runs``) or ``failed`` (``cause``: one line, from the run's own error message)."""

    seed: int
    run_dir: str
    status: str
    wall_s: float | None = None
    exit_code: int | None = None
    cause: str = ""
    log: str = ""


# ---------------------------------------------------------------------------- input


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``; ``SweepError`` for an empty list, a non-integer or a repeated seed."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise SweepError("--seeds: no seed given (e.g. --seeds 0,1,2)")
    seeds = []
    for x in items:
        try:
            seeds.append(int(x, 10))
        except ValueError:
            raise SweepError(f"--seeds: {x!r} is not an integer (e.g. --seeds 0,1,2)") from None
    dup = sorted({s for s in seeds if seeds.count(s) > 1})
    if dup:
        raise SweepError(f"--seeds: seed {dup[0]} is given twice (each seed is one run)")
    return seeds


def seed_dir(out: Path, seed: int) -> Path:
    return out / f"seed_{seed}"


def base_dir(out: Path) -> Path:
    """The sweep's shared base run (``--shared-base``)."""
    return out / "base"


def check_recipe(recipe: Path, overrides: list[str], seeds: list[int], out: Path) -> Any:
    """The recipe as the first seed trains it, loaded and validated; ``SweepError`` naming the recipe
    and the cause where it cannot be swept."""
    from rl.config.recipe import RecipeError, load_recipe, validate_recipe

    for o in overrides:
        if o.split("=", 1)[0].strip() in ("run.seed", "seed"):
            raise SweepError(f"{recipe}: run.seed is given as an override; the sweep sets it from --seeds")
    try:
        cfg = load_recipe(recipe, [*overrides, *seed_overrides(seeds[0], out)])
        validate_recipe(cfg)
    except RecipeError as e:
        raise SweepError(f"{recipe}, seed {seeds[0]}: {e}") from None
    except Exception as e:  # noqa: BLE001 - e.g. a user module of the recipe that fails at import time
        raise SweepError(f"{recipe}, seed {seeds[0]}: {type(e).__name__}: {e}") from None
    if not cfg.data.eval_files:
        raise SweepError(
            f"{recipe}: no data.eval_files: the sweep compares each seed's first and last held-out "
            "evaluation; give the recipe held-out task files"
        )
    if not cfg.train.eval_at_start:
        raise SweepError(f"{recipe}: train.eval_at_start is false: each seed's base is its step-0 held-out evaluation")
    return cfg


def shared_base(run_dir: Path) -> Evaluation:
    """The step-0 held-out evaluation in ``run_dir`` (a ``train.steps=0`` run: ``bench/seesaw.py``'s base), every
    seed's base with ``--base``; ``SweepError`` naming the folder where it holds none."""
    from bench.seesaw import base_eval

    try:
        return base_eval(records(run_dir))
    except (OSError, ValueError) as e:
        raise SweepError(f"--base {run_dir}: {e}") from None


def seed_overrides(seed: int, out: Path) -> list[str]:
    """What the sweep sets in every seed's run (after the user's overrides: these win)."""
    return [f"run.seed={seed}", f"run.output_dir={seed_dir(out, seed)}", "run.overwrite=true"]


def pinned_precision(cfg: Any, local: bool) -> tuple[list[str], str]:
    """(overrides, note): on a CPU run, ``learner.precision``/``model.engine_dtype`` ``auto`` timed once here
    (``rl.trainer.precision.resolve``) and set for every seed; ([], "") where nothing is timed (GPU, a Ray
    cluster elsewhere, no ``auto``)."""
    if cfg.run.ray_address or os.environ.get("RAY_ADDRESS"):
        return [], ""
    if cfg.model.engine_dtype != "auto" and cfg.learner.precision != "auto":
        return [], ""
    if local:
        import torch

        device = "gpu" if torch.cuda.is_available() else "cpu"
    else:
        from rl.driver.placement import local_gpus

        device = "gpu" if cfg.cluster.device == "gpu" or (cfg.cluster.device == "auto" and local_gpus()) else "cpu"
    if device != "cpu":
        return [], ""
    from rl.trainer.precision import resolve

    pinned, note = resolve(cfg, "cpu")
    m = pinned.model
    keys = [
        f"learner.precision={pinned.learner.precision}",
        f"model.autocast={str(m.autocast).lower()}",
        f"model.engine_dtype={m.engine_dtype}",
        f"model.reference_dtype={m.reference_dtype}",
    ]
    return keys, note


# ---------------------------------------------------------------------------- running


def failure_cause(text: str, code: int) -> str:
    """One line for a failed run: its ``jointrl: error:`` / ``jointrl: run stopped:`` message, else its last
    output line (a traceback's exception), with the exit code."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    for prefix in ("jointrl: error: ", "jointrl: run stopped: "):
        hits = [x for x in lines if x.startswith(prefix)]
        if hits:
            return f"{hits[-1][len(prefix) :]} (exit {code})"
    return f"{lines[-1] if lines else 'no output'} (exit {code})"


def _train_argv(recipe: Path, seed: int, out: Path, overrides: list[str], local: bool) -> list[str]:
    return ["train", str(recipe), *(["--local"] if local else []), *overrides, *seed_overrides(seed, out)]


def _run_subprocess(argv: list[str], log: Path) -> int:
    """``jointrl`` ``argv`` in a child process (this checkout's code first on its path), output into ``log``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    with log.open("w") as f:
        p = subprocess.Popen([sys.executable, "-m", "rl.cli.main", *argv], stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            return p.wait()
        except KeyboardInterrupt:  # Ctrl-C reached the run too: it checkpoints its last step and exits 130
            try:
                return p.wait()
            except KeyboardInterrupt:  # a second Ctrl-C: now
                p.kill()
                p.wait()
                raise


def _run_in_process(argv: list[str], log: Path) -> int:
    """``jointrl`` ``argv`` in this process (``--in-process``); its output into ``log``. An exception that
    escapes the command counts as a failed run (exit 1), never as the sweep's end."""
    from rl.cli.main import main as cli

    buf = io.StringIO()
    with redirect_stdout(buf), redirect_stderr(buf):
        try:
            code = cli(argv)
        except SystemExit as e:  # argparse's way out
            code = e.code if isinstance(e.code, int) else 1
        except Exception as e:  # noqa: BLE001 - one seed's crash must not end the sweep
            print(f"{type(e).__name__}: {e}")
            code = 1
    log.write_text(buf.getvalue())
    return code


def run_seed(
    recipe: Path, seed: int, out: Path, overrides: list[str], local: bool, in_process: bool, base: bool = False
) -> SeedRun:
    """Train one seed (``base``: the shared base run instead, ``OUT/base``: no step, the step-0 held-out evaluation
    only); a failure comes back as a ``SeedRun`` with its cause (and is printed), never raised."""
    run_dir = base_dir(out) if base else seed_dir(out, seed)
    log = out / "logs" / f"{run_dir.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    (run_dir / "sweep_wall_s.txt").unlink(missing_ok=True)
    what = "the base model's held-out evaluation" if base else f"seed {seed}"
    print(f"seeds: {recipe.name}, {what}: training into {run_dir}", file=sys.stderr, flush=True)
    argv = _train_argv(recipe, seed, out, overrides, local)
    if base:
        argv += [f"run.output_dir={run_dir}", "train.steps=0", "train.eval_at_start=true"]
    t0 = time.perf_counter()
    code = (_run_in_process if in_process else _run_subprocess)(argv, log)
    wall = time.perf_counter() - t0
    if code != 0:
        cause = failure_cause(log.read_text(errors="replace"), code)
        print(f"seeds: {recipe}, {what}: failed: {cause}; log {log}", file=sys.stderr, flush=True)
        return SeedRun(seed, str(run_dir), "failed", wall, code, cause, str(log))
    (run_dir / "sweep_wall_s.txt").write_text(f"{wall:.1f}\n")
    return SeedRun(seed, str(run_dir), "done", wall, 0, "", str(log))


def finished(out: Path, seed: int, base: bool = False) -> SeedRun | None:
    """The seed's run in ``out`` if it finished (``DONE``) with this seed (``base``: the shared base run, whatever
    its seed), else None."""
    import yaml

    d = base_dir(out) if base else seed_dir(out, seed)
    resolved = d / "recipe.resolved.yaml"
    if not ((d / "DONE").is_file() and resolved.is_file()):
        return None
    if not base and (yaml.safe_load(resolved.read_text()) or {}).get("run", {}).get("seed") != seed:
        return None
    walls = [w for w in (d / "sweep_wall_s.txt", d / "seesaw_wall_s.txt") if w.is_file()]  # this sweep's, the seesaw's
    return SeedRun(seed, str(d), "kept", float(walls[0].read_text()) if walls else None)


def sweep(
    recipe: Path,
    seeds: list[int],
    out: Path,
    overrides: list[str],
    *,
    local: bool = False,
    in_process: bool = False,
    parallel: int = 1,
    keep_done: bool = False,
) -> list[SeedRun]:
    """Every seed's run, in seed order: trained (``parallel`` at a time) or kept (``keep_done``). Ctrl-C (a run
    that exits 130, or the signal here) starts no further seed; the runs under way stop on their own signal
    and come back failed, the seeds never started as ``not run``."""
    kept = {s: r for s in seeds if keep_done and (r := finished(out, s)) is not None}
    todo = [s for s in seeds if s not in kept]

    def one(s: int) -> SeedRun:
        return run_seed(recipe, s, out, overrides, local, in_process)

    done: dict[int, SeedRun] = {}
    if parallel <= 1:  # in this thread: a run's signal handlers (Ctrl-C, SIGTERM) need the main thread
        for s in todo:
            done[s] = one(s)
            if done[s].exit_code == INTERRUPTED:
                break
    else:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            futures = {s: pool.submit(one, s) for s in todo}
            try:
                done = {s: f.result() for s, f in futures.items()}
            except KeyboardInterrupt:
                for f in futures.values():
                    f.cancel()
                done = {s: f.result() for s, f in futures.items() if not f.cancelled()}
    never = "not run: the sweep was interrupted"
    return [kept.get(s) or done.get(s) or SeedRun(s, str(seed_dir(out, s)), "failed", cause=never) for s in seeds]


# ---------------------------------------------------------------------------- statistics


def across(ps: list[dict[str, float]]) -> dict[str, Any]:
    """Across seeds, from each seed's ``paired`` (base -> final) result on one domain: the gains' mean and
    sample standard deviation (None for one seed), how many seeds cleared two paired SE (``verdict`` up; and
    ``cleared_group``, two SE clustered by template, where the tasks share templates),
    how many ended below their base, and the mean base and final held-out rewards."""
    k = len(ps)
    if not k:
        raise ValueError("no seed to summarize")
    gains = [p["diff"] for p in ps]
    mean = sum(gains) / k
    sd = math.sqrt(sum((g - mean) ** 2 for g in gains) / (k - 1)) if k > 1 else None
    return {
        "k": k,
        "mean": mean,
        "sd": sd,
        "min": min(gains),
        "cleared": sum(verdict(p) == "up" for p in ps),
        **({"cleared_group": sum(verdict_group(p) == "up" for p in ps)} if _grouped(ps) else {}),
        "below": sum(g < 0 for g in gains),
        "base": sum(p["a"] for p in ps) / k,
        "final": sum(p["b"] for p in ps) / k,
    }


def _grouped(ps: list[dict[str, float]]) -> bool:
    """Every seed's gain has an SE by template and some template holds more than one task (else that SE is the
    per-task one)."""
    return all("se_group" in p for p in ps) and any(p["groups"] < p["n"] for p in ps)


def verdict_group(p: dict[str, float]) -> str:
    """``verdict`` on the SE clustered by template (``paired``'s ``se_group``), with the templates as the count."""
    return verdict({"diff": p["diff"], "se": p["se_group"], "n": p["groups"]})


def eval_groups(recipe: Path, cfg: Any) -> dict[str, str] | None:
    """Task id -> template over the recipe's held-out files (``task_groups``; paths relative to the recipe, as
    the trainer reads them); None, with a note on stderr, where a file does not read as JSONL tasks: the report
    then gives the per-task SE alone."""
    try:
        return task_groups([(recipe.parent / f).resolve() for f in cfg.data.eval_files])
    except (OSError, ValueError) as e:
        print(f"{recipe}: no SE by template ({e})", file=sys.stderr)
        return None


def first_tasks(recipe: Path, cfg: Any, n: int) -> set[str]:
    """The ids of the first ``n`` tasks of each of the recipe's held-out files (paths relative to the recipe)."""
    keep: set[str] = set()
    for f in cfg.data.eval_files:
        path = (recipe.parent / f).resolve()
        try:
            lines = [line for line in path.read_text().splitlines() if line.strip()][:n]
            keep.update(str(json.loads(line)["id"]) for line in lines)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SweepError(
                f"{recipe}: --first {n}: held-out file {path} does not read as JSONL tasks ({e!r})"
            ) from None
    return keep


def only(evaluation: Evaluation, keep: set[str]) -> Evaluation:
    """``evaluation`` restricted to the task ids in ``keep`` (domains left empty are dropped)."""
    out = {d: {t: r for t, r in per.items() if t in keep} for d, per in evaluation.items()}
    return {d: per for d, per in out.items() if per}


def across_verdict(s: dict[str, Any]) -> str:
    """``up`` / ``down`` when the across-seed mean is beyond two of its standard errors (SD / sqrt(k)),
    else ``noise``; ``one seed`` when there is no spread to judge by."""
    if s["sd"] is None:
        return "one seed"
    return verdict({"diff": s["mean"], "se": s["sd"] / math.sqrt(s["k"]), "n": s["k"]})


def analyse(evals: dict[int, tuple[Evaluation, Evaluation]], groups: dict[str, str] | None = None) -> dict[str, Any]:
    """``{"per_seed": {domain: {seed: paired}}, "across": {domain: across}}`` from each seed's (first,
    last) held-out evaluation; a domain counts in the seeds whose both evaluations hold it. ``groups`` (task id
    -> template, ``eval_groups``): each gain's SE clustered by template too (``paired``'s ``se_group``)."""
    domains = sorted({d for first, last in evals.values() for d in first if d in last})
    per_seed: dict[str, dict[int, dict[str, float]]] = {}
    for d in domains:
        per_seed[d] = {
            s: paired(first[d], last[d], groups) for s, (first, last) in evals.items() if d in first and d in last
        }
    out = {"per_seed": per_seed, "across": {d: across(list(ps.values())) for d, ps in per_seed.items()}}
    if groups:
        out["templates"] = template_moves(evals, groups)
    return out


def template_moves(evals: dict[int, tuple[Evaluation, Evaluation]], groups: dict[str, str]) -> dict[str, Any]:
    """Where each domain's gain sits: ``{domain: {template: {"n": tasks, "diffs": {seed: mean change over the
    template's tasks}}}}`` for the templates (``groups``' values, several tasks each) that moved in some seed."""
    out: dict[str, Any] = {}
    for s, (first, last) in sorted(evals.items()):
        for d in first:
            if d not in last:
                continue
            sums: dict[str, list[float]] = {}
            for t in sorted(set(first[d]) & set(last[d])):
                if t in groups:
                    sums.setdefault(groups[t], []).append(last[d][t] - first[d][t])
            for g, diffs in sums.items():
                row = out.setdefault(d, {}).setdefault(g, {"n": len(diffs), "diffs": {}})
                row["diffs"][s] = sum(diffs) / len(diffs)
    return {
        d: {g: row for g, row in sorted(rows.items()) if any(abs(x) > 1e-12 for x in row["diffs"].values())}
        for d, rows in sorted(out.items())
    }


# ---------------------------------------------------------------------------- report


def z_text(p: dict[str, float]) -> str:
    """The gain in paired SE (``+4.3 SE``), or what stands in for it without a spread."""
    if p["se"] > 0:
        return f"{p['diff'] / p['se']:+.1f} SE"
    return "SE 0" if p["n"] > 1 else "n < 2"


def _cell(p: dict[str, float]) -> str:
    return f"{p['a']:.3f} -> {p['b']:.3f}, {p['diff']:+.3f} ± {p['se']:.3f} ({z_text(p)}), n={p['n']}"


def _group_cell(p: dict[str, float]) -> str:
    return f"{p['diff']:+.3f} ± {p['se_group']:.3f} ({z_text({**p, 'se': p['se_group'], 'n': p['groups']})}), G={p['groups']}"


def clustered(result: dict[str, Any]) -> bool:
    """Whether the SE by template says something the per-task SE does not: some domain's held-out tasks share
    templates (``across`` counted ``cleared_group`` for it)."""
    return any("cleared_group" in s for s in result["across"].values())


def spread_text(s: dict[str, Any]) -> str:
    """An ``across`` result as ``mean ± SD`` (one seed: no SD)."""
    return f"{s['mean']:+.3f} ± {s['sd']:.3f}" if s["sd"] is not None else f"{s['mean']:+.3f} (one seed)"


def render(result: dict[str, Any], runs: list[SeedRun], meta: dict[str, Any]) -> str:
    """The Markdown body of the sweep's RESULTS.md section."""
    from bench._results import table

    per, acr = result["per_seed"], result["across"]
    domains = sorted(per)
    ok = [r for r in runs if r.status != "failed"]
    base_text = meta.get("base") or "each seed's step-0 evaluation"
    first_text = f", their first {meta['first']} tasks each" if meta.get("first") else ""
    lines = [
        f"Recipe `{meta['recipe']}`{' with ' + ' '.join(f'`{o}`' for o in meta['overrides']) if meta['overrides'] else ''}, "
        f"seeds {', '.join(str(r.seed) for r in runs)} ({meta['runtime']}), {meta['steps']} steps, "
        f"{meta['samples']} samples per run. Held-out: the recipe's `data.eval_files` (greedy)"
        f"{first_text}, base = "
        f"{base_text}, final = its last, paired over the same "
        f"tasks (n per domain in the table). "
        f"± per seed: one paired standard error (evaluation noise only); across seeds: the sample standard "
        f"deviation of the gains (run-to-run variance). {meta['precision'] + ' ' if meta.get('precision') else ''}"
        f"Host: {meta['host']}.",
        "",
        "Per seed, base -> final held-out mean, gain ± paired SE:",
        "",
    ]
    rows = [
        [str(r.seed), f"{r.wall_s:.0f}" if r.wall_s is not None else "-"]
        + [_cell(per[d][r.seed]) if r.seed in per[d] else "-" for d in domains]
        for r in ok
    ]
    lines += [table(["seed", "wall s", *domains], rows), ""]
    by_template = clustered(result)
    if by_template:
        lines += [
            "The same gains with the SE clustered by template (`meta.template` of the held-out tasks; G templates): "
            "tasks of one template move together, a policy learns a template's trick or not, so a gain that sits "
            "in a few templates is less sure than the per-task SE says:",
            "",
        ]
        rows = [[str(r.seed)] + [_group_cell(per[d][r.seed]) if r.seed in per[d] else "-" for d in domains] for r in ok]
        lines += [table(["seed", *domains], rows), ""]
        moved = [
            [d, f"{g.split(':', 1)[-1]} ({row['n']})"]
            + [f"{row['diffs'][r.seed]:+.2f}" if r.seed in row["diffs"] else "-" for r in ok]
            for d, rows in result.get("templates", {}).items()
            for g, row in rows.items()
            if row["n"] > 1
        ]
        if moved:
            lines += [
                "Where the gains sit: the held-out templates whose mean moved in some seed (change of the mean over "
                "the template's tasks; the others did not move in any seed):",
                "",
                table(["domain", "template (tasks)", *(f"seed {r.seed}" for r in ok)], moved),
                "",
            ]
    lines += ["Across seeds:", ""]
    rows = [
        [
            d,
            f"{s['base']:.3f}",
            f"{s['final']:.3f}",
            spread_text(s),
            f"{s['cleared']} of {s['k']}",
            *([f"{s['cleared_group']} of {s['k']}" if "cleared_group" in s else "-"] if by_template else []),
            f"{s['below']} of {s['k']}",
        ]
        for d, s in acr.items()
    ]
    head = [
        "domain",
        "base (mean)",
        "final (mean)",
        "gain, mean ± SD",
        "seeds > 2 SE",
        *(["seeds > 2 SE by template"] if by_template else []),
        "seeds below base",
    ]
    lines += [table(head, rows), ""]
    failed = [r for r in runs if r.status == "failed"]
    if failed:
        lines += ["Failed (not in the tables): " + "; ".join(f"seed {r.seed}: {r.cause}" for r in failed) + ".", ""]
    lines.append("What this supports: " + conclusions(result, len(ok)))
    return "\n".join(lines)


def conclusions(result: dict[str, Any], k: int) -> str:
    """Plain sentences on the across-seed table: only gains beyond two paired SE count as cleared."""
    acr = result["across"]
    if not acr:
        return "no finished seed holds a held-out evaluation."
    every = [d for d, s in acr.items() if s["cleared"] == s["k"] == k]
    said = [
        f"{', '.join(every) or 'no domain'} cleared two paired SE in every one of the {k} finished seeds",
        *(f"{d} cleared in {s['cleared']} of {s['k']}" for d, s in acr.items() if d not in every),
    ]
    below = [f"{d} ({s['below']} of {s['k']})" for d, s in acr.items() if s["below"]]
    said.append(f"ended below base: {', '.join(below)}" if below else "no domain ended below its base in any seed")
    if clustered(result):
        by = [f"{d} {s['cleared_group']} of {s['k']}" for d, s in acr.items() if "cleared_group" in s]
        said.append(f"with the SE clustered by template, seeds beyond two SE: {', '.join(by)}")
    return "; ".join(said) + "."


# ---------------------------------------------------------------------------- main


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", help="recipe YAML")
    ap.add_argument("--seeds", required=True, help="comma-separated integer seeds, e.g. 0,1,2")
    ap.add_argument("--out", default="", help="sweep folder (default runs/seeds/<recipe name>)")
    ap.add_argument("--local", action="store_true", help="train --local: the in-process runtime (no Ray, no vLLM)")
    ap.add_argument("--in-process", action="store_true", help="with --local: each seed in this process")
    ap.add_argument("--parallel", type=int, default=1, help="seeds trained at once (each its own process)")
    ap.add_argument("--keep-done", action="store_true", help="keep seeds whose run in --out finished; train the rest")
    ap.add_argument("--from-runs", action="store_true", help="analyse the runs in --out; train nothing")
    ap.add_argument("--write", action="store_true", help="also replace the section in bench/RESULTS.md")
    ap.add_argument(
        "--base",
        default="",
        help="with --from-runs: a run folder whose step-0 evaluation is every seed's base, for runs that skipped "
        "their own (bench/seesaw.py's OUT/base for its OUT/<config>/seed_<S> runs)",
    )
    ap.add_argument(
        "--shared-base",
        action="store_true",
        help="evaluate the base model once (OUT/base, a train.steps=0 run) and train every seed without its own "
        "step-0 evaluation (train.eval_at_start=false), each read against that one; with --from-runs, read so",
    )
    ap.add_argument(
        "--first",
        type=int,
        default=0,
        help="with --from-runs: read only the first N tasks of each held-out file (file order), to compare with "
        "a sweep over files that held those N; its section gets its own key (..._first<N>)",
    )
    add_section_args(ap)
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every seed's run")
    return ap.parse_intermixed_args(argv)  # overrides may come before or after the flags


def _check_flags(args: argparse.Namespace) -> None:
    if args.parallel < 1:
        raise SweepError(f"--parallel must be >= 1, got {args.parallel}")
    if args.in_process and not args.local:
        raise SweepError("--in-process runs the in-process runtime only: add --local")
    if args.in_process and args.parallel > 1:
        raise SweepError("--in-process trains one seed at a time: drop --parallel or --in-process")
    if args.base and not args.from_runs:
        raise SweepError("--base reads finished runs against a shared base evaluation: add --from-runs")
    if args.base and args.shared_base:
        raise SweepError("--base RUN and --shared-base (OUT/base) both name the base evaluation: give one")
    if args.first < 0:
        raise SweepError(f"--first must be >= 0, got {args.first}")
    if args.first and not args.from_runs:
        raise SweepError("--first reads part of finished runs' evaluations: add --from-runs")
    if err := section_key_error(args.section_key):
        raise SweepError(err)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    try:
        _check_flags(args)
        seeds = parse_seeds(args.seeds)
        recipe = Path(args.recipe).resolve()
        out = Path(args.out or ROOT / "runs" / "seeds" / recipe.stem).resolve()
        cfg = check_recipe(recipe, args.overrides, seeds, out)
        # the run folder of the one base evaluation every seed is read against, where there is one
        base_at = Path(args.base).resolve() if args.base else base_dir(out) if args.shared_base else None
        base = shared_base(base_at) if base_at and args.from_runs else None
        keep = first_tasks(recipe, cfg, args.first) if args.first else None
    except SweepError as e:
        print(f"seeds: error: {e}", file=sys.stderr)
        return 2
    pinned, note = ([], "") if args.from_runs else pinned_precision(cfg, args.local)
    base_run = finished(out, seeds[0], base=True) if args.shared_base else None
    if args.from_runs:
        runs = [finished(out, s) or SeedRun(s, str(seed_dir(out, s)), "failed", cause="no finished run") for s in seeds]
    else:
        if args.shared_base:
            if base_run is None or not args.keep_done:
                base_run = run_seed(
                    recipe, seeds[0], out, [*args.overrides, *pinned], args.local, args.in_process, True
                )
            if base_run.status == "failed":  # nothing to read any seed against: train none
                print(f"seeds: error: {recipe}, the base run: {base_run.cause}", file=sys.stderr)
                return base_run.exit_code if base_run.exit_code == INTERRUPTED else 3
            try:
                base = shared_base(base_at)
            except SweepError as e:
                print(f"seeds: error: {recipe}, the base run: {e}", file=sys.stderr)
                return 3
        runs = sweep(
            recipe,
            seeds,
            out,
            [*args.overrides, *pinned, *(["train.eval_at_start=false"] if args.shared_base else [])],
            local=args.local,
            in_process=args.in_process,
            parallel=args.parallel,
            keep_done=args.keep_done,
        )
    meta = {
        "recipe": os.path.relpath(recipe, ROOT) if recipe.is_relative_to(ROOT) else str(recipe),
        "overrides": args.overrides,
        "runtime": "in-process runtime, --local" if args.local else "Ray + vLLM",
        "steps": cfg.train.steps,
        "samples": cfg.rollout.prompts_per_step * cfg.rollout.group_size * cfg.train.steps,
        "precision": f"Precision pinned for every seed: {note}." if note else "",
        "base": (
            f"one shared step-0 evaluation of the base model (`{args.base or base_at}`"
            + (f", {base_run.wall_s:.0f} s; each seed's wall leaves it out" if base_run and base_run.wall_s else "")
            + ")"
        )
        if base
        else "",
        "first": args.first,
        "section_key": args.section_key,
        "section_title": args.section_title,
        "base_dir": str(base_at) if base else "",  # bench/ablate.py's FOLDER@STEP reads against it too
    }
    return report(recipe, out, runs, meta, args.write, eval_groups(recipe, cfg), base, keep)


def report(
    recipe: Path,
    out: Path,
    runs: list[SeedRun],
    meta: dict[str, Any],
    write: bool,
    groups: dict[str, str] | None = None,
    base: Evaluation | None = None,
    keep: set[str] | None = None,
) -> int:
    """Read each finished seed's evaluations (a run whose records do not read counts as failed; ``keep``: only
    those task ids), then write ``sweep.json``, ``RESULTS-section.md`` and ``report.html`` (``..._first<N>``
    names with ``meta["first"]``); 0 when every seed finished, 130 when the sweep was interrupted, else 3."""
    from bench._results import cpu_model, section, write_section
    from rl.cli.report import write_seed_report

    evals = {}
    for r in runs:
        if r.status == "failed":
            continue
        try:
            first, last = eval_rewards(records(Path(r.run_dir)), base)
            evals[r.seed] = (first, last) if keep is None else (only(first, keep), only(last, keep))
        except (OSError, ValueError) as e:
            r.status, r.cause = "failed", f"its held-out records do not read: {e}"
            print(f"seeds: {recipe}, seed {r.seed}: failed: {r.cause}", file=sys.stderr)
    result = analyse(evals, groups)
    meta["host"] = cpu_model() or "unknown"
    body = render(result, runs, meta)
    n = meta.get("first") or 0
    tail = f"_first{n}" if n else ""
    title = f"Seed sweep: `{meta['recipe']}`" + (f", the first {n} tasks of each held-out file" if n else "")
    title = meta.get("section_title") or title + " (`bench/seeds.py`)"
    out.mkdir(parents=True, exist_ok=True)
    key = (meta.get("section_key") or f"seeds_{recipe.stem}") + tail
    (out / f"RESULTS-section{tail}.md").write_text(section(key, title, body))
    if write:
        write_section(key, title, body)
    (out / f"sweep{tail}.json").write_text(
        json.dumps({"meta": meta, "runs": [asdict(r) for r in runs], **_json_result(result)}, indent=1) + "\n"
    )
    html = write_seed_report(
        {f"seed {r.seed}" + (" (failed)" if r.status == "failed" else ""): Path(r.run_dir) for r in runs},
        out / f"report{tail}.html",
        title=f"seed sweep: {recipe.name}",
        summary=body,
    )
    print(body)
    print(f"seeds: wrote {out / f'RESULTS-section{tail}.md'}, {out / f'sweep{tail}.json'}, {html}", file=sys.stderr)
    if any(r.exit_code == INTERRUPTED or r.cause.startswith("not run") for r in runs):
        return INTERRUPTED
    return 3 if any(r.status == "failed" for r in runs) else 0


def _json_result(result: dict[str, Any]) -> dict[str, Any]:
    """``analyse``'s result with string keys (JSON objects)."""
    out = {
        "per_seed": {d: {str(s): p for s, p in ps.items()} for d, ps in result["per_seed"].items()},
        "across": result["across"],
    }
    if "templates" in result:
        out["templates"] = {
            d: {g: {**row, "diffs": {str(s): x for s, x in row["diffs"].items()}} for g, row in rows.items()}
            for d, rows in result["templates"].items()
        }
    return out


if __name__ == "__main__":
    sys.exit(main())
