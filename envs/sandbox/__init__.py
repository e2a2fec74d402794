"""Run untrusted, model-generated code in a bubblewrap (``bwrap``) sandbox.

Two entry points: :class:`Sandbox` runs one command (or one Python program) to completion
and returns a :class:`RunResult`; :class:`ShellSession` keeps one interactive
``bash`` alive inside a sandbox and runs commands in it one at a time (cwd, variables and
background jobs persist between commands), as a terminal env needs.

What ``mode="bwrap"`` isolates
------------------------------
* **Identity.** The code runs as uid/gid 65534 (``nobody``) inside, with no capabilities,
  ``no_new_privs`` and nested user namespaces disabled. When the launching process is
  root, each sandbox leases a host uid (and gid) of its own from a pool
  (:mod:`envs.sandbox.uids`; ``SandboxConfig.uid_base``/``uid_count``, unique across the
  host's processes, released on close or when the harness dies), and privileges are
  dropped to it *before* bwrap starts (``setpriv --reuid=<leased> --regid=<leased>
  --clear-groups``); bwrap's user namespace maps 65534 inside to it. Launched as root,
  bwrap would keep host capabilities inside (a read-only bind could be remounted
  read-write) and RLIMIT_NPROC would be ignored. Files the code creates in the work dir are
  owned by the leased uid on the host (:attr:`Sandbox.host_uid`; by the calling user when
  it is not root).
* **Filesystem.** The host root is bind-mounted read-only. Writable: the private work dir
  (mounted at ``/work``, or ``/tmp/work`` on hosts without a ``/work`` directory; also the
  cwd and ``$HOME``), ``/tmp`` and ``/dev/shm``, all three on ONE private tmpfs capped in
  bytes and inodes (:mod:`envs.sandbox.storage`, :class:`~envs.sandbox.config.SandboxConfig`;
  /tmp and /dev/shm are emptied before every launch). ``/root``, ``/home``, ``/run`` and
  the directory that holds every sandbox's storage (whatever ``TMPDIR`` is) are replaced
  by empty read-only tmpfs: no sandbox sees another's files.
* **Kernel surface.** A seccomp filter (:mod:`envs.sandbox.seccomp`, libseccomp through
  ``pyseccomp``) kills keyring, ptrace, perf, bpf, userfaultfd, mount and namespace calls
  and makes io_uring look absent.
  ``/dev`` is a minimal private one (null, zero, random, urandom, tty, pts); ``/proc``
  belongs to the sandbox's own PID namespace (host processes are invisible).
* **Network.** A new network namespace holding only a loopback interface: no outbound
  traffic, no DNS, no host ports (abstract unix sockets are per-namespace too).
* **Processes.** A new PID namespace whose init is bwrap. Everything the code starts,
  daemons that ``setsid``/``nohup`` included, is SIGKILLed when :meth:`Sandbox.run`
  returns or :meth:`ShellSession.close` is called: killing the sandbox's PID 1 kills the
  whole namespace. IPC, UTS (hostname ``sandbox``) and cgroup namespaces are new too.
* **Resources.** rlimits set in the child before bwrap starts (by ``prlimit(1)``, or a
  ``preexec_fn`` where it is missing): RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC,
  RLIMIT_NOFILE, RLIMIT_CORE=0; a wall-clock timeout that kills the whole sandbox; and a
  cap on captured output.

What it does NOT isolate
------------------------
* **The kernel.** The seccomp filter is a deny list and there is no VM: a kernel exploit
  through an allowed syscall escapes.
* **Reads.** Anything world-readable on the host outside the hidden directories is
  readable (``/etc``, ``/usr``, ``/opt``, ``/sys``, ``/proc/sys``, ``/var``...). Keep
  secrets in ``/root``, ``/home`` or ``/run``, or make them unreadable to other users.
  When the launcher is not root the code runs as the calling user (mapped to 65534),
  keeps that user's supplementary groups, and can read whatever that user can read.
* **Disk, without root, where user namespaces are refused.** Without root the capped tmpfs
  is mounted in an unprivileged user + mount namespace (:mod:`envs.sandbox.storage`); only
  where that is refused (or ``unshare``/``nsenter`` are missing) is the work dir on the
  host disk, with RLIMIT_FSIZE capping each file, not the total (a warning is logged).
* **Memory and CPU totals.** RLIMIT_AS and RLIMIT_CPU are per process, so the totals are
  bounded by ``processes`` times those limits, not by a cgroup. RLIMIT_AS also counts
  reserved address space: runtimes that reserve a lot up front (JVM, Go) need a larger
  ``memory_mb``.
* **RLIMIT_NPROC without root.** RLIMIT_NPROC counts per host uid. As root every sandbox
  has its own leased uid, so its ``processes`` budget is its own (a sandbox that forks to
  its limit cannot make another fail to fork). A non-root harness has no uids to lease:
  all its sandboxes run as the caller's uid and share one count; each gets ``processes``
  plus the number of processes that uid already has when it starts.
* **Timing and resource side channels** between sandboxes and the host.
* ``mode="none"`` isolates nothing: only the rlimits, the timeout and the output cap
  apply (as root, RLIMIT_NPROC is not even enforced). It is for trusted code and tests,
  and says so with a warning.

Output floods: output beyond ``Limits.output_bytes`` (per stream) is not stored but the
pipes keep being drained, so a program that prints 50 MB still exits normally with its
real exit code; an endless flood ends at the wall-clock timeout. Memory stays bounded
by the cap.

Reaping: the sandbox's PID 1 is a grandchild of this process. When the outer bwrap exits,
PID 1 is orphaned. Without a reaper it would stay a zombie (many container inits never
reap) and zombies count against RLIMIT_NPROC: sequential runs would fail with "Can't
fork" after about a hundred. So the first sandbox launch makes this process a child
subreaper (``prctl(PR_SET_CHILD_SUBREAPER, 1)``): orphaned sandbox processes are
reparented here, and each run reaps its own PID 1 after collecting the outer bwrap,
through a pidfd opened from bwrap's ``--info-fd`` report and checked against the
reported PID namespace. Nothing is reaped with ``waitpid(-1)``: that could steal the
exit status of children other code in this process spawned. When no pidfd could be
opened, a guarded sweep reaps only zombie children named ``bwrap`` that are not a
live launcher of ours. One side effect: other code's orphaned grandchildren are now
reparented to this process too, and this module does not reap them, so run sandboxes
in a worker process that does not daemonize other programs.


Layout: :mod:`~envs.sandbox.base` (limits, results, errors), :mod:`~envs.sandbox.config`
(:class:`SandboxConfig`, the recipe-level defaults), :mod:`~envs.sandbox.probe`,
:mod:`~envs.sandbox.launch` (bwrap command line and mounts), :mod:`~envs.sandbox.storage`
(capped per-sandbox tmpfs), :mod:`~envs.sandbox.limits` (rlimits) and
:mod:`~envs.sandbox.seccomp`, :mod:`~envs.sandbox.pump` (I/O pump),
:mod:`~envs.sandbox.reap`, :mod:`~envs.sandbox.uids` (host uid leases),
:mod:`~envs.sandbox.core` (:class:`Sandbox`),
:mod:`~envs.sandbox.shell` (:class:`ShellSession`).
"""

from __future__ import annotations

from envs.sandbox.base import Limits, RunResult, SandboxUnavailable, ShellResult, ShellSessionError
from envs.sandbox.config import SandboxConfig
from envs.sandbox.core import Sandbox
from envs.sandbox.probe import check_sandbox
from envs.sandbox.shell import ShellSession

__all__ = [
    "Limits",
    "RunResult",
    "Sandbox",
    "SandboxConfig",
    "SandboxUnavailable",
    "ShellResult",
    "ShellSession",
    "ShellSessionError",
    "check_sandbox",
]
