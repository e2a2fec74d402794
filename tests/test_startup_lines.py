"""Start-up you can see and numbers that are right: a progress line per start-up phase with the elapsed
time, the end summary's wall time counted from the command's start, and a resumed run continuing the
same W&B run (the stored run id)."""

from __future__ import annotations

import io
import os
import re
import time
from pathlib import Path

import pytest

from rl.driver.local_runtime import LocalRuntime
from rl.driver.logger import STARTUP, WANDB_ID_FILE, RunLogger, StartupClock, process_start_time, wandb_run_id
from rl.driver.loop import train
from rl.config.recipe import load_recipe, validate_recipe


def test_clock_prints_phases_with_elapsed_time_only_when_enabled() -> None:
    clock, buf = StartupClock(), io.StringIO()
    clock.start(time.time() - 12.34, stream=buf)
    clock.phase("engines: starting 1 vLLM engine(s)")
    assert re.fullmatch(r"jointrl: start-up \[  12\.\ds\] engines: starting 1 vLLM engine\(s\)\n", buf.getvalue())
    clock.start(stream=buf, enabled=False)
    clock.phase("quiet")
    assert "quiet" not in buf.getvalue() and clock.elapsed() < 1.0


def test_process_start_time_is_this_process() -> None:
    t = process_start_time()
    assert t is not None and 0.0 <= time.time() - t < 3600  # the test process started before this line, not long ago


def _local(cfg, model_path, out, verbose):
    return LocalRuntime(cfg, model_path, out, verbose)


def test_startup_phases_and_the_commands_wall_time(recipe_copy, capsys) -> None:
    """An in-process run started "100 s ago" (as a command whose imports and start-up took that long):
    every phase is printed in order, and the summary's wall time counts those 100 s."""

    def edit(d: dict) -> None:
        d["wandb"]["mode"] = "disabled"
        d["model"].update(engine_dtype="float32", autocast=False)
        d["run"]["threads"] = 1
        d["rollout"].update(prompts_per_step=2, group_size=2, max_new_tokens=4)
        d["data"]["eval_limit"] = 2
        d["train"]["steps"] = 1

    cfg = load_recipe(recipe_copy("tiny.yaml", edit=edit))
    validate_recipe(cfg)
    try:
        train(cfg, runtime=_local, started=time.time() - 100.0)
    finally:
        STARTUP.start(enabled=False)
    out, err = capsys.readouterr()
    phases = re.findall(r"jointrl: start-up \[\s*([\d.]+)s\] (.+)", err)
    names = [p[1].split(":")[0].split(" ")[0] for p in phases]
    assert names == ["model", "task", "engine", "rewards", "learner", "ready", "baseline"], phases
    assert all(float(t) >= 100.0 for t, _ in phases) and [float(t) for t, _ in phases] == sorted(
        float(t) for t, _ in phases
    )
    wall = re.search(r"\((\d+) steps?, (\d+)m(\d\d)s wall\)", out)
    assert wall and int(wall.group(2)) * 60 + int(wall.group(3)) >= 100, out


def test_a_resumed_run_keeps_its_wandb_run_id(tmp_path: Path) -> None:
    """W&B offline: the second logger on the same output dir (a resume) uses the first one's run id."""
    first = RunLogger(tmp_path, {"a": 1}, mode="offline")
    rid = first.run.id
    first.log(1, {"x": 1.0})
    first.close()
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == rid
    time.sleep(1.1)  # W&B names an offline run's folder by the second it starts: two in one second share one
    second = RunLogger(tmp_path, {"a": 1}, mode="offline")
    assert second.run.id == rid
    second.log(2, {"x": 2.0})
    second.close()
    runs = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.endswith(f"-{rid}") for r in runs), runs


@pytest.mark.parametrize("content", ["", "Bad Id!", "x" * 100])
def test_a_bad_stored_wandb_id_is_replaced(tmp_path: Path, content: str) -> None:
    (tmp_path / WANDB_ID_FILE).write_text(content)
    rid = wandb_run_id(tmp_path)
    assert re.fullmatch(r"[a-z0-9]{8}", rid) and wandb_run_id(tmp_path) == rid


@pytest.mark.parametrize("verbose", [False, True])
def test_eval_engine_logs_are_quiet_unless_verbose(monkeypatch, verbose: bool) -> None:
    import logging
    import warnings

    from rl.cli.eval import quiet_engine_logs

    keys = ("VLLM_LOGGING_LEVEL", "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS", "JOINTRL_VERBOSE", "VLLM_LOGGING_STREAM")
    # a copy of the environment: nothing this sets leaks into later tests
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in keys})
    lib = logging.getLogger("torch._library")
    monkeypatch.setattr(lib, "level", lib.level)
    with warnings.catch_warnings():
        quiet_engine_logs(verbose)
    env = os.environ
    assert env["VLLM_LOGGING_STREAM"] == "ext://sys.stderr"  # stdout carries the JSON summary
    if verbose:
        assert env["JOINTRL_VERBOSE"] == "1" and "VLLM_LOGGING_LEVEL" not in env
    else:
        assert env["VLLM_LOGGING_LEVEL"] == "ERROR" and env["TORCH_CPP_LOG_LEVEL"] == "ERROR"
        assert "JOINTRL_VERBOSE" not in env


def test_eval_keeps_a_log_level_the_user_set(monkeypatch) -> None:
    import warnings

    from rl.cli.eval import quiet_engine_logs

    monkeypatch.setattr(os, "environ", {**os.environ, "VLLM_LOGGING_LEVEL": "INFO"})
    with warnings.catch_warnings():
        quiet_engine_logs(False)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
