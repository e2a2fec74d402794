"""Ablations on a dev split: choose a recipe change by looking at training data, never at the held-out files.

Two steps around ``bench/seeds.py``:

``split``: cut a dev set out of a recipe's training files. Within each file, tasks are grouped by their
``meta["template"]`` (one group for a file without templates) and every ``--every``-th task of a group, in
file order, goes to the dev file, the rest to the new training file; both go to ``--out``, and the command
prints the two overrides (``data.train_files=[...]``, ``data.eval_files=[...]``) that train on the rest and
evaluate on the dev set. Each template keeps tasks on both sides, so the dev set measures new instances of the
training templates: an easier test than the held-out files (new templates), but one the ablation may look at.
``--by template``: every ``--every``-th template of a file (in order of first appearance) goes to dev whole, so
the dev set asks what the held-out files ask, how much of the training reaches templates never trained on,
still without reading them; the training files keep the other templates.

``compare``: read the ``sweep.json`` of a control sweep and of one or more arms (each a ``bench/seeds.py``
sweep with the same seeds and the split's overrides plus the arm's own) and report per domain each arm's dev
gain (mean ± SD over seeds, seeds beyond 2 paired SE) and its difference to the control: per seed, the arm's
final dev mean minus the control's (same seed, same dev tasks), then mean ± SD and SE (SD / sqrt(seeds)) of
those differences. ``--write`` puts the table in ``bench/RESULTS.md`` (section ``ablation_<name>``). A folder given as
``FOLDER@STEP`` is read at the dev evaluation of step ``STEP`` instead of its last (each seed's run must have
evaluated there, ``train.eval_every``): one sweep of a longer run then compares training for ``STEP`` steps
against training on, paired by seed, without a second sweep (the learning rate must not depend on the run's
length for that to equal a shorter run: ``algo.optim.schedule: constant``).

    .venv/bin/python bench/ablate.py split recipes/joint_rl.yaml --out runs/dev_split
    .venv/bin/python bench/ablate.py split recipes/joint_rl.yaml --by template --out runs/dev_templates
    .venv/bin/python bench/seeds.py recipes/joint_rl.yaml --seeds 0,1,2 --out runs/abl/control <overrides>
    .venv/bin/python bench/seeds.py recipes/joint_rl.yaml --seeds 0,1,2 --out runs/abl/prior8 <overrides> \\
        algo.reward_norm.prior_samples=8
    .venv/bin/python bench/ablate.py compare --name joint_rl --control runs/abl/control \\
        --arm prior_samples=8:runs/abl/prior8 --write
    .venv/bin/python bench/ablate.py compare --name steps --control runs/abl/steps46@23 --arm 46:runs/abl/steps46

Bad input (exit 2, one line naming it): a training file that is not a task file (a Harbor directory, a
dataset), a group too small to give the dev set a task, a file with fewer templates than ``--every`` or none
(``--by template``), a sweep folder without ``sweep.json``, arms whose
seeds or dev sets differ from the control's, a ``@STEP`` at which a seed's run did not evaluate.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

__all__ = ["split_tasks", "split_recipe", "compare", "render", "main"]


class AblationError(ValueError):
    """Bad input to the ablation: the message names the file, folder or arm."""


SPLIT_BY = ("instance", "template")


def split_tasks(lines: list[str], every: int, where: str, by: str = "instance") -> tuple[list[str], list[str]]:
    """(train, dev) JSONL lines. ``by="instance"``: within each ``meta.template`` group, in order, every
    ``every``-th task is dev. ``by="template"``: every ``every``-th template group, in order of first appearance,
    is dev whole. ``where`` names the file in errors."""
    if every < 2:
        raise AblationError(f"--every must be at least 2 (got {every})")
    if by not in SPLIT_BY:
        raise AblationError(f"--by must be one of {', '.join(SPLIT_BY)} (got {by!r})")
    groups: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        try:
            task = json.loads(line)
        except json.JSONDecodeError as e:
            raise AblationError(f"{where}:{i + 1}: not JSON ({e.msg})") from None
        groups.setdefault(str((task.get("meta") or {}).get("template", "")), []).append(i)
    dev = set()
    if by == "template":
        names = list(groups)
        if names == [""]:
            raise AblationError(f"{where}: no task has a meta.template: --by template has nothing to hold out")
        if len(names) < every:
            raise AblationError(f"{where}: {len(names)} templates, fewer than --every {every}: no dev template")
        for name in names[every - 1 :: every]:
            dev.update(groups[name])
    else:
        for name, idx in groups.items():
            if len(idx) < every:
                label = f"template {name!r}" if name else "the file"
                raise AblationError(f"{where}: {label} has {len(idx)} tasks, fewer than --every {every}: no dev task")
            dev.update(idx[every - 1 :: every])
    return [x for i, x in enumerate(lines) if i not in dev], [x for i, x in enumerate(lines) if i in dev]


def split_recipe(recipe: Path, out: Path, every: int = 3, by: str = "instance") -> tuple[list[Path], list[Path]]:
    """Split each of ``recipe``'s ``data.train_files`` into ``out/<name>.train.jsonl`` and ``<name>.dev.jsonl``
    (``split_tasks``); returns (train files, dev files) in the recipe's order."""
    from rl.config.loading import load_recipe

    cfg = load_recipe(recipe)
    if not cfg.data.train_files:
        raise AblationError(f"{recipe}: data.train_files is empty: nothing to split")
    out.mkdir(parents=True, exist_ok=True)
    trains, devs = [], []
    for f in cfg.data.train_files:
        path = (recipe.parent / f).resolve()
        if not path.is_file() or path.suffix != ".jsonl":
            raise AblationError(f"{recipe}: data.train_files {f}: not a .jsonl task file (split needs one)")
        lines = [x for x in path.read_text().splitlines() if x.strip()]
        train, dev = split_tasks(lines, every, str(path), by)
        stem = path.name.removesuffix(".jsonl").removesuffix(".train")
        trains.append(out / f"{stem}.train.jsonl")
        devs.append(out / f"{stem}.dev.jsonl")
        trains[-1].write_text("\n".join(train) + "\n")
        devs[-1].write_text("\n".join(dev) + "\n")
    return trains, devs


def _sweep(folder: Path, step: int | None = None) -> dict[str, Any]:
    """A sweep's ``sweep.json``; with ``step``, its ``per_seed`` and ``across`` recomputed from each finished
    seed's dev evaluations, first against the one at ``step`` (``bench/seeds.py``'s statistics); "first" is the
    sweep's shared base evaluation where it has one (``--shared-base``, ``meta.base_dir``), else each run's
    earliest."""
    path = folder / "sweep.json"
    try:
        sweep = json.loads(path.read_text())
    except FileNotFoundError:
        raise AblationError(f"{folder}: no sweep.json (run bench/seeds.py with --out {folder} first)") from None
    except json.JSONDecodeError as e:
        raise AblationError(f"{path}: not JSON ({e.msg})") from None
    if step is None:
        return sweep
    from bench.seeds import _json_result, analyse
    from bench.seesaw import base_eval, eval_steps, records

    base = None
    if sweep.get("meta", {}).get("base_dir"):
        try:
            base = base_eval(records(Path(sweep["meta"]["base_dir"])))
        except (OSError, ValueError) as e:
            raise AblationError(f"{folder}@{step}: the sweep's shared base evaluation does not read: {e}") from None
    evals = {}
    for run in sweep.get("runs", []):
        if run.get("status") not in ("done", "kept"):
            continue
        by_step = eval_steps(records(Path(run["run_dir"])))
        if step not in by_step or (base is None and step == min(by_step)):
            raise AblationError(
                f"{folder}@{step}: seed {run['seed']}'s run {run['run_dir']} has no dev evaluation at step {step} after "
                f"its first (it evaluated at steps {sorted(by_step)})"
            )
        evals[run["seed"]] = (by_step[min(by_step)] if base is None else base, by_step[step])
    if not evals:
        raise AblationError(f"{folder}@{step}: no finished seed in sweep.json")
    return {**sweep, **_json_result(analyse(evals, _groups(sweep)))}


def _groups(sweep: dict[str, Any]) -> dict[str, str] | None:
    """Task id -> template over the dev files the sweep evaluated on (its recipe with its overrides, as
    ``bench/seeds.py`` reads them), so that a sweep read at a step counts the seeds beyond two SE clustered by
    template as its own report does; None where the recipe no longer loads (the per-task SE alone)."""
    from bench.seeds import eval_groups
    from rl.config.recipe import load_recipe

    if "recipe" not in sweep["meta"]:
        return None
    recipe = ROOT / sweep["meta"]["recipe"]
    try:
        cfg = load_recipe(recipe, list(sweep["meta"].get("overrides", [])))
    except Exception as e:  # noqa: BLE001 - a recipe edited or gone since the sweep: report without it
        print(f"ablate: {recipe}: no SE by template ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    return eval_groups(recipe, cfg)


def _eval_files(sweep: dict[str, Any]) -> list[str]:
    """The sweep's ``data.eval_files=`` override (the dev files it was evaluated on)."""
    return [o for o in sweep["meta"].get("overrides", []) if o.startswith("data.eval_files=")]


def compare(control: dict[str, Any], arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per arm and domain: its gains across seeds (``sweep.json``'s ``across``) and its per-seed final dev mean
    minus the control's (``diffs``: seed -> difference; ``mean``, ``sd``, ``se``)."""
    seeds = sorted(control["per_seed"][next(iter(control["per_seed"]))])
    out: dict[str, Any] = {"seeds": seeds, "control": control["across"], "arms": {}}
    for name, arm in arms.items():
        if _eval_files(arm) != _eval_files(control):
            raise AblationError(f"arm {name}: evaluated on other files than the control ({_eval_files(arm)})")
        rows = {}
        for domain, per in control["per_seed"].items():
            got = arm["per_seed"].get(domain, {})
            if sorted(got) != seeds:
                raise AblationError(f"arm {name}, {domain}: seeds {sorted(got)}, the control's {seeds}")
            diffs = {s: got[s]["b"] - per[s]["b"] for s in seeds}
            vals = list(diffs.values())
            sd = statistics.stdev(vals) if len(vals) > 1 else None
            rows[domain] = {
                "diffs": diffs,
                "mean": statistics.fmean(vals),
                "sd": sd,
                "se": sd / math.sqrt(len(vals)) if sd is not None else None,
                "across": arm["across"][domain],
            }
        out["arms"][name] = rows
    return out


def _gain(a: dict[str, Any]) -> str:
    sd = f" ± {a['sd']:.3f}" if a.get("sd") is not None else ""
    by = f"; {a['cleared_group']} by template" if "cleared_group" in a else ""
    return f"{a['mean']:+.3f}{sd} ({a['cleared']} of {a['k']} > 2 SE{by})"


def _diff(r: dict[str, Any]) -> str:
    if r["se"] is None:
        return f"{r['mean']:+.3f}"
    verdict = "up" if r["mean"] > 2 * r["se"] else "down" if r["mean"] < -2 * r["se"] else "noise"
    return f"{r['mean']:+.3f} ± {r['se']:.3f} ({verdict})"


def render(result: dict[str, Any], meta: dict[str, Any]) -> str:
    """The Markdown body: dev gains per arm, then each arm minus the control."""
    from bench._results import table

    domains = sorted(result["control"])
    head = ["arm"] + domains
    gains = [["control"] + [_gain(result["control"][d]) for d in domains]]
    gains += [[name] + [_gain(rows[d]["across"]) for d in domains] for name, rows in result["arms"].items()]
    diffs = [[name] + [_diff(rows[d]) for d in domains] for name, rows in result["arms"].items()]
    seeds = ", ".join(str(s) for s in result["seeds"])
    return (
        f"{meta['what']}\n\nDev gain (final minus step-0 dev mean), mean ± SD over seeds {seeds}, and the seeds whose "
        "gain cleared two paired SE (and two SE clustered by the dev tasks' template, where they share templates: "
        "`bench/seeds.py`):\n\n"
        + table(head, gains)
        + "\n\nArm minus control, final dev mean, paired by seed (mean ± SE over seeds; up/down only beyond 2 SE):\n\n"
        + table(head, diffs)
        + "\n"
    )


def _source(text: str) -> tuple[Path, int | None]:
    """``FOLDER`` or ``FOLDER@STEP`` (a sweep read at one step's evaluation)."""
    folder, sep, step = text.rpartition("@")
    if not sep or not folder:
        return Path(text), None
    if not step.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected FOLDER or FOLDER@STEP (STEP an integer)")
    return Path(folder), int(step)


def _arm(text: str) -> tuple[str, tuple[Path, int | None]]:
    name, sep, folder = text.partition(":")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"--arm {text!r}: expected NAME:FOLDER or NAME:FOLDER@STEP")
    return name, _source(folder)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("split", help="cut a dev set out of a recipe's training files")
    sp.add_argument("recipe", type=Path)
    sp.add_argument("--out", type=Path, required=True, help="folder for the train and dev files")
    sp.add_argument(
        "--every",
        type=int,
        default=3,
        help="every N-th task of each template (--by template: every N-th template) goes to dev",
    )
    sp.add_argument(
        "--by",
        choices=SPLIT_BY,
        default="instance",
        help="instance: new instances of the training templates; template: whole templates held out",
    )
    cp = sub.add_parser("compare", help="the arms' dev gains against the control's")
    cp.add_argument("--name", required=True, help="the RESULTS.md section is ablation_<name>")
    cp.add_argument("--control", type=_source, required=True, help="the control's bench/seeds.py --out folder [@STEP]")
    cp.add_argument("--arm", type=_arm, action="append", required=True, help="NAME:FOLDER[@STEP] (repeatable)")
    cp.add_argument("--what", default="", help="one paragraph: what was compared and why (the section's text)")
    cp.add_argument("--write", action="store_true", help="replace the section in bench/RESULTS.md")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "split":
            trains, devs = split_recipe(args.recipe, args.out, args.every, args.by)
            n = [sum(1 for _ in open(p)) for p in devs]
            print(f"data.train_files=[{','.join(str(p) for p in trains)}]")
            print(f"data.eval_files=[{','.join(str(p) for p in devs)}]")
            print(f"ablate: {sum(n)} dev tasks ({', '.join(map(str, n))}) in {args.out}", file=sys.stderr)
            return 0
        control = _sweep(*args.control)
        result = compare(control, {name: _sweep(*source) for name, source in args.arm})
    except AblationError as e:
        print(f"ablate: {e}", file=sys.stderr)
        return 2
    from bench._results import section, write_section

    meta = {"what": args.what or f"Arms {', '.join(result['arms'])} against the control on the dev split."}
    body = render(result, meta)
    key, title = f"ablation_{args.name}", f"Ablation on the dev split: `{args.name}` (`bench/ablate.py`)"
    print(section(key, title, body))
    if args.write:
        write_section(key, title, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
