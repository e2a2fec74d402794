"""``jointrl audit [TASKS ...] --recipe R``: the strategy catalogue against every task, a table and a JSON report.

Exit codes: 0 when nothing is flagged, 1 when a strategy scored above its task's baseline, a
reference scored below 1, or an episode or reward raised (each is listed); 2 on bad input (a
recipe, task file, format or option, named in one message), as the other commands.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import rl.cli.audit.harbor  # noqa: F401 - registers the harbor task source and strategies
from rl.cli.audit.runner import EnvSpec, TaskReport, audit_tasks, declared_work
from rl.cli.audit.sources import SOURCES, AuditTask, SourceError, load_audit_tasks
from rl.cli.audit.strategies import STRATEGIES
from rl.cli.common import CommandError, _guarded, recipe_reward_specs

__all__ = ["add_parser", "run_audit", "render_table", "report_json"]


def add_parser(sub: Any) -> None:
    """Add ``audit`` to ``jointrl``'s subparsers."""
    p = sub.add_parser(
        "audit",
        help="try answers that do none of the work (no-op, constants, echoes, forgeries...) on every task; "
        "flag any that scores above the baseline",
        description="Play a catalogue of strategies that do none of a task's work through the recipe's envs "
        "and rewards, and flag every strategy that scores above the task's baseline (the higher of the no-op's "
        "and a well-formed wrong answer's reward) and every reference solution that scores below 1. "
        "A no-op that scores above 0 and an episode or reward that raises are flagged too. "
        "Exit 1 when anything is flagged, 0 when clean, 2 on bad input.",
    )
    p.add_argument("tasks", nargs="*", help="task files (default: the recipe's data.train_files and data.eval_files)")
    p.add_argument("--recipe", help="recipe YAML: its rollout.envs, rollout.max_turns and rewards")
    p.add_argument(
        "--format", default=None, help="task source for every file (default: the first that reads it; see --list)"
    )
    p.add_argument("--json", dest="json_out", help="write the full report (every task and strategy) here as JSON")
    p.add_argument(
        "--workers",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="tasks audited at once, each on its own thread with its own envs (default: min(4, CPUs))",
    )
    p.add_argument("--strategies", help="comma-separated strategy names to run (default: all; noop and wrong always)")
    p.add_argument("--limit", type=int, default=0, help="audit the first N tasks of each file only (0 = all)")
    p.add_argument("--list", action="store_true", help="list the task sources and strategies, then exit")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(run=run_audit)


def run_audit(args: argparse.Namespace) -> int:
    return _guarded(_audit_guarded, args)


def _audit_guarded(args: argparse.Namespace) -> int:
    try:
        return _audit(args)
    except SourceError as e:
        raise CommandError(str(e)) from None


def _audit(args: argparse.Namespace) -> int:
    if args.list:
        print(_listing())
        return 0
    if not args.recipe:
        raise CommandError("--recipe is required: the audit plays the tasks through the recipe's envs and rewards")
    if args.workers < 1 or args.limit < 0:
        raise CommandError("--workers must be >= 1 and --limit >= 0")
    specs, cfg = recipe_reward_specs(args.recipe)
    envs = _env_specs(cfg, args.recipe)
    only = _only(args.strategies)
    marker = next(
        (str(e.kwargs.get("done_marker", "DONE")) for e in cfg.rollout.envs if e.domain == "terminal"), "DONE"
    )
    tasks = _tasks(args, cfg, envs, marker)
    reports = audit_tasks(
        tasks,
        envs,
        specs,
        max_turns=cfg.rollout.max_turns,
        timeout_s=cfg.reward_service.timeout_s,
        workers=args.workers,
        only=only,
        progress=_progress(len(tasks)) if sys.stderr.isatty() else None,
    )
    print(render_table(reports))
    if args.json_out:
        out = Path(args.json_out)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report_json(reports, args.recipe), indent=2) + "\n")
        except OSError as e:
            raise CommandError(f"--json {out}: cannot write: {e.strerror or e}") from None
    return 1 if any(r.findings for r in reports) else 0


def _progress(total: int) -> Any:
    """A progress callback: one line on standard error per finished task (on a terminal only)."""
    done = [0]
    lock = threading.Lock()

    def note(rep: TaskReport) -> None:
        with lock:
            done[0] += 1
            print(f"[{done[0]}/{total}] {rep.task_id}: {len(rep.findings)} flagged", file=sys.stderr, flush=True)

    return note


def _listing() -> str:
    lines = ["task sources: " + ", ".join(sorted(SOURCES)), "strategies:"]
    for domain, table in sorted(STRATEGIES.items()):
        for s in table.values():
            lines.append(f"  {domain:10} {s.name:22} {s.role:7} {s.doc}")
    return "\n".join(lines)


def _only(raw: str | None) -> set[str] | None:
    if raw is None:
        return None
    names = {n.strip() for n in raw.split(",") if n.strip()}
    known = {n for table in STRATEGIES.values() for n in table}
    unknown = sorted(names - known)
    if unknown or not names:
        raise CommandError(f"--strategies: unknown {', '.join(unknown) or '(none given)'}; see jointrl audit --list")
    return names


def _env_specs(cfg: Any, recipe: str) -> dict[str, EnvSpec]:
    """The recipe's env per domain, each constructed once here so that bad kwargs stop the audit naming the key."""
    from envs.base import resolve

    out = {}
    for i, e in enumerate(cfg.rollout.envs):
        try:
            env = resolve(e.cls)(**dict(e.kwargs))
        except Exception as ex:  # noqa: BLE001 - import error, bad kwargs, no sandbox: the user's to see
            raise CommandError(
                f"{recipe}: rollout.envs.{i}: cannot construct {e.cls}: {type(ex).__name__}: {ex}"
            ) from None
        getattr(env, "close", lambda: None)()
        out[e.domain] = EnvSpec(e.domain, e.cls, dict(e.kwargs))
    return out


def _tasks(args: argparse.Namespace, cfg: Any, envs: dict[str, EnvSpec], marker: str) -> list[AuditTask]:
    """The tasks of every file (``--limit`` each), each of a domain the recipe serves."""
    from rl.config.recipe import resolve_path

    files = list(args.tasks) or [str(resolve_path(cfg, f)) for f in (*cfg.data.train_files, *cfg.data.eval_files)]
    if not files:
        raise CommandError(f"no task files: name them, or set data.train_files in {args.recipe}")
    tasks: list[AuditTask] = []
    for f in files:
        got = load_audit_tasks(f, args.format, marker)
        tasks += got[: args.limit] if args.limit else got
    if not tasks:
        raise CommandError(f"no tasks in {', '.join(files)}")
    for at in tasks:
        if at.task.domain not in envs:
            raise CommandError(
                f"{at.where}: task {at.task.id!r} has domain {at.task.domain!r}, but the recipe's rollout.envs "
                f"serves only {sorted(envs)}"
            )
        try:
            declared_work(at.task)
        except ValueError as e:
            raise CommandError(f"{at.where}: {e}") from None
    return tasks


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _flag_text(rep: TaskReport) -> str:
    parts = []
    for f in rep.findings:
        if f.kind == "error":
            parts.append(f"{f.strategy}=ERROR")
        else:
            parts.append(f"{f.strategy}={f.reward:.2f}")
    parts += [f"({f.strategy}={f.reward:.2f} excused: does the work)" for f in rep.excused]
    return ", ".join(parts) or "-"


def _noop_reward(rep: TaskReport) -> float | None:
    return next((r.reward for r in rep.results if r.role == "noop"), None)


def render_table(reports: list[TaskReport]) -> str:
    """Per task: its reference's reward, its baseline and what is flagged; then a summary line, and the
    flagged tasks by name. When a source adds columns (the Harbor source's ``image`` build time), the
    table shows them and the no-op's reward before the reference's."""
    w = max([len("task"), *(len(r.task_id) for r in reports)])
    extra = list(dict.fromkeys(k for r in reports for k in r.columns))
    cw = {k: max([len(k), *(len(r.columns.get(k, "-")) for r in reports)]) for k in extra}
    head = "".join(f"{k:>{cw[k]}} " for k in extra) + (f"{'noop':>5} " if extra else "")
    lines = [f"{'task':{w}}  {'domain':10} {head}{'ref':>5} {'base':>5}  flagged"]
    for r in reports:
        cells = "".join(f"{r.columns.get(k, '-'):>{cw[k]}} " for k in extra)
        cells += f"{_fmt(_noop_reward(r)):>5} " if extra else ""
        lines.append(
            f"{r.task_id:{w}}  {r.domain:10} {cells}{_fmt(r.reference_reward):>5} {_fmt(r.baseline):>5}  {_flag_text(r)}"
        )
    n = sum(1 for r in reports if r.findings)
    kinds = [f.kind for r in reports for f in r.findings]
    excused = [f for r in reports for f in r.excused]
    lines.append(
        f"\n{len(reports)} tasks audited, {n} flagged: {kinds.count('above_baseline')} strategies above the "
        f"baseline, {kinds.count('noop_paid')} no-ops paid, {kinds.count('reference_below_1')} references "
        f"below 1, {kinds.count('error')} errors"
        + (f"; {len(excused)} excused (a strategy its task declares to do its work)" if excused else "")
    )
    errors: dict[tuple[str, str], list[str]] = {}
    for r in reports:
        for f in r.findings:
            if f.kind == "error":
                errors.setdefault((f.strategy, f.detail[:300]), []).append(r.task_id)
    for (strategy, detail), ids in errors.items():
        more = f", +{len(ids) - 3} more" if len(ids) > 3 else ""
        lines.append(f"  {strategy}: {detail} ({len(ids)} tasks: {', '.join(ids[:3])}{more})")
    flagged = [r.task_id for r in reports if r.findings]
    if flagged:
        lines.append("failing tasks: " + ", ".join(flagged))
    return "\n".join(lines)


def report_json(reports: list[TaskReport], recipe: str) -> dict[str, Any]:
    """The whole audit as JSON: findings first, then every task with every strategy's result."""
    return {
        "recipe": recipe,
        "tasks": len(reports),
        "flagged_tasks": sum(1 for r in reports if r.findings),
        "findings": [dataclasses.asdict(f) for r in reports for f in r.findings],
        "excused": [dataclasses.asdict(f) for r in reports for f in r.excused],
        "per_task": [dataclasses.asdict(r) for r in reports],
    }
