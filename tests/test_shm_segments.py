"""rollout.pool's /dev/shm bookkeeping against a real POSIX named semaphore: glibc's ``sem_open`` maps it under
the temporary name it was made as (``/dev/shm/sem.XXXXXX (deleted)``) before linking it to its real name, so a
search by name alone neither records it for a dead engine nor sees that a live process still uses it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from rollout.pool import _in_use, shm_segments, unlink_unmapped

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
