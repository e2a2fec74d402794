"""The learner process's memory as the C allocator sees it, and handing freed memory back to the OS.

On CPU, torch allocates tensors through the C library's ``malloc`` (there is no caching allocator
as on CUDA). glibc keeps what is freed: blocks below its mmap threshold (which rises, up to
32 MiB, each time a larger mmapped block is freed) live in arenas (one per thread that
allocates, so torch's intra-op threads get their own) and go back to the OS only when the top of
an arena is free; blocks above it are mmapped fresh and unmapped when freed, so every tensor of
32 MiB or more (a micro-batch's logits, a weight's bf16 copy, a vocabulary-sized gradient) is paid
for in page faults each time it is allocated. A learner step allocates and frees gigabytes of
activations of every size, so its resident memory grows after each step although the live tensors
do not (bench/RESULTS.md, "learner_memory: resident memory over a run").

jemalloc (``libjemalloc.so.2``, loaded into a learner actor with ``LD_PRELOAD`` when
``learner.allocator`` resolves to it, ``learner_env``) reuses freed pages of
every size within a step instead (faster under bf16 autocast, not in fp32: ``resolve_allocator``);
``jemalloc_path`` finds the library, ``allocator`` says which allocator this process runs.

``trim()`` hands the free pages back to the OS without moving live blocks: glibc's
``malloc_trim(0)``, or jemalloc's ``arena.<all>.purge``. The learner calls it after loading its models.
After a step it either trims too (``learner.hold_memory: false``: between steps, while the engines
generate, it holds only its live tensors, and the next step faults every page in again) or holds
(``hold()``, the default): glibc is told never to give a block its own mapping nor to hand back the
heap's free top, so a step's allocations reuse the pages the previous step freed: the step pays a small
fraction of the page faults and runs faster, at the price of resident memory between steps up to the
step's peak (bench/RESULTS.md, "Holding a step's memory"). jemalloc already reuses
freed pages within a process; its decay returns those that stay unused for 10 s, and ``hold()`` leaves
it alone. What glibc holds can fragment into growth without bound (a block kept live, carved from the
front of a freed one, sends the next block of that size to the heap's top): ``HoldBudget`` trims after a
step that ends above 1.25x the level the run settled at. ``stats()`` reads the allocator's counters
(bytes in live blocks vs free but held), for the memory bench. Elsewhere (musl, macOS) all three are
no-ops: ``trim()`` and ``hold()`` return False, ``stats()`` None. This module sets no ``MALLOC_*``
environment variables: ``hold()`` calls ``mallopt`` in the running process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
from typing import Any

__all__ = [
    "trim",
    "hold",
    "HoldBudget",
    "stats",
    "rss_bytes",
    "available",
    "allocator",
    "jemalloc_path",
    "resolve_allocator",
    "process_env",
    "learner_env",
]

# Where distributions put jemalloc's shared library (Debian/Ubuntu: libjemalloc2; Fedora/RHEL: jemalloc).
_JEMALLOC_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
# jemalloc's MALLCTL_ARENAS_ALL: "arena.4096.purge" purges every arena.
_ARENAS_ALL = 4096


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


def jemalloc_path() -> str | None:
    """The path of ``libjemalloc.so.2`` on this machine (what ``LD_PRELOAD`` takes), or None."""
    if platform.system() != "Linux":
        return None
    for d in _JEMALLOC_DIRS:
        path = os.path.join(d, "libjemalloc.so.2")
        if os.path.exists(path):
            return path
    name = ctypes.util.find_library("jemalloc")  # e.g. a conda or custom prefix in the loader's cache
    return name if name and name.endswith(".so.2") else None


def resolve_allocator(allocator: str, fp32: bool = False) -> str:
    """``learner.allocator`` made concrete: ``jemalloc`` or ``system``. ``auto`` is jemalloc where it is
    installed, unless the learner computes in fp32 (``fp32``): there glibc. jemalloc made the learner step
    faster only under bf16 autocast; in fp32 it was slower than glibc side by side and held more memory after
    the step (bench/RESULTS.md, "The learner step on jemalloc" and "An fp32 host")."""
    if allocator == "auto":
        return "jemalloc" if jemalloc_path() is not None and not fp32 else "system"
    return allocator


def process_env(
    huge_pages: bool = True, allocator: str = "auto", environ: dict[str, str] | None = None, fp32: bool = False
) -> dict[str, str]:
    """The environment variables that give a new process these memory settings (``learner.huge_pages``,
    ``learner.allocator``, resolved with ``fp32`` by ``resolve_allocator``; ``learner_env``
    says why each); ``environ`` (default ``os.environ``) supplies a preload already set, which stays after
    jemalloc. A jemalloc in that preload is dropped when the process is to run glibc's malloc: a new process
    inherits its parent's ``LD_PRELOAD`` (Ray's workers the driver's), so leaving the variable out would not
    be enough."""
    env = {"THP_MEM_ALLOC_ENABLE": "1"} if huge_pages else {}
    allocator = resolve_allocator(allocator, fp32)
    lib = jemalloc_path() if allocator == "jemalloc" else None
    if allocator == "jemalloc" and lib is None:  # validate_recipe says so before anything starts
        raise RuntimeError("learner.allocator: jemalloc, but libjemalloc.so.2 is not installed on this machine")
    have = (os.environ if environ is None else environ).get("LD_PRELOAD", "").split()
    rest = [p for p in have if "jemalloc" not in p]
    if lib is not None:
        env["LD_PRELOAD"] = " ".join([lib, *rest])
    elif len(rest) < len(have):  # an inherited jemalloc: set the preload without it (may be empty)
        env["LD_PRELOAD"] = " ".join(rest)
    return env


@functools.cache
def _jemalloc() -> ctypes.CDLL | None:
    """This process's jemalloc (its ``mallctl``), when jemalloc is the process's ``malloc`` (preloaded)."""
    try:
        proc = ctypes.CDLL(None)
        proc.mallctl  # noqa: B018  (a symbol lookup: present only where jemalloc is loaded)
    except (OSError, AttributeError):
        return None
    proc.mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    proc.mallctl.restype = ctypes.c_int
    return proc


def allocator() -> str:
    """Which ``malloc`` this process runs: ``"jemalloc"``, ``"glibc"`` or ``"other"``."""
    if _jemalloc() is not None:
        return "jemalloc"
    return "glibc" if _libc() is not None else "other"


def available() -> bool:
    """Whether ``trim`` does anything here (jemalloc, or a glibc process)."""
    if _jemalloc() is not None:
        return True
    lib = _libc()
    return lib is not None and hasattr(lib, "malloc_trim")


def trim() -> bool:
    """Return the allocator's free pages to the OS (jemalloc's purge of every arena, or glibc's
    ``malloc_trim(0)``); False where neither is the process's allocator."""
    je = _jemalloc()
    if je is not None:
        return je.mallctl(f"arena.{_ARENAS_ALL}.purge".encode(), None, None, None, 0) == 0
    if not available():
        return False
    _libc().malloc_trim(0)  # its result (1: memory was released) says nothing about how much: not used
    return True


# mallopt(3) parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def hold() -> bool:
    """Make glibc keep what this process frees for its next allocations: ``mallopt(M_MMAP_MAX, 0)`` (no block
    gets a mapping of its own, which is unmapped when freed and faulted in afresh the next time: every
    tensor above the mmap threshold, up to 32 MiB, each time it is allocated) and ``M_TRIM_THRESHOLD`` at
    its maximum (the heap's free top is never handed back; ``trim()`` still does). Blocks mapped before
    the call stay mapped until freed. False (nothing done) where glibc is not the process's malloc: jemalloc
    reuses freed pages anyway."""
    lib = _libc()
    if allocator() != "glibc" or not hasattr(lib, "mallopt"):
        return False
    # mallopt takes an int; glibc converts it to size_t, so -1 is the largest threshold there is.
    return bool(lib.mallopt(_M_MMAP_MAX, 0)) and bool(lib.mallopt(_M_TRIM_THRESHOLD, -1))


class HoldBudget:
    """Bounds what ``hold()`` keeps, one call per learner step.

    glibc reuses a freed block only for a request that fits in it. A block that stays live after a large
    one was freed (a tensor kept past the step, a buffer allocated in between) can be carved from the front
    of the free block; the next request of the same size then goes to the heap's top, onto fresh pages,
    and under such a pattern the resident memory grows by one block per step without bound
    (the pattern of tests/test_allocator.py; the free blocks stay counted as held). ``after_step(rss)``
    takes the resident memory after a step: the largest of the first ``settle`` steps is the level a run
    holds; a step that ends above ``slack`` times it calls ``trim()`` (the free pages go back to the OS,
    the next step faults in what it needs) and the level is read again after the next step, so a run
    whose batches grew for real holds the new level from then on. It does not prevent the pattern; it
    caps what the pattern costs at ``slack`` times the level plus one step's growth."""

    def __init__(self, slack: float = 1.25, settle: int = 2):
        if slack < 1 or settle < 1:
            raise ValueError(f"HoldBudget: slack {slack} must be >= 1 and settle {settle} >= 1")
        self.slack, self.settle = slack, settle
        self.level = 0  # bytes
        self._reading = settle  # steps left whose resident memory sets the level

    def after_step(self, rss: int) -> bool:
        """Trim if ``rss`` (bytes, after a step) is above the budget; True when it trimmed."""
        if self._reading:
            self.level, self._reading = max(self.level, rss), self._reading - 1
            return False
        if rss <= self.slack * self.level:
            return False
        trim()
        self.level, self._reading = 0, 1
        return True


def _je_size(je: ctypes.CDLL, name: str) -> int:
    value, size = ctypes.c_size_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
    if je.mallctl(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        raise OSError(f"jemalloc mallctl({name!r}) failed")
    return value.value


def stats() -> dict[str, int] | None:
    """The allocator's view of the heap in bytes: ``in_use`` (live blocks), ``free_held`` (freed, still
    held), ``mmapped``; glibc's ``mallinfo2`` or jemalloc's ``stats.*`` counters; None where neither
    is available (not glibc, glibc < 2.33, a jemalloc built without statistics)."""
    je = _jemalloc()
    if je is not None:
        epoch = ctypes.c_uint64(1)  # writing the epoch refreshes the counters
        je.mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))
        try:
            allocated, resident, mapped = (_je_size(je, f"stats.{k}") for k in ("allocated", "resident", "mapped"))
        except OSError:
            return None
        return {"in_use": allocated, "free_held": max(resident - allocated, 0), "mmapped": mapped}
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


def learner_env(learner: Any, model_cfg: Any = None) -> dict[str, str]:
    """Environment variables of a learner actor's process for the recipe's ``learner`` section.

    ``learner.huge_pages``: ``THP_MEM_ALLOC_ENABLE=1``, which torch's CPU allocator reads once, at its
    first allocation, to ``madvise(MADV_HUGEPAGE)`` every block of 2 MB or more. A learner step allocates
    and frees gigabytes (activations, vocabulary-sized logits, gradients); when the learner hands freed
    pages back to the OS after each step (``learner.hold_memory: false``, ``trim``), with
    4 KB pages the next step faults them all in again, page by page; huge pages cut those faults by orders of
    magnitude (bench/RESULTS.md). It must be set before the process imports torch, hence in the actor's environment. The kernel uses huge
    pages only where ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` or ``always``;
    elsewhere it is a no-op.

    ``learner.allocator``: ``jemalloc`` (or ``auto`` where ``libjemalloc.so.2`` is installed) puts jemalloc
    first in ``LD_PRELOAD`` (before any preload already set), so it is the process's ``malloc`` from its
    start (this module's docstring: why it is faster here). ``LD_PRELOAD`` is read when the process starts,
    hence again the actor's environment. ``system`` sets the preload without a jemalloc the actor would
    otherwise inherit from the driver's environment. ``auto`` follows the learner's precision
    (``model_cfg.autocast``, concrete once ``rl.trainer.precision.resolve`` ran): glibc for an fp32 learner
    (``resolve_allocator`` says why).
    """
    fp32 = model_cfg is not None and not getattr(model_cfg, "autocast", True)
    return process_env(getattr(learner, "huge_pages", True), getattr(learner, "allocator", "auto"), fp32=fp32)
