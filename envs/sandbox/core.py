"""Sandbox: run one command (or Python program) to completion in a private work dir."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from envs.sandbox.base import retry_setup_race, setup_race
from envs.sandbox.base import MODES, SANDBOX_PATH, _MiB, Limits, RunResult, _Tools
from envs.sandbox.files import _open_parent, _split_rel, remove_tree
from envs.sandbox.launch import (
    _base_env,
    _bwrap_command,
    _check_env,
    _inner_work_dir,
    _prepare_work_dir,
    _sandbox_python,
    _temp_parent,
)
from envs.sandbox.limits import _limit_launcher, _rlimit_values
from envs.sandbox.probe import _tools
from envs.sandbox.pump import Launch, run_launches
from envs.sandbox.seccomp import seccomp_fd
from envs.sandbox.storage import Storage
from envs.sandbox.warm import WarmLauncher
from envs.sandbox.config import SandboxConfig
from envs.sandbox.events import classify
from envs.sandbox.reap import _count_procs, _ensure_subreaper, _retry_pending
from envs.sandbox.uids import UidLease, lease_uid

logger = logging.getLogger("envs.sandbox")

# --------------------------------------------------------------------------------------
# Sandbox
# --------------------------------------------------------------------------------------


class Sandbox:
    """Runs commands to completion in a private work dir, isolated by bubblewrap.

    ``mode="bwrap"`` isolates (see the module docstring); ``mode="none"`` runs directly on
    the host with only rlimits, the timeout and the output cap, for trusted code. With
    ``work_dir=None`` a private temporary directory is made and removed by :meth:`close`.
    ``python`` overrides the interpreter :meth:`run_python` uses (it must be visible
    inside); ``ro_binds`` lists extra host paths mounted read-only at the same path.

    :attr:`host_uid` / :attr:`host_gid`: who the sandbox's processes and files are on the
    host. As root (bwrap mode) a uid leased for this sandbox alone (:mod:`envs.sandbox.uids`),
    so its RLIMIT_NPROC count is its own, released by :meth:`close`; a Sandbox opened over
    another's live storage (``work_dir=other.work_dir``, as a terminal env's shell session
    is) shares that storage's ids. Otherwise the caller's own uid and gid.
    """

    def __init__(
        self,
        work_dir: str | None = None,
        limits: Limits = Limits(),
        mode: str = "bwrap",
        *,
        python: str | None = None,
        ro_binds: Sequence[str] = (),
        config: SandboxConfig | Mapping[str, Any] | None = None,
        warm: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.limits = limits
        self.config = SandboxConfig.coerce(config)
        self._tools: _Tools | None = None
        self.storage: Storage | None = None
        self._owns_storage = False
        self._warm: WarmLauncher | None = None
        self._lease: UidLease | None = None
        if mode == "none":
            logger.warning(
                "Sandbox(mode='none'): NO ISOLATION. Code runs directly on the host as uid %d with only "
                "rlimits and a timeout; use it for trusted code only, never for model-generated code.",
                os.geteuid(),
            )
        else:
            self._tools = _tools()
        self._owns_dir = work_dir is None
        self._closed = False
        self.host_uid, self.host_gid = self._host_ids(work_dir)
        try:
            self.work_dir = self._make_work_dir(work_dir)
        except BaseException:
            self.close()
            raise
        try:
            self._set_mounts(ro_binds, python)
        except BaseException:
            self.close()
            raise
        if warm and mode == "bwrap":
            # Runs with the default limits use a sandbox pre-started during the previous run.
            self._warm = WarmLauncher(self)

    def _host_ids(self, work_dir: str | None) -> tuple[int, int]:
        """The host (uid, gid) of this sandbox (see the class docstring); leases one when needed."""
        if self.mode == "none":
            return os.getuid(), os.getgid()
        shared = Storage.of(work_dir) if work_dir is not None else None
        if shared is not None and shared.owner is not None:
            return shared.owner
        self._lease = lease_uid(self.config)
        return self._lease.uid, self._lease.gid

    def _make_work_dir(self, work_dir: str | None) -> str:
        """The work dir: a capped storage's (bwrap, none given), a temp dir, or ``work_dir``."""
        if work_dir is None and self.mode == "bwrap":
            self.storage = Storage(_temp_parent(), self.config, owner=(self.host_uid, self.host_gid))
            self._owns_storage = True
            return self.storage.work  # canonical already (and not realpath-able through /proc)
        if work_dir is None:
            return os.path.realpath(tempfile.mkdtemp(prefix="jointrl-sandbox-"))
        os.makedirs(work_dir, exist_ok=True)
        self.storage = Storage.of(work_dir) if self.mode == "bwrap" else None
        return self.storage.work if self.storage is not None else os.path.realpath(work_dir)

    def _set_mounts(self, ro_binds: Sequence[str], python: str | None) -> None:
        """Where the work dir appears inside, what is hidden, bound, and which Python runs."""
        if self.mode == "bwrap":
            _prepare_work_dir(self.work_dir, (self.host_uid, self.host_gid))
            self.inner_work_dir = _inner_work_dir()
        else:
            self.inner_work_dir = self.work_dir
        # Other sandboxes' work dirs sit beside this one (whatever TMPDIR is): hide their parent.
        top = self.storage.root if self.storage is not None else self.work_dir
        self.hidden = tuple(d for d in {os.path.dirname(top), os.path.realpath(_temp_parent())} if d != "/")
        self.ro_binds = tuple(os.path.realpath(p) for p in ro_binds)
        if python is not None:
            self.python = python
        elif self.mode == "none":
            self.python = sys.executable or os.path.realpath("/usr/bin/python3")
        else:
            self.python = _sandbox_python(self.inner_work_dir, self.hidden)

    # -- files -------------------------------------------------------------------------

    def _chown_files(self) -> tuple[int, int] | None:
        """Whom files the harness writes into the work dir belong to: the sandbox (as root), else None."""
        return (self.host_uid, self.host_gid) if self.mode == "bwrap" and os.geteuid() == 0 else None

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Write ``{relative path: content}`` into the work dir (str is UTF-8 encoded).

        Parent directories are created. Symlinks are never followed: a symlink (or other
        non-regular file) the sandboxed code left at a target path is replaced, and a
        symlinked parent directory raises OSError.
        """
        self._check_open()
        chown = self._chown_files()
        for rel, content in files.items():
            parts = _split_rel(rel)
            data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
            dfd = _open_parent(self.work_dir, parts, create=True, chown=chown)
            try:
                name = parts[-1]
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        raise IsADirectoryError(f"{rel!r} is a directory in the work dir")
                    if not stat.S_ISREG(st.st_mode):
                        os.unlink(name, dir_fd=dfd)
                except FileNotFoundError:
                    pass
                fd = os.open(
                    name,
                    os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                    0o644,
                    dir_fd=dfd,
                )
                try:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        raise OSError(f"{rel!r} is not a regular file")
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    if chown is not None:
                        os.fchown(fd, *chown)
                finally:
                    os.close(fd)
            finally:
                os.close(dfd)

    def read_file(self, path: str, max_bytes: int | None = None) -> str:
        """Read a regular file from the work dir as text (UTF-8, errors replaced).

        Refuses symlinks anywhere in the path (OSError), so sandboxed code cannot make
        the host read files outside the work dir.
        """
        self._check_open()
        parts = _split_rel(path)
        dfd = _open_parent(self.work_dir, parts, create=False, chown=None)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        finally:
            os.close(dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path!r} is not a regular file")
            chunks, left = [], (max_bytes if max_bytes is not None else -1)
            while left != 0:
                chunk = os.read(fd, _MiB if left < 0 else min(left, _MiB))
                if not chunk:
                    break
                chunks.append(chunk)
                if left > 0:
                    left -= len(chunk)
            return b"".join(chunks).decode("utf-8", errors="replace")
        finally:
            os.close(fd)

    # -- running -----------------------------------------------------------------------

    def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        limits: Limits,
        info_fd: int | None,
        new_session: bool,
        seccomp_fd: int | None = None,
    ):
        """(command, launcher env, cwd, preexec_fn) for one sandboxed process."""
        user_env = _check_env(env)
        if self.mode == "bwrap":
            assert self._tools is not None
            # The leased uid's own count (what its other launches hold), not other sandboxes'.
            count = _count_procs(self.host_uid)
            prefix, preexec = _limit_launcher(self._tools.prlimit, _rlimit_values(limits, count))
            st = self.storage
            cmd = _bwrap_command(
                self._tools,
                argv,
                work_dir=st.inside(self.work_dir) if st is not None else self.work_dir,
                inner=self.inner_work_dir,
                env=user_env,
                limits=limits,
                info_fd=info_fd,
                new_session=new_session,
                ro_binds=self.ro_binds,
                # Uncapped storage (not root): fresh bwrap tmpfs, capped in size, per launch.
                scratch=(st.inside(st.tmp), st.inside(st.shm)) if st is not None and st.capped else None,
                hide=self.hidden,
                seccomp_fd=seccomp_fd,
                host_ids=(self.host_uid, self.host_gid),
            )
            # Without root, the capped storage is mounted in a namespace the launcher enters first.
            enter = st.enter() if st is not None else []
            return prefix + enter + cmd, {"PATH": SANDBOX_PATH}, "/", preexec
        prlimit = shutil.which("prlimit")
        prefix, preexec = _limit_launcher(prlimit, _rlimit_values(limits, _count_procs(os.getuid())))
        full_env = {**_base_env(self.work_dir), "PATH": os.environ.get("PATH", SANDBOX_PATH), **user_env}
        return prefix + list(argv), full_env, self.work_dir, preexec

    def prepare(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | int | None = None,
        stdout: int | None = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        clear: bool = True,
    ) -> Launch:
        """A :class:`~envs.sandbox.pump.Launch` for ``argv`` in this sandbox (not started yet).

        For :func:`~envs.sandbox.pump.run_launches`, which can run several sandboxes at
        once with their stdio wired to each other (the code verdict). /tmp and /dev/shm are
        emptied here, so every launch starts with empty ones.
        """
        self._check_open()
        if not argv:
            raise ValueError("argv must not be empty")
        lim = limits or self.limits
        _ensure_subreaper()
        _retry_pending()
        if clear and self.storage is not None and self.storage.capped:
            self.storage.clear_scratch()
        info = os.pipe() if self.mode == "bwrap" else None
        sfd = seccomp_fd() if self.mode == "bwrap" else None
        try:
            cmd, launch_env, cwd, preexec = self._launch(
                list(argv), env, lim, info[1] if info else None, new_session=True, seccomp_fd=sfd
            )
        except BaseException:
            for fd in (*(info or ()), sfd):
                if fd is not None:
                    os.close(fd)
            raise
        return Launch(
            cmd,
            launch_env,
            cwd,
            preexec,
            stdin=stdin,
            stdout=stdout,
            info=info,
            pass_fds=(sfd,) if sfd is not None else (),
            bwrap=self.mode == "bwrap",
            output_bytes=lim.output_bytes,
        )

    def finish(self, res: RunResult) -> RunResult:
        """``res`` with its sandbox events (see :mod:`envs.sandbox.events`) filled in."""
        full = self.storage.full() if self.storage is not None else False
        ev = classify(
            timed_out=res.timed_out,
            signal=res.signal,
            output_truncated=res.output_truncated,
            stderr=res.stderr,
            storage_full=full,
        )
        return dataclasses.replace(res, events=ev)

    def run(
        self,
        argv: list[str],
        stdin: str | None = None,
        files: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        limits: Limits | None = None,
    ) -> RunResult:
        """Run ``argv`` in the sandbox (cwd = the work dir) and wait for it, within the limits.

        ``files`` are written into the work dir first. ``env`` adds to a minimal
        environment (PATH, HOME, LANG, TMPDIR). Returns when the program has exited and
        everything it started is dead, or when the wall-clock timeout killed it all.
        /tmp and /dev/shm start empty on every run.
        """
        self._check_open()
        if files:
            self.write_files(files)
        lim = limits or self.limits
        data = stdin.encode("utf-8") if stdin is not None else None
        if self._warm is not None and lim == self.limits:
            if not argv:
                raise ValueError("argv must not be empty")
            full_env = {**_base_env(self.inner_work_dir), **_check_env(env)}  # what bwrap --setenv gives cold runs
            res = self._warm.run(argv, data or b"", full_env, lim.wall_seconds)
            if res is None:
                self._warm.prestart()  # none was waiting: start this run cold, the next one warm
            elif not setup_race(res):
                return self.finish(res)
            # else the pre-started sandbox was still setting up its mounts when the command was handed over and
            # lost a mount race (the program never ran): this run starts cold, with the cold path's retries

        def attempt() -> RunResult:
            spec = self.prepare(argv, stdin=data, env=env, limits=lim)
            # run_launches owns (and closes) every fd of the spec from here on.
            return run_launches([spec], lim.wall_seconds)[0]

        return self.finish(retry_setup_race(attempt, setup_race))

    def run_python(
        self,
        code: str,
        stdin: str | None = None,
        files: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        limits: Limits | None = None,
        *,
        filename: str = "main.py",
        args: Sequence[str] = (),
    ) -> RunResult:
        """Write ``code`` to ``filename`` in the work dir and run it with :attr:`python`."""
        self.write_files({**(files or {}), filename: code})
        return self.run([self.python, filename, *args], stdin=stdin, env=env, limits=limits)

    # -- lifecycle ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Sandbox is closed")

    def close(self) -> None:
        """Remove the work dir if this sandbox made it, then release its uid lease. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if getattr(self, "_warm", None) is not None:
                self._warm.close()
            if getattr(self, "_owns_storage", False) and self.storage is not None:
                self.storage.close()
            elif self._owns_dir and getattr(self, "work_dir", None):
                remove_tree(self.work_dir)
        finally:
            # Last: the uid goes back once nothing of this sandbox is left (a lease whose uid still
            # runs processes is never handed out again anyway, see envs.sandbox.uids).
            if self._lease is not None:
                self._lease.release()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Sandbox(work_dir={self.work_dir!r}, mode={self.mode!r}, limits={self.limits!r})"
