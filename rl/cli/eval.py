"""``jointrl eval``: k completions per task sampled from a model (vLLM, or Transformers with ``--engine hf``, through
the in-process runtime), scored with the recipe's rewards; pass@k per domain, and the failed tasks written as a
task file a recipe can train on."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from envs.types import Task, Trajectory
from rewards.service import RewardScorer, reward_specs
from rl.cli.common import FORMATS, CommandError, _guarded, load_task_file, make_scorer, _mean, summarize, _write_jsonl

__all__ = ["add_eval_parser", "pass_at_k", "resolve_model_arg", "eval_summary"]


def add_eval_parser(sub: Any) -> None:
    """``jointrl eval``: its arguments."""
    e = sub.add_parser(
        "eval",
        help="pass@k per domain with vLLM; writes the failed tasks for retraining",
        description="Sample completions for a task set with vLLM, score them with the recipe's rewards, "
        "print pass@k per domain as JSON and write the failed tasks as a native task file.",
    )
    e.add_argument(
        "recipe", help="recipe YAML file (model, rollout, envs, rewards, data.eval_files / data.eval_datasets)"
    )
    e.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rollout.max_new_tokens=128")
    e.add_argument(
        "--model",
        help="model folder, checkpoint dir (checkpoints/step_N) or run dir (its newest "
        "checkpoint); default: the recipe's model.path",
    )
    e.add_argument(
        "--tasks", help="evaluate these tasks instead of the recipe's data.eval_files and data.eval_datasets"
    )
    e.add_argument("--format", choices=FORMATS, default="native", help="format of --tasks (default: native)")
    e.add_argument("--answers", help="BFCL answer file (with --format bfcl)")
    e.add_argument("--k", type=int, default=1, help="k of pass@k (default 1)")
    e.add_argument(
        "--n",
        type=int,
        default=None,
        help="samples per task (>= k; default k); pass@k uses the unbiased estimator over n samples",
    )
    e.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature (default: 1.0 when more than one sample per task, else 0 = greedy)",
    )
    e.add_argument(
        "--pass-threshold",
        type=float,
        default=1.0,
        help="a sample passes when its reward, shaping terms left out, is >= this (default 1.0)",
    )
    e.add_argument("--limit", type=int, default=0, help="evaluate the first N tasks only (0 = all)")
    e.add_argument(
        "--out", help="failed tasks (native .jsonl); default: <run dir of --model, else .>/eval_failures.jsonl"
    )
    e.add_argument("--samples-out", help="write every sample's completion and scores here (JSON lines)")
    e.add_argument("--batch", type=int, default=256, help="episodes per engine call (default 256)")
    e.add_argument(
        "--engine",
        choices=("vllm", "hf"),
        default="vllm",
        help="vllm (default) | hf: Transformers in this process, one request at a time (small models, "
        "machines without vLLM)",
    )
    e.add_argument("--debug", action="store_true", help="show tracebacks")
    e.add_argument("--verbose", action="store_true", help="show vLLM logs")
    e.set_defaults(run=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    return _guarded(_eval, args)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` passed (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def resolve_model_arg(arg: str) -> tuple[str, Path | None]:
    """``--model``: (model path for the recipe, the run dir it belongs to or None).

    Accepts ``embedded:NAME``, a Hugging Face folder, a checkpoint dir (``…/step_N``, or its ``model/``
    subfolder) or a run dir (its newest complete ``checkpoints/step_N``). Only a run's last checkpoint holds
    ``model/``; for another one the HF folder is the run's export of it (``RUN_DIR/export/step_N``), written on
    first use (``rl.cli.export.checkpoint_model``, which says so on stderr).
    """
    import sys

    from rl.cli.export import ExportError, checkpoint_model, run_of_checkpoint

    if arg.startswith("embedded:"):
        return arg, None
    p = Path(os.path.expanduser(arg)).resolve()
    if p.name == "model" and not p.exists() and _is_checkpoint(p.parent):
        p = p.parent  # the documented checkpoints/step_N/model of a checkpoint that has none: its export
    if not p.exists():
        raise CommandError(f"--model {arg}: not found")
    if (p / "config.json").is_file():
        return str(p), (run_of_checkpoint(p.parent) if p.name == "model" else None)
    ckpts = sorted(c for c in (p / "checkpoints").glob("step_*") if _is_checkpoint(c))
    ck = p if _is_checkpoint(p) else ckpts[-1] if ckpts else None
    if ck is None:
        raise CommandError(
            f"--model {arg}: not a Hugging Face model folder (config.json), a checkpoint dir "
            f"(checkpoints/step_N: model/config.json or step.json) or a run dir (checkpoints/step_N)"
        )
    try:
        model = checkpoint_model(ck, say=lambda line: print(f"jointrl: {line}", file=sys.stderr, flush=True))
    except ExportError as e:
        raise CommandError(f"--model {arg}: {e}") from e
    return str(model), run_of_checkpoint(ck)


def _is_checkpoint(p: Path) -> bool:
    """A checkpoint folder with an HF export (``model/config.json``) or a complete one (``step.json``)."""
    return (p / "model" / "config.json").is_file() or (p / "step.json").is_file()


def _eval(args: argparse.Namespace) -> int:
    n, temperature = _eval_sampling(args)
    cfg, run_dir = _eval_recipe(args)
    tasks, source = _eval_tasks(args, cfg)
    out_path = Path(args.out) if args.out else (run_dir or Path.cwd()) / "eval_failures.jsonl"
    if not out_path.name.endswith((".jsonl", ".jsonl.gz")):
        raise CommandError(f"--out {out_path}: the failures file must end in .jsonl or .jsonl.gz")

    specs = reward_specs(cfg.rewards)
    scorer = make_scorer(specs, cfg.reward_service.timeout_s, f"{args.recipe}: ")
    t0 = time.perf_counter()
    trajs = _generate(cfg, tasks, n, temperature, args.batch, args.verbose, args.engine, scorer)
    t1 = time.perf_counter()
    res = scorer.score_with_stats(trajs)
    scored = res.trajs
    t2 = time.perf_counter()

    summary, failed = eval_summary(tasks, scored, n, args.k, args.pass_threshold)
    per_fn = summarize(scored, res.fn, args.pass_threshold, scorer)["domains"]
    for d, block in summary["domains"].items():
        block["functions"] = per_fn.get(d, {}).get("functions", {})
    summary = {
        "model": cfg.model.path,
        "tasks_from": source,
        "temperature": temperature,
        **summary,
        "timing": {"generate_s": round(t1 - t0, 3), "score_s": round(t2 - t1, 3)},
    }
    summary |= _write_eval_outputs(args, scored, failed, out_path, n)
    print(json.dumps(summary, indent=2))
    return 0


def _eval_sampling(args: argparse.Namespace) -> tuple[int, float]:
    """Samples per task and temperature from ``--k``/``--n``/``--temperature`` (checked)."""
    if args.k < 1:
        raise CommandError("--k must be >= 1")
    n = args.n if args.n is not None else args.k
    if n < args.k:
        raise CommandError(f"--n ({n}) must be >= --k ({args.k})")
    if args.limit < 0 or args.batch < 1:
        raise CommandError("--limit must be >= 0 and --batch >= 1")
    temperature = args.temperature if args.temperature is not None else (1.0 if n > 1 else 0.0)
    if temperature < 0:
        raise CommandError("--temperature must be >= 0")
    return n, temperature


def _eval_recipe(args: argparse.Namespace) -> tuple[Any, Path | None]:
    """The recipe with ``--model`` applied, validated; and the run dir ``--model`` belongs to (or None)."""
    from rl.config.recipe import load_recipe, validate_recipe

    cfg = load_recipe(args.recipe, args.overrides)
    run_dir = None
    if args.model:
        model, run_dir = resolve_model_arg(args.model)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=model))
    # Everything but the output dir, which eval does not write (a finished run's recipe is fine).
    validate_recipe(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, overwrite=True)))
    return cfg, run_dir


def _eval_tasks(args: argparse.Namespace, cfg: Any) -> tuple[list[Task], str]:
    """The tasks to evaluate (``--tasks``, or the recipe's ``data.eval_files`` then ``data.eval_datasets``;
    ``--limit``) and where they came from; each task's domain must be served by the recipe's ``rollout.envs``."""
    from rl.config.recipe import resolve_path
    from rl.data.hub_data import recipe_datasets

    if args.tasks:
        tasks, source = load_task_file(args.tasks, args.format, args.answers), args.tasks
    else:
        if args.format != "native" or args.answers:
            raise CommandError("--format/--answers go with --tasks")
        if not cfg.data.eval_files and not cfg.data.eval_datasets:
            raise CommandError(
                f"{args.recipe}: data.eval_files is empty; pass --tasks FILE (or set data.eval_datasets)"
            )
        tasks, sources = [], list(cfg.data.eval_files)
        for f in cfg.data.eval_files:
            tasks += load_task_file(str(resolve_path(cfg, f)))
        # The held-out datasets `jointrl train` evaluates on, read the same way (rl/data/hub_data.py).
        for key, entry, ts in recipe_datasets(cfg, "eval"):
            tasks += ts
            sources.append(f"{key} ({entry.path}:{entry.split})")
        source = ", ".join(sources)
    if args.limit:
        tasks = tasks[: args.limit]
    if not tasks:
        raise CommandError(f"no tasks in {source}")
    served = {e.domain for e in cfg.rollout.envs}
    for t in tasks:
        if t.domain not in served:
            raise CommandError(
                f"{source}: task {t.id!r} has domain {t.domain!r}, but the recipe's rollout.envs "
                f"serves only {sorted(served)}"
            )
    return tasks, source


def _write_eval_outputs(
    args: argparse.Namespace, scored: list[Trajectory], failed: list[Task], out_path: Path, n: int
) -> dict[str, str]:
    """The failed tasks (native task file) and, with ``--samples-out``, every sample; returns their paths."""
    from envs.io import save_tasks

    try:
        save_tasks(failed, out_path)
    except OSError as e:
        raise CommandError(f"cannot write {out_path}: {e.strerror or e}") from None
    written = {"failures_file": str(out_path)}
    if args.samples_out:
        _write_jsonl(
            args.samples_out,
            [
                {
                    "task_id": t.task.id,
                    "sample": i % n,
                    "domain": t.task.domain,
                    "completion": t.completion,
                    "reward": t.reward,
                    "passed": t.passes(args.pass_threshold),
                    "scores": t.scores,
                    "reward_error": t.reward_error,
                    "finish_reason": t.finish_reason,
                    "response_tokens": t.num_policy_tokens,
                }
                for i, t in enumerate(scored)
            ],
        )
        written["samples_file"] = str(args.samples_out)
    return written


def eval_summary(
    tasks: list[Task], scored: list[Trajectory], n: int, k: int, threshold: float
) -> tuple[dict[str, Any], list[Task]]:
    """pass@1, pass@k and mean reward overall and per domain, and the failed tasks.

    ``scored`` holds ``n`` consecutive samples per task, in task order. A sample passes when
    its task's own score (``task_reward``: shaping terms left out) is >= ``threshold``; an errored sample does not pass (and is counted under
    ``errors``). A task fails when none of its samples passed; failed tasks are returned with
    ``meta["eval"] = {"samples", "passed", "errors", "mean_reward"}``.
    """
    per_domain: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    failed: list[Task] = []
    for ti, task in enumerate(tasks):
        group = scored[ti * n : (ti + 1) * n]
        rewards = [t.reward for t in group if t.reward is not None]
        c = sum(t.passes(threshold) for t in group)
        d = per_domain[task.domain]
        d["pass@1"].append(pass_at_k(n, c, 1))
        if k != 1:  # with k = 1 the same list: appending again counted every task twice
            d[f"pass@{k}"].append(pass_at_k(n, c, k))
        d["rewards"] += rewards
        d["errors"].append(n - len(rewards))
        if c == 0:
            failed.append(
                dataclasses.replace(
                    task,
                    meta={
                        **task.meta,
                        "eval": {"samples": n, "passed": 0, "errors": n - len(rewards), "mean_reward": _mean(rewards)},
                    },
                )
            )
    keys = ["pass@1"] + ([f"pass@{k}"] if k != 1 else [])

    def block(ds: list[dict[str, list[float]]]) -> dict[str, Any]:
        b: dict[str, Any] = {"tasks": sum(len(d["pass@1"]) for d in ds)}
        for key in keys:
            vals = [v for d in ds for v in d[key]]
            b[key] = _mean(vals)
        b["mean_reward"] = _mean([r for d in ds for r in d["rewards"]])
        b["errors"] = int(sum(e for d in ds for e in d["errors"]))
        b["failed_tasks"] = sum(1 for d in ds for v in d["pass@1"] if v == 0.0)
        return b

    summary = {
        "samples_per_task": n,
        "k": k,
        "pass_threshold": threshold,
        **block(list(per_domain.values())),
        "domains": {d: block([v]) for d, v in sorted(per_domain.items())},
    }
    for d, rates in per_task_rates(tasks, scored, n, threshold).items():
        summary["domains"][d]["per_task"] = rates
    return summary, failed


def per_task_rates(tasks: list[Task], scored: list[Trajectory], n: int, threshold: float) -> dict[str, dict[str, Any]]:
    """Per domain, for benchmark sets scored task by task (Harbor task directories: ``meta["harbor"]``), each
    task's ``{"pass_rate", "passed", "samples", "errors", "mean_reward"}`` over its ``n`` samples."""
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for ti, task in enumerate(tasks):
        if not task.meta.get("harbor"):
            continue
        group = scored[ti * n : (ti + 1) * n]
        rewards = [t.reward for t in group if t.reward is not None]
        c = sum(t.passes(threshold) for t in group)
        out[task.domain][task.id] = {
            "pass_rate": c / n if n else None,
            "passed": c,
            "samples": n,
            "errors": n - len(rewards),
            "mean_reward": _mean(rewards),
        }
    return dict(out)


def quiet_engine_logs(verbose: bool) -> None:
    """The engine's logs for ``jointrl eval``: everything with ``verbose``; else errors only, since vLLM's and
    torch's warnings about this machine (no Triton, chunked prefill, NUMA binding, tcmalloc...) are tens of
    lines that say nothing about the evaluation. Set before vLLM is imported (its engine processes inherit
    them); a variable the user set is kept. vLLM logs to stderr either way: stdout carries the JSON summary."""
    import warnings

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if verbose:
        os.environ["JOINTRL_VERBOSE"] = "1"
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # torch's C++ warnings (NUMA binding)
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # engine processes: deprecations in vLLM
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    import logging

    logging.getLogger("torch._library").setLevel(logging.ERROR)  # "Triton not available"


def _generate(
    cfg: Any,
    tasks: list[Task],
    n: int,
    temperature: float,
    batch: int,
    verbose: bool,
    engine: str = "vllm",
    scorer: RewardScorer | None = None,
) -> list[Trajectory]:
    """``n`` episodes per task (consecutive, in task order) from the in-process runtime (one engine, no learner).

    Sampling seeds are the training loop's (``rl.driver.loop.expand`` at step 0: task i is group i, its
    samples 0..n-1), so an eval samples what a training step drawing the same tasks would.
    """
    from envs.types import Sampling
    from rl.driver.local_runtime import LocalRuntime
    from rl.driver.loop import expand
    from rl.driver.recovery import raise_on_term
    from rl.trainer.hub import resolve_model

    quiet_engine_logs(verbose)
    base = Path(cfg.source).parent if cfg.source else None
    r = cfg.rollout
    sampling = Sampling(
        max_new_tokens=r.max_new_tokens,
        temperature=temperature,
        top_p=r.top_p if temperature > 0 else 1.0,
        max_turns=r.max_turns,
        max_model_len=r.max_model_len,
    )
    all_tasks, groups, seeds = expand(tasks, n, cfg.run.seed, 0)
    rt = LocalRuntime(cfg, resolve_model(cfg.model.path, base), engine=engine, learner=False, scorer=scorer)
    trajs: list[Trajectory] = []
    # SIGTERM becomes an exception so that `finally` shuts the engine down (it holds shared memory).
    old_term = (
        signal.signal(signal.SIGTERM, raise_on_term) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        rt.start()
        for start in range(0, len(all_tasks), batch):
            end = start + batch
            trajs += rt.generate(all_tasks[start:end], groups[start:end], seeds[start:end], sampling)
    finally:
        rt.stop()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    return trajs
