"""Choosing the learner's compute precision by measurement (``learner.precision: auto``).

Hosts of one kind differ: on one CPU bf16 autocast ran 2-2.7x faster than fp32, on another
(avx512_bf16 without AMX) bf16 matmuls ran at 56% of fp32's speed (docs in
/work/shared/reference/machine-notes.md). ``pick(device)`` times the same square matmul in
fp32 and under bf16 autocast for about a second in all and returns the faster, with the
measured rates, for the learner to log. On CUDA it returns bf16 without timing (every GPU the
recipes target runs bf16 at least as fast). This module does not change any global state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

__all__ = ["Choice", "matmul_gflops", "pick"]


@dataclass(frozen=True)
class Choice:
    autocast: bool  # bf16 autocast (True) or fp32 (False)
    fp32_gflops: float  # measured rates (0 when not measured)
    bf16_gflops: float

    def describe(self) -> str:
        pick = "bf16 autocast" if self.autocast else "fp32"
        if not self.fp32_gflops:
            return f"precision auto: {pick} (not timed on this device)"
        return (
            f"precision auto: {pick} (matmul fp32 {self.fp32_gflops:.0f} GFLOP/s, bf16 {self.bf16_gflops:.0f} GFLOP/s)"
        )


def matmul_gflops(dtype: torch.dtype, n: int = 1024, seconds: float = 0.4, device: str = "cpu") -> float:
    """Rate of ``n x n`` matmuls in ``dtype`` (bf16: under autocast from fp32 inputs, as the learner runs),
    best of repeated timings for about ``seconds``."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    bf16 = dtype == torch.bfloat16

    def once() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            (a @ b).sum().item()

    once()  # warm-up: kernel selection, first-touch pages
    best = float("inf")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def pick(device: torch.device, seconds: float = 0.4) -> Choice:
    """The faster of fp32 and bf16 autocast on ``device`` (see the module docstring)."""
    if device.type == "cuda":
        return Choice(True, 0.0, 0.0)
    fp32 = matmul_gflops(torch.float32, seconds=seconds)
    bf16 = matmul_gflops(torch.bfloat16, seconds=seconds)
    return Choice(bf16 > fp32, fp32, bf16)
