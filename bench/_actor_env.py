"""Run a bench script with the malloc a learner actor gets (``learner.allocator``).

``LD_PRELOAD`` is read when a process starts, so a bench that measures what a learner actor does
(``bench/learner_floor.py``, ``bench/learner_memory.py``) re-executes itself once, with the same
arguments, when its ``--allocator`` (default ``auto``: as ``rl.trainer.memory.process_env`` gives a
learner actor, jemalloc where ``libjemalloc.so.2`` is installed unless the learner runs fp32, which the
script's ``--autocast`` says or, for ``auto``, a timing of this host) differs from the preload it
started with. Call it before torch is imported. It does not set ``THP_MEM_ALLOC_ENABLE`` (each
script does, read at torch's first allocation).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_GUARD = "_JOINTRL_BENCH_ALLOCATOR"  # set in the re-executed process: never a second exec


def allocator_arg(argv: list[str]) -> str:
    """The value of ``--allocator`` in ``argv`` (``auto`` when absent)."""
    for i, a in enumerate(argv):
        if a == "--allocator" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--allocator="):
            return a.split("=", 1)[1]
    return "auto"


def fp32_learner(autocast: str) -> bool:
    """Whether a learner with ``--autocast`` ``on`` / ``off`` / ``auto`` computes in fp32 (``auto``: this host's
    timing, ``rl.trainer.precision.pick``, as a run's ``learner.precision: auto``)."""
    if autocast != "auto":
        return autocast == "off"
    sys.path.insert(0, str(ROOT))
    import torch

    from rl.trainer.precision import pick

    return not pick(torch.device("cpu")).autocast


def with_allocator(choice: str, environ: dict[str, str], fp32: bool = False) -> dict[str, str]:
    """``environ`` with the preload of ``choice`` (``auto``, ``jemalloc``, ``system``) for a learner that
    computes in fp32 or not (``auto`` follows it, ``rl.trainer.memory.resolve_allocator``)."""
    sys.path.insert(0, str(ROOT))
    from rl.trainer.memory import process_env

    if choice not in ("auto", "jemalloc", "system"):
        raise SystemExit(f"--allocator: {choice!r} (choose auto, jemalloc, system)")
    env = {**environ, **process_env(huge_pages=False, allocator=choice, environ=environ, fp32=fp32)}
    if env.get("LD_PRELOAD") == "":  # nothing left to preload
        del env["LD_PRELOAD"]
    return env


def autocast_arg(argv: list[str], default: str) -> str:
    """The script's ``--autocast`` in ``argv``: its value (``on``, ``off``, ``auto``), ``on`` for a bare flag,
    ``default`` when absent."""
    for i, a in enumerate(argv):
        if a.startswith("--autocast="):
            return a.split("=", 1)[1]
        if a == "--autocast":
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            return nxt if nxt in ("on", "off", "auto") else "on"
    return default


def reexec_with_allocator(argv: list[str] | None = None, autocast_default: str = "auto") -> None:
    """Re-execute this script under ``--allocator``'s preload unless it already runs under it; ``auto``
    follows the precision the script's learner will run (``--autocast``, else ``autocast_default``)."""
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get(_GUARD):  # the re-executed process: no second exec, and no second precision timing
        return
    choice = allocator_arg(argv)
    fp32 = fp32_learner(autocast_arg(argv, autocast_default)) if choice == "auto" else False
    env = with_allocator(choice, dict(os.environ), fp32)
    if env.get("LD_PRELOAD") == os.environ.get("LD_PRELOAD"):
        return
    env[_GUARD] = "1"
    os.execve(sys.executable, [sys.executable, sys.argv[0], *argv], env)
