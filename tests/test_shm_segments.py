"""rollout.pool's /dev/shm bookkeeping against a real POSIX named semaphore: glibc's ``sem_open`` maps it under
the temporary name it was made as (``/dev/shm/sem.XXXXXX (deleted)``) before linking it to its real name, so a
search by name alone neither records it for a dead engine nor sees that a live process still uses it."""

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

from rollout.shm import _in_use, ipc_segments, shm_segments, unlink_unmapped

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm (Linux)")

# A child that makes a multiprocessing lock as a spawned engine does (spawn context: a named semaphore that stays
# linked while the lock lives), prints its name and holds it.
HOLDER = (
    "import multiprocessing as mp, sys, time\n"
    "lock = mp.get_context('spawn').Lock()\n"
    "print(lock._semlock.name, flush=True)\n"
    "time.sleep(120)\n"
)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child and its resource tracker at once (as a dead worker's engine is reaped): nobody is
    left to unlink the semaphore."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def test_a_named_semaphore_of_a_child_is_recorded_seen_in_use_and_freed_once_its_holder_is_dead():
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        name = proc.stdout.readline().strip()
        assert name, "the child printed its semaphore's name"
        path = "/dev/shm/sem." + name.lstrip("/")
        assert os.path.exists(path)
        # Recorded as a descendant's segment, though /proc/<pid>/maps names it "/dev/shm/sem.XXXXXX (deleted)".
        assert path in shm_segments(os.getpid())
        # In use while its holder lives: not unlinked.
        assert _in_use({path}) == {path}
        assert unlink_unmapped([path]) == [] and os.path.exists(path)
    finally:
        _kill_group(proc)
    time.sleep(0.2)
    if os.path.exists(path):  # the resource tracker, killed with the child, did not get to unlink it
        assert _in_use({path}) == set()
        assert unlink_unmapped([path]) == [path]
    assert not os.path.exists(path)


def test_ipc_segments_are_multiprocessing_files_directly_in_dev_shm():
    """An engine's shutdown unlinks only these: never a model or weights file that it mapped from under /dev/shm."""
    paths = [
        "/dev/shm/psm_0a1b2c3d",
        "/dev/shm/sem.mp-x1y2z3",
        "/dev/shm/jointrl-weights-12.safetensors",
        "/dev/shm/jointrl-export/model.safetensors",
        "/dev/shm/models/psm_like/psm_file",
        "/dev/shm/torch_123_456",
        "/tmp/psm_0a1b2c3d",
    ]
    assert ipc_segments(paths) == ["/dev/shm/psm_0a1b2c3d", "/dev/shm/sem.mp-x1y2z3"]


# An engine whose core vLLM's shutdown SIGKILLs at once: what a core that overran vLLM's few seconds of grace after
# SIGTERM gets on a loaded host (the slow tier's intermittent 160 MiB psm_* leak). Prints what the core processes
# mapped at start, what is left of it after the engine's shutdown, and how the cores ended.
FORCE_KILLED = textwrap.dedent(
    """
    import json, os, sys
    import vllm.v1.engine.utils as core_utils
    from vllm.utils.system_utils import kill_process_tree

    def kill_at_once(procs, timeout=None):
        for p in procs:
            if p.is_alive() and p.pid:
                kill_process_tree(p.pid)
        for p in procs:
            p.join(30)

    core_utils.shutdown = kill_at_once
    from rollout.engine import VLLMEngine
    from rollout.shm import shm_segments

    e = VLLMEngine(sys.argv[1], dtype="float32", max_model_len=512, kv_cache_gib=0.25)
    procs = list(e._core_procs)
    held = sorted({f for p in procs for f in shm_segments(p.pid, own=True)})
    e.shutdown()
    left = [f for f in held if os.path.exists(f)]
    print("SHM", json.dumps({"held": held, "left": left, "exit": [p.exitcode for p in procs]}), flush=True)
    """
)


@pytest.mark.slow
def test_an_engine_core_force_killed_at_shutdown_leaves_nothing_in_dev_shm(tiny_model_path):
    """vLLM unlinks its engine core's message queue (160 MiB on CPU) only when the core exits cleanly; one its
    shutdown SIGKILLs leaves it. The engine's shutdown unlinks what its core processes mapped at start once nothing
    maps it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_ENABLE_V1_MULTIPROCESSING="1")  # a real engine core process
    out = subprocess.run(
        [sys.executable, "-c", FORCE_KILLED, tiny_model_path], capture_output=True, text=True, env=env, timeout=300
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("SHM ")), None)
    assert line, out.stdout[-2000:] + out.stderr[-4000:]
    got = json.loads(line[4:])
    assert got["exit"] and all(code == -signal.SIGKILL for code in got["exit"]), got  # the cores were killed
    assert any(os.path.basename(f).startswith("psm_") for f in got["held"]), got  # vLLM's message queue
    assert got["left"] == [], got
