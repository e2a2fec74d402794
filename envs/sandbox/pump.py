"""The I/O pump: start launchers, feed stdin, capture capped output, enforce the wall clock, reap."""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from envs.sandbox.base import _EXIT_DRAIN_S, _KILL_WAIT_S, _READ_CHUNK, Limits, RunResult
from envs.sandbox.reap import (
    _finish_inner,
    _has_exited,
    _kill_pidfd,
    _killpg,
    _live_launchers,
    _note_bwrap_run,
    _open_inner,
    _pidfd_open,
    _registry_lock,
)

logger = logging.getLogger("envs.sandbox")

# --------------------------------------------------------------------------------------
# Output capture
# --------------------------------------------------------------------------------------


class _Capture:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.total = 0
        self.open = True
        self.stream = ""

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - len(self.buf)
        if room > 0:
            self.buf += data[:room]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        return _with_marker(bytes(self.buf), self.total, self.cap)


def _with_marker(kept: bytes, total: int, cap: int, crlf: bool = False) -> str:
    if crlf:
        kept = kept.replace(b"\r\n", b"\n")
    s = kept.decode("utf-8", errors="replace")
    if total > cap:
        s += f"\n[... output truncated: showing the first {cap} of {total} bytes ...]\n"
    return s


@dataclass
class Launch:
    """One launcher to start: its command, environment, cwd and how its stdio is wired.

    ``stdin`` is bytes to feed (then EOF), None for /dev/null, or an fd to use as the
    child's stdin; ``stdout`` is None to capture it, or an fd to write to (a pipe to
    another sandbox). stderr is always captured. ``info`` is bwrap's ``--info-fd`` pipe
    ``(read end, write end)`` or None; ``pass_fds`` are extra fds the child inherits
    (the seccomp program). The pump owns every fd named here and closes it.
    """

    cmd: list[str]
    env: dict[str, str]
    cwd: str
    preexec: Any
    stdin: bytes | int | None = None
    stdout: int | None = None
    info: tuple[int, int] | None = None
    pass_fds: tuple[int, ...] = ()
    bwrap: bool = True
    output_bytes: int = 1_000_000


class _Running:
    """A started launcher and what the pump tracks about it."""

    def __init__(self, spec: Launch, proc: subprocess.Popen) -> None:
        self.spec = spec
        self.proc = proc
        self.inner: int | None = None  # pidfd of the sandbox's PID 1
        self.exit_fd = _pidfd_open(proc.pid)
        self.info_buf = bytearray()
        self.caps: list[_Capture] = []
        self.exited = False
        self.stdin_view: memoryview | None = None

    def kill(self) -> None:
        _kill_pidfd(self.inner)
        _killpg(self.proc.pid)


def _close_fds(fds) -> None:
    for fd in fds:
        if isinstance(fd, int) and fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def _start(spec: Launch) -> _Running:
    """Popen one launcher (in its own session) and register it as a live launcher."""
    stdin = spec.stdin if isinstance(spec.stdin, int) else (subprocess.PIPE if spec.stdin else subprocess.DEVNULL)
    stdout = spec.stdout if spec.stdout is not None else subprocess.PIPE
    pass_fds = tuple(spec.pass_fds) + ((spec.info[1],) if spec.info else ())
    try:
        with _registry_lock:
            proc = subprocess.Popen(
                spec.cmd,
                stdin=stdin,
                stdout=stdout,
                stderr=subprocess.PIPE,
                cwd=spec.cwd,
                env=spec.env,
                start_new_session=True,
                pass_fds=pass_fds,
                preexec_fn=spec.preexec,
            )
            _live_launchers.add(proc.pid)
    finally:
        # The child holds its copies now; ours would keep pipes open.
        _close_fds(
            [
                *spec.pass_fds,
                spec.info[1] if spec.info else None,
                spec.stdin if isinstance(spec.stdin, int) else None,
                spec.stdout,
            ]
        )
    return _Running(spec, proc)


def _register(sel: selectors.BaseSelector, run: _Running) -> None:
    for stream in (run.proc.stdout, run.proc.stderr):
        if stream is None:
            continue
        fd = stream.fileno()
        os.set_blocking(fd, False)
        cap = _Capture(run.spec.output_bytes)
        cap.stream = "stdout" if stream is run.proc.stdout else "stderr"
        run.caps.append(cap)
        sel.register(fd, selectors.EVENT_READ, ("out", run, cap))
    if run.spec.info is not None:
        os.set_blocking(run.spec.info[0], False)
        sel.register(run.spec.info[0], selectors.EVENT_READ, ("info", run, None))
    if run.exit_fd is not None:
        sel.register(run.exit_fd, selectors.EVENT_READ, ("exit", run, None))
    if run.proc.stdin is not None:
        data = run.spec.stdin if isinstance(run.spec.stdin, bytes) else b""
        if data:
            run.stdin_view = memoryview(data)
            os.set_blocking(run.proc.stdin.fileno(), False)
            sel.register(run.proc.stdin.fileno(), selectors.EVENT_WRITE, ("in", run, None))
        else:
            run.proc.stdin.close()


def _read_ready(sel: selectors.BaseSelector, fd: int) -> bytes | None:
    """One read of ready ``fd``: None when it has nothing after all; ``b""`` at its end or on an error,
    when ``fd`` is unregistered from ``sel``."""
    try:
        data = os.read(fd, _READ_CHUNK)
    except BlockingIOError:
        return None
    except OSError:
        data = b""
    if not data:
        sel.unregister(fd)
    return data


def _on_ready(sel: selectors.BaseSelector, key: selectors.SelectorKey, stopping: bool) -> None:
    """Handle one ready fd: read output, read bwrap's info report, write stdin."""
    tag, run, cap = key.data
    if tag == "out":
        for _ in range(16):
            data = _read_ready(sel, key.fd)
            if data is None:
                return
            if not data:
                cap.open = False
                return
            cap.feed(data)
    elif tag == "info":
        data = _read_ready(sel, key.fd)
        if not data:
            return
        run.info_buf += data
        if run.inner is None and _open_reported(run) and (stopping or run.exited):
            _kill_pidfd(run.inner)
    elif tag == "in":
        try:
            n = os.write(key.fd, run.stdin_view[:_READ_CHUNK])
            run.stdin_view = run.stdin_view[n:]
        except BlockingIOError:
            return
        except OSError:  # BrokenPipe: the program stopped reading
            run.stdin_view = run.stdin_view[:0]
        if not run.stdin_view:
            sel.unregister(key.fd)
            try:
                run.proc.stdin.close()
            except OSError:
                pass
    elif tag == "exit":
        sel.unregister(key.fd)


def _pump(sel: selectors.BaseSelector, runs: list[_Running], wall_seconds: float, start: float) -> bool:
    """Move data until the first launcher (the primary) has exited and its pipes closed, or
    the wall clock ran out. When a launcher exits, everything it left is killed; when the
    primary exits, the others are killed too. Returns True on a timeout."""
    primary = runs[0]
    deadline = start + wall_seconds
    stop_at = deadline
    timed_out = False
    while True:
        now = time.monotonic()
        for run in runs:
            if not run.exited and _has_exited(run.proc.pid):
                # Done: kill whatever it left behind. The launcher is an unreaped zombie, so its
                # process group id cannot have been recycled.
                run.exited = True
                run.kill()
                if run is primary:
                    for other in runs[1:]:
                        other.kill()
                    stop_at = now + _EXIT_DRAIN_S
        if primary.exited and not any(c.open for r in runs for c in r.caps):
            return timed_out
        if not primary.exited and not timed_out and now >= deadline:
            timed_out = True
            for run in runs:
                run.kill()
            stop_at = now + _KILL_WAIT_S
        elif now >= stop_at and (primary.exited or timed_out):
            return timed_out
        wait = max(0.0, stop_at - now)
        if any(r.exit_fd is None for r in runs):
            wait = min(wait, 0.02)
        for key, _ in sel.select(wait):
            _on_ready(sel, key, timed_out or primary.exited)


def _open_reported(run: _Running) -> bool:
    """Open the pidfd of the sandbox's PID 1 once ``run.info_buf`` holds bwrap's whole info report; False while
    the report is incomplete."""
    try:
        info = json.loads(run.info_buf)
    except ValueError:
        return False
    run.inner = _open_inner(info)
    return True


def _read_report(run: _Running) -> None:
    """Open the sandbox PID 1's pidfd from what bwrap's info report holds so far, for a run the pump never
    read it for: a pre-started sandbox closed unused. Without the pidfd only an orphan sweep could reap that
    PID 1, and a sweep run at once can miss it (it dies after its bwrap, by ``--die-with-parent``) and leave it a
    zombie until the next sweep."""
    fd = run.spec.info[0] if run.spec.info else None
    if fd is None or run.inner is not None:
        return
    try:
        os.set_blocking(fd, False)
        while data := os.read(fd, _READ_CHUNK):
            run.info_buf += data
    except OSError:  # BlockingIOError: all bwrap wrote so far is read
        pass
    _open_reported(run)  # no report yet (killed while setting up): the orphan sweep is the fallback


def _finish(run: _Running) -> None:
    """Kill (if needed) and reap one launcher and its sandbox's PID 1; close its fds."""
    proc = run.proc
    if run.spec.info is not None:
        if run.spec.bwrap:
            _read_report(run)
        _close_fds([run.spec.info[0]])
    if proc.poll() is None and not _has_exited(proc.pid):
        run.kill()
    try:
        proc.wait(timeout=_KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        logger.error("sandbox launcher %d did not exit after SIGKILL; leaving it", proc.pid)
    for f in (proc.stdout, proc.stderr, proc.stdin):
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
    if run.exit_fd is not None:
        os.close(run.exit_fd)
    with _registry_lock:
        if proc.returncode is not None:
            _live_launchers.discard(proc.pid)
    if run.spec.bwrap:
        _finish_inner(run.inner)
        _note_bwrap_run(sweep_now=run.inner is None)


def _result(run: _Running, timed_out: bool, duration: float) -> RunResult:
    rc = run.proc.returncode
    exit_code: int | None = rc
    sig: int | None = None
    if timed_out:
        exit_code, sig = None, signal.SIGKILL.value
    elif rc is None:
        exit_code = None
    elif rc < 0:
        exit_code, sig = None, -rc
    elif run.spec.bwrap and 128 < rc < 128 + 65:
        exit_code, sig = None, rc - 128
    caps = {c.stream: c for c in run.caps}
    out, err = caps.get("stdout"), caps["stderr"]
    return RunResult(
        exit_code=exit_code,
        stdout=out.text() if out else "",
        stderr=err.text(),
        timed_out=timed_out,
        output_truncated=any(c.truncated for c in run.caps),
        duration_s=duration,
        signal=sig,
        stdout_bytes=out.total if out else 0,
        stderr_bytes=err.total,
    )


def run_launches(specs: list[Launch], wall_seconds: float) -> list[RunResult]:
    """Start every launcher, pump their I/O until the first one (the primary) ends or the
    wall clock runs out, kill and reap them all; one :class:`RunResult` per launcher."""
    runs: list[_Running] = []
    try:
        for i, spec in enumerate(specs):
            try:
                runs.append(_start(spec))
            except BaseException:
                for later in specs[i + 1 :]:  # not started: the pump owned their fds too
                    _close_fds(
                        [
                            *later.pass_fds,
                            *(later.info or ()),
                            later.stdout,
                            later.stdin if isinstance(later.stdin, int) else None,
                        ]
                    )
                if spec.info is not None:
                    _close_fds([spec.info[0]])
                raise
    except BaseException:
        for run in runs:
            _finish(run)
        raise
    return pump_started(runs, wall_seconds)


def pump_started(runs: list[_Running], wall_seconds: float) -> list[RunResult]:
    """Pump already started launchers (see :func:`run_launches`); the wall clock starts now."""
    start = time.monotonic()
    sel = selectors.DefaultSelector()
    timed_out = False
    try:
        for run in runs:
            _register(sel, run)
        timed_out = _pump(sel, runs, wall_seconds, start)
    finally:
        sel.close()
        for run in runs:
            _finish(run)
    duration = time.monotonic() - start
    return [_result(run, timed_out, duration) for run in runs]


def _execute(
    cmd: list[str],
    launch_env: dict[str, str],
    cwd: str,
    preexec,
    stdin: str | None,
    limits: Limits,
    info_r: int | None,
    info_w: int | None,
    *,
    bwrap: bool,
    pass_fds: tuple[int, ...] = (),
) -> RunResult:
    """Run one launcher to completion (the single-process case of :func:`run_launches`)."""
    spec = Launch(
        cmd,
        launch_env,
        cwd,
        preexec,
        stdin=stdin.encode("utf-8") if stdin is not None else None,
        info=(info_r, info_w) if info_r is not None else None,
        pass_fds=pass_fds,
        bwrap=bwrap,
        output_bytes=limits.output_bytes,
    )
    return run_launches([spec], limits.wall_seconds)[0]
