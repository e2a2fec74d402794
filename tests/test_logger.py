"""Run outputs on the driver: metrics/rollouts files, the W&B rollouts table, progress bar and end summary."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import pytest

from envs.types import Message, Task, Trajectory
from rl.driver.logger import TABLE_ROWS, ProgressBar, RunLogger, rollout_table_rows, summary, wandb_mode


def traj(i: int, domain: str = "tool_call", reward: float | None = 0.5, scores: dict | None = None) -> Trajectory:
    task = Task(id=f"t{i}", domain=domain, messages=(Message("system", "sys"), Message("user", f"question {i}")))
    return Trajectory(
        task=task,
        group_id=i // 4,
        prompt_ids=[1, 2],
        response_ids=[3, 4, 5],
        loss_mask=[1, 1, 0],
        logprobs=[-0.1, -0.2, 0.0],
        messages=[*task.messages, Message("assistant", f"answer {i}")],
        terminated=True,
        truncated=False,
        finish_reason="stop",
        reward=reward,
        scores=scores if scores is not None else {"toolcall": reward},
    )


class FakeRun:
    def __init__(self) -> None:
        self.logged: list[tuple[dict, int]] = []

    def log(self, data: dict, step: int) -> None:
        self.logged.append((data, step))

    def finish(self) -> None:
        pass


def test_files_and_what_the_summary_needs(tmp_path: Path) -> None:
    lg = RunLogger(tmp_path, {"a": 1}, mode="disabled")
    assert lg.run is None
    lg.log(0, {"eval/reward/mean": 0.1, "eval/reward/x/mean": 0.1, "timing/eval_s": 2.0})
    lg.log(1, {"reward/mean": 0.2, "reward/x/mean": 0.2, "timing/step_s": 5.0, "kl/mean": float("nan")})
    lg.log(
        2,
        {
            "reward/mean": 0.4,
            "reward/x/mean": 0.4,
            "timing/step_s": 7.0,
            "eval/reward/mean": 0.3,
            "eval/reward/x/mean": 0.3,
        },
    )
    lg.rollouts(1, "train", [traj(0), traj(1, reward=None, scores={"toolcall": None})])
    lg.close()
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1, 2] and recs[1]["kl/mean"] is None  # NaN -> null
    rows = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert rows[0]["prompt"] == "question 0" and rows[0]["response"] == "answer 0" and rows[1]["reward"] is None
    assert lg.first["reward/x/mean"] == 0.2 and lg.last["reward/x/mean"] == 0.4
    assert lg.first["eval/reward/x/mean"] == 0.1 and lg.last["eval/reward/x/mean"] == 0.3
    assert "kl/mean" not in lg.last  # a null value is not a value
    assert lg.timings == {"timing/eval_s": [2.0], "timing/step_s": [5.0, 7.0]}
    text = lg.summary()
    assert "0.200 -> 0.400" in text and "0.100 -> 0.300" in text and "step 6.00" in text


def test_turn_chars_split_a_multi_turn_response_into_its_turns(tmp_path: Path) -> None:
    """``response`` joins the assistant turns by newlines, which a turn may hold too: ``turn_chars`` says where each
    turn ends, so a reader recovers every turn exactly (env messages in between are not in ``response``)."""
    base = traj(0, domain="code")
    turns = ["```python\ndef f():\n    return 1\n```", "line one\nline two", ""]
    between = [Message("assistant", turns[0]), Message("user", "feedback\nmore"), Message("assistant", turns[1])]
    after = [*between, Message("user", "again"), Message("assistant", turns[2])]
    t = dataclasses.replace(base, messages=[*base.task.messages, *after], num_turns=3)
    lg = RunLogger(tmp_path, {}, mode="disabled")
    lg.rollouts(1, "train", [t, traj(1)])
    lg.close()
    rows = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert rows[0]["turn_chars"] == [len(x) for x in turns] and rows[1]["turn_chars"] == [len("answer 1")]
    response, start, got = rows[0]["response"], 0, []
    for n in rows[0]["turn_chars"]:
        got.append(response[start : start + n])
        start += n + 1
    assert got == turns and start == len(response) + 1


def test_rollout_table_every_n_steps(tmp_path: Path) -> None:
    lg = RunLogger(tmp_path, {}, mode="disabled", table_every=2, last_step=5)
    lg.run = FakeRun()  # W&B itself is exercised offline below
    batch = [
        traj(i, domain="code" if i % 2 else "tool_call", scores={"tests": 1.0} if i % 2 else {"toolcall": 0.5})
        for i in range(100)
    ]
    lg.rollouts(1, "train", batch)
    assert lg.run.logged == []  # not a table step
    lg.rollouts(2, "train", batch)
    lg.rollouts(3, "eval", batch[:3], table=True)  # forced
    lg.rollouts(4, "eval", batch[:3], table=False)  # suppressed
    lg.rollouts(5, "eval", batch[:3])  # the last step
    (data, step), (data3, step3), (_, step5) = lg.run.logged
    assert step == 2 and list(data) == ["rollouts/train"] and step3 == 3 and list(data3) == ["rollouts/eval"]
    assert step5 == 5
    table = data["rollouts/train"]
    assert table.columns == [
        "step",
        "domain",
        "task_id",
        "prompt",
        "response",
        "reward",
        "score/tests",
        "score/toolcall",
        "response_tokens",
        "finish_reason",
    ]
    assert len(table.data) == TABLE_ROWS == 64
    assert len({r[2] for r in table.data}) == 64 and {r[1] for r in table.data} == {"code", "tool_call"}
    first = table.data[0]
    assert first[:6] == [2, "tool_call", "t0", "question 0", "answer 0", 0.5] and first[6] is None
    assert first[8:] == [2, "stop"]
    lg.run = None
    lg.close()
    (tmp_path / "off").mkdir()
    off = RunLogger(tmp_path / "off", {}, mode="disabled", last_step=5)
    off.run = FakeRun()
    off.rollouts(5, "eval", batch[:3])
    assert off.run.logged == []  # table_every=0: never, not even at the last step
    off.run = None
    off.close()
    # Rows are spread over the whole batch (every group is represented), and NaN becomes None.
    cols, rows = rollout_table_rows(5, [traj(i, reward=math.nan) for i in range(10)], cap=4)
    assert [r[2] for r in rows] == ["t0", "t2", "t5", "t7"] and rows[0][5] is None


def test_wandb_offline_run_with_table(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    lg = RunLogger(tmp_path, {"train": {"steps": 2}}, mode="offline", run_name="t", tags=["x"], table_every=1)
    try:
        lg.log(0, {"eval/reward/mean": 0.1})
        lg.rollouts(1, "train", [traj(0), traj(1, reward=None, scores={"toolcall": None})])
        lg.log(1, {"reward/mean": 0.2})
    finally:
        lg.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].rglob("media/table/rollouts/train_*.table.json")), sorted(str(p) for p in runs[0].rglob("*"))
    table = json.loads(next(runs[0].rglob("media/table/rollouts/train_*.table.json")).read_text())
    assert table["columns"][:3] == ["step", "domain", "task_id"] and len(table["data"]) == 2


def test_wandb_mode_without_api_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    mode, note = wandb_mode("")
    assert mode == "offline" and "no API key" in note
    assert wandb_mode("disabled") == ("disabled", "")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("") == ("online", "")


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


M = {"reward/mean": 0.25, "kl/mean": 0.00123, "timing/step_s": 3.04}


def test_progress_bar_plain_lines() -> None:
    s = Stream(tty=False)
    bar = ProgressBar(10, s)
    bar.update(1, M)
    bar.update(2, M | {"eval/reward/mean": 0.5, "reward/mean": math.nan})
    bar.close()
    lines = s.getvalue().splitlines()
    assert lines[0].startswith("step 1/10  reward 0.250  kl 0.0012  3.0s/step  ETA ")
    assert "reward n/a" in lines[1] and "eval 0.500" in lines[1] and len(lines) == 2 and "\r" not in s.getvalue()
    assert bar.line(5, M, elapsed=50.0).endswith("ETA 50s")  # 10 s per step, 5 left
    assert bar.line(10, M, elapsed=100.0).endswith("3.0s/step")  # no ETA at the end
    assert ProgressBar(100, s, start_step=40).line(50, M, elapsed=600.0).endswith("ETA 50m00s")


def test_progress_bar_on_a_terminal() -> None:
    s = Stream(tty=True)
    bar = ProgressBar(4, s, width=8)
    bar.update(1, M)
    bar.update(2, M)
    assert s.getvalue().count("\r") == 2 and "\n" not in s.getvalue()
    assert "step 2/4  [####----]  50%  reward 0.250" in s.getvalue()
    bar.close()
    bar.close()
    assert s.getvalue().endswith("\n") and s.getvalue().count("\n") == 1


def test_summary_is_one_screen(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "step_000010").mkdir(parents=True)
    (tmp_path / "wandb" / "offline-run-1").mkdir(parents=True)
    first = {"step": 0, "reward/mean": 0.1, "reward/a/mean": 0.1, "reward/b/mean": 0.2, "eval/reward/a/mean": 0.05}
    last = {"step": 10, "reward/mean": 0.5, "reward/a/mean": 0.4, "reward/b/mean": 0.6, "eval/reward/a/mean": 0.3}
    timings = {
        "timing/rollout_s": [1.0, 3.0],
        "timing/learner_s": [4.0],
        "timing/step_s": [6.0, 8.0],
        "timing/x_s": [9.0],
    }
    text = summary(tmp_path, first, last, timings, wall_s=125)
    lines = text.splitlines()
    # One screen: few lines, none wide apart from the run's own paths (their length is the caller's).
    assert len(lines) <= 24 and max(len(x.replace(str(tmp_path), "RUN")) for x in lines) < 120
    assert lines[0] == f"run: {tmp_path}  (10 steps, 2m05s wall)"
    assert any(x.split() == ["a", "0.100", "->", "0.400"] for x in lines)
    assert any(x.split() == ["all", "0.100", "->", "0.500"] for x in lines)  # several domains: the overall row too
    assert any(x.split() == ["a", "0.050", "->", "0.300"] for x in lines)
    assert "mean seconds per phase: rollout 2.00  learner 4.00  step 7.00" in text
    assert f"checkpoints  {tmp_path / 'checkpoints'} (step_000010)" in text
    assert f"wandb sync {tmp_path / 'wandb' / 'offline-run-1'}" in text
    assert f"jointrl report {tmp_path}" in text
    # Nothing logged yet: still a summary, no crash.
    assert "outputs:" in summary(tmp_path / "none", {}, {}, {})
