"""The terminal domain: a multi-turn shell env whose episodes are scored by a bash check.

Protocol seen by the policy
---------------------------
Each assistant turn holds ONE shell command, either in a fenced block (```` ```bash ````,
```` ```sh ````, ```` ```shell ````, ```` ```console ```` or a bare ```` ``` ````; the first
such block is used, and it may span several lines) or as the whole turn on one bare line
(a leading ``$ `` and surrounding single backticks are stripped). The env runs it in a
persistent, sandboxed ``bash`` (cwd, variables, functions and background jobs persist
from turn to turn) and answers with one user message::

    exit code N
    <the command's output (stdout and stderr interleaved, as on a terminal)>

A turn whose text has a line that is exactly the done marker (``DONE`` by default; a
fenced block holding only the marker counts too) or whose command is empty says the
policy is finished. Text with several lines but no fenced block and no marker holds no
command: the env answers with a format reminder, runs nothing, and the turn counts.
:func:`extract_command` and :func:`parse_action` implement these rules.

Episode and check semantics (:class:`TerminalEnv`)
--------------------------------------------------
* ``reset(task)`` needs ``task.terminal`` (else ``ValueError``). It makes a fresh private
  work dir (``/work`` inside the sandbox; also ``$HOME``), starts a
  :class:`~envs.sandbox.ShellSession` on it, and runs ``spec.setup`` in that session,
  in a subshell with ``set -e`` (background processes it starts keep running in the
  session; its variables and ``cd`` do not leak). A setup that fails or times out raises
  ``RuntimeError`` naming the task and the setup's output: a broken task never scores
  silently. Returns ``list(task.messages)``.
* ``step(action)`` runs the command with a timeout of
  ``min(command_timeout_s, time left)``, its standard input ``/dev/null`` by default
  (``stdin="null"``: ``tee out.txt`` or ``grep word`` without a file get end-of-file and
  finish, as in a script, instead of waiting for keyboard input that never comes until
  the timeout; on a tty one such command holds a whole rollout batch for ``command_timeout_s``);
  ``stdin="terminal"`` gives commands the session's tty. A command that times out is interrupted with
  Ctrl-C and reported as an observation (``command timed out after Xs (interrupted)``);
  the session goes on. ``time_limit_s`` of the task budgets the summed wall time of
  the policy's commands (not the time the policy spends generating, which depends on
  batching, not on the policy).
* The episode ends, and the check runs, when
  - the policy says it is done: ``terminated=True``, observation ``[]``;
  - the shell exited (the policy ran ``exit``): ``terminated=True``;
  - ``max_turns`` turns were taken, the time budget is spent, or the shell died of a
    command that could not be interrupted: ``truncated=True``.
  Truncated episodes are checked and scored like the others.
* Values the check compares against are held by the harness, never kept in the work dir:
  the setup runs with ``$JOINTRL_HELD`` naming a directory (:data:`HELD_DIR` in the work
  dir) and writes each such value there as a file ``NAME`` (a token's hash, a process id
  and start time, an expected output); right after the setup, before the policy's first
  turn, the harness reads them (:func:`read_held`) and removes the directory. The check
  gets each as the environment variable ``HELD_NAME``, which the policy cannot write.
* Before the check, the harness records the session's process table from the host's
  /proc (:func:`session_processes`; nothing in the sandbox is asked) and hands it to the
  check as ``$HELD_PROCESSES``, one ``PID START_TIME COMMAND LINE`` line per live process
  (pid inside the sandbox, start time in clock ticks since boot). Then the session is
  closed: every process it started (background jobs, daemons) is killed, so nothing keeps
  changing the work dir while the check runs and the check sees a settled state. A process
  task checks both what a process did (files it writes on a signal) and which processes
  were still alive at the end (the pids and start times its setup held): "killed the right
  one" differs from "killed everything and edited the log".
* The check: ``spec.check`` runs as ``bash -c <check>`` in a SEPARATE, fresh sandbox
  process (:meth:`Sandbox.run`) over the same work dir, cwd the work dir, with the
  harness's environment (:data:`CHECK_ENV`: ``HOME`` outside the work dir, a system-only
  ``PATH``, no Python user site, ``PYTHONSAFEPATH``, no global or system git config, git
  settings that run programs pinned off). Functions, aliases, variables, dotfiles, ``.pth``
  files or ``~/.local/bin`` programs the policy left cannot fake the check. A task whose
  check runs the policy's own program sets ``Task.meta["check_runs_policy_files"]``
  (:data:`RUNS_POLICY_FILES`): its check keeps the script dir on ``sys.path``.
  Before it, when the work dir holds git metadata, :mod:`envs.terminal_git` vets it in the
  same sandbox and environment: a repository whose own config, info files, attributes or
  index could change what git reports (or run a program during the check) is refused, and
  the episode scores 0.0 without running the check (the output names each reason).
  If the episode filled its capped storage, it scores 0.0 (``storage limit hit``). Its result: exit status 0 -> ``1.0``;
  otherwise, if the last non-empty stdout line parses as a float in ``[0, 1]``, that
  value (partial credit: print it and exit non-zero); otherwise ``0.0``. A check that
  times out (``check_timeout_s``) scores 0.0.
* The final step's ``info`` is ``{"reward": float, "passed": bool, "check_output": str,
  "check_exit_code": int | None, "end": <why>, "turns": n}``; other steps' ``info`` is
  ``{"exit_code": int | None, "timed_out": bool, "turns": n}``.
* ``close()`` kills everything the session started and removes the work dir
  (idempotent). Stepping before ``reset`` or after the episode ended raises
  ``RuntimeError``.

Safety: policy output only ever runs inside a bubblewrap sandbox (``sandbox="bwrap"``,
the only mode accepted). When bubblewrap cannot run here the constructor raises
:class:`~envs.sandbox.SandboxUnavailable`; there is no fallback to running unsandboxed.
Scoring for the recipe lives in :mod:`rewards.terminal`.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import shutil
import stat
import time
from pathlib import Path
from typing import Any

from envs.sandbox import (
    Limits,
    Sandbox,
    SandboxUnavailable,
    ShellResult,
    ShellSession,
    ShellSessionError,
    check_sandbox,
)
from envs.sandbox.base import SANDBOX_PATH
from envs.sandbox.config import SandboxConfig
from envs.sandbox.events import shell_status_events
from envs import terminal_git
from envs.types import Message, Task

__all__ = [
    "DONE_MARKER",
    "SHELL_LANGS",
    "SYSTEM_PROMPT",
    "TerminalEnv",
    "extract_command",
    "parse_action",
    "parse_check_result",
    "truncate_output",
    "SandboxUnavailable",
    "HELD_DIR",
    "HELD_PREFIX",
    "PROCESS_TABLE",
    "read_held",
    "reference_problems",
    "session_processes",
    "check_env",
]

DONE_MARKER = "DONE"
SHELL_LANGS = ("", "bash", "sh", "shell", "console", "zsh")

SYSTEM_PROMPT = (
    "You are working in a Linux terminal (bash). Your current directory is your work directory; "
    "it is also $HOME.\n"
    "Each of your turns must contain exactly ONE shell command, in a fenced code block like:\n"
    "```bash\nls -la\n```\n"
    "The command runs and you receive its exit code and output. The shell keeps its state between "
    "turns (current directory, variables, background jobs). Do not use interactive programs (editors, "
    "pagers): write files with redirections, heredocs, sed or python3. There is no network access.\n"
    "When the task is complete, reply with a line containing only DONE."
)

_OPEN_RE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^`]*$")
_CLOSE_RE = re.compile(r"^[ \t]*```[ \t]*$")

_SETUP_TIMEOUT_S = 60.0
# The vetting script runs inside the check's sandbox, which does not see the harness's files.
_VET_SOURCE = Path(terminal_git.__file__).read_text(encoding="utf-8")
RUNS_POLICY_FILES = "check_runs_policy_files"  # Task.meta flag: the check runs a program the policy wrote

# Values the harness holds for the check, out of the policy's reach (see the module docstring).
HELD_DIR = ".jointrl-held"  # where the setup writes them ($JOINTRL_HELD); gone before the policy's turn
HELD_PREFIX = "HELD_"  # the check reads value NAME as $HELD_NAME
PROCESS_TABLE = "PROCESSES"  # $HELD_PROCESSES: the session's process table, recorded before it is closed
_HELD_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
_HELD_MAX_BYTES = 65536
_HELD_MAX_FILES = 32

# The check's environment comes from the harness, never from the work dir the policy wrote:
# HOME outside every writable place (no dotfiles, no ~/.local/bin, no user site-packages),
# no user site, no script-dir/cwd on sys.path, no global/system git config, and git settings
# that would run programs (fsmonitor, hooks, pagers, editors, ssh) pinned off. PATH holds
# system directories only, all read-only inside the sandbox.
_GIT_PINS = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("core.sshCommand", "false"),
    ("status.showUntrackedFiles", "normal"),
    ("sequence.editor", "false"),
    ("credential.helper", ""),
    # Files named by config that change what git reports: a policy-set excludes file would hide
    # untracked files from `git status`, an attributes file would assign filter/diff drivers.
    ("core.excludesFile", "/dev/null"),
    ("core.attributesFile", "/dev/null"),
    # The untracked cache is index state the policy wrote; gc would rewrite the repo mid-check.
    ("core.untrackedCache", "false"),
    ("gc.auto", "0"),
    # A bare repository is used only when named (--git-dir): git does not discover one from the
    # check's working directory, so a work dir (or subdirectory) the policy made into a bare
    # repository with its own config is never the repository a check's `git status` reads.
    ("safe.bareRepository", "explicit"),
)
CHECK_ENV = {
    "HOME": "/nonexistent",
    "PATH": SANDBOX_PATH,
    "XDG_CONFIG_HOME": "/nonexistent",
    "PYTHONNOUSERSITE": "1",
    "PYTHONSAFEPATH": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_NO_REPLACE_OBJECTS": "1",  # refs/replace/* would swap the objects a check reads
    "GIT_OPTIONAL_LOCKS": "0",  # a check's `git status` does not rewrite the index
    "GIT_CONFIG_COUNT": str(len(_GIT_PINS)),
    **{f"GIT_CONFIG_KEY_{i}": k for i, (k, _) in enumerate(_GIT_PINS)},
    **{f"GIT_CONFIG_VALUE_{i}": v for i, (_, v) in enumerate(_GIT_PINS)},
}


def check_env(runs_policy_files: bool = False, work_dir: str | None = None) -> dict[str, str]:
    """The environment a check runs with (see :data:`CHECK_ENV`). A task whose check runs the
    policy's own program (``runs_policy_files``) keeps the script dir / cwd on ``sys.path``
    (``python3 -m unittest test_calc`` must import the policy's module). ``work_dir`` (the
    check's working directory inside the sandbox) sets ``GIT_CEILING_DIRECTORIES`` to its
    parent: git discovers repositories in the work dir and below, all of them vetted, and never
    one in a directory above it."""
    env = dict(CHECK_ENV)
    if runs_policy_files:
        del env["PYTHONSAFEPATH"]
    if work_dir is not None:
        env["GIT_CEILING_DIRECTORIES"] = posixpath.dirname(posixpath.normpath(work_dir)) or "/"
    return env


def _pidfd_pid(pidfd: int) -> int | None:
    """The pid (in this process's namespace) behind ``pidfd``, from /proc/self/fdinfo."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        return None
    return None


def session_processes(pidfd: int | None) -> list[tuple[int, int, str]]:
    """The live processes of a sandbox, read from the host's /proc (nothing in the sandbox is
    asked, so nothing the policy runs can shape the answer): ``(pid inside the sandbox, start
    time in clock ticks since boot, command line with NULs as spaces)`` for each process in the
    PID namespace of the process behind ``pidfd`` (the sandbox's PID 1), zombies left out,
    sorted by pid. A pid with its start time names one process: a later process that reuses
    the pid has another start time."""
    pid = None if pidfd is None else _pidfd_pid(pidfd)
    if pid is None:
        return []
    try:
        ns = os.stat(f"/proc/{pid}/ns/pid")
    except OSError:
        return []
    table = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{name}/ns/pid")
            if (st.st_ino, st.st_dev) != (ns.st_ino, ns.st_dev):
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
            with open(f"/proc/{name}/status", "rb") as f:
                nspid = next(ln for ln in f if ln.startswith(b"NSpid:")).split()[-1]
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, StopIteration):
            continue  # gone meanwhile
        fields = raw[raw.rfind(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X"):
            continue
        cmd = cmdline.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
        table.append((int(nspid), int(fields[19]), cmd))
    return sorted(table)


def read_held(task_id: str, held_dir: str) -> dict[str, str]:
    """The values a setup left in ``held_dir`` (:data:`HELD_DIR`) as the check's environment
    (``HELD_<name>``). Each is a regular file named ``[A-Za-z0-9_]{1,64}`` of at most 64 KiB
    of text without NUL, at most 32 of them, never ``PROCESSES``; anything else is the
    setup's bug and raises ``RuntimeError`` naming the task and the file."""
    held: dict[str, str] = {}
    if not os.path.lexists(held_dir):
        return held
    if not stat.S_ISDIR(os.lstat(held_dir).st_mode):
        raise RuntimeError(f"terminal task {task_id!r}: setup: ${HELD_DIR} is not a directory")
    names = sorted(os.listdir(held_dir))
    if len(names) > _HELD_MAX_FILES:
        raise RuntimeError(f"terminal task {task_id!r}: setup held {len(names)} values (at most {_HELD_MAX_FILES})")
    for name in names:
        path = os.path.join(held_dir, name)
        st = os.lstat(path)
        why = None
        if not _HELD_NAME.fullmatch(name) or name == PROCESS_TABLE:
            why = f"the name is not [A-Za-z0-9_]{{1,64}} or is the reserved {PROCESS_TABLE!r}"
        elif not stat.S_ISREG(st.st_mode) or st.st_size > _HELD_MAX_BYTES:
            why = f"not a regular file of at most {_HELD_MAX_BYTES} bytes"
        else:
            with open(path, "rb") as f:
                data = f.read(_HELD_MAX_BYTES + 1)
            if b"\0" in data:
                why = "holds a NUL byte (it goes into the check's environment)"
            held[HELD_PREFIX + name] = data.decode("utf-8", "replace")
        if why:
            raise RuntimeError(f"terminal task {task_id!r}: setup held value {name!r}: {why}")
    return held


# A word of a setup or check that names a work-dir file (relative, with an extension or a leading dot).
_FILE_WORD = re.compile(r"(?<![\w$./-])(?:\.[\w-]|[\w-]+[./])[\w./-]*")
# Names that mark a file as a value the check compares against.
_REFERENCE_HINT = re.compile(r"sha\d*|md5|checksum|digest|expected|reference|token|secret|answer.?key", re.I)


def reference_problems(task: Task) -> list[str]:
    """Why ``task``'s check reads a reference value from the work dir, where the policy can
    rewrite it (empty: no such sign). The rule (what ``jointrl validate`` enforces): the check
    names a relative file the setup also names, and the file's name is hidden (``.token``;
    ``.git*`` excepted) or marks a reference (``sha256``, ``md5``, ``checksum``, ``expected``,
    ``reference``, ``token``, ``secret``...). Such a value belongs in ``$JOINTRL_HELD/NAME``
    (read by the check as ``$HELD_NAME``); see the module docstring."""
    spec = task.terminal
    if spec is None:
        return []
    shared = set(_FILE_WORD.findall(spec.check)) & set(_FILE_WORD.findall(spec.setup))
    out = []
    for word in sorted(shared):
        name = word.rstrip("/").rsplit("/", 1)[-1]
        hidden = name.startswith(".") and not name.startswith(".git") and name.strip(".")
        if hidden or _REFERENCE_HINT.search(name):
            out.append(
                f"task {task.id!r}: field 'terminal.check' reads {word!r}, which its setup writes in the work dir, "
                "where the policy can rewrite it: have the setup write the value to $JOINTRL_HELD/<name> and "
                "the check read $HELD_<name>"
            )
    return out


def parse_action(text: str, done_marker: str = DONE_MARKER) -> tuple[str, str | None]:
    """Classify one assistant turn: ``("command", cmd)``, ``("done", None)`` or ``("invalid", None)``.

    Rules, in order:

    1. The first fenced block whose language tag is empty or a shell
       (:data:`SHELL_LANGS`) gives the command: its body, stripped, ``$ `` prompt removed
       from a single-line body. A block without a closing fence runs to the end of the
       text. A body that is empty or exactly ``done_marker`` means done. Text outside the
       block is ignored (a ``DONE`` line after a command block does not end the episode;
       the command runs and the policy says ``DONE`` on its next turn).
    2. Without such a block: a line that is exactly ``done_marker`` (after stripping
       whitespace) means done; so does a turn with no non-blank text.
    3. Otherwise a turn that is one non-blank line is the command (``$ `` and wrapping
       single backticks stripped; it is done if nothing is left).
    4. Anything else (several lines of prose, or only non-shell code blocks) is invalid.
    """
    if not isinstance(text, str):
        raise TypeError(f"action must be a str, got {type(text).__name__}")
    text = text.replace("\r\n", "\n")
    block = _first_shell_block(text)
    if block is not None:
        cmd = block.strip("\n").rstrip()
        if cmd.strip() and "\n" not in cmd.strip():
            cmd = _strip_prompt(cmd.strip())
        if not cmd.strip() or cmd.strip() == done_marker:
            return "done", None
        return "command", cmd
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines or done_marker in lines:
        return "done", None
    if "```" in text or len(lines) > 1:
        return "invalid", None
    cmd = _strip_prompt(lines[0])
    if len(cmd) >= 2 and cmd[0] == "`" and cmd[-1] == "`" and "`" not in cmd[1:-1]:
        cmd = cmd[1:-1].strip()
    if not cmd or cmd == done_marker:
        return "done", None
    return "command", cmd


def _first_shell_block(text: str) -> str | None:
    """The body of the first fenced block tagged as shell (or untagged); None when there is none.

    Fences pair up in order (a closing fence is never read as an opening one); a block
    without a closing fence runs to the end of the text.
    """
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _OPEN_RE.match(lines[i])
        if m is None:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not _CLOSE_RE.match(lines[j]):
            j += 1
        if m.group(1).lower() in SHELL_LANGS:
            return "\n".join(lines[i + 1 : j])
        i = j + 1
    return None


def _strip_prompt(line: str) -> str:
    if line == "$":
        return ""
    return line[2:].strip() if line.startswith("$ ") else line


def extract_command(text: str, done_marker: str = DONE_MARKER) -> str | None:
    """The shell command of one assistant turn, or ``None`` when the turn runs no command.

    ``None`` covers a finished turn (the done marker, or an empty command) and a turn
    with no recognisable command; :func:`parse_action` tells the two apart (the env
    ends the episode on the first and answers a format reminder on the second).
    """
    kind, cmd = parse_action(text, done_marker)
    return cmd if kind == "command" else None


def truncate_output(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters: its head and tail around an omission note."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[len(text) - tail :]}"


def parse_check_result(exit_code: int | None, stdout: str, timed_out: bool = False) -> float:
    """The reward of a check run: 1.0 on exit 0, else a last-line float in [0, 1], else 0.0."""
    if timed_out:
        return 0.0
    if exit_code == 0:
        return 1.0
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if lines:
        try:
            value = float(lines[-1])
        except ValueError:
            return 0.0
        if math.isfinite(value) and 0.0 <= value <= 1.0:
            return value
    return 0.0


class TerminalEnv:
    """A sandboxed bash session per episode, scored by the task's check. See the module docstring.

    ``max_turns``: assistant turns before the episode is truncated (and checked).
    ``command_timeout_s``: wall-clock limit of one command. ``output_chars``: the most
    characters of a command's output shown to the policy. ``sandbox``: only ``"bwrap"``.
    ``done_marker``: the line that ends the episode. ``check_timeout_s``: wall-clock
    limit of the check. ``limits``: resource limits of the session's processes.
    ``stdin``: what the policy's commands read, ``"null"`` (``/dev/null``) or ``"terminal"`` (the tty).
    """

    def __init__(
        self,
        max_turns: int = 8,
        command_timeout_s: float = 10.0,
        output_chars: int = 2000,
        sandbox: str = "bwrap",
        *,
        done_marker: str = DONE_MARKER,
        check_timeout_s: float = 30.0,
        limits: Limits | None = None,
        sandbox_config: SandboxConfig | dict | None = None,
        stdin: str = "null",
    ) -> None:
        if sandbox != "bwrap":
            raise ValueError(
                f"TerminalEnv runs policy commands only in a bubblewrap sandbox: sandbox must be "
                f"'bwrap', got {sandbox!r}"
            )
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an int >= 1, got {max_turns!r}")
        if not command_timeout_s > 0 or not check_timeout_s > 0:
            raise ValueError("command_timeout_s and check_timeout_s must be > 0")
        if not isinstance(output_chars, int) or output_chars < 16:
            raise ValueError(f"output_chars must be an int >= 16, got {output_chars!r}")
        if not done_marker or not done_marker.strip() or "\n" in done_marker:
            raise ValueError(f"done_marker must be a non-empty single line, got {done_marker!r}")
        if stdin not in ("null", "terminal"):
            raise ValueError(f"stdin must be 'null' or 'terminal', got {stdin!r}")
        check_sandbox()  # SandboxUnavailable here, not in the middle of a rollout
        self.sandbox_config = SandboxConfig.coerce(sandbox_config)
        self.max_turns = max_turns
        self.command_timeout_s = float(command_timeout_s)
        self.output_chars = output_chars
        self.sandbox = sandbox
        self.done_marker = done_marker.strip()
        self.check_timeout_s = float(check_timeout_s)
        self.stdin = stdin
        self.limits = limits or Limits(
            cpu_seconds=60, wall_seconds=self.command_timeout_s, output_bytes=max(65536, 8 * output_chars)
        )
        self._task: Task | None = None
        self._box: Sandbox | None = None
        self._session: ShellSession | None = None
        self._done = True
        self._turns = 0
        self._used_s = 0.0
        self._events: list[str] = []
        self._held: dict[str, str] = {}

    # -- episode -----------------------------------------------------------------------

    def reset(self, task: Task) -> list[Message]:
        spec = task.terminal
        if spec is None:
            raise ValueError(
                f"task {task.id!r} (domain {task.domain!r}) has no terminal spec; TerminalEnv needs "
                "task.terminal (setup, check)"
            )
        if not task.messages:
            raise ValueError(f"task {task.id!r} has no messages")
        self._release()
        self._task = task
        self._turns = 0
        self._used_s = 0.0
        self._events = []
        self._held = {}
        try:
            # The Sandbox owns (and on close removes) the work dir; the session and the check
            # both run over it.
            self._box = Sandbox(None, self.limits, self.sandbox, config=self.sandbox_config)
            self._session = ShellSession(self._box.work_dir, self.limits, self.sandbox)
            if spec.setup.strip():
                self._run_setup(task)
        except BaseException:
            self._release()
            self._task = None
            raise
        self._done = False
        return list(task.messages)

    def _run_setup(self, task: Task) -> None:
        """Run the setup in the session; take the values it held (``$JOINTRL_HELD``) out of the
        work dir before the policy's first turn (see :func:`read_held`)."""
        assert self._session is not None and self._box is not None and task.terminal is not None
        spec = task.terminal
        held_inner = posixpath.join(self._box.inner_work_dir, HELD_DIR)
        setup = f'(\nset -e\nexport JOINTRL_HELD={held_inner}\nmkdir -p "$JOINTRL_HELD"\n{spec.setup}\n) </dev/null'
        res = self._session.run(setup, timeout=max(_SETUP_TIMEOUT_S, spec.time_limit_s))
        if res.timed_out or res.exit_code != 0 or not self._session.alive:
            why = "timed out" if res.timed_out else f"exit code {res.exit_code}"
            raise RuntimeError(
                f"terminal task {task.id!r}: setup failed ({why}); its output:\n{truncate_output(res.output, 4000)}"
            )
        held_host = os.path.join(self._box.work_dir, HELD_DIR)
        self._held = read_held(task.id, held_host)
        shutil.rmtree(held_host, ignore_errors=True)
        if os.path.lexists(held_host):
            raise RuntimeError(f"terminal task {task.id!r}: setup: {HELD_DIR} could not be removed")

    def step(self, action: str) -> tuple[list[Message], bool, bool, dict[str, Any]]:
        if self._task is None:
            raise RuntimeError(f"{type(self).__name__}.step() before reset()")
        if self._done:
            raise RuntimeError(f"{type(self).__name__}.step() after the episode ended; call reset() first")
        kind, cmd = parse_action(action, self.done_marker)
        self._turns += 1
        if kind == "done":
            return self._finish([], "done", terminated=True)

        if kind == "invalid":
            obs = [
                Message(
                    "user",
                    f"No command found. Put exactly one shell command in a ```bash block, "
                    f"or reply {self.done_marker} when the task is complete.",
                )
            ]
            info: dict[str, Any] = {"exit_code": None, "timed_out": False, "turns": self._turns, "invalid": True}
        else:
            assert cmd is not None
            timeout = max(0.1, min(self.command_timeout_s, self._time_left_s()))
            try:
                res = self._run_command(cmd, timeout)
            except ShellSessionError as exc:  # dead before this command: end the episode
                obs = [Message("user", f"the shell is gone ({exc})")]
                return self._finish(obs, "shell_dead", truncated=True)
            output = truncate_output(res.output.replace("\r\n", "\n"), self.output_chars)
            if res.timed_out:
                head = f"command timed out after {timeout:g}s (interrupted)"
            else:
                head = f"exit code {res.exit_code}"
            obs = [Message("user", f"{head}\n{output}" if output else head)]
            self._note_events(res)
            info = {"exit_code": res.exit_code, "timed_out": res.timed_out, "turns": self._turns}
            limit = self._limit_hit()
            if limit is not None:
                return self._finish(obs, limit, truncated=True)
            if not self._shell_alive():
                if res.timed_out:
                    return self._finish(obs, "shell_dead", truncated=True)
                return self._finish(obs, "shell_exited", terminated=True)
        if self._time_left_s() <= 0:
            return self._finish(obs, "time_limit", truncated=True)
        if self._turns >= self.max_turns:
            return self._finish(obs, "max_turns", truncated=True)
        return obs, False, False, info

    # Where an episode's commands run; an env over another kind of episode (envs.harbor.env) overrides these.

    def _time_left_s(self) -> float:
        """What is left of the task's time budget (the summed wall time of the policy's commands)."""
        assert self._task is not None and self._task.terminal is not None
        return self._task.terminal.time_limit_s - self._used_s

    def _run_command(self, cmd: str, timeout: float) -> ShellResult:
        """Run one policy command in the session; raises ShellSessionError when the shell is gone."""
        assert self._session is not None
        start = time.monotonic()
        res = self._session.run(cmd, timeout=timeout, stdin=self.stdin)
        self._used_s += time.monotonic() - start
        return res

    def _shell_alive(self) -> bool:
        return self._session is not None and self._session.alive

    def _limit_hit(self) -> str | None:
        """Why the episode must end now whatever the policy does (None here: storage ends a terminal episode at its check)."""
        return None

    def _note_events(self, res) -> None:
        """Record what one command hit (timeouts, limits, seccomp kills, a full storage)."""
        ev = list(shell_status_events(res.exit_code, res.output))
        if res.timed_out:
            ev.append("timeout")
        if res.output_truncated:
            ev.append("output")
        if self._box is not None and self._box.storage is not None and self._box.storage.full():
            ev.append("storage")
        self._events.extend(dict.fromkeys(ev))

    def _finish(
        self, obs: list[Message], end: str, *, terminated: bool = False, truncated: bool = False
    ) -> tuple[list[Message], bool, bool, dict[str, Any]]:
        self._done = True
        reward, passed, output, code = self._run_check()
        if "storage" in self._events:
            cfg = self.sandbox_config
            reward, passed = 0.0, False
            output = (
                f"[storage limit hit: the episode filled its storage (cap {cfg.storage_mb} MiB, "
                f"{cfg.storage_inodes} inodes); the episode fails]\n" + output
            )
        info = {
            "reward": reward,
            "passed": passed,
            "check_output": output,
            "check_exit_code": code,
            "end": end,
            "turns": self._turns,
            "sandbox_events": list(self._events),
        }
        return obs, terminated, truncated, info

    def _run_check(self) -> tuple[float, bool, str, int | None]:
        """Kill the session, then run the check in a fresh sandbox process over the work dir."""
        assert self._task is not None and self._task.terminal is not None and self._box is not None
        procs: list[tuple[int, int, str]] = []
        if self._session is not None:
            procs = session_processes(self._session.init_pidfd)  # before the session is gone
            self._session.close()  # kills every process the policy (or setup) started
            self._session = None
        lim = Limits(
            cpu_seconds=max(10, math.ceil(self.check_timeout_s)),
            memory_mb=self.limits.memory_mb,
            file_size_mb=self.limits.file_size_mb,
            processes=self.limits.processes,
            open_files=self.limits.open_files,
            wall_seconds=self.check_timeout_s,
            output_bytes=65536,
        )
        runs_policy_files = self._task.meta.get(RUNS_POLICY_FILES) is True
        refused = self._vet_git(lim)
        if refused is not None:
            return 0.0, False, truncate_output(refused, 4000), None
        env = {**check_env(runs_policy_files, self._box.inner_work_dir), **self._held}
        env[HELD_PREFIX + PROCESS_TABLE] = "".join(f"{pid} {start} {cmd}\n" for pid, start, cmd in procs)[
            :_HELD_MAX_BYTES
        ]
        res = self._box.run(["bash", "-c", self._task.terminal.check], limits=lim, env=env)
        if "storage" in res.events:
            self._events.append("storage")
        reward = parse_check_result(res.exit_code, res.stdout, res.timed_out)
        output = res.stdout + (
            ("\n" if res.stdout and not res.stdout.endswith("\n") else "") + res.stderr if res.stderr else ""
        )
        if res.timed_out:
            output += f"\n[check timed out after {self.check_timeout_s:g}s]"
        return reward, res.ok, truncate_output(output, 4000), res.exit_code

    def _vet_git(self, lim: Limits) -> str | None:
        """The refusal when the work dir's git metadata could shape a check (see
        :mod:`envs.terminal_git`), else None. The vetting runs in the sandbox with the check's
        environment, and only when the work dir holds git metadata at all (a host-side walk)."""
        assert self._box is not None
        gitdirs, problems = terminal_git.find_git_dirs(self._box.work_dir)
        if not gitdirs and not problems:
            return None
        argv = [self._box.python, "-I", "-S", "-c", _VET_SOURCE, self._box.inner_work_dir, "git"]
        res = self._box.run(argv, limits=lim, env=check_env(work_dir=self._box.inner_work_dir))
        if res.ok:
            return None
        why = res.stdout.strip() or f"git vetting failed (exit {res.exit_code}): {res.stderr.strip()}"
        return f"[the check was not run: the work dir's git metadata could change what git reports]\n{why}"

    def finalize(self) -> dict[str, Any]:
        """The rollout ended the episode before the env did (token or context limit): run the
        check on the state the policy left, so the episode is still scored."""
        if self._task is None or self._done:
            return {}
        return self._finish([], "cut_by_rollout", truncated=True)[3]

    # -- lifecycle ---------------------------------------------------------------------

    def _release(self) -> None:
        session, box = self._session, self._box
        self._session = self._box = None
        try:
            if session is not None:
                session.close()
        finally:
            if box is not None:
                box.close()

    def close(self) -> None:
        """Kill everything the episode started and remove its work dir. Idempotent."""
        self._done = True
        self._release()

    def __enter__(self) -> TerminalEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
