"""One Harbor episode: the agent's shell in a private copy-on-write view of the task's image, then the verifier.

:class:`HarborEpisode` ties the pieces together:

* **The view** (:mod:`envs.harbor.overlay`): the image root under an overlay whose upper layer
  is the episode's own directory on disk, mounted in a namespace only the episode's launches
  enter. Two episodes of one image share the image and nothing else.
* **The cap on the writable layer** (:mod:`envs.harbor.storage`): ``storage_mb`` of the task
  (at most the recipe's ceiling), watched while commands run; over it, the episode's
  processes are killed and it scores 0 (a ``storage`` event).
* **The agent's shell**: a :class:`~envs.sandbox.ShellSession` (the terminal env's protocol)
  whose bwrap root is the view, in the task's workdir, as the task's user (the image's
  ``USER``; root otherwise), with the image's ``ENV``. The sandbox's other rules hold: its
  own PID, IPC, UTS and network namespaces (the network only when the task sets
  ``allow_internet``), the seccomp filter, no capabilities, a leased host uid as root.
  Limits from task.toml: ``memory_mb`` as RLIMIT_AS per process, ``cpus`` as the CPUs the
  processes may run on (an affinity mask of ``ceil(cpus)`` CPUs) and RLIMIT_CPU of
  ``cpus x agent timeout`` per process, ``storage_mb`` as RLIMIT_FSIZE and the watch above;
  ``agent_timeout_s`` budgets the summed wall time of the agent's commands.
* **The verifier** (:mod:`envs.harbor.verifier`): after the agent's last turn the session is
  killed, the tests are copied in, read-only, with a fresh ``/logs/verifier``, and ``bash
  /tests/test.sh`` runs under ``verifier_timeout_s`` in a root composed so that its programs
  come from the image. A verifier that crashes, times out, or writes no or a malformed reward
  scores 0; only failures before the agent's first command (the view, the sandbox) raise.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envs.harbor.overlay import IdMap, Overlay
from envs.harbor.rootfs import ContextError, lookup_user
from envs.harbor.storage import StorageWatch
from envs.harbor.verifier import VERIFIER_BASE_ENV, VerifierResult, compose_mounts, read_reward
from envs.sandbox import Limits, Sandbox, ShellResult, ShellSession
from envs.sandbox.base import SANDBOX_PATH, _MiB
from envs.sandbox.config import SandboxConfig
from envs.sandbox.files import remove_tree
from envs.sandbox.launch import _check_env, _privilege_drop
from envs.sandbox.limits import _limit_launcher, _rlimit_values
from envs.sandbox.reap import _count_procs
from envs.sandbox.uids import UidLease, lease_uid

if TYPE_CHECKING:  # the loader and builder of branch h45img; only their records are used here
    from envs.harbor.image import BuiltImage
    from envs.harbor.task import HarborTask

__all__ = ["EpisodeCeilings", "HarborEpisode", "image_user"]


@dataclass(frozen=True)
class EpisodeCeilings:
    """The recipe's ceilings over what a task asks (task.toml values above them are lowered to them)."""

    storage_mb: int = 4096
    memory_mb: int = 8192
    cpus: float = 4.0
    max_entries: int = 500_000  # files and directories of the writable layer
    processes: int = 512
    output_bytes: int = 1_000_000
    scratch_dir: str = ""  # where episode directories go ("" = the temp dir); must be on disk


@dataclass
class _View:
    """What one launch of the episode mounts, as whom, where and with which environment."""

    mounts: list[str]
    cwd: str
    uid: int
    gid: int
    env: dict[str, str]
    net: bool
    cpus: list[int] = field(default_factory=list)


class _EpisodeSandbox(Sandbox):
    """A :class:`Sandbox` whose launches run bwrap over the episode's view instead of the host root.

    It holds no storage and no lease of its own: the episode owns the host ids, the overlay and
    the directory; this object only builds each launch's command line.
    """

    def __init__(self, episode: HarborEpisode, view: _View, limits: Limits) -> None:
        self._episode, self._view = episode, view
        super().__init__(episode.dir, limits, "bwrap", config=episode.sandbox_config)

    def _host_ids(self, work_dir: str | None) -> tuple[int, int]:
        return self._episode.host_ids

    def _make_work_dir(self, work_dir: str | None) -> str:
        assert work_dir is not None
        return work_dir

    def _set_mounts(self, ro_binds: Sequence[str], python: str | None) -> None:
        self.inner_work_dir = self._view.cwd
        self.hidden, self.ro_binds, self.python = (), (), "/usr/bin/python3"

    def _launch(self, argv, env, limits, info_fd, new_session, seccomp_fd=None):
        assert self._tools is not None
        v = self._view
        prefix, preexec = _limit_launcher(self._tools.prlimit, _rlimit_values(limits, _count_procs(self.host_uid)))
        cmd = _privilege_drop(self._tools, self.host_ids) + [self._tools.bwrap]
        if info_fd is not None:
            cmd += ["--info-fd", str(info_fd)]
        small = ["--size", str(min(64, limits.memory_mb) * _MiB)] if self._tools.has_size else []
        cmd += [*v.mounts, "--proc", "/proc", "--dev", "/dev", *small, "--tmpfs", "/dev/shm", "--chdir", v.cwd]
        cmd += ["--unshare-all", *(["--share-net"] if v.net else []), "--unshare-user"]
        cmd += ["--uid", str(v.uid), "--gid", str(v.gid), "--hostname", "harbor", "--cap-drop", "ALL"]
        if self._tools.has_disable_userns:
            cmd.append("--disable-userns")
        if seccomp_fd is not None:
            cmd += ["--seccomp", str(seccomp_fd)]
        cmd += ["--die-with-parent", *(["--new-session"] if new_session else []), "--clearenv"]
        for k, val in {**v.env, **_check_env(env)}.items():
            cmd += ["--setenv", k, val]
        taskset = shutil.which("taskset")
        pin = [taskset, "--cpu-list", ",".join(map(str, v.cpus))] if v.cpus and taskset else []
        return prefix + pin + self._episode.overlay.enter() + cmd + ["--", *argv], {"PATH": SANDBOX_PATH}, "/", preexec

    @property
    def host_ids(self) -> tuple[int, int]:
        return self.host_uid, self.host_gid


def image_user(root: str, user: str | None) -> tuple[int, int, str]:
    """``(uid, gid, home)`` of the image's ``USER`` (a name or ``uid[:gid]``): the builder's
    ``rootfs.lookup_user`` (the image's /etc/passwd and /etc/group, resolved inside the image); root when
    ``user`` is empty. Raises ``ValueError`` naming an unknown user or group."""
    if not user or user in ("root", "0", "0:0", "root:root"):
        return 0, 0, "/root"
    try:
        uid, gid, home, _ = lookup_user(root, user)
    except ContextError as e:
        raise ValueError(f"USER {user!r}: no such user or group in the image ({e})") from None
    return uid, gid, home or "/"


class HarborEpisode:
    """One episode of ``task`` over ``image`` (see the module docstring).

    ``start()`` mounts the view and starts the agent's shell (raises on failure: a harness
    failure); ``run(command)`` runs one agent command within the agent's time budget;
    ``verify()`` ends the agent's part and runs the verifier once; ``close()`` removes
    everything (idempotent). ``extra_ro_binds`` maps an inside path to a host path mounted
    read-only for the agent (the oracle audit's ``/solution``).
    """

    def __init__(
        self,
        task: HarborTask,
        image: BuiltImage,
        ceilings: EpisodeCeilings = EpisodeCeilings(),
        *,
        sandbox_config: SandboxConfig | Mapping[str, Any] | None = None,
        extra_ro_binds: Mapping[str, str] | None = None,
        image_paths: tuple[str, ...] = (),
    ) -> None:
        self.task, self.image, self.ceilings = task, image, ceilings
        self.sandbox_config = SandboxConfig.coerce(sandbox_config)
        self.extra_ro_binds = dict(extra_ro_binds or {})
        self.image_paths = tuple(image_paths)
        self.storage_mb = max(1, min(int(task.storage_mb), ceilings.storage_mb))
        self.memory_mb = max(64, min(int(task.memory_mb), ceilings.memory_mb))
        self.cpus = max(0.1, min(float(task.cpus), ceilings.cpus))
        self.agent_timeout_s = float(task.agent_timeout_s)
        self.verifier_timeout_s = float(task.verifier_timeout_s)
        # task.toml's [agent] user, else the image's USER; [environment] env over the image's ENV (agent and verifier).
        self.uid, self.gid, self.home = image_user(str(image.root), getattr(task, "agent_user", None) or image.user)
        self.task_env = dict(getattr(task, "task_env", None) or {})
        self.workdir = task.workdir or image.workdir or "/"
        self.used_s = 0.0
        self.events: list[str] = []
        self.dir = ""
        self.overlay: Overlay | None = None
        self.session: ShellSession | None = None
        self.watch: StorageWatch | None = None
        self._lease: UidLease | None = None
        self._verified: VerifierResult | None = None
        self._closed = False

    # -- start -------------------------------------------------------------------------

    def start(self) -> HarborEpisode:
        """Mount the view, start the agent's shell in the workdir. Raises (a harness failure)."""
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        # One parent per harness uid: a directory another user made is not this one's to write in.
        parent = self.ceilings.scratch_dir or os.path.join(tempfile.gettempdir(), f"jointrl-harbor-{os.geteuid()}")
        os.makedirs(parent, mode=0o711, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="ep-", dir=parent)
        os.chmod(self.dir, 0o711)  # the episode's host uid must reach merged/ to bind it
        if os.geteuid() == 0:
            self._lease = lease_uid(self.sandbox_config)
            self.host_ids = (self._lease.uid, self._lease.gid)
        else:
            self.host_ids = (os.getuid(), os.getgid())
        root = str(self.image.root)
        st = os.stat(root)
        # As root the image keeps its owners' ids on disk (root-owned: the task user's own ids);
        # an image built without root belongs to its builder, whose files are the task user's.
        disk_uid, disk_gid = (self.uid, self.gid) if st.st_uid == 0 else (st.st_uid, st.st_gid)
        self.overlay = Overlay(root, self.dir, IdMap(disk_uid, self.host_ids[0], disk_gid, self.host_ids[1]))
        self.watch = StorageWatch(self.overlay.upper, self.storage_mb, self.ceilings.max_entries)
        view = _View(
            self._agent_mounts(), self.workdir, self.uid, self.gid, self._agent_env(), self.task.allow_internet
        )
        view.cpus = self._cpu_list()
        self._make_workdir()
        lim = self._limits(self.agent_timeout_s)
        self.session = ShellSession(limits=lim, sandbox=_EpisodeSandbox(self, view, lim))

    def _make_workdir(self) -> None:
        """The workdir exists in the view (the task may name one the image lacks), owned by the agent."""
        assert self.overlay is not None
        path = os.path.join(self.overlay.view, self.workdir.lstrip("/"))
        if not os.path.lexists(path):
            os.makedirs(path, mode=0o755)
            if os.geteuid() == 0:
                os.chown(path, *self.host_ids)

    def _agent_mounts(self) -> list[str]:
        assert self.overlay is not None
        m = ["--bind", self.overlay.merged, "/"]
        if self.task.allow_internet and os.path.isfile("/etc/resolv.conf"):
            m += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        for inside, host in self.extra_ro_binds.items():
            m += ["--ro-bind", os.path.realpath(host), inside]
        return m

    def _agent_env(self) -> dict[str, str]:
        env = {"PATH": SANDBOX_PATH, "HOME": self.home, "LANG": "C.UTF-8", "TERM": "dumb"}
        env.update(
            {k: v for k, v in {**self.image.env, **self.task_env}.items() if k not in ("PS1", "PS2", "PROMPT_COMMAND")}
        )
        return env

    def _cpu_list(self) -> list[int]:
        allowed = sorted(os.sched_getaffinity(0))
        n = math.ceil(self.cpus)
        if n >= len(allowed):
            return []
        first = self.host_ids[0] % len(allowed)  # spread episodes over the CPUs
        return sorted(allowed[(first + i) % len(allowed)] for i in range(n))

    def _limits(self, wall_s: float) -> Limits:
        return Limits(
            cpu_seconds=max(1, math.ceil(self.cpus * wall_s)) + 1,
            memory_mb=self.memory_mb,
            file_size_mb=self.storage_mb,
            processes=self.ceilings.processes,
            open_files=1024,
            wall_seconds=wall_s,
            output_bytes=self.ceilings.output_bytes,
        )

    # -- the agent ---------------------------------------------------------------------

    @property
    def time_left_s(self) -> float:
        return max(0.0, self.agent_timeout_s - self.used_s)

    @property
    def storage_full(self) -> bool:
        return self.watch is not None and self.watch.full

    def run(self, command: str, timeout_s: float, *, stdin: str = "null") -> ShellResult:
        """Run one agent command for at most ``min(timeout_s, time left)``; the storage watch is
        armed while it runs. Raises :class:`~envs.sandbox.ShellSessionError` when the shell is gone."""
        if self.session is None or self._verified is not None:
            raise RuntimeError("HarborEpisode.run() before start() or after verify()")
        assert self.watch is not None
        timeout = max(0.1, min(timeout_s, self.time_left_s))
        t0 = time.monotonic()
        with self.watch.armed(self._kill_agent):
            res = self.session.run(command, timeout=timeout, stdin=stdin)
        self.used_s += time.monotonic() - t0
        if self.watch.full and "storage" not in self.events:
            self.events.append("storage")
        return res

    def _kill_agent(self) -> None:
        """SIGKILL the agent's sandbox (its PID 1 takes every process with it)."""
        pidfd = self.session.init_pidfd if self.session is not None else None
        if pidfd is not None:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass

    # -- the verifier ------------------------------------------------------------------

    def verify(self) -> VerifierResult:
        """End the agent's part (every process killed) and run the verifier once; later calls
        return the same result."""
        if self._verified is not None:
            return self._verified
        if self.overlay is None:
            raise RuntimeError("HarborEpisode.verify() before start()")
        if self.session is not None:
            self.session.close()
            self.session = None
        self._verified = self._verify()
        return self._verified

    def _verify(self) -> VerifierResult:
        assert self.overlay is not None and self.watch is not None
        if self.watch.check():
            if "storage" not in self.events:
                self.events.append("storage")
            return VerifierResult(0.0, f"storage limit hit (cap {self.storage_mb} MiB)", "", None, False, 0.0)
        tests, logs = os.path.join(self.dir, "tests"), os.path.join(self.dir, "logs-verifier")
        shutil.copytree(self.task.tests_dir, tests, symlinks=True)
        _readable(tests)
        os.mkdir(logs, 0o755)
        if os.geteuid() == 0:
            os.chown(logs, *self.host_ids)
        mounts, refusal = compose_mounts(
            view=self.overlay.view,
            merged=self.overlay.merged,
            image=str(self.image.root),
            image_inner=self.overlay.lower_inside,
            image_paths=self.image_paths,
        )
        if refusal is not None:
            return VerifierResult(0.0, f"the verifier was not run: {refusal}", "", None, False, 0.0)
        mounts += ["--ro-bind", tests, "/tests", "--dir", "/logs", "--bind", logs, "/logs/verifier"]
        uid, gid, home = self._verifier_user()
        env = {**VERIFIER_BASE_ENV, "HOME": home, **self.image.env, **self.task_env, **self.task.verifier_env}
        for k in ("PYTHONNOUSERSITE", "PYTHONSAFEPATH"):
            env.setdefault(k, "1")
        cwd = self.workdir if os.path.isdir(os.path.join(self.overlay.view, self.workdir.lstrip("/"))) else "/"
        view = _View(mounts, cwd, uid, gid, env, self.task.allow_internet, self._cpu_list())
        lim = self._limits(self.verifier_timeout_s)
        box = _EpisodeSandbox(self, view, lim)
        try:
            with self.watch.armed(lambda: None):
                res = box.run(["/bin/bash", "--noprofile", "--norc", "/tests/test.sh"], limits=lim)
        finally:
            box.close()
        output = res.stdout + (("\n" if res.stdout and not res.stdout.endswith("\n") else "") + res.stderr)
        if res.timed_out:
            return VerifierResult(
                0.0, f"the verifier timed out after {self.verifier_timeout_s:g}s", output, None, True, res.duration_s
            )
        if self.watch.full:
            return VerifierResult(
                0.0, "storage limit hit during the verifier", output, res.exit_code, False, res.duration_s
            )
        reward, why = read_reward(logs)
        return VerifierResult(reward, why, output, res.exit_code, False, res.duration_s)

    def _verifier_user(self) -> tuple[int, int, str]:
        """The task's ``[verifier] user`` (the image's name or ids), else the agent's user. Either maps
        to the episode's one host uid, so the files of the view look owned by it."""
        if not self.task.verifier_user:
            return self.uid, self.gid, self.home
        return image_user(str(self.image.root), self.task.verifier_user)

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process, unmount the view, remove the episode's directory, release the uid. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            # The processes first, then what they ran on: the watch, the view, the layer on disk.
            for part in (self.session, self.watch, self.overlay):
                if part is not None:
                    part.close()
            self.session = None
            if self.dir:
                remove_tree(self.dir)
        finally:
            if self._lease is not None:  # last: the uid is free once nothing of the episode is left
                self._lease.release()

    def __enter__(self) -> HarborEpisode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _readable(tree: str) -> None:
    """Make a harness-made copy readable (and its directories searchable) by every uid."""
    for dirpath, _, filenames in os.walk(tree):
        os.chmod(dirpath, 0o755)
        for n in filenames:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o444)
