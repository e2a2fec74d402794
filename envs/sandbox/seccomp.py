"""The seccomp filter every bwrap sandbox gets (built with libseccomp through ``pyseccomp``).

bwrap installs it (``--seccomp FD``) after it has set up the namespaces and mounts and
before it executes the sandboxed program, so it constrains the program and everything the
program starts, and not bwrap's own setup.

* Killed on use (``SCMP_ACT_KILL_PROCESS``, the process dies of SIGSYS, which the run
  reports as signal 31 and :mod:`envs.sandbox.events` counts as ``seccomp``): the
  kernel keyrings (``add_key``, ``keyctl``, ``request_key``: they outlive the sandbox
  and are shared by every process of one uid), ``ptrace`` and ``process_vm_*`` (reading
  another process), ``perf_event_open``, ``bpf``, ``userfaultfd`` (a classic exploit
  primitive), namespace and mount calls (``unshare``, ``setns``, ``mount``, ``umount2``,
  ``pivot_root``, ``open_by_handle_at``...), kernel modules, ``kexec_*``, ``reboot``,
  ``swapon``/``swapoff``, ``acct``, ``quotactl``, ``syslog``.
* Refused with ``ENOSYS`` (the call looks absent, so runtimes fall back quietly):
  ``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``. Such refusals are not
  counted: a runtime probing for io_uring is normal.
* Any other architecture's syscall ABI (32-bit ``int 0x80`` on x86-64) kills the process
  (libseccomp's bad-arch action), so the lists cannot be bypassed through compat calls.

What it does NOT do: it is a deny list over a default-allow policy, not an allow list;
a kernel bug in an allowed syscall is still reachable.
"""

from __future__ import annotations

import errno
import os
import threading

__all__ = ["ENOSYS_SYSCALLS", "KILLED_SYSCALLS", "SIGSYS", "filter_bpf", "seccomp_fd"]

SIGSYS = 31
KILLED_SYSCALLS = (
    "add_key",
    "keyctl",
    "request_key",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "perf_event_open",
    "bpf",
    "userfaultfd",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_by_handle_at",
    "name_to_handle_at",
    "fsopen",
    "fsmount",
    "fsconfig",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "lookup_dcookie",
    "fanotify_init",
    "iopl",
    "ioperm",
)
ENOSYS_SYSCALLS = ("io_uring_setup", "io_uring_enter", "io_uring_register")

_lock = threading.Lock()
_bpf: bytes | None = None


def filter_bpf() -> bytes:
    """The compiled BPF program (built once per process)."""
    global _bpf
    with _lock:
        if _bpf is None:
            _bpf = _build()
        return _bpf


def _build() -> bytes:
    import pyseccomp as sc  # a ctypes binding of the system libseccomp

    filt = sc.SyscallFilter(sc.ALLOW)
    for name in KILLED_SYSCALLS:
        try:
            filt.add_rule(sc.KILL_PROCESS, name)
        except (ValueError, RuntimeError, OSError) as exc:  # a syscall this arch does not have
            if not _unknown(exc):
                raise
    for name in ENOSYS_SYSCALLS:
        filt.add_rule(sc.ERRNO(errno.ENOSYS), name)
    r, w = os.pipe()
    try:
        # export_bpf writes to a file object; a pipe avoids a temp file. The program is a few KiB,
        # far below the pipe buffer, so the write cannot block.
        with os.fdopen(w, "wb", closefd=True) as fw:
            filt.export_bpf(fw)
        w = -1
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def _unknown(exc: Exception) -> bool:
    return "syscall" in str(exc).lower() or isinstance(exc, ValueError)


def seccomp_fd() -> int:
    """A fresh fd (a memfd at position 0) holding the BPF program, for bwrap ``--seccomp``.

    One fd per launch: bwrap reads it to the end, so launches cannot share one offset.
    The caller passes it to the child and closes it.
    """
    data = filter_bpf()
    fd = os.memfd_create("jointrl-seccomp", 0)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
