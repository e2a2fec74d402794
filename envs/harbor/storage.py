"""The cap on a Harbor episode's writable layer: a watchdog over the overlay's upper directory.

The upper directory is on disk (an image's tasks install packages and build programs: more
than a RAM-backed tmpfs should hold), and without root no per-episode filesystem with a size
limit can be mounted there. So the cap is enforced by measuring: while a command of the
episode runs, a thread sums the disk usage (allocated blocks) and the entries of the upper
directory every ``interval_s`` (or four times as long as the last walk took, so that a layer of many
files costs the harness at most a fifth of a core); the first measurement over the cap kills the episode's
processes (its sandbox's PID 1) and marks the episode as over its storage, which scores it 0.
Each process is also held to RLIMIT_FSIZE = the cap, so no single file outgrows it.

What it guarantees: the layer exceeds the cap by at most what the episode's processes write
in one interval (plus the time one walk takes), and the episode never goes on past it; the
entries (files and directories) are capped the same way.
What it does not: a hard byte limit at every instant; the overflow of the last interval
reaches the host disk until the episode's directory is removed (at close).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

__all__ = ["StorageWatch", "usage"]


def usage(path: str, byte_cap: int | None = None, entry_cap: int | None = None) -> tuple[int, int]:
    """``(bytes allocated, entries)`` of the tree at ``path``, symlinks not followed; the walk stops
    early once a cap is passed (the returned counts are then past it)."""
    total, entries = 0, 0
    stack = [path]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries += 1
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(e.path)
                if (byte_cap is not None and total > byte_cap) or (entry_cap is not None and entries > entry_cap):
                    return total, entries
    return total, entries


class StorageWatch:
    """Measures the upper directory while armed (:meth:`armed`) and calls ``on_full`` once over the cap."""

    def __init__(self, upper: str, cap_mb: int, max_entries: int, interval_s: float = 0.5) -> None:
        self.upper = upper
        self.byte_cap = cap_mb << 20
        self.max_entries = max_entries
        self.interval_s = interval_s
        self.full = False
        self._on_full: Callable[[], None] | None = None
        self._armed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="jointrl-harbor-storage", daemon=True)
        self._thread.start()

    def check(self) -> bool:
        """Measure now; True (and :attr:`full` set) when the layer is over its cap."""
        if not self.full:
            nbytes, n = usage(self.upper, self.byte_cap, self.max_entries)
            self.full = nbytes > self.byte_cap or n > self.max_entries
        return self.full

    @contextmanager
    def armed(self, on_full: Callable[[], None]):
        """Watch while the block runs; ``on_full`` (kill the episode's processes) runs on the watch thread."""
        self._on_full = on_full
        self._armed.set()
        try:
            yield
        finally:
            self._armed.clear()
            self._on_full = None
        self.check()

    def _loop(self) -> None:
        walk_s = 0.0
        while not self._stop.is_set():
            self._armed.wait(0.5)
            # A layer of many files takes long to walk: then the harness walks it at most a fifth of the time.
            if self._stop.wait(max(self.interval_s, 4 * walk_s)) or not self._armed.is_set() or self.full:
                continue
            t0 = time.monotonic()
            full = self.check()
            walk_s = time.monotonic() - t0
            if full:
                cb = self._on_full
                if cb is not None:
                    cb()

    def close(self) -> None:
        self._stop.set()
        self._armed.set()
        self._thread.join(timeout=5)
