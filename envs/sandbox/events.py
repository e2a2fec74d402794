"""Sandbox events: what a run hit (timeouts, limits, seccomp denials), named for metrics.

Each :class:`~envs.sandbox.base.RunResult` carries ``events``, a tuple of names from
:data:`EVENTS`; envs report them in their step ``info["sandbox_events"]`` and the rollout
turns them into ``sandbox/<domain>/<event>`` counters.

How each is recognised (rlimits do not report themselves, so some are read from signals
and the program's error output):

* ``timeout``: the wall clock ran out (the harness killed the run);
* ``cpu``: killed by SIGXCPU (RLIMIT_CPU);
* ``memory``: RLIMIT_AS refused an allocation (``MemoryError``, ``Cannot allocate memory``,
  ``bad_alloc`` in stderr);
* ``processes``: RLIMIT_NPROC refused a fork (``Resource temporarily unavailable`` /
  ``BlockingIOError`` with a fork in stderr);
* ``storage``: the sandbox's capped tmpfs was found full after the run, or a process was
  killed by SIGXFSZ (RLIMIT_FSIZE);
* ``output``: stdout or stderr went over the capture cap;
* ``seccomp``: a process was killed by SIGSYS (a syscall the filter kills on);
* ``harness_error``: the harness itself failed (set by the domain code, e.g. a code
  verdict whose judge crashed).

Not exhaustive: a program that catches ``MemoryError`` and prints nothing is not seen.
"""

from __future__ import annotations

import re

__all__ = ["EVENTS", "classify", "shell_status_events"]

EVENTS = ("timeout", "cpu", "memory", "processes", "storage", "output", "seccomp", "harness_error")
_SIGXCPU, _SIGXFSZ, _SIGSYS = 24, 25, 31
_MEMORY_RE = re.compile(r"MemoryError|Cannot allocate memory|bad_alloc|out of memory", re.I)
_FORK_RE = re.compile(
    r"(fork|spawn|clone|Thread).{0,80}(Resource temporarily unavailable|EAGAIN|Errno 11)|"
    r"(Resource temporarily unavailable|BlockingIOError: \[Errno 11\]).{0,80}(fork|clone|thread)|"
    r"retry: Resource temporarily unavailable|can't start new thread",
    re.I | re.S,
)


def classify(
    *, timed_out: bool, signal: int | None, output_truncated: bool, stderr: str, storage_full: bool
) -> tuple[str, ...]:
    """The events of one finished run (see the module docstring)."""
    ev = []
    if timed_out:
        ev.append("timeout")
    if signal == _SIGXCPU:
        ev.append("cpu")
    tail = stderr[-20000:]
    if _MEMORY_RE.search(tail):
        ev.append("memory")
    if _FORK_RE.search(tail):
        ev.append("processes")
    if storage_full or signal == _SIGXFSZ:
        ev.append("storage")
    if output_truncated:
        ev.append("output")
    if signal == _SIGSYS:
        ev.append("seccomp")
    return tuple(ev)


def shell_status_events(exit_code: int | None, output: str) -> tuple[str, ...]:
    """Events of one shell command, from bash's ``$?`` (128 + signal) and its output."""
    sig = exit_code - 128 if exit_code is not None and 128 < exit_code < 128 + 65 else None
    return classify(timed_out=False, signal=sig, output_truncated=False, stderr=output, storage_full=False)
