"""A pre-started launcher: the next run's sandbox is set up while the current one runs.

Starting a sandbox costs setpriv, prlimit and bwrap (namespaces, mounts, seccomp) before the
program itself starts (``bench/sandbox_bench.py`` times cold and warm runs; bench/RESULTS.md).
:class:`WarmLauncher` starts the NEXT run's sandbox ahead of time with a tiny trusted stub
(:data:`STUB`) as its program: the stub blocks reading one command from a private pipe and then
``execve``\\ s it. So a run only pays for handing over its command, and the setup of the
following sandbox overlaps with it.

Every run still gets its own sandbox, used once: fresh PID, mount, IPC, UTS and network
namespaces, a fresh process tree (the previous run's sandbox and everything in it was
killed when it ended), an empty /tmp and /dev/shm (emptied at hand-over, after the
previous run is dead; the waiting stub never touches them), and the environment given
to this run only. What a warm sandbox shares with the previous run is what a cold one
shares too: the Sandbox's work dir.

What it does NOT do: the rlimits are fixed when the sandbox is pre-started, so only runs
with the Sandbox's default limits use it (others start cold); a pre-started sandbox dies
with the thread that forked it (bwrap ``--die-with-parent``), and a dead one is replaced by
a cold start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Protocol

from envs.sandbox.base import RunResult
from envs.sandbox.pump import Launch, _finish, _has_exited, _Running, _start, pump_started
from envs.sandbox.storage import Storage

__all__ = ["STUB", "WarmLauncher", "WarmBox"]

# Runs inside the sandbox before the untrusted program exists, then replaces itself with it:
# reads NUL-separated ``NAME=VALUE``... ``argv``... from fd $1 and execs ``env -i`` with them.
STUB = 'mapfile -d "" -t a <&"$1" && eval "exec $1<&-" && exec /usr/bin/env -i "${a[@]}"'
_STUB_ARGV = ("/bin/bash", "--norc", "--noprofile", "-c", STUB, "stub")


class WarmBox(Protocol):
    """What a :class:`WarmLauncher` uses of its :class:`~envs.sandbox.core.Sandbox`: declared here, so that
    this module does not import :mod:`envs.sandbox.core` (which imports this one)."""

    storage: Storage | None

    def prepare(self, argv: Sequence[str], *, stdin: bytes | int | None = None, clear: bool = True) -> Launch: ...


class WarmLauncher:
    """One pre-started sandbox for the next :meth:`Sandbox.run` of ``box`` (see the module docstring)."""

    def __init__(self, box: WarmBox) -> None:
        self.box = box
        self._next: tuple[_Running, int] | None = None

    def prestart(self) -> None:
        """Start the sandbox the next run will use (if none is waiting)."""
        if self._next is not None:
            return
        ctl_r, ctl_w = os.pipe()
        try:
            spec = self.box.prepare([*_STUB_ARGV, str(ctl_r)], stdin=b"-", clear=False)
            spec.pass_fds = (*spec.pass_fds, ctl_r)
        except BaseException:
            os.close(ctl_r)
            os.close(ctl_w)
            raise
        try:
            run = _start(spec)  # closes ctl_r (ours) once the child holds it
        except BaseException:
            os.close(ctl_w)
            raise
        self._next = (run, ctl_w)

    def run(self, argv: Sequence[str], stdin: bytes, env: Mapping[str, str], wall_seconds: float) -> RunResult | None:
        """Hand ``argv`` to the waiting sandbox and pump it; None when none was alive or ``argv``
        cannot go through ``env`` (an ``=`` in the program name, a NUL anywhere): start cold."""
        items = [*(f"{k}={v}" for k, v in env.items()), *argv]
        if self._next is None or "=" in argv[0] or any("\0" in x for x in items):
            return None
        run, ctl_w = self._next
        self._next = None
        if run.proc.poll() is not None or _has_exited(run.proc.pid):
            os.close(ctl_w)
            _finish(run)
            return None
        if self.box.storage is not None and self.box.storage.capped:
            self.box.storage.clear_scratch()  # the previous run is dead by now
        try:
            data = memoryview(b"".join(x.encode("utf-8", "surrogateescape") + b"\0" for x in items))
            while data:
                data = data[os.write(ctl_w, data) :]
        except OSError:
            os.close(ctl_w)
            _finish(run)
            return None
        os.close(ctl_w)
        run.spec.stdin = stdin
        self.prestart()  # the next run's sandbox starts while this one runs
        return pump_started([run], wall_seconds)[0]

    def close(self) -> None:
        """Kill and reap the waiting sandbox, if any."""
        if self._next is not None:
            run, ctl_w = self._next
            self._next = None
            os.close(ctl_w)
            run.kill()
            _finish(run)
