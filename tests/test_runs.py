"""``jointrl runs DIR``: finding runs and telling done, running and stopped ones apart."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import pytest

from rl.cli.runs import add_parser, format_runs, list_runs, run_info


def make(
    d: Path,
    steps: int,
    *,
    done: bool = False,
    age_s: float = 0.0,
    total: int | None = 10,
    step_s: float = 5.0,
    tail: str = "",
) -> Path:
    d.mkdir(parents=True)
    recs = [{"step": 0, "eval/reward/mean": 0.1, "timing/eval_s": 1.0}]
    recs += [{"step": s, "reward/mean": s / 10, "timing/step_s": step_s} for s in range(1, steps + 1)]
    if steps:
        recs[-1]["eval/reward/mean"] = 0.5
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + tail)
    if total is not None:
        (d / "recipe.resolved.yaml").write_text(f"run:\n  seed: 0\ntrain:\n  steps: {total}\n")
    if done:
        (d / "DONE").write_text(json.dumps({"steps": steps}) + "\n")
    if age_s:
        t = time.time() - age_s
        for p in d.iterdir():
            os.utime(p, (t, t))
    return d


def test_status_steps_and_rewards(tmp_path: Path) -> None:
    make(tmp_path / "a_done", 10, done=True, age_s=7200)
    make(tmp_path / "b_running", 3, tail='{"step": 4, "rew')  # a line being written
    make(tmp_path / "c_stopped", 2, age_s=3600)
    make(tmp_path / "d_slow", 2, age_s=1500, step_s=900.0)  # 15-minute steps: 25 minutes quiet is still running
    make(tmp_path / "sweep" / "lr1", 1, total=None)  # nested
    make(tmp_path / ".hidden" / "x", 1)  # hidden folders are skipped
    (tmp_path / "not_a_run" / "wandb").mkdir(parents=True)
    runs = list_runs(tmp_path)
    assert [r.path.name for r in runs] == ["a_done", "b_running", "c_stopped", "d_slow", "lr1"]
    by = {r.path.name: r for r in runs}
    assert [by[n].status for n in ("a_done", "b_running", "c_stopped", "d_slow", "lr1")] == [
        "done",
        "running",
        "stopped",
        "running",
        "running",
    ]
    a = by["a_done"]
    assert (a.steps, a.total_steps, a.reward, a.eval_reward_first, a.eval_reward) == (10, 10, 1.0, 0.1, 0.5)
    assert by["b_running"].steps == 3 and by["lr1"].total_steps is None
    assert a.started is not None and a.updated is not None and time.time() - a.updated > 7000
    # A run dir given directly is listed as itself; runs do not nest (no search inside a run).
    make(tmp_path / "a_done" / "inner", 1)
    assert [r.path for r in list_runs(tmp_path / "a_done")] == [tmp_path / "a_done"]
    assert list_runs(tmp_path / "missing") == []


def test_nothing_logged_yet(tmp_path: Path) -> None:
    d = tmp_path / "fresh"
    d.mkdir()
    (d / "metrics.jsonl").write_text("")
    r = run_info(d)
    assert (r.status, r.steps, r.reward, r.eval_reward) == ("running", -1, None, None)
    assert run_info(d, now=time.time() + 3600).status == "stopped"


def test_format_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make(tmp_path / "q", 20, done=True, total=20)
    make(tmp_path / "s" / "t", 3, age_s=5000)
    text = format_runs(list_runs(tmp_path), root=tmp_path)
    lines = text.splitlines()
    assert lines[0].split() == ["RUN", "STATUS", "STEPS", "REWARD", "EVAL", "REWARD", "STARTED", "UPDATED"]
    assert lines[1].split()[:7] == ["q", "done", "20/20", "2.000", "0.100", "->", "0.500"]
    assert lines[2].split()[:4] == ["s/t", "stopped", "3/10", "0.300"] and "1.4h ago" in lines[2]
    assert format_runs([], root=tmp_path) == f"no runs under {tmp_path}"
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["runs", str(tmp_path)])
    assert args.run(args) == 0 and "20/20" in capsys.readouterr().out
    args = parser.parse_args(["runs", str(tmp_path / "nope")])
    assert args.run(args) == 2 and "not a folder" in capsys.readouterr().err
