"""``jointrl score``: recorded completions run through the reward functions (the same ``RewardScorer`` the trainer
uses, in-process or on ``--workers`` Ray actors through ``rl.driver.ray_runtime.score_on_ray``), and a JSON
summary per domain and function."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from envs.io import TaskFormatError, read_json_objects
from envs.types import Message, Task, Trajectory
from rewards.service import RewardFnSpec
from rl.cli.common import (
    FORMATS,
    CommandError,
    _guarded,
    load_task_file,
    make_scorer,
    recipe_reward_specs,
    summarize,
    _write_jsonl,
)

__all__ = ["add_score_parser", "DEFAULT_REWARDS", "read_completions", "build_trajectories"]


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
        "--pass-threshold",
        type=float,
        default=1.0,
        help="a sample passes when its reward, shaping terms left out, is >= this (default 1.0)",
    )
    s.add_argument(
        "--tokenizer",
        help="model folder, embedded:NAME, or a run's checkpoint dir or run dir (its tokenizer); tokenizes "
        "completions so that length-based rewards (e.g. OverlongPenalty) see token counts",
    )
    s.add_argument("--debug", action="store_true", help="show tracebacks")
    s.add_argument("--verbose", action="store_true", help="show Ray logs (with --workers)")
    s.set_defaults(run=run_score)


def run_score(args: argparse.Namespace) -> int:
    return _guarded(_score, args)


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


def _load_tokenizer(spec: str) -> Any:
    """``--tokenizer``: a model folder, ``embedded:NAME``, a Hub id, or a run's checkpoint dir (or its ``model/``)
    or run dir, whose tokenizer is the checkpoint's ``model/`` or else the run's base model's
    (``rl.cli.export.tokenizer_folder``: only a run's last checkpoint has ``model/``)."""
    from transformers import AutoTokenizer

    from rl.cli.export import ExportError, tokenizer_folder
    from rl.trainer.hub import resolve_model

    try:
        folder = None if spec.startswith("embedded:") else tokenizer_folder(Path(os.path.expanduser(spec)))
        return AutoTokenizer.from_pretrained(folder or resolve_model(spec))
    except (ExportError, FileNotFoundError) as e:
        raise CommandError(f"--tokenizer {spec}: {e}") from e


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
        from rl.driver.ray_runtime import score_on_ray  # the CLI reaches Ray only through the runtime

        scored, stats, extra = score_on_ray(specs, trajs, args.workers, timeout, args.verbose)
    else:
        res = scorer.score_with_stats(trajs)
        scored, stats = res.trajs, res.fn
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
                    "passed": t.passes(args.pass_threshold),
                    "scores": t.scores,
                    "reward_error": t.reward_error,
                }
                for t, s in zip(scored, samples)
            ],
        )
        summary["out"] = str(args.out)
    print(json.dumps(summary, indent=2))
    return 0
