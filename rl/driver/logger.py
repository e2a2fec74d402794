"""Run outputs on the driver: ``metrics.jsonl``, ``rollouts.jsonl``, Weights & Biases, console.

Every metric goes to the local jsonl first (one object per step, flushed at once, so a
crash loses nothing already logged), then to W&B. The W&B mode is the recipe's
``wandb.mode``, else ``$WANDB_MODE``, else ``online`` when an API key is configured and
``offline`` (with one message) when none is. W&B files go under the run dir.

With ``table_every=N`` the rollouts of every N-th step (and of ``last_step``) also go to W&B
as a table ``rollouts/<split>``: step, domain, task_id, prompt, response, reward, one
``score/<fn>`` column per reward function, response_tokens, finish_reason; at most
``TABLE_ROWS`` rows per call, spread evenly over the batch.

Console: :class:`ProgressBar` (one updating line on a terminal, one line per step
otherwise) and :func:`summary` (the one-screen end-of-run summary; ``RunLogger`` keeps
what it needs, see :meth:`RunLogger.summary`). This module computes no metrics.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any, TextIO

from envs.types import Trajectory


class StartupClock:
    """The command's clock and its start-up progress lines.

    ``start(t0)`` sets when the command started (``jointrl train``: the process's start, so that the
    end summary's wall time is the whole command's, imports and Ray start-up included; ``rl.train``:
    the call). ``phase(what)`` prints ``jointrl: start-up [  12.3s] what`` on stderr while
    ``enabled``, so the minute or two before the first step (Ray, engines, learners, model load) is
    not silent; ``elapsed()`` is the seconds since ``t0``.
    """

    def __init__(self) -> None:
        self.t0 = time.time()
        self.enabled = False
        self.stream: TextIO | None = None  # None: sys.stderr at the time of printing

    def start(self, t0: float | None = None, *, enabled: bool = True, stream: TextIO | None = None) -> None:
        """Start the clock at ``t0`` (default now); ``enabled``: print phases."""
        self.t0 = time.time() if t0 is None else t0
        self.enabled, self.stream = enabled, stream

    def elapsed(self) -> float:
        """Seconds since the command started."""
        return time.time() - self.t0

    def phase(self, what: str) -> None:
        """One progress line for a start-up phase, with the elapsed time."""
        if self.enabled:
            print(f"jointrl: start-up [{self.elapsed():6.1f}s] {what}", file=self.stream or sys.stderr, flush=True)


STARTUP = StartupClock()  # the driver's one clock: set by the command, read by the runtimes and the summary


def process_start_time() -> float | None:
    """When this process started (Unix time, from ``/proc``), or None where that cannot be read."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        btime = next(int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def read_step_records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` or ``rollouts.jsonl`` (objects with an int
    ``step``), streamed; lines that do not parse (one being written right now, or cut by a
    crash) are skipped. A missing file yields nothing."""
    if not path.is_file():
        return
    with open(path, errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                yield rec


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


TABLE_ROWS = 64  # most rows of one W&B rollouts table (one call of ``RunLogger.rollouts``)
TABLE_COLUMNS = ("step", "domain", "task_id", "prompt", "response", "reward")  # then score/<fn>..., then:
TABLE_TAIL_COLUMNS = ("response_tokens", "finish_reason")


def _pick(n: int, cap: int) -> list[int]:
    """At most ``cap`` indices of ``range(n)``, evenly spread (every group of a batch is represented)."""
    if n <= cap:
        return list(range(n))
    return [i * n // cap for i in range(cap)]


def rollout_table_rows(step: int, trajs: list[Trajectory], cap: int = TABLE_ROWS) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) of the W&B rollouts table: one row per sampled trajectory, one
    ``score/<fn>`` column per reward function seen in ``trajs`` (None where it did not apply)."""
    picked = [trajs[i] for i in _pick(len(trajs), cap)]
    fns = sorted({fn for t in picked for fn in t.scores})
    columns = [*TABLE_COLUMNS, *(f"score/{fn}" for fn in fns), *TABLE_TAIL_COLUMNS]
    rows = []
    for t in picked:
        user = [m.content for m in t.task.messages if m.role == "user"]
        rows.append(
            [
                step,
                t.task.domain,
                t.task.id,
                t.prompt or (user[-1] if user else ""),
                t.completion,
                _clean(t.reward),
                *(_clean(t.scores.get(fn)) for fn in fns),
                t.num_policy_tokens,
                t.finish_reason,
            ]
        )
    return columns, rows


WANDB_ID_FILE = "wandb_run_id"


def wandb_run_id(out_dir: Path) -> str:
    """The W&B run id of the run in ``out_dir``: read from ``WANDB_ID_FILE`` there, else made and written
    there, so a resume (``run.resume=auto``) logs into the run it continues instead of starting another."""
    path = out_dir / WANDB_ID_FILE
    if path.is_file():
        rid = path.read_text().strip()
        if re.fullmatch(r"[a-z0-9]{4,64}", rid):
            return rid
    import secrets

    rid = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))
    path.write_text(rid + "\n")
    return rid


class RunLogger:
    def __init__(
        self,
        out_dir: Path,
        config: dict[str, Any],
        *,
        mode: str = "",
        project: str = "jointrl",
        entity: str = "",
        run_name: str = "",
        tags: list[str] | None = None,
        table_every: int = 0,
        last_step: int | None = None,
    ) -> None:
        """``table_every``: log a W&B rollouts table every N steps and at ``last_step`` (0 = never);
        ``rollouts.jsonl`` gets every call regardless."""
        self.out_dir = out_dir
        self.table_every = table_every
        self.last_step = last_step
        self.first: dict[str, float] = {}  # first logged value of every key (for the end summary)
        self.last: dict[str, float] = {}  # last logged value of every key
        self.timings: dict[str, list[float]] = {}  # every logged timing/* value, per key
        self.started = time.time()
        self.metrics_f = open(out_dir / "metrics.jsonl", "a")
        self.rollouts_f = open(out_dir / "rollouts.jsonl", "a")
        self.run = None
        mode, note = wandb_mode(mode)
        if note:
            print(note, file=sys.stderr)
        if mode != "disabled":
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.run = wandb.init(
                id=wandb_run_id(out_dir),  # a resumed run (run.resume=auto) continues the same W&B run
                resume="allow",
                project=project,
                entity=entity or None,
                name=run_name or out_dir.name,
                tags=list(tags or []),
                config=config,
                dir=str(out_dir),
                mode=mode,
                settings=wandb.Settings(console="off", x_disable_stats=True),
            )
        self.mode = mode

    def log(self, step: int, metrics: dict[str, float]) -> None:
        rec = {"step": step, **{k: _clean(v) for k, v in sorted(metrics.items())}}
        self.metrics_f.write(json.dumps(rec) + "\n")
        self.metrics_f.flush()
        for k, v in rec.items():
            if v is None:
                continue
            self.first.setdefault(k, v)
            self.last[k] = v
            if k.startswith("timing/"):
                self.timings.setdefault(k, []).append(v)
        if self.run is not None:
            self.run.log({k: v for k, v in metrics.items()}, step=step)

    def rollouts(self, step: int, split: str, trajs: list[Trajectory], table: bool | None = None) -> None:
        """Append ``trajs`` to ``rollouts.jsonl``; on every ``table_every``-th step and at ``last_step``
        (``table`` True/False overrides) also log them to W&B as the table ``rollouts/<split>``
        (``TABLE_ROWS`` rows at most)."""
        for t in trajs:
            user = [m.content for m in t.task.messages if m.role == "user"]
            self.rollouts_f.write(
                json.dumps(
                    {
                        "step": step,
                        "split": split,
                        "domain": t.task.domain,
                        "task_id": t.task.id,
                        "group": t.group_id,
                        "prompt": t.prompt or (user[-1] if user else ""),
                        "response": t.completion,
                        # characters of each assistant turn in ``response`` (joined by one newline each): where
                        # one turn ends and the next begins (bench/code_turns.py scores each answer alone)
                        "turn_chars": [len(text) for text in t.assistant_turns],
                        "reward": t.reward,
                        # what shaping terms added to reward (reward - reward_shaping: the task's own score)
                        "reward_shaping": t.reward_shaping,
                        "scores": t.scores,
                        "reward_error": t.reward_error,
                        "finish_reason": t.finish_reason,
                        "cut_turns": t.cut_turns,
                        "terminated": t.terminated,
                        "truncated": t.truncated,
                        "response_tokens": t.num_policy_tokens,
                        # policy versions of the weights that sampled its tokens (None: not recorded)
                        "oldest_version": t.oldest_version,
                        "newest_version": t.newest_version,
                    }
                )
                + "\n"
            )
        self.rollouts_f.flush()
        if table is None:
            table = bool(self.table_every) and (step % self.table_every == 0 or step == self.last_step)
        if table and self.run is not None and trajs:
            import wandb

            columns, rows = rollout_table_rows(step, trajs)
            self.run.log(
                {f"rollouts/{split}": wandb.Table(columns=columns, data=rows, allow_mixed_types=True)}, step=step
            )

    def summary(self) -> str:
        """The one-screen end-of-run summary of what was logged (see :func:`summary`); the wall
        time is the command's (``STARTUP``'s clock: from the process's start for ``jointrl train``)."""
        return summary(self.out_dir, self.first, self.last, self.timings, wall_s=STARTUP.elapsed())

    def rewind(self, step: int) -> None:
        """Back to the end of ``step`` (the learners restarted from its checkpoint): lines of later steps in
        ``metrics.jsonl`` and ``rollouts.jsonl`` move to ``*.discarded.jsonl`` (kept; the replay logs those
        steps anew, once). W&B keeps what it was sent."""
        from rl.driver.checkpoints import split_log

        self.metrics_f.close()
        self.rollouts_f.close()
        for name in ("metrics", "rollouts"):
            split_log(self.out_dir / f"{name}.jsonl", self.out_dir / f"{name}.discarded.jsonl", step)
        self.metrics_f = open(self.out_dir / "metrics.jsonl", "a")
        self.rollouts_f = open(self.out_dir / "rollouts.jsonl", "a")

    def close(self) -> None:
        self.metrics_f.close()
        self.rollouts_f.close()
        if self.run is not None:
            self.run.finish()
            self.run = None


# ---------------------------------------------------------------------------- console


def _fmt_s(s: float) -> str:
    s = max(int(round(s)), 0)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


def _num(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"


class ProgressBar:
    """Progress over training steps: step i/N, reward, KL, eval reward (when present), s/step, ETA.

    On a terminal (``stream.isatty()``) one line is redrawn in place (with a bar); otherwise
    (a log file, CI) each update prints one plain line. s/step is the step's ``timing/step_s``;
    the ETA is the mean wall time per step since the bar was made (eval and checkpoints
    included) times the steps left. ``close()`` ends the line; call it on every exit path.
    """

    def __init__(self, total: int, stream: TextIO | None = None, *, start_step: int = 0, width: int = 24) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start_step = start_step
        self.width = width
        self.t0 = time.perf_counter()
        self._open = False

    def line(self, step: int, metrics: dict[str, Any], elapsed: float | None = None) -> str:
        """The text shown after ``step`` (pure: ``elapsed`` is the wall time since the bar started)."""
        done = step - self.start_step
        parts = [f"step {step}/{self.total}"]
        if self.tty:
            frac = min(max(step / self.total, 0.0), 1.0) if self.total else 1.0
            fill = int(round(frac * self.width))
            parts.append("[" + "#" * fill + "-" * (self.width - fill) + f"] {frac:4.0%}")
        parts.append(f"reward {_num(metrics.get('reward/mean'), '.3f')}")
        if "kl/mean" in metrics:
            parts.append(f"kl {_num(metrics['kl/mean'], '.4f')}")
        if "eval/reward/mean" in metrics:
            parts.append(f"eval {_num(metrics['eval/reward/mean'], '.3f')}")
        if "timing/step_s" in metrics:
            parts.append(f"{_num(metrics['timing/step_s'], '.1f')}s/step")
        if elapsed is not None and done > 0 and step < self.total:
            parts.append(f"ETA {_fmt_s(elapsed / done * (self.total - step))}")
        return "  ".join(parts)

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        text = self.line(step, metrics, time.perf_counter() - self.t0)
        if self.tty:
            cols = shutil.get_terminal_size((100, 20)).columns
            self.stream.write("\r\x1b[2K" + text[: max(cols - 1, 20)])
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


_PHASES = ("rollout", "reward", "learner", "sync", "step", "eval")


def summary(
    out_dir: Path | str,
    first: dict[str, Any],
    last: dict[str, Any],
    timings: dict[str, list[float]],
    *,
    wall_s: float | None = None,
) -> str:
    """The one-screen end-of-run summary (pure).

    ``first`` / ``last``: the first and the last logged value of every metric key (``step``
    included); ``timings``: every logged value of each ``timing/*`` key. Shows the train and
    eval reward per domain start -> end, the mean seconds per phase, and where the outputs are.
    """
    out = Path(out_dir)
    head = f"run: {out}"
    extra = [f"{last['step']} steps"] if isinstance(last.get("step"), int) else []
    if wall_s is not None:
        extra.append(f"{_fmt_s(wall_s)} wall")
    lines = [head + (f"  ({', '.join(extra)})" if extra else "")]

    def table(title: str, prefix: str) -> None:
        rx = re.compile("^" + re.escape(prefix) + r"([^/]+)/mean$")
        doms = sorted({m.group(1) for k in last if (m := rx.match(k))})
        rows = [(d, f"{prefix}{d}/mean") for d in doms]
        if f"{prefix}mean" in last and len(doms) != 1:
            rows.append(("all", f"{prefix}mean"))
        if not rows:
            return
        lines.append(f"{title:<34}start -> end")
        for name, key in rows:
            lines.append(f"  {name:<32}{_num(first.get(key), '.3f')} -> {_num(last.get(key), '.3f')}")

    table("reward (train)", "reward/")
    table("eval reward (held-out, greedy)", "eval/reward/")
    means = []
    for ph in _PHASES:
        vs = [v for v in timings.get(f"timing/{ph}_s", []) if isinstance(v, (int, float)) and math.isfinite(v)]
        if vs:
            means.append(f"{ph} {sum(vs) / len(vs):.2f}")
    if means:
        lines.append("mean seconds per phase: " + "  ".join(means))
    lines.append("outputs:")
    lines.append(f"  metrics      {out / 'metrics.jsonl'}")
    lines.append(f"  rollouts     {out / 'rollouts.jsonl'}")
    ck = out / "checkpoints"
    steps = sorted(p.name for p in ck.iterdir() if p.name.startswith("step_")) if ck.is_dir() else []
    lines.append(f"  checkpoints  {ck}" + (f" ({', '.join(steps)})" if steps else " (none yet)"))
    if (out / "wandb").is_dir():
        offline = sorted((out / "wandb").glob("offline-run-*"))
        lines.append(
            f"  W&B          {out / 'wandb'}" + (f" (offline; upload: wandb sync {offline[-1]})" if offline else "")
        )
    lines.append(f"  report       jointrl report {out}")
    return "\n".join(lines)
