"""Resource limits: rlimits applied before bwrap starts."""

from __future__ import annotations

import math
import os
import resource

from envs.sandbox.base import _MiB, Limits


def _rlimit_values(limits: Limits, nproc_base: int) -> list[tuple[str, int, int, int]]:
    """(prlimit option, resource, soft, hard), clamped to the current hard limits when not root."""
    cpu = max(1, math.ceil(limits.cpu_seconds))
    wanted = [
        ("cpu", resource.RLIMIT_CPU, cpu, cpu + 1),
        ("as", resource.RLIMIT_AS, limits.memory_mb * _MiB, limits.memory_mb * _MiB),
        ("fsize", resource.RLIMIT_FSIZE, limits.file_size_mb * _MiB, limits.file_size_mb * _MiB),
        ("nproc", resource.RLIMIT_NPROC, limits.processes + nproc_base, limits.processes + nproc_base),
        ("nofile", resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        ("core", resource.RLIMIT_CORE, 0, 0),
    ]
    if os.geteuid() == 0:
        return wanted
    out = []
    for opt, res, soft, hard in wanted:
        _, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        out.append((opt, res, soft, hard))
    return out


def _limit_launcher(prlimit: str | None, values: list[tuple[str, int, int, int]]):
    """(argv prefix, preexec_fn): prlimit(1) when available (keeps subprocess on vfork)."""
    if prlimit:
        return [prlimit, *(f"--{opt}={soft}:{hard}" for opt, _, soft, hard in values), "--"], None
    pairs = [(res, (soft, hard)) for _, res, soft, hard in values]

    def preexec() -> None:
        for res, val in pairs:
            resource.setrlimit(res, val)

    return [], preexec
