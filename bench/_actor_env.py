"""Run a bench script with the malloc a learner actor gets (``learner.allocator``).

``LD_PRELOAD`` is read when a process starts, so a bench that measures what a learner actor does
(``bench/learner_floor.py``, ``bench/learner_memory.py``) re-executes itself once, with the same
arguments, when its ``--allocator`` (default ``auto``: jemalloc where ``libjemalloc.so.2`` is
installed, as ``rl.trainer.memory.process_env`` gives a learner actor) differs from the preload it
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


def with_allocator(choice: str, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with the preload of ``choice`` (``auto``, ``jemalloc``, ``system``)."""
    sys.path.insert(0, str(ROOT))
    from rl.trainer.memory import process_env

    if choice not in ("auto", "jemalloc", "system"):
        raise SystemExit(f"--allocator: {choice!r} (choose auto, jemalloc, system)")
    env = dict(environ)
    want = process_env(huge_pages=False, allocator=choice, environ=environ).get("LD_PRELOAD")
    rest = " ".join(p for p in environ.get("LD_PRELOAD", "").split() if "jemalloc" not in p)
    env.pop("LD_PRELOAD", None)
    if want or rest:
        env["LD_PRELOAD"] = want or rest
    return env


def reexec_with_allocator(argv: list[str] | None = None) -> None:
    """Re-execute this script under ``--allocator``'s preload unless it already runs under it."""
    argv = sys.argv[1:] if argv is None else argv
    env = with_allocator(allocator_arg(argv), dict(os.environ))
    if env.get("LD_PRELOAD") == os.environ.get("LD_PRELOAD") or os.environ.get(_GUARD):
        return
    env[_GUARD] = "1"
    os.execve(sys.executable, [sys.executable, sys.argv[0], *argv], env)
