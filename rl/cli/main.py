"""The ``jointrl`` command: ``train`` and ``validate`` a recipe; ``score`` and ``eval`` (``rl/cli/score.py``, ``rl/cli/eval.py``).

Bad input (recipe, overrides, files, models, output dir) exits with code 2 and one
message, before any actor starts; ``--debug`` shows the traceback too. A run that cannot
go on (updates non-finite ``train.max_bad_steps`` times in a row, an engine that keeps
dying, a checkpoint that cannot be written, learners that keep failing, any unexpected error
once the run is under way) exits with code 3 and one message; Ctrl-C or SIGTERM with 130,
after checkpointing the last finished step. Outputs written so far are kept in every case, and
the run folder says how it ended (``STOPPED``; docs/reliability.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from rl.config.recipe import RecipeError, load_recipe, validate_recipe


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jointrl", description="Cross-domain joint RL post-training on Ray + vLLM.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, help_ in (("train", "run a recipe"), ("validate", "check a recipe without starting anything")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("recipe", help="recipe YAML file")
        s.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.steps=5 run.output_dir=runs/x")
        s.add_argument("--debug", action="store_true", help="show tracebacks")
        if name == "train":
            s.add_argument("--verbose", action="store_true", help="show Ray and vLLM logs")
            s.add_argument(
                "--local",
                action="store_true",
                help="run everything in this process, no Ray or vLLM (Transformers generation, one "
                "learner): small models, smoke tests, machines without vLLM",
            )
        else:
            s.add_argument(
                "--print",
                dest="print_recipe",
                action="store_true",
                help="print the full resolved recipe (every key, defaults filled) as YAML",
            )
    from rl.cli.eval import add_eval_parser
    from rl.cli.score import add_score_parser

    add_score_parser(sub)  # score TASKS COMPLETIONS
    add_eval_parser(sub)  # eval RECIPE --model M
    from rl.cli.report import add_parser as add_report_parser
    from rl.cli.runs import add_parser as add_runs_parser

    add_report_parser(sub)  # report RUN_DIR [--out FILE]
    add_runs_parser(sub)  # runs [DIR]
    from rl.cli.difficulty import add_parser as add_difficulty_parser

    add_difficulty_parser(sub)  # difficulty RECIPE --k 8
    from rl.cli.export import add_parser as add_export_parser

    add_export_parser(sub)  # export RUN_DIR [--out DIR] [--step N]
    from rl.cli.audit.command import add_parser as add_audit_parser

    add_audit_parser(sub)  # audit [TASKS ...] --recipe R
    from rl.cli.images import add_parser as add_images_parser

    add_images_parser(sub)  # images ls|rm [DIGEST ...]
    return p


_FLAGS = ("--debug", "--verbose", "--print", "--local")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Flags may come after the key=value overrides (argparse stops at the first positional list).
    flags = [a for a in argv if a in _FLAGS]
    rest = [a for a in argv if a not in _FLAGS]
    args = _parser().parse_args(rest[:1] + flags + rest[1:])
    if getattr(args, "run", None) is not None:  # score, eval: rl/cli/score.py, rl/cli/eval.py
        return args.run(args)
    try:
        cfg = load_recipe(args.recipe, args.overrides)
        # validate also checks every task's domain is served (train checks it when it loads the task files)
        validate_recipe(cfg, task_domains=args.cmd == "validate")
    except RecipeError as e:
        return _fail(str(e), args.debug)
    except Exception as e:  # noqa: BLE001 - e.g. a user module that fails at import time
        return _fail(f"{type(e).__name__}: {e}", args.debug)
    if args.cmd == "validate":
        return _validate(args, cfg)
    return _train(args, cfg)


def _validate(args: argparse.Namespace, cfg: Any) -> int:
    """``jointrl validate``: the recipe loaded and checked; ``--print``: the resolved recipe as YAML."""
    if args.print_recipe:
        import yaml

        from rl.config.recipe import recipe_to_dict

        print(
            yaml.safe_dump(
                {k: v for k, v in recipe_to_dict(cfg).items() if k != "source"},
                sort_keys=False,
                default_flow_style=False,
                width=110,
            ),
            end="",
        )
    if not (cfg.run.ray_address or os.environ.get("RAY_ADDRESS")):  # a cluster's resources are checked at start
        from rl.driver.placement import local_gpus, oversubscription

        for w in oversubscription(cfg, os.cpu_count() or 1, local_gpus()):
            print(f"jointrl: warning: {w}", file=sys.stderr)
    print(f"{args.recipe}: ok", file=sys.stderr if args.print_recipe else sys.stdout)
    plan = _resume_plan(cfg)
    if plan:
        print(plan, file=sys.stderr if args.print_recipe else sys.stdout)
    return 0


def _resume_plan(cfg: Any) -> str:
    """What ``train`` does with ``run.resume=auto`` in this output dir (the rule ``prepare_output_dir`` applies;
    a dir it would refuse failed ``validate_recipe`` already); "" for a fresh dir or ``resume=never``."""
    import json

    from rl.config.recipe import STOPPED_FILE, holds_run, newest_checkpoint, resolve_output_dir

    out = resolve_output_dir(cfg)
    if cfg.run.resume != "auto" or not holds_run(out):
        return ""
    ck = newest_checkpoint(out)
    if ck is not None:
        step = json.loads((ck / "step.json").read_text())["step"]
        return f"run.resume=auto: continues {out} after step {step} ({ck})"
    if (out / STOPPED_FILE).is_file():
        return f"run.resume=auto: the stopped run in {out} has no checkpoint; it starts again from step 1"
    return ""


def _train(args: argparse.Namespace, cfg: Any) -> int:
    """``jointrl train``: run the recipe; exit 2 for bad input, 3 for a run that stopped, 130 for Ctrl-C."""
    if args.verbose:
        os.environ["JOINTRL_VERBOSE"] = "1"
    from envs.io import TaskFormatError
    from rl.driver.placement import PlacementError
    from rl.driver.loop import RunAborted, train
    from rollout.pool import EngineFailure

    try:
        from rl.driver.logger import process_start_time

        out = train(
            cfg, verbose=args.verbose, runtime=_local_runtime if args.local else None, started=process_start_time()
        )
    except (FileNotFoundError, FileExistsError, TaskFormatError, RecipeError, PlacementError) as e:
        return _fail(str(e), args.debug)  # RecipeError/PlacementError: cluster section vs the Ray cluster
    except KeyboardInterrupt:
        print(
            "jointrl: interrupted; engines shut down, outputs so far kept (continue with run.resume=auto)",
            file=sys.stderr,
        )
        return 130
    except (RunAborted, EngineFailure) as e:
        if args.debug:
            traceback.print_exc()
        print(
            f"jointrl: run stopped: {e}\n(outputs so far kept; after a fix, continue with run.resume=auto)",
            file=sys.stderr,
        )
        return 3
    print(f"done: {out}")
    return 0


def _local_runtime(cfg: Any, model_path: str, out: Path, verbose: bool) -> Any:
    """``train --local``: the in-process runtime (an ``rl.driver.loop.RuntimeFactory``)."""
    from rl.driver.local_runtime import LocalRuntime

    return LocalRuntime(cfg, model_path, out, verbose)


def _fail(msg: str, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"jointrl: error: {msg}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
