"""Choosing the learner's compute precision by measurement (``learner.precision: auto``).

Which precision is faster depends on the CPU's matmul units, not on its vendor or family: bf16 autocast
is well ahead of fp32 where bf16 matmuls run natively (AMX, avx512_bf16), far behind where the CPU has no
bf16 instructions (bench/RESULTS.md, the learner_floor sections and "An fp32 host"), and it can be behind
where the instructions exist but its bf16 matmuls are slow. ``pick(device)`` times the same square matmul
in fp32 and under bf16 autocast for about a second in all and returns the faster, with the measured rates,
for the learner to log. bf16 is first timed on a small 256^3 product: far below fp32 there (a CPU without
bf16 instructions), that settles it without a 1024^3 bf16 product, which is slow on such a CPU and would
dominate the start-up timing (bench/RESULTS.md, "An fp32 host", "The precision timing at start").
On CUDA it returns bf16 without timing (every GPU the recipes target runs bf16 at least as fast). The timing runs once per process and device
(``timed_choice`` is cached): what the learner and the engines follow is one measurement.

``resolve(recipe, device)`` is what a runtime calls at start-up, before any learner or engine
exists: with ``learner.precision: auto`` and/or ``model.engine_dtype: auto`` on a CPU run it times
once (on the driver's host) and returns the recipe with both made concrete: the learner's
``model.autocast`` (and ``learner.precision: manual``, so the learners do not time again), the
engines' dtype and the KL reference's (``auto``: bfloat16 when bf16 autocast won, else float32),
plus the line to log. On a GPU run
``engine_dtype: auto`` is bfloat16 and the learners' own ``auto`` stays (bf16, untimed). On CPU with
``learner.precision: manual``, ``engine_dtype: auto`` is bfloat16, untimed (nothing times
the precision for the engines alone).

This module changes no global state besides its cache.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Choice", "matmul_gflops", "pick", "timed_choice", "resolve", "resolve_logged", "reference_dtype"]


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
    best of repeated timings for about ``seconds``, after one untimed warm-up product.

    At least one product after the warm-up is timed, whatever the budget: the first product pays one-time
    costs (kernel selection and code generation, first-touch pages) that can exceed the 256^3 probe's whole
    budget (seconds / 8), and a rate read from it alone could put a fast bf16 path 8x below fp32 and pin fp32.
    """
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    bf16 = dtype == torch.bfloat16

    def once() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            (a @ b).sum().item()

    once()  # warm-up, untimed
    best = float("inf")
    end = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() >= end:
            return 2 * n**3 / best / 1e9


def pick(device: torch.device, seconds: float = 0.4) -> Choice:
    """The faster of fp32 and bf16 autocast on ``device`` (see the module docstring)."""
    if device.type == "cuda":
        return Choice(True, 0.0, 0.0)
    return timed_choice(device.type, seconds)


@functools.cache
def timed_choice(device_type: str, seconds: float = 0.4) -> Choice:
    """``pick``'s timing, once per process and (device type, seconds); ``timed_choice.cache_clear()`` forgets it."""
    fp32 = matmul_gflops(torch.float32, seconds=seconds, device=device_type)
    # A CPU without bf16 instructions runs a bf16 1024^3 product orders of magnitude below fp32, so timing it
    # would dominate the start-up. A 256^3 product (64x less work) first: far below fp32 (with the margin
    # small sizes need), it settles the choice (bench/RESULTS.md, "The precision timing at start").
    probe = matmul_gflops(torch.bfloat16, n=256, seconds=seconds / 8, device=device_type)
    if probe < fp32 / _PROBE_MARGIN:
        return Choice(False, fp32, probe)
    bf16 = matmul_gflops(torch.bfloat16, seconds=seconds, device=device_type)
    return Choice(bf16 > fp32, fp32, bf16)


# How far below fp32's 1024^3 rate a 256^3 bf16 product must be to decide without the 1024^3 one. Small
# products run somewhat below large ones (fewer flops per load; under autocast, the casts), but only by a few
# percent in fp32 (bench/RESULTS.md, "The precision timing at start"). A bf16 path worth choosing is not 8x
# below at 256^3.
_PROBE_MARGIN = 8.0


def resolve(recipe: Any, device: str) -> tuple[Any, str]:
    """(``recipe`` with ``learner.precision``/``model.engine_dtype`` ``auto`` made concrete, a log line or "").

    ``device``: the run's resolved ``cpu`` | ``gpu`` (``rl.driver.placement.resolve_device``). See the module
    docstring for the rules; a recipe without ``auto`` comes back unchanged.
    """
    model, lcfg = recipe.model, recipe.learner
    if device == "gpu":
        if model.engine_dtype != "auto":
            return recipe, ""
        return dataclasses.replace(recipe, model=dataclasses.replace(model, engine_dtype="bfloat16")), (
            "engine_dtype auto: bfloat16 (GPU)"
        )
    learner_auto, engine_auto = lcfg.precision == "auto", model.engine_dtype == "auto"
    if not (learner_auto or engine_auto):
        return recipe, ""
    if not learner_auto:  # the learner's precision is set by hand: no timing, the engines run bf16
        model = dataclasses.replace(model, engine_dtype="bfloat16")
        return dataclasses.replace(recipe, model=model), "engine_dtype auto: bfloat16 (learner.precision manual)"
    choice = pick(torch.device("cpu"))
    model = dataclasses.replace(model, autocast=choice.autocast)
    notes = [choice.describe()]
    dtype = "bfloat16" if choice.autocast else "float32"
    if engine_auto:
        model = dataclasses.replace(model, engine_dtype=dtype)
        notes.append(f"engine_dtype auto: {dtype}")
    if model.reference_dtype == "auto":  # the KL reference runs at the learner's precision
        ref = reference_dtype("auto", cuda=False, autocast=choice.autocast)
        model = dataclasses.replace(model, reference_dtype=ref)
        notes.append(f"reference_dtype auto: {ref}")
    learner = dataclasses.replace(lcfg, precision="manual")  # the learners follow this timing, untimed
    return dataclasses.replace(recipe, model=model, learner=learner), "; ".join(notes)


def reference_dtype(setting: str, cuda: bool, autocast: bool) -> str:
    """``model.reference_dtype`` made concrete: ``auto`` is bfloat16 on GPU or under bf16 autocast, else
    float32 (a bf16 reference on a CPU without fast bf16 matmuls is the slowest pass of a step)."""
    if setting != "auto":
        return setting
    return "bfloat16" if cuda or autocast else "float32"


def resolve_logged(recipe: Any, device: str) -> Any:
    """``resolve``, with its line (if any) printed once as ``jointrl: ...`` on stderr (stdout is the commands'
    output: ``jointrl eval`` prints its JSON summary there): what the runtimes call at start-up."""
    recipe, note = resolve(recipe, device)
    if note:
        print(f"jointrl: {note}", file=sys.stderr, flush=True)
    return recipe
