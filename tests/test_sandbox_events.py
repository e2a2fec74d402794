"""Sandbox events: classification, per-domain step counters, the report's table, SandboxConfig."""

from __future__ import annotations

import pytest

from trajs import finished
from envs.sandbox.config import SandboxConfig
from envs.sandbox.events import EVENTS, classify, shell_status_events
from envs.types import Message, Task, Trajectory
from rl.algos.batch import rollout_metrics
from rl.cli.report import sandbox_events_table
from rollout.episode import _Episode, _note_sandbox_events


def traj(domain: str, events: list[str] | None) -> Trajectory:
    task = Task(id="t", domain=domain, messages=(Message("user", "x"),))
    return finished(task, task.messages, reward=0.0, sandbox_events=events)


def test_classify_reads_signals_stderr_and_storage():
    assert classify(timed_out=True, signal=9, output_truncated=False, stderr="", storage_full=False) == ("timeout",)
    assert classify(timed_out=False, signal=31, output_truncated=True, stderr="", storage_full=False) == (
        "output",
        "seccomp",
    )
    assert classify(
        timed_out=False, signal=None, output_truncated=False, stderr="MemoryError\n", storage_full=True
    ) == ("memory", "storage")
    assert "processes" in classify(
        timed_out=False,
        signal=None,
        output_truncated=False,
        storage_full=False,
        stderr="BlockingIOError: [Errno 11] Resource temporarily unavailable in fork",
    )
    assert classify(timed_out=False, signal=24, output_truncated=False, stderr="", storage_full=False) == ("cpu",)
    assert shell_status_events(159, "Bad system call") == ("seccomp",)
    assert shell_status_events(0, "all fine") == ()


def test_step_metrics_count_events_per_domain():
    m = rollout_metrics(
        [traj("code", ["timeout", "storage"]), traj("code", ["timeout"]), traj("code", []), traj("tool_call", None)]
    )
    assert m["sandbox/code/timeout"] == 2.0 and m["sandbox/code/storage"] == 1.0
    assert all(f"sandbox/code/{e}" in m for e in EVENTS) and m["sandbox/code/seccomp"] == 0.0
    assert not any(k.startswith("sandbox/tool_call/") for k in m)  # its env reports no sandbox events
    assert rollout_metrics([traj("code", ["seccomp"])], prefix="eval/")["eval/sandbox/code/seccomp"] == 1.0


def test_episode_collects_events_from_every_step():
    e = _Episode(task=traj("code", None).task, group_id=0, seed=0, env=None, prompt_ids=[], messages=[])
    _note_sandbox_events(e, {"reward": 0.0})
    assert e.sandbox_events is None
    _note_sandbox_events(e, {"sandbox_events": ["timeout"]})
    _note_sandbox_events(e, {"sandbox_events": ["storage", "timeout"]})
    assert e.sandbox_events == ["timeout", "storage", "timeout"]


def test_report_lists_sandbox_events():
    html = sandbox_events_table(
        [
            {"step": 1, "sandbox/code/timeout": 2.0, "sandbox/code/seccomp": 0.0},
            {"step": 3, "eval/sandbox/terminal/storage": 1.0},
        ]
    )
    assert "<td>code</td><td>timeout</td><td>train</td><td>2</td>" in html
    assert "<td>terminal</td><td>storage</td><td>eval</td><td>1</td>" in html and "seccomp" not in html
    assert sandbox_events_table([{"step": 1, "sandbox/code/timeout": 0.0}]) == ""


def test_sandbox_config_validates_and_names_the_key():
    assert SandboxConfig.coerce(None) == SandboxConfig()
    assert SandboxConfig.coerce({"storage_mb": 64}).storage_mb == 64
    with pytest.raises(ValueError, match=r"sandbox_config\.storage_inodes"):
        SandboxConfig(storage_inodes=1)
    with pytest.raises(ValueError, match=r"unknown keys \['storage_gb'\]"):
        SandboxConfig.coerce({"storage_gb": 1})
    with pytest.raises(ValueError, match="sandbox_config.storage_mb"):
        SandboxConfig.coerce({"storage_mb": True})


def test_setup_race_is_recognised_and_only_that():
    from envs.sandbox.base import RunResult, setup_race

    def res(code, err):
        return RunResult(exit_code=code, stdout="", stderr=err, timed_out=False, output_truncated=False, duration_s=0)

    msg = (
        "bwrap: Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags: remount "
        '"/newroot/tmp/jointrl-sb-x": Invalid argument\n'
    )
    assert setup_race(res(1, msg))
    assert not setup_race(res(0, msg)) and not setup_race(res(1, "Traceback ...\n" + msg))
    assert not setup_race(res(1, "bwrap: execvp nope: No such file or directory\n"))
