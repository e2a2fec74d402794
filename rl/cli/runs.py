"""``jointrl runs DIR``: the runs under a folder, with status, steps and last rewards.

A run is a folder holding ``metrics.jsonl``. Its status is

* ``done``: it has a ``DONE`` file (written when the last step finished);
* ``running``: no ``DONE`` and ``metrics.jsonl`` changed in the last ``RUNNING_WINDOW_S``
  seconds (or in the last three mean step times, when steps are slower than that);
* ``interrupted`` / ``crashed``: no ``DONE``, and the run wrote ``STOPPED`` as it ended on a signal or
  an error; it is resumable (``run.resume=auto``): from its newest checkpoint, else from step 1;
* ``stopped``: otherwise (killed).

``DIR`` may be a run itself; runs are searched ``MAX_DEPTH`` folder levels down (not inside
a run, nor in hidden folders).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.driver.logger import read_step_records

__all__ = ["RunInfo", "run_info", "status_text", "list_runs", "format_runs", "add_parser", "RUNNING_WINDOW_S"]

RUNNING_WINDOW_S = 600.0
MAX_DEPTH = 3


@dataclass(frozen=True)
class RunInfo:
    path: Path
    status: str  # done | running | interrupted | crashed | stopped
    steps: int  # last logged step (0: only the initial evaluation; -1: nothing logged yet)
    total_steps: int | None  # train.steps of recipe.resolved.yaml, when readable
    reward: float | None  # last reward/mean
    eval_reward: float | None  # last eval/reward/mean
    eval_reward_first: float | None  # first eval/reward/mean (step 0)
    started: float | None  # epoch seconds: recipe.resolved.yaml written (the run's start)
    updated: float | None  # epoch seconds: metrics.jsonl last written
    resume_step: int | None = None  # interrupted | crashed: the step run.resume=auto continues after (0: none)


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _total_steps(d: Path) -> int | None:
    p = d / "recipe.resolved.yaml"
    if not p.is_file():
        return None
    try:
        import yaml

        steps = (yaml.safe_load(p.read_text()) or {}).get("train", {}).get("steps")
    except Exception:  # noqa: BLE001 - an unreadable recipe only loses this column
        return None
    return steps if isinstance(steps, int) else None


def _stopped(d: Path) -> tuple[str, int] | None:
    """(interrupted | crashed, the checkpoint step a resume continues after, 0: none) from ``STOPPED``."""
    from rl.config.recipe import STOPPED_FILE, newest_checkpoint

    try:
        rec = json.loads((d / STOPPED_FILE).read_text())
    except (OSError, ValueError):
        return None
    status = rec.get("status") if isinstance(rec, dict) else None
    if status not in ("interrupted", "crashed"):
        return None
    ck = newest_checkpoint(d)
    return status, int(json.loads((ck / "step.json").read_text())["step"]) if ck is not None else 0


def status_text(r: RunInfo) -> str:
    """The status as shown: ``interrupted``/``crashed`` say where ``run.resume=auto`` continues."""
    if r.resume_step is None:
        return r.status
    return f"{r.status} (resumable: " + (f"after step {r.resume_step})" if r.resume_step else "from step 1)")


def run_info(run_dir: str | os.PathLike[str], now: float | None = None, window_s: float = RUNNING_WINDOW_S) -> RunInfo:
    """What ``run_dir`` (a folder with ``metrics.jsonl``) holds; see the module docstring for the status."""
    d = Path(run_dir)
    m = d / "metrics.jsonl"
    steps, reward, ev, ev0 = -1, None, None, None
    step_times: list[float] = []
    for rec in read_step_records(m):  # skips a line being written
        steps = max(steps, rec["step"])
        if _finite(rec.get("reward/mean")) is not None:
            reward = _finite(rec["reward/mean"])
        if _finite(rec.get("eval/reward/mean")) is not None:
            ev = _finite(rec["eval/reward/mean"])
            if ev0 is None:
                ev0 = ev
        t = sum(_finite(rec.get(k)) or 0.0 for k in ("timing/step_s", "timing/eval_s"))
        if t > 0:
            step_times.append(t)
    updated = m.stat().st_mtime if m.is_file() else None
    recipe = d / "recipe.resolved.yaml"
    started = recipe.stat().st_mtime if recipe.is_file() else None
    stopped = _stopped(d)
    if (d / "DONE").is_file():
        status = "done"
    elif stopped is not None:
        return RunInfo(d, stopped[0], steps, _total_steps(d), reward, ev, ev0, started, updated, stopped[1])
    else:
        now = time.time() if now is None else now
        slow = 3 * sum(step_times) / len(step_times) if step_times else 0.0
        status = "running" if updated is not None and now - updated <= max(window_s, slow) else "stopped"
    return RunInfo(d, status, steps, _total_steps(d), reward, ev, ev0, started, updated)


def list_runs(
    root: str | os.PathLike[str], now: float | None = None, window_s: float = RUNNING_WINDOW_S
) -> list[RunInfo]:
    """The runs in ``root`` (``root`` itself when it is a run), sorted by path."""
    root = Path(root)
    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        if (d / "metrics.jsonl").is_file():
            found.append(d)
            return  # runs do not nest
        if depth >= MAX_DEPTH:
            return
        try:
            kids = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return
        for k in kids:
            walk(k, depth + 1)

    if root.is_dir():
        walk(root, 0)
    return [run_info(d, now, window_s) for d in sorted(found)]


def _when(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    ago = max(now - t, 0)
    if ago < 60:
        return f"{ago:.0f}s ago"
    if ago < 3600:
        return f"{ago / 60:.0f}m ago"
    if ago < 86400:
        return f"{ago / 3600:.1f}h ago"
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def format_runs(runs: list[RunInfo], root: str | os.PathLike[str] | None = None, now: float | None = None) -> str:
    """A plain-text table: run, status, steps, last reward, eval reward first -> last, started, updated."""
    now = time.time() if now is None else now
    if not runs:
        return f"no runs under {root}" if root is not None else "no runs"

    def name(p: Path) -> str:
        if root is not None:
            try:
                rel = p.resolve().relative_to(Path(root).resolve())
                return str(rel) if str(rel) != "." else str(p)
            except ValueError:
                pass
        return str(p)

    def f3(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    header = ("RUN", "STATUS", "STEPS", "REWARD", "EVAL REWARD", "STARTED", "UPDATED")
    rows = [header]
    for r in runs:
        steps = "-" if r.steps < 0 else str(r.steps) + (f"/{r.total_steps}" if r.total_steps is not None else "")
        ev = (
            "-"
            if r.eval_reward is None
            else (
                f"{f3(r.eval_reward_first)} -> {f3(r.eval_reward)}"
                if r.eval_reward_first is not None
                else f3(r.eval_reward)
            )
        )
        rows.append(
            (name(r.path), status_text(r), steps, f3(r.reward), ev, _when(r.started, now), _when(r.updated, now))
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


# ---------------------------------------------------------------------------- CLI


def add_parser(sub: Any) -> None:
    """Add ``jointrl runs DIR`` to ``jointrl``'s subparsers."""
    p = sub.add_parser(
        "runs",
        help="list the runs under a folder (status, steps, last rewards)",
        description="List the runs (folders with metrics.jsonl) under DIR with their status "
        "(done, running, interrupted, crashed, stopped), steps and last rewards.",
    )
    p.add_argument("dir", nargs="?", default="runs", help="folder to search (default: runs)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(run=run_runs)


def run_runs(args: argparse.Namespace) -> int:
    if not Path(args.dir).is_dir():
        print(f"jointrl: error: not a folder: {args.dir}", file=sys.stderr)
        return 2
    print(format_runs(list_runs(args.dir), root=args.dir))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m rl.cli.runs [DIR]``."""
    p = argparse.ArgumentParser(prog="python -m rl.cli.runs")
    sub = p.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = p.parse_args(["runs", *(sys.argv[1:] if argv is None else argv)])
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
