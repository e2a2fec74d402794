"""ShellSession: one persistent interactive bash inside a sandbox."""

from __future__ import annotations

import json
import os
import re
import secrets
import selectors
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from envs.sandbox.base import (
    _READ_CHUNK,
    Limits,
    ShellResult,
    ShellSessionError,
    bwrap_mount_race,
    retry_setup_race,
)
from envs.sandbox.core import Sandbox
from envs.sandbox.pump import _with_marker
from envs.sandbox.seccomp import seccomp_fd
from envs.sandbox.reap import (
    _ensure_subreaper,
    _finish_inner,
    _kill_pidfd,
    _killpg,
    _live_launchers,
    _open_inner,
    _registry_lock,
)

# --------------------------------------------------------------------------------------
# ShellSession
# --------------------------------------------------------------------------------------


def _shell_encode(command: str, stdin_null: bool = False) -> bytes:
    """The line that runs ``command`` in a session.

    The command travels as an ANSI-C quoted string for ``eval``: printable ASCII as is,
    everything else (newlines, control characters, non-ASCII bytes) as ``\\xHH``, so the
    tty's line discipline sees no special characters and bash runs the whole command as
    one unit (one prompt, one exit status) even when it spans several lines. Pieces of at
    most 1000 characters are joined by backslash-newline continuations, which keeps every
    physical line far below the tty's 4096-byte canonical line limit.
    """
    toks = []
    for b in command.encode("utf-8", errors="surrogateescape"):
        if b == 0x27:
            toks.append("\\'")
        elif b == 0x5C:
            toks.append("\\\\")
        elif 0x20 <= b < 0x7F:
            toks.append(chr(b))
        else:
            toks.append(f"\\x{b:02x}")
    pieces, cur, n = [], [], 0
    for t in toks:
        if n + len(t) > 1000:
            pieces.append("".join(cur))
            cur, n = [], 0
        cur.append(t)
        n += len(t)
    pieces.append("".join(cur))
    body = "\\\n".join(f"$'{p}'" for p in pieces)
    # With ``stdin_null`` the whole command list reads /dev/null (a redirection of the ``eval``
    # builtin: ``cd`` and variables still persist, a heredoc inside still feeds its own command).
    return f"eval -- {body}{' </dev/null' if stdin_null else ''}\n".encode("ascii")


# The prompt is printed by PROMPT_COMMAND, not PS1: after an eval that hits EOF inside a
# quote, bash reuses the previous PS1 expansion (stale $?), while PROMPT_COMMAND runs
# afresh before every prompt (and bash keeps $? across it). It numbers the prompts, so a
# late prompt of an earlier line (after Ctrl-C) cannot end a later command.
_PROMPT_COMMAND = '__jrl_r=$?; __jrl_n=$((__jrl_n+1)); printf "\\n__jrl_%s_%s_%s> " "{token}" "$__jrl_n" "$__jrl_r"'
# Sent once when a session starts: the prompt settings came in through the environment;
# stop exporting them to the commands' processes.
_SHELL_SETUP = b"export -n PS1 PS2 PROMPT_COMMAND; unset HISTFILE; set +H +o history\n"


class _StartError(ShellSessionError):
    """The sandboxed shell did not start; ``output`` is what its terminal showed."""

    def __init__(self, output: str) -> None:
        super().__init__(f"the sandboxed shell did not start: {output!r}")
        self.output = output


class _PromptCollector:
    """One command's terminal output up to its prompt, keeping the first ``cap`` bytes.

    The prompt that ends the command is the first one numbered ``first`` or later; the
    text drops any other (late) prompts.
    """

    TAIL = 256

    def __init__(self, regex: re.Pattern[bytes], cap: int, first: int) -> None:
        self.re = regex
        self.cap = cap
        self.first = first
        self.number = 0  # the matched prompt's number
        self.kept = bytearray()
        self.pos = 0  # bytes seen so far
        self.tail = b""
        self.end: int | None = None  # stream offset where the prompt starts
        self.exit_code: int | None = None
        self.leftover = b""

    def add_prefix(self, data: bytes) -> None:
        """Output that precedes the command (not searched for the prompt)."""
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        self.pos += len(data)

    def feed(self, data: bytes) -> bool:
        window = self.tail + data
        base = self.pos - len(self.tail)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        self.pos += len(data)
        for m in self.re.finditer(window):
            if int(m.group(1)) >= self.first:
                self.end = base + m.start()
                self.number = int(m.group(1))
                self.exit_code = int(m.group(2))
                self.leftover = window[m.end() :]
                return True
        self.tail = window[-self.TAIL :]
        return False

    @property
    def total(self) -> int:
        return self.end if self.end is not None else self.pos

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        kept = self.re.sub(b"", bytes(self.kept[: min(self.total, self.cap)]))
        return _with_marker(kept, self.total, self.cap, crlf=True)


class ShellSession:
    """A persistent ``bash`` inside a sandbox, driven through a pty with pexpect.

    Each :meth:`run` sends one command (as one ``eval`` line, see :func:`_shell_encode`)
    and reads until a prompt that carries a random per-session token, a prompt number and
    ``$?``; cwd, variables, functions and background jobs persist. Because commands run
    through ``eval``, ``set -e`` also fires when the command's last status is non-zero in
    a context that bash otherwise exempts (``set -e; ! true`` ends the shell); a shell that
    exits makes the session dead, like a closed terminal. On a timeout the
    session sends Ctrl-C (then, if the prompt does not come back, SIGKILLs the
    terminal's foreground process group) and reports ``timed_out=True``; if the prompt
    still does not come back the session is marked dead and the next call raises
    :class:`ShellSessionError`. :meth:`close` kills everything the session started.

    Unlike :meth:`Sandbox.run`, bash keeps the pty as its controlling terminal (no
    ``--new-session``) so job control and Ctrl-C work; the pty belongs to this session
    alone, so TIOCSTI can only inject input into the sandbox's own shell. Output that
    the code prints imitating the next prompt (the format is readable from
    ``$PROMPT_COMMAND``) ends the current command early; that only garbles the sandbox's
    own transcript. Commands that replace ``PROMPT_COMMAND`` or ``exec`` another program
    lose the prompt: the command then times out and the session is recovered or dead.
    Sessions are forked from one long-lived helper thread (the main thread when created
    there): bwrap's ``--die-with-parent`` fires when the forking *thread* exits, and a
    session usually outlives the thread-pool or actor thread that created it.
    Limits: rlimits apply to the session's processes; ``cpu_seconds`` counts per process,
    including bash itself (shell-builtin busy loops count against bash), so a session
    that burns it dies; ``output_bytes`` caps each command's output.
    """

    def __init__(
        self,
        work_dir: str | None = None,
        limits: Limits = Limits(),
        mode: str = "bwrap",
        *,
        ro_binds: Sequence[str] = (),
        startup_timeout: float = 10.0,
        sandbox: Sandbox | None = None,
    ) -> None:
        import pexpect  # deferred: only sessions need it

        self._pexpect = pexpect
        self.limits = limits
        # ``sandbox``: an open Sandbox whose launch (mounts, identity) the shell runs in; the session owns
        # and closes it (a Harbor episode passes one over its image's copy-on-write view).
        self.sandbox = sandbox if sandbox is not None else Sandbox(work_dir, limits, mode, ro_binds=ro_binds)
        self.mode = mode
        self._closed = False
        self._dead: str | None = None
        self._inner: int | None = None
        self._child = None
        self._leftover = b""
        token = secrets.token_hex(8)
        self._next = 1  # number of the prompt that will end the next line sent
        self._prompt_re = re.compile(rb"\r?\n__jrl_" + token.encode() + rb"_(\d+)_(\d+)> ")
        env = {
            "PS1": "",
            "PS2": "",
            "PROMPT_COMMAND": _PROMPT_COMMAND.replace("{token}", token),
            "TERM": "dumb",
            "HISTFILE": "",
        }
        argv = ["/bin/bash", "--norc", "--noprofile", "--noediting", "+H", "-i"]
        try:
            _ensure_subreaper()
            error = retry_setup_race(
                lambda: self._try_start(argv, env, startup_timeout),
                lambda err: err is not None and bwrap_mount_race(err.output),
            )
            if error is not None:
                raise error
        except BaseException:
            self.close()
            raise

    def _try_start(self, argv: list[str], env: dict[str, str], startup_timeout: float) -> _StartError | None:
        """Start the shell once: None when it is up, else the failure (its processes killed,
        the session ready for another attempt)."""
        try:
            self._start(argv, env, startup_timeout)
            return None
        except _StartError as err:
            self._terminate()
            self._dead, self._next, self._leftover = None, 1, b""
            return err

    def _start(self, argv: list[str], env: dict[str, str], startup_timeout: float) -> None:
        """Spawn the sandboxed shell on a pty and wait for its first two prompts."""
        info_r = info_w = sfd = None
        try:
            if self.mode == "bwrap":
                info_r, info_w = os.pipe()
                os.set_inheritable(info_w, True)
                sfd = seccomp_fd()
                if self.sandbox.storage is not None:
                    self.sandbox.storage.clear_scratch()
            cmd, launch_env, cwd, preexec = self.sandbox._launch(
                argv, env, self.limits, info_w, new_session=False, seccomp_fd=sfd
            )
            self._spawn(cmd, launch_env, cwd, preexec, tuple(fd for fd in (info_w, sfd) if fd is not None))
            for fd in (info_w, sfd):
                if fd is not None:
                    os.close(fd)
            info_w = sfd = None
            self._await_shell(info_r, time.monotonic() + startup_timeout)
        finally:
            for fd in (info_r, info_w, sfd):
                if fd is not None:
                    os.close(fd)

    def _spawn(self, cmd: list[str], launch_env: dict[str, str], cwd: str, preexec, pass_fds: tuple[int, ...]) -> None:
        """Fork the launcher on a pty (from the long-lived spawner thread) and register it."""

        def spawn():
            with _registry_lock:
                child = _make_spawn(
                    cmd[0],
                    cmd[1:],
                    env=launch_env,
                    cwd=cwd,
                    echo=False,
                    encoding=None,
                    use_poll=True,
                    preexec_fn=preexec,
                    dimensions=(24, 200),
                    pass_fds=pass_fds,
                )
                _live_launchers.add(child.pid)
            return child

        # bwrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that
        # forked bwrap exits. Sessions outlive the call that creates them (thread pools, Ray
        # actor threads), so they are forked from one long-lived thread.
        self._child = _spawner_call(spawn)
        self._child.delaybeforesend = None
        self._child.delayafterclose = 0
        self._child.delayafterterminate = 0
        self._child.ptyproc.delayafterclose = 0
        self._child.ptyproc.delayafterterminate = 0

    def _await_shell(self, info_r: int | None, deadline: float) -> None:
        """Wait for the first prompt, learn the sandbox's pid, send the one-time setup line."""
        col = _PromptCollector(self._prompt_re, self.limits.output_bytes, 1)
        if self._collect(col, deadline) != "prompt":
            raise _StartError(col.text())
        if info_r is not None:
            self._inner = _read_info(info_r, deadline)
        self._shell_pgrp = os.tcgetpgrp(self._child.child_fd)
        self._child.send(_SHELL_SETUP)
        col = _PromptCollector(self._prompt_re, self.limits.output_bytes, self._next)
        if self._collect(col, deadline) != "prompt" or col.exit_code != 0 or col.total:
            raise _StartError(col.text())

    @property
    def work_dir(self) -> str:
        return self.sandbox.work_dir

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        self.sandbox.write_files(files)

    def read_file(self, path: str, max_bytes: int | None = None) -> str:
        return self.sandbox.read_file(path, max_bytes)

    @property
    def alive(self) -> bool:
        return not self._closed and self._dead is None

    @property
    def init_pidfd(self) -> int | None:
        """A pidfd of the sandbox's PID 1 while the session runs, else None. Every process the
        session started lives in that process's PID namespace, so the harness can list them
        from the host's /proc (see :func:`envs.terminal.session_processes`)."""
        return self._inner

    def _collect(self, col: _PromptCollector, deadline: float) -> str:
        """Read into ``col`` until the prompt ("prompt"), EOF ("eof") or ``deadline`` ("timeout")."""
        pexpect = self._pexpect
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            try:
                data = self._child.read_nonblocking(_READ_CHUNK, timeout=remaining)
            except pexpect.TIMEOUT:
                return "timeout"
            except pexpect.EOF:
                return "eof"
            if col.feed(data):
                self._leftover = col.leftover
                self._next = col.number + 1
                return "prompt"

    def run(self, command: str, timeout: float = 10.0, *, stdin: str = "terminal") -> ShellResult:
        """Run ``command`` (any bash, multi-line allowed) and return its output and exit status.

        ``stdin``: ``"terminal"`` (the session's tty: a command that reads input waits for it, until
        ``timeout``) or ``"null"`` (``/dev/null``: a command that reads input gets end-of-file at once).
        """
        if stdin not in ("terminal", "null"):
            raise ValueError(f"stdin must be 'terminal' or 'null', got {stdin!r}")
        if self._closed:
            raise ShellSessionError("this ShellSession is closed")
        if self._dead is not None:
            raise ShellSessionError(f"this ShellSession is dead ({self._dead}); start a new ShellSession")
        pexpect = self._pexpect
        # Output that background jobs printed since the last prompt opens this command's output.
        before, self._leftover = bytearray(self._leftover), b""
        for _ in range(64):
            try:
                before += self._child.read_nonblocking(_READ_CHUNK, timeout=0)
            except pexpect.TIMEOUT:
                break
            except pexpect.EOF:
                col = _PromptCollector(self._prompt_re, self.limits.output_bytes, self._next)
                col.add_prefix(bytes(before))
                return self._on_eof(col)
        col = _PromptCollector(self._prompt_re, self.limits.output_bytes, self._next)
        col.add_prefix(bytes(before))
        try:
            self._child.send(_shell_encode(command, stdin_null=stdin == "null"))
        except OSError as exc:
            self._dead = f"cannot write to the shell: {exc}"
            self._terminate()
            raise ShellSessionError(f"this ShellSession is dead ({self._dead})") from exc
        state = self._collect(col, time.monotonic() + timeout)
        if state == "prompt":
            return ShellResult(col.text(), col.exit_code, False, col.truncated)
        if state == "eof":
            return self._on_eof(col)
        # Timed out: Ctrl-C, then SIGKILL the foreground job, then give up on the session.
        try:
            self._child.sendintr()
        except OSError:
            pass
        state = self._collect(col, time.monotonic() + 1.0)
        if state == "timeout" and self._kill_foreground():
            state = self._collect(col, time.monotonic() + 2.0)
        if state == "prompt":
            return ShellResult(col.text(), None, True, col.truncated)
        if state == "eof":
            res = self._on_eof(col)
            return ShellResult(res.output, None, True, res.output_truncated)
        self._dead = f"a command timed out after {timeout}s and the prompt did not come back after Ctrl-C"
        self._terminate()
        return ShellResult(col.text(), None, True, col.truncated)

    def _kill_foreground(self) -> bool:
        """SIGKILL the terminal's foreground job if it is not the shell itself."""
        try:
            fg = os.tcgetpgrp(self._child.child_fd)
        except OSError:
            return False
        if fg <= 0 or fg in (self._shell_pgrp, self._child.pid, os.getpgrp()):
            return False
        if self.mode == "bwrap":
            try:
                if os.stat(f"/proc/{fg}").st_uid != self.sandbox.host_uid:  # the sandbox's, not another's
                    return False
            except OSError:
                return False
        _killpg(fg)
        return True

    def _on_eof(self, col: _PromptCollector) -> ShellResult:
        """The terminal closed: the shell exited (or closed its terminal). The session is dead."""
        deadline = time.monotonic() + 1.0
        alive = True
        while time.monotonic() < deadline:
            try:
                alive = self._child.isalive()  # reaps the launcher once it has exited
            except Exception:  # noqa: BLE001 - ptyprocess errors when the child is gone already
                alive = False
            if not alive:
                break
            time.sleep(0.01)
        status = None if alive else self._child.exitstatus
        shown = status if status is not None else (self._child.signalstatus if not alive else "unknown")
        self._dead = f"the shell exited (status {shown})" if not alive else "the shell closed its terminal"
        self._terminate()
        return ShellResult(col.text(), status, False, col.truncated)

    def _terminate(self) -> None:
        """Kill every process of the session and reap them; keeps the work dir."""
        child = self._child
        if child is None:
            return
        _kill_pidfd(self._inner)
        ptyproc = getattr(child, "ptyproc", None)
        if ptyproc is not None and not ptyproc.terminated:
            if self.mode == "none":
                _kill_session_members(child.pid)
            _killpg(child.pid)
            try:
                ptyproc.wait()
            except Exception:  # noqa: BLE001
                pass
        try:
            child.close(force=True)
        except Exception:  # noqa: BLE001
            pass
        with _registry_lock:
            _live_launchers.discard(child.pid)
        if self._inner is not None:
            _finish_inner(self._inner)
            self._inner = None
        self._child = None
        if self._dead is None:
            self._dead = "terminated"

    def close(self) -> None:
        """Kill everything the session started (background daemons included), remove its temp dir."""
        if self._closed:
            return
        self._closed = True
        try:
            self._terminate()
        finally:
            if hasattr(self, "sandbox"):
                self.sandbox.close()

    def __enter__(self) -> ShellSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_info(fd: int, deadline: float) -> int | None:
    buf = bytearray()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                return None
            data = os.read(fd, _READ_CHUNK)
            if not data:
                break
            buf += data
            try:
                return _open_inner(json.loads(buf))
            except ValueError:
                continue
    finally:
        sel.close()
    try:
        return _open_inner(json.loads(buf))
    except ValueError:
        return None


def _kill_session_members(sid: int) -> None:
    """SIGKILL processes in session ``sid`` (mode "none": bash's jobs live in their own groups)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid and int(name) != os.getpid():
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass


def _spawn_class():
    import pexpect
    import ptyprocess

    class Spawn(pexpect.spawn):
        """pexpect.spawn that can pass extra fds (bwrap's --info-fd) to the child."""

        def __init__(self, *args: Any, pass_fds: Sequence[int] = (), **kwargs: Any) -> None:
            self._pass_fds = tuple(pass_fds)
            super().__init__(*args, **kwargs)

        def _spawnpty(self, args, **kwargs):
            return ptyprocess.PtyProcess.spawn(args, pass_fds=self._pass_fds, **kwargs)

    return Spawn


def _make_spawn(*args: Any, **kwargs: Any):
    global _SPAWN_CLS
    if _SPAWN_CLS is None:
        _SPAWN_CLS = _spawn_class()
    return _SPAWN_CLS(*args, **kwargs)


_SPAWN_CLS = None
_spawner_lock = threading.Lock()
_spawner: Any = None


def _spawner_call(fn):
    """Run ``fn`` on the module's long-lived spawner thread and return its result."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return fn()  # the main thread lives as long as the process
    with _spawner_lock:
        if _spawner is None:
            from concurrent.futures import ThreadPoolExecutor

            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jointrl-sandbox-spawner")
        pool = _spawner
    return pool.submit(fn).result()
