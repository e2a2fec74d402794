"""The learner process's memory as the C allocator sees it, and handing freed memory back to the OS.

On CPU, torch allocates tensors through the C library's ``malloc`` (there is no caching allocator
as on CUDA). glibc keeps what is freed: blocks below its mmap threshold (which rises, up to
32 MiB, each time a larger mmapped block is freed) live in arenas (one per thread that
allocates, so torch's intra-op threads get their own) and go back to the OS only when the top of
an arena is free. A learner step allocates and frees gigabytes of activations of every size, so
its resident memory grows after each step although the live tensors do not
(bench/RESULTS.md, "learner_memory: resident memory over a run"). ``trim()`` calls glibc's
``malloc_trim(0)``, which returns the free pages of every arena (``MADV_DONTNEED``) without
moving live blocks; the learner calls it after each step.

``stats()`` reads glibc's ``mallinfo2`` (bytes in use by live blocks vs free but held), for the
memory bench. Elsewhere (musl, macOS) both are no-ops: ``trim()`` returns False, ``stats()`` None.
This module does not change allocator settings (``mallopt``, ``MALLOC_*`` env vars).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

__all__ = ["trim", "stats", "rss_bytes", "available"]


class _Mallinfo2(ctypes.Structure):
    # struct mallinfo2 (glibc >= 2.33): every field a size_t
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc loaded in this process, or None where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def available() -> bool:
    """Whether ``trim`` does anything here (a glibc process)."""
    lib = _libc()
    return lib is not None and hasattr(lib, "malloc_trim")


def trim() -> bool:
    """Return the allocator's free pages to the OS (glibc ``malloc_trim(0)``); False where it is not glibc."""
    if not available():
        return False
    _libc().malloc_trim(0)  # its result (1: memory was released) says nothing about how much: not used
    return True


def stats() -> dict[str, int] | None:
    """glibc's view of the heap in bytes: ``in_use`` (live blocks, arenas + mmapped), ``free_held`` (freed,
    still held in arenas), ``mmapped``; None where ``mallinfo2`` is missing (not glibc, or glibc < 2.33)."""
    lib = _libc()
    if lib is None or not hasattr(lib, "mallinfo2"):
        return None
    lib.mallinfo2.restype = _Mallinfo2
    m = lib.mallinfo2()
    return {"in_use": m.uordblks + m.hblkhd, "free_held": m.fordblks, "mmapped": m.hblkhd}


def rss_bytes() -> int:
    """This process's resident memory now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
