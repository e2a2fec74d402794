"""What ``jointrl score`` and ``jointrl eval`` share: their error handling (bad input exits with code 2 and one
message naming the file and line; ``--debug`` adds the traceback), task files, the recipe's reward functions and
their scorer, and the JSON summary of scored samples per domain and function."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from envs.io import TaskFormatError
from envs.types import Task, Trajectory
from rewards.service import RewardFnSpec, RewardScorer, StatsTable, reward_specs

__all__ = ["CommandError", "FORMATS", "load_task_file", "recipe_reward_specs", "make_scorer", "summarize"]


FORMATS = ("native", "humaneval", "bfcl")


class CommandError(Exception):
    """Bad input for a command: the message is for the user as is (exit code 2)."""


def _fail(msg: str, debug: bool) -> int:
    if debug:
        import traceback

        traceback.print_exc()
    print(f"jointrl: error: {msg}", file=sys.stderr)
    return 2


def _guarded(fn: Any, args: argparse.Namespace) -> int:
    from rl.config.recipe import RecipeError

    try:
        return fn(args)
    except (CommandError, RecipeError, TaskFormatError, FileNotFoundError) as e:
        return _fail(str(e), args.debug)
    except KeyboardInterrupt:
        print("jointrl: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - e.g. an engine failure: one line, the traceback with --debug
        if args.debug:
            import traceback

            traceback.print_exc()
        print(f"jointrl: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def load_task_file(path: str, fmt: str = "native", answers: str | None = None) -> list[Task]:
    """Tasks of ``path`` in ``fmt`` (native, humaneval or bfcl; ``answers`` = BFCL answer file)."""
    if fmt not in FORMATS:
        raise CommandError(f"unknown task format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if answers is not None and fmt != "bfcl":
        raise CommandError("--answers goes with --format bfcl")
    if fmt == "humaneval":
        from envs.code import load_humaneval

        return load_humaneval(path)
    if fmt == "bfcl":
        from envs.toolcall import load_bfcl

        return load_bfcl(path, answers)
    from envs.io import load_tasks

    try:
        return load_tasks(path)
    except ValueError as e:  # unsupported suffix
        if type(e) is ValueError:
            raise CommandError(str(e)) from None
        raise


def recipe_reward_specs(
    recipe_path: str, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[list[RewardFnSpec], Any]:
    """The recipe's reward specs (each class imported and its kwargs checked, naming the recipe key) and the recipe."""
    from rl.config.recipe import load_recipe

    cfg = load_recipe(recipe_path, list(overrides))
    specs = reward_specs(cfg.rewards)
    if not specs:
        raise CommandError(f"{recipe_path}: rewards: at least one reward class is needed")
    check_reward_specs(specs, where=f"{recipe_path}: ")
    return specs, cfg


def check_reward_specs(specs: list[RewardFnSpec], where: str = "") -> None:
    """Import each class (or plain function) and bind its kwargs; raise :class:`CommandError` naming ``rewards.<i>``."""
    from envs.base import resolve
    from rewards.protocol import check_reward_kwargs

    for i, s in enumerate(specs):
        try:
            cls = resolve(s.cls)
        except Exception as e:  # noqa: BLE001 - any import failure is the user's to see
            raise CommandError(f"{where}rewards.{i}.cls: cannot import {s.cls!r}: {e}") from None
        try:
            check_reward_kwargs(cls, s.kwargs)
        except TypeError as e:
            what = "constructor" if isinstance(cls, type) else "signature (called as fn(traj, **kwargs))"
            raise CommandError(f"{where}rewards.{i}.kwargs: do not match {s.cls}'s {what}: {e}") from None


def make_scorer(specs: list[RewardFnSpec], timeout_s: float | None, where: str = "") -> RewardScorer:
    try:
        return RewardScorer(specs, timeout_s=timeout_s)
    except Exception as e:  # noqa: BLE001 - a constructor that rejects its kwargs
        raise CommandError(f"{where}cannot construct the reward classes: {type(e).__name__}: {e}") from None


def summarize(trajs: list[Trajectory], stats: StatsTable, threshold: float, scorer: RewardScorer) -> dict[str, Any]:
    """The JSON summary of scored ``trajs``: overall, per domain, and per function within each domain.

    ``count`` = samples; ``scored`` = samples with a reward; ``errors`` = samples whose reward
    errored, and ``error_reasons`` why (each reason with its count, :func:`error_reasons`); ``mean`` = mean reward over scored samples; ``pass_rate`` = samples whose reward, shaping terms left out
    (``task_reward``), is >= ``threshold`` over ALL samples (an errored sample does not pass). Per function:
    ``count`` = samples it returned a number for, ``none`` = samples it did not apply to,
    ``errors`` = samples it errored on, ``mean`` and ``pass_rate`` over its numbers
    (unweighted), ``latency_s`` = mean seconds per call.
    """

    def block(ts: list[Trajectory]) -> dict[str, Any]:
        scored = [t.reward for t in ts if t.reward is not None]
        return {
            "count": len(ts),
            "scored": len(scored),
            "errors": len(ts) - len(scored),
            "error_reasons": error_reasons(ts),
            "mean": _mean(scored),
            "pass_rate": (sum(t.passes(threshold) for t in ts) / len(ts)) if ts else None,
        }

    out: dict[str, Any] = {"pass_threshold": threshold, **block(trajs), "domains": {}}
    by_domain: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_domain[t.task.domain].append(t)
    weights = {name: w for name, _, w, _ in scorer.fns}
    for d, ts in sorted(by_domain.items()):
        db = block(ts)
        fns: dict[str, Any] = {}
        for name in scorer.names:
            s = stats.get((d, name))
            if s is None:
                continue
            vals = [t.scores[name] for t in ts if t.scores.get(name) is not None]
            nones = sum(1 for t in ts if name in t.scores and t.scores[name] is None)
            fns[name] = {
                "weight": weights[name],
                "count": len(vals),
                "none": nones,
                "errors": s.errors,
                "mean": _mean(vals),
                "pass_rate": (sum(v >= threshold for v in vals) / len(vals)) if vals else None,
                "latency_s": s.latency_s / s.samples if s.samples else None,
            }
        db["functions"] = fns
        out["domains"][d] = db
    return out


ERROR_REASONS = 10  # the most distinct reasons listed per summary block


REASON_CHARS = 300


def error_reasons(ts: list[Trajectory]) -> dict[str, int]:
    """Why samples got no reward: each distinct ``reward_error`` (cut to ``REASON_CHARS``) with its count,
    the most common first; at most ``ERROR_REASONS``, the rest counted under ``"(other reasons)"``."""
    counts: dict[str, int] = defaultdict(int)
    for t in ts:
        if t.reward is None:
            counts[(t.reward_error or "no reward and no error recorded")[:REASON_CHARS]] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    out = dict(ranked[:ERROR_REASONS])
    if len(ranked) > ERROR_REASONS:
        out["(other reasons)"] = sum(n for _, n in ranked[ERROR_REASONS:])
    return out


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    except OSError as e:
        raise CommandError(f"cannot write {p}: {e.strerror or e}") from None
