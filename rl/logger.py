"""Run outputs on the driver: ``metrics.jsonl``, ``rollouts.jsonl`` and Weights & Biases.

Every metric goes to the local jsonl first (one object per step, flushed at once, so a
crash loses nothing already logged), then to W&B. The W&B mode is the recipe's
``wandb.mode``, else ``$WANDB_MODE``, else ``online`` when an API key is configured and
``offline`` (with one message) when none is. W&B files go under the run dir.
This module computes no metrics.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from envs.types import Trajectory


def wandb_mode(configured: str) -> tuple[str, str]:
    """(mode, note): the mode to use and, when it was chosen for the user, why."""
    if configured:
        return configured, ""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"], ""
    if os.environ.get("WANDB_API_KEY"):
        return "online", ""
    netrc = Path.home() / ".netrc"
    if netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online", ""
    return "offline", "W&B: no API key configured, logging offline (set WANDB_API_KEY or wandb.mode=online to sync)"


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null keeps the line valid
    return v


class RunLogger:
    def __init__(self, out_dir: Path, config: dict[str, Any], *, mode: str = "", project: str = "jointrl",
                 entity: str = "", run_name: str = "", tags: list[str] | None = None) -> None:
        self.out_dir = out_dir
        self.metrics_f = open(out_dir / "metrics.jsonl", "a")
        self.rollouts_f = open(out_dir / "rollouts.jsonl", "a")
        self.run = None
        mode, note = wandb_mode(mode)
        if note:
            print(note, file=sys.stderr)
        if mode != "disabled":
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.run = wandb.init(project=project, entity=entity or None, name=run_name or out_dir.name,
                                  tags=list(tags or []), config=config, dir=str(out_dir), mode=mode,
                                  settings=wandb.Settings(console="off", x_disable_stats=True))
        self.mode = mode

    def log(self, step: int, metrics: dict[str, float]) -> None:
        rec = {"step": step, **{k: _clean(v) for k, v in sorted(metrics.items())}}
        self.metrics_f.write(json.dumps(rec) + "\n")
        self.metrics_f.flush()
        if self.run is not None:
            self.run.log({k: v for k, v in metrics.items()}, step=step)

    def rollouts(self, step: int, split: str, trajs: list[Trajectory]) -> None:
        for t in trajs:
            user = [m.content for m in t.task.messages if m.role == "user"]
            self.rollouts_f.write(json.dumps({
                "step": step, "split": split, "domain": t.task.domain, "task_id": t.task.id, "group": t.group_id,
                "prompt": user[-1] if user else "", "response": t.completion, "reward": t.reward,
                "scores": t.scores, "reward_error": t.reward_error, "finish_reason": t.finish_reason,
                "terminated": t.terminated, "truncated": t.truncated, "response_tokens": t.num_policy_tokens,
            }) + "\n")
        self.rollouts_f.flush()

    def close(self) -> None:
        self.metrics_f.close()
        self.rollouts_f.close()
        if self.run is not None:
            self.run.finish()
            self.run = None
