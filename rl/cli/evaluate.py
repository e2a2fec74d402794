"""``jointrl score`` and ``jointrl eval``: rewards and evaluation outside a training run.

``score`` runs recorded completions through the reward service (the same
``RewardScorer`` the trainer uses) and prints a JSON summary per domain and function;
``eval`` samples k completions per task from a model with vLLM, scores them with the
recipe's rewards, prints pass@k per domain and writes the failed tasks as a task file a
recipe can train on. Bad input exits with code 2 and one message naming the file (and
line); ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from envs.io import TaskFormatError, read_json_objects
from envs.types import Message, Task, Trajectory
from rewards.service import RewardFnSpec, RewardScorer

__all__ = [
    "add_parsers",
    "DEFAULT_REWARDS",
    "CommandError",
    "pass_at_k",
    "load_task_file",
    "read_completions",
    "summarize",
    "resolve_model_arg",
]

FORMATS = ("native", "humaneval", "bfcl")

# `jointrl score` without --recipe: the built-in reward of each shipped domain, plus the format
# rewards at weight 0 (reported per function, not added to the score, never "scoring" a sample).
DEFAULT_REWARDS = (
    RewardFnSpec("rewards.toolcall.ToolCallReward", 1.0),
    RewardFnSpec("rewards.toolcall.ToolAnswerReward", 1.0),
    RewardFnSpec("rewards.toolcall.ToolCallFormatReward", 0.0),
    RewardFnSpec("rewards.code.CodeTestsReward", 1.0),
    RewardFnSpec("rewards.code.CodeFormatReward", 0.0),
    RewardFnSpec("rewards.terminal.TerminalCheckReward", 1.0),
)


class CommandError(Exception):
    """Bad input for a command: the message is for the user as is (exit code 2)."""


# ---------------------------------------------------------------------------- argparse


def add_parsers(sub: Any) -> None:
    """Add the ``score`` and ``eval`` subcommands to ``jointrl``'s subparsers."""
    add_score_parser(sub)
    add_eval_parser(sub)


def add_score_parser(sub: Any) -> None:
    """``jointrl score``: its arguments."""
    s = sub.add_parser(
        "score",
        help="score recorded completions with reward classes (JSON summary per domain/function)",
        description="Run recorded completions through the reward service and print a JSON summary "
        "per domain and function (count, mean, pass rate, errors).",
    )
    s.add_argument("--tasks", required=True, help="task file (native .jsonl/.jsonl.gz/.parquet, or see --format)")
    s.add_argument("--format", choices=FORMATS, default="native", help="task file format (default: native)")
    s.add_argument("--answers", help="BFCL answer file (with --format bfcl)")
    s.add_argument(
        "--completions",
        required=True,
        help="JSON lines: task_id, completion (or response, or messages), optional sample and env_reward",
    )
    s.add_argument("--out", help="write per-sample scores here (JSON lines)")
    s.add_argument(
        "overrides", nargs="*", help="key=value overrides of --recipe, e.g. rewards.0.kwargs.args_credit=fraction"
    )
    s.add_argument(
        "--recipe",
        help="take the rewards (and reward_service.timeout_s) from this recipe; "
        "default: the built-in rewards of each domain",
    )
    s.add_argument(
        "--workers",
        type=int,
        default=0,
        help="score on N Ray reward actors (the trainer's RewardService); 0 = in this process (default)",
    )
    s.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="per-call timeout in seconds (default: the recipe's reward_service.timeout_s, else 60)",
    )
    s.add_argument(
        "--pass-threshold", type=float, default=1.0, help="a sample passes when reward >= this (default 1.0)"
    )
    s.add_argument(
        "--tokenizer",
        help="model folder or embedded:NAME; tokenizes completions so that length-based "
        "rewards (e.g. OverlongPenalty) see token counts",
    )
    s.add_argument("--debug", action="store_true", help="show tracebacks")
    s.add_argument("--verbose", action="store_true", help="show Ray logs (with --workers)")
    s.set_defaults(run=run_score)


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
        "--pass-threshold", type=float, default=1.0, help="a sample passes when reward >= this (default 1.0)"
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


def run_score(args: argparse.Namespace) -> int:
    return _guarded(_score, args)


def run_eval(args: argparse.Namespace) -> int:
    return _guarded(_eval, args)


# ---------------------------------------------------------------------------- shared pieces


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
    specs = [RewardFnSpec(s.cls, s.weight, tuple(s.domains), dict(s.kwargs)) for s in cfg.rewards]
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


@dataclasses.dataclass
class Completion:
    """One recorded completion of ``jointrl score``'s input."""

    where: str
    task_id: str
    sample: int | None
    completion: str | None
    messages: list[Message] | None
    env_reward: float | None


def read_completions(path: str) -> list[Completion]:
    """Records of a completions file (``.jsonl`` or ``.jsonl.gz``), validated, naming ``file:line``.

    Fields: ``task_id`` (str); exactly one of ``completion`` (str: the assistant's text),
    ``response`` (str: the same, as in a run's ``rollouts.jsonl``) or ``messages`` (the
    messages after the task's prompt: assistant turns and tool/user observations, for
    multi-turn episodes); optional ``sample`` (int >= 0) and ``env_reward`` (number or
    null: the env's own score, e.g. a terminal check result). Other fields are ignored.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"completions file not found: {p}")
    try:
        records = list(read_json_objects(p, "a completion record"))
    except TaskFormatError as e:
        raise CommandError(str(e)) from None
    return [_completion(where, d) for where, d in records]


def _completion(where: str, d: dict[str, Any]) -> Completion:
    """One record of a completions file, checked field by field (``where`` = ``file:line``)."""
    tid = d.get("task_id")
    if not isinstance(tid, str) or not tid:
        raise CommandError(f"{where}: field 'task_id': missing or not a non-empty string")
    given = [k for k in ("completion", "response", "messages") if d.get(k) is not None]
    if len(given) != 1:
        raise CommandError(
            f"{where}: need exactly one of 'completion', 'response' or 'messages'"
            + (f", got {', '.join(given)}" if given else "")
        )
    text, msgs = None, None
    if given[0] == "messages":
        msgs = _messages(where, d["messages"])
    else:
        text = d[given[0]]
        if not isinstance(text, str):
            raise CommandError(f"{where}: field {given[0]!r}: must be a string, got {type(text).__name__}")
    sample = d.get("sample")
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 0):
        raise CommandError(f"{where}: field 'sample': must be an int >= 0, got {sample!r}")
    return Completion(where, tid, sample, text, msgs, _env_reward(where, d.get("env_reward")))


def _messages(where: str, raw: Any) -> list[Message]:
    """A record's ``messages``: a non-empty list of role/content objects with at least one assistant turn."""
    if not isinstance(raw, list) or not raw:
        raise CommandError(f"{where}: field 'messages': must be a non-empty list of messages")
    msgs = []
    for i, m in enumerate(raw):
        if (
            not isinstance(m, dict)
            or m.get("role") not in ("assistant", "tool", "user", "system")
            or not isinstance(m.get("content"), str)
        ):
            raise CommandError(
                f"{where}: field 'messages[{i}]': must be an object with a role "
                f"(assistant, tool, user, system) and a string content"
            )
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise CommandError(f"{where}: field 'messages[{i}].name': must be a string")
        msgs.append(Message(m["role"], m["content"], name))
    if not any(m.role == "assistant" for m in msgs):
        raise CommandError(f"{where}: field 'messages': has no assistant message")
    return msgs


def _env_reward(where: str, env_reward: Any) -> float | None:
    """A record's ``env_reward``: a finite number (as float) or null."""
    if env_reward is None:
        return None
    if isinstance(env_reward, bool) or not isinstance(env_reward, (int, float)) or not math.isfinite(env_reward):
        raise CommandError(f"{where}: field 'env_reward': must be a finite number or null, got {env_reward!r}")
    return float(env_reward)


def with_prefill(task: Task, text: str) -> str:
    """``text`` as the first assistant turn: the task's prefill is prepended unless it is there already."""
    return text if not task.prefill or text.startswith(task.prefill) else task.prefill + text


def build_trajectories(
    tasks: list[Task], records: list[Completion], tasks_path: str, tokenizer: Any = None
) -> tuple[list[Trajectory], list[int]]:
    """One trajectory per record (and its sample number). Unknown task ids and duplicate
    (task_id, sample) pairs raise :class:`CommandError` naming ``file:line``."""
    by_id = {t.id: t for t in tasks}
    group = {t.id: g for g, t in enumerate(tasks)}
    next_sample: dict[str, int] = defaultdict(int)
    seen: dict[tuple[str, int], str] = {}
    trajs, samples = [], []
    for r in records:
        task = by_id.get(r.task_id)
        if task is None:
            raise CommandError(f"{r.where}: task_id {r.task_id!r} is not in {tasks_path} ({len(tasks)} tasks)")
        sample = r.sample if r.sample is not None else next_sample[r.task_id]
        next_sample[r.task_id] = max(next_sample[r.task_id], sample + 1)
        if (r.task_id, sample) in seen:
            raise CommandError(
                f"{r.where}: duplicate sample {sample} of task {r.task_id!r} (first at {seen[(r.task_id, sample)]})"
            )
        seen[(r.task_id, sample)] = r.where
        after = list(r.messages) if r.messages is not None else [Message("assistant", r.completion or "")]
        first = next(i for i, m in enumerate(after) if m.role == "assistant")
        after[first] = Message("assistant", with_prefill(task, after[first].content), after[first].name)
        response_ids: list[int] = []
        if tokenizer is not None:  # the policy's tokens: assistant turns, the prefill (a prompt part) left out
            for k, m in enumerate(after):
                if m.role == "assistant":
                    text = m.content[len(task.prefill) :] if k == first else m.content
                    response_ids += list(tokenizer(text, add_special_tokens=False)["input_ids"])
        trajs.append(
            Trajectory(
                task=task,
                group_id=group[task.id],
                prompt_ids=[],
                response_ids=response_ids,
                loss_mask=[1] * len(response_ids),
                logprobs=[0.0] * len(response_ids),
                messages=list(task.messages) + after,
                terminated=True,
                truncated=False,
                finish_reason="recorded",
                num_turns=sum(m.role == "assistant" for m in after),
                env_reward=r.env_reward,
            )
        )
        samples.append(sample)
    return trajs, samples


def summarize(
    trajs: list[Trajectory], stats: dict[tuple[str, str], list[float]], threshold: float, scorer: RewardScorer
) -> dict[str, Any]:
    """The JSON summary of scored ``trajs``: overall, per domain, and per function within each domain.

    ``count`` = samples; ``scored`` = samples with a reward; ``errors`` = samples whose reward
    errored, and ``error_reasons`` why (each reason with its count, :func:`error_reasons`); ``mean`` = mean reward over scored samples; ``pass_rate`` = samples with reward
    >= ``threshold`` over ALL samples (an errored sample does not pass). Per function:
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
            "pass_rate": (sum(r >= threshold for r in scored) / len(ts)) if ts else None,
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
                "errors": int(s[1]),
                "mean": _mean(vals),
                "pass_rate": (sum(v >= threshold for v in vals) / len(vals)) if vals else None,
                "latency_s": s[3] / s[0] if s[0] else None,
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


def _load_tokenizer(spec: str) -> Any:
    from transformers import AutoTokenizer

    from rl.trainer.hub import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(spec))


# ---------------------------------------------------------------------------- score


def _score(args: argparse.Namespace) -> int:
    if args.workers < 0:
        raise CommandError("--workers must be >= 0")
    if args.timeout is not None and not args.timeout > 0:
        raise CommandError("--timeout must be > 0")
    tasks = load_task_file(args.tasks, args.format, args.answers)
    records = read_completions(args.completions)
    if args.overrides and not args.recipe:
        raise CommandError(f"overrides ({' '.join(args.overrides)}) change a recipe: pass it with --recipe")
    if args.recipe:
        specs, cfg = recipe_reward_specs(args.recipe, args.overrides)
        timeout = args.timeout or cfg.reward_service.timeout_s
    else:
        specs, timeout = list(DEFAULT_REWARDS), args.timeout or 60.0
    tokenizer = _load_tokenizer(args.tokenizer) if args.tokenizer else None
    trajs, samples = build_trajectories(tasks, records, args.tasks, tokenizer)
    where = f"{args.recipe}: " if args.recipe else ""
    scorer = make_scorer(specs, timeout, where)  # also names and weights the functions for the summary
    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    if args.workers:
        scored, stats, extra = _score_on_ray(specs, trajs, args.workers, timeout, args.verbose)
    else:
        scored, call = scorer.score_with_stats(trajs)
        stats = call["fn"]
    summary = summarize(scored, stats, args.pass_threshold, scorer)
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    summary["rewards"] = [
        {"name": n, "cls": s.cls, "weight": w, "domains": sorted(d)} for (n, _, w, d), s in zip(scorer.fns, specs)
    ]
    summary.update(extra)
    if args.out:
        _write_jsonl(
            args.out,
            [
                {
                    "task_id": t.task.id,
                    "sample": s,
                    "domain": t.task.domain,
                    "reward": t.reward,
                    "passed": t.reward is not None and t.reward >= args.pass_threshold,
                    "scores": t.scores,
                    "reward_error": t.reward_error,
                }
                for t, s in zip(scored, samples)
            ],
        )
        summary["out"] = str(args.out)
    print(json.dumps(summary, indent=2))
    return 0


def _score_on_ray(
    specs: list[RewardFnSpec], trajs: list[Trajectory], workers: int, timeout: float, verbose: bool
) -> tuple[list[Trajectory], dict, dict[str, Any]]:
    import ray

    from rewards.service import RewardService

    own = not ray.is_initialized()
    if own:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        pythonpath = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), *sys.path] if p and os.path.isdir(p))
        ray.init(
            num_cpus=max(2, os.cpu_count() or 2),
            include_dashboard=False,
            log_to_driver=verbose,
            logging_level="INFO" if verbose else "WARNING",
            runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "PYTHONWARNINGS": "ignore"}},
        )
    service = None
    try:
        service = RewardService(specs, workers=workers, timeout_s=timeout)
        out = service.score(trajs)
        stats = service.take_stats()
        m = service.metrics()
        return (
            out,
            stats,
            {
                "service": {
                    "workers": workers,
                    "restarts": int(m["reward/service/restarts"]),
                    "worker_errors": int(m["reward/service/worker_errors"]),
                }
            },
        )
    finally:
        if service is not None:
            service.shutdown()
        if own:
            ray.shutdown()


# ---------------------------------------------------------------------------- eval


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

    Accepts ``embedded:NAME``, a Hugging Face folder, a checkpoint dir (``…/step_N`` with a
    ``model/`` subfolder) or a run dir (its newest ``checkpoints/step_N``).
    """
    if arg.startswith("embedded:"):
        return arg, None
    p = Path(os.path.expanduser(arg)).resolve()
    if not p.exists():
        raise CommandError(f"--model {arg}: not found")

    def run_of(ckpt: Path) -> Path | None:
        return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None

    if (p / "config.json").is_file():
        return str(p), (run_of(p.parent) if p.name == "model" else None)
    if (p / "model" / "config.json").is_file():
        return str(p / "model"), run_of(p)
    ckpts = sorted(c for c in (p / "checkpoints").glob("step_*") if (c / "model" / "config.json").is_file())
    if ckpts:
        return str(ckpts[-1] / "model"), p
    raise CommandError(
        f"--model {arg}: not a Hugging Face model folder (config.json), a checkpoint dir "
        f"(model/config.json) or a run dir (checkpoints/step_N/model)"
    )


def _eval(args: argparse.Namespace) -> int:
    n, temperature = _eval_sampling(args)
    cfg, run_dir = _eval_recipe(args)
    tasks, source = _eval_tasks(args, cfg)
    out_path = Path(args.out) if args.out else (run_dir or Path.cwd()) / "eval_failures.jsonl"
    if not out_path.name.endswith((".jsonl", ".jsonl.gz")):
        raise CommandError(f"--out {out_path}: the failures file must end in .jsonl or .jsonl.gz")

    specs = [RewardFnSpec(s.cls, s.weight, tuple(s.domains), dict(s.kwargs)) for s in cfg.rewards]
    scorer = make_scorer(specs, cfg.reward_service.timeout_s, f"{args.recipe}: ")
    t0 = time.perf_counter()
    trajs = _generate(cfg, tasks, n, temperature, args.batch, args.verbose, args.engine, scorer)
    t1 = time.perf_counter()
    scored, call = scorer.score_with_stats(trajs)
    t2 = time.perf_counter()

    summary, failed = eval_summary(tasks, scored, n, args.k, args.pass_threshold)
    per_fn = summarize(scored, call["fn"], args.pass_threshold, scorer)["domains"]
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
                    "passed": t.reward is not None and t.reward >= args.pass_threshold,
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
    its reward is >= ``threshold``; an errored sample does not pass (and is counted under
    ``errors``). A task fails when none of its samples passed; failed tasks are returned with
    ``meta["eval"] = {"samples", "passed", "errors", "mean_reward"}``.
    """
    per_domain: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    failed: list[Task] = []
    for ti, task in enumerate(tasks):
        group = scored[ti * n : (ti + 1) * n]
        rewards = [t.reward for t in group if t.reward is not None]
        c = sum(r >= threshold for r in rewards)
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
        rewards = [t.reward for t in scored[ti * n : (ti + 1) * n] if t.reward is not None]
        c = sum(r >= threshold for r in rewards)
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
