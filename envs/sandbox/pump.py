"""The I/O pump: start launchers, feed stdin, capture capped output, enforce the wall clock, reap."""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import time

from envs.sandbox import reap
from envs.sandbox.base import _EXIT_DRAIN_S, _KILL_WAIT_S, _READ_CHUNK, Limits, RunResult
from envs.sandbox.reap import (_finish_inner, _has_exited, _kill_pidfd, _killpg, _live_launchers, _open_inner,
                               _pidfd_open, _registry_lock, _sweep_orphans)

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


def _execute(cmd: list[str], launch_env: dict[str, str], cwd: str, preexec, stdin: str | None, limits: Limits,
             info_r: int | None, info_w: int | None, *, bwrap: bool) -> RunResult:
    stdin_data = stdin.encode("utf-8") if stdin is not None else None
    start = time.monotonic()
    try:
        with _registry_lock:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=launch_env, start_new_session=True,
                pass_fds=(info_w,) if info_w is not None else (), preexec_fn=preexec,
            )
            _live_launchers.add(proc.pid)
    except BaseException:
        if info_r is not None:
            os.close(info_r)
        raise
    finally:
        if info_w is not None:
            os.close(info_w)
    inner: int | None = None
    exit_fd = _pidfd_open(proc.pid)
    sel = selectors.DefaultSelector()
    caps: dict[int, _Capture] = {}
    timed_out = exited = False
    try:
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None
            fd = stream.fileno()
            os.set_blocking(fd, False)
            caps[fd] = _Capture(limits.output_bytes)
            sel.register(fd, selectors.EVENT_READ, "out")
        info_buf = bytearray()
        if info_r is not None:
            os.set_blocking(info_r, False)
            sel.register(info_r, selectors.EVENT_READ, "info")
        if exit_fd is not None:
            sel.register(exit_fd, selectors.EVENT_READ, "exit")
        stdin_view = memoryview(stdin_data) if stdin_data else None
        if proc.stdin is not None:
            if stdin_view:
                os.set_blocking(proc.stdin.fileno(), False)
                sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "in")
            else:
                proc.stdin.close()
        deadline = start + limits.wall_seconds
        stop_at = deadline
        while True:
            now = time.monotonic()
            if not exited and _has_exited(proc.pid):
                exited = True
                # The program is done: kill whatever it left behind. The launcher is a zombie
                # we have not reaped, so its process group id cannot have been recycled.
                _kill_pidfd(inner)
                _killpg(proc.pid)
                stop_at = now + _EXIT_DRAIN_S
            if exited and not any(c.open for c in caps.values()):
                break
            if not exited and not timed_out and now >= deadline:
                timed_out = True
                _kill_pidfd(inner)
                _killpg(proc.pid)
                stop_at = now + _KILL_WAIT_S
            elif now >= stop_at and (exited or timed_out):
                break
            wait = max(0.0, stop_at - now)
            if exit_fd is None:
                wait = min(wait, 0.02)
            for key, _ in sel.select(wait):
                tag = key.data
                if tag == "out":
                    cap = caps[key.fd]
                    for _ in range(16):
                        try:
                            data = os.read(key.fd, _READ_CHUNK)
                        except BlockingIOError:
                            break
                        except OSError:
                            data = b""
                        if not data:
                            sel.unregister(key.fd)
                            cap.open = False
                            break
                        cap.feed(data)
                elif tag == "info":
                    try:
                        data = os.read(key.fd, _READ_CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(key.fd)
                        continue
                    info_buf += data
                    if inner is None:
                        try:
                            info = json.loads(info_buf)
                        except ValueError:
                            continue
                        inner = _open_inner(info)
                        if timed_out or exited:
                            _kill_pidfd(inner)
                elif tag == "in":
                    assert proc.stdin is not None and stdin_view is not None
                    try:
                        n = os.write(key.fd, stdin_view[:_READ_CHUNK])
                        stdin_view = stdin_view[n:]
                    except BlockingIOError:
                        continue
                    except OSError:  # BrokenPipe: the program stopped reading
                        stdin_view = stdin_view[:0]
                    if not stdin_view:
                        sel.unregister(key.fd)
                        try:
                            proc.stdin.close()
                        except OSError:
                            pass
                elif tag == "exit":
                    sel.unregister(key.fd)
    finally:
        sel.close()
        if info_r is not None:
            os.close(info_r)
        if proc.poll() is None and not _has_exited(proc.pid):
            _kill_pidfd(inner)
            _killpg(proc.pid)
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
        if exit_fd is not None:
            os.close(exit_fd)
        with _registry_lock:
            if proc.returncode is not None:
                _live_launchers.discard(proc.pid)
        if bwrap:
            _finish_inner(inner)
            reap._runs_since_sweep += 1
            if inner is None or reap._runs_since_sweep >= 100:
                reap._runs_since_sweep = 0
                _sweep_orphans()
    duration = time.monotonic() - start
    rc = proc.returncode
    exit_code: int | None = rc
    sig: int | None = None
    if timed_out:
        exit_code, sig = None, signal.SIGKILL.value
    elif rc is None:
        exit_code = None
    elif rc < 0:
        exit_code, sig = None, -rc
    elif bwrap and 128 < rc < 128 + 65:
        exit_code, sig = None, rc - 128
    out, err = (caps[fd] for fd in caps)
    return RunResult(
        exit_code=exit_code,
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        output_truncated=out.truncated or err.truncated,
        duration_s=duration,
        signal=sig,
    )


