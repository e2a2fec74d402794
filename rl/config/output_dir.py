"""The output dir of a run: whether it is writable with room for checkpoints, and whether it holds a run.

``check_output_dir`` (at validate time) writes a probe file, compares the free space with the
checkpoints the run keeps, and applies ``output_dir_problem``: the rule ``validate`` and ``train``
share for a dir that already holds a run (resume it, replace it, or refuse). ``newest_checkpoint``,
``holds_run`` and ``STOPPED_FILE`` are what the driver and the CLI read of a run folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from rl.config.loading import Fail, resolve_path
from rl.config.schema import Recipe

__all__ = [
    "STOPPED_FILE",
    "check_output_dir",
    "newest_checkpoint",
    "holds_run",
    "output_dir_problem",
    "checkpoint_bytes_estimate",
    "resolve_output_dir",
]


def check_output_dir(recipe: Recipe, fail: Fail) -> None:
    """``run.output_dir`` is writable, has room for the kept checkpoints, and may be used (``output_dir_problem``)."""
    out = resolve_output_dir(recipe)
    probe = out
    while not probe.exists():
        probe = probe.parent
    try:
        if not probe.is_dir():
            raise NotADirectoryError(str(probe))
        # A real write, not os.access: root passes access checks on read-only or virtual file systems.
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError:
        fail("run.output_dir", f"not writable: {out} ({probe} is not a writable folder)")
    need = checkpoint_bytes_estimate(recipe) * (max(recipe.run.keep_checkpoints, 1) + 1) + 64 * 2**20
    free = shutil.disk_usage(probe).free
    if free < need:
        fail(
            "run.output_dir",
            f"only {free / 2**20:.0f} MiB free under {probe}; checkpoints (model + optimizer, "
            f"run.keep_checkpoints={recipe.run.keep_checkpoints} kept, one being written) and logs "
            f"need about {need / 2**20:.0f} MiB",
        )
    problem = output_dir_problem(recipe)
    if problem is not None:
        fail("run.output_dir", problem)


# Written into the output dir by a run that stopped on a signal or an error (``rl.driver.recovery``):
# JSON with its status (interrupted | crashed), its last finished step and checkpoint, and the reason.
STOPPED_FILE = "STOPPED"


def newest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint (``checkpoints/step_N`` with its ``step.json``, written last), if any."""
    ck = out / "checkpoints"
    done = sorted(p for p in ck.glob("step_*") if (p / "step.json").is_file()) if ck.is_dir() else []
    return done[-1] if done else None


def written_unpublished(out: Path) -> list[Path]:
    """``checkpoints/.step_N.tmp`` folders whose learner write ended (``dcp/.complete``) with the driver's part
    written (``driver.json``): complete but for ``step.json`` and the rename, which a resume does
    (``rl.driver.checkpoints.publish_finished``)."""
    ck = out / "checkpoints"
    tmps = sorted(ck.glob(".step_*.tmp")) if ck.is_dir() else []
    return [p for p in tmps if (p / "dcp" / ".complete").is_file() and (p / "driver.json").is_file()]


def holds_run(out: Path) -> bool:
    """Whether ``out`` holds a previous run's metrics or checkpoints."""
    ck = out / "checkpoints"
    return (out / "metrics.jsonl").exists() or (ck.is_dir() and any(ck.iterdir()))


def output_dir_problem(recipe: Recipe) -> str | None:
    """Why ``jointrl train`` would refuse ``run.output_dir``, or None; ``validate`` and ``train`` share this rule.

    A dir holding a run is taken by ``run.resume=auto`` when it has a complete checkpoint (continue
    from it) or when that run stopped on a signal or an error (``STOPPED``) before its first
    checkpoint (start again, its log lines kept in ``*.discarded.jsonl``); ``run.overwrite`` replaces
    it. Anything else (a run killed before its first checkpoint, or one still running) is refused.
    """
    out, r = resolve_output_dir(recipe), recipe.run
    if r.overwrite or not holds_run(out):
        return None
    if r.resume != "auto":
        return (
            f"{out} already holds a run; set run.resume=auto to continue it, run.overwrite=true "
            "to replace it, or choose another run.output_dir"
        )
    if newest_checkpoint(out) is not None or written_unpublished(out) or (out / STOPPED_FILE).is_file():
        return None
    return (
        f"{out} already holds a run with no checkpoint to resume from (run.resume=auto) and no record that it "
        "stopped (it may still be running, or was killed before its first checkpoint); set run.overwrite=true "
        "to replace it, or choose another run.output_dir"
    )


# Weights file bytes per parameter -> checkpoint bytes per parameter (fp32 master weights + AdamW's
# two fp32 moments = 12 bytes/param) is at most 6x the file (bf16 files: 2 bytes/param).
_CKPT_PER_FILE_BYTE = 6
_EMBEDDED_WEIGHT_BYTES = {
    "embedded:smollm2-135m-instruct": 270 * 2**20,
    "embedded:tiny": 4 * 2**20,
    "embedded:tiny-moe": 6 * 2**20,
}


def checkpoint_bytes_estimate(recipe: Recipe) -> int:
    """An upper estimate of one checkpoint's size, from the model's weight files (0 if unknown)."""
    mp = recipe.model.path
    if mp in _EMBEDDED_WEIGHT_BYTES:
        return _CKPT_PER_FILE_BYTE * _EMBEDDED_WEIGHT_BYTES[mp]
    folder = resolve_path(recipe, mp)
    size = (
        sum(f.stat().st_size for pat in ("*.safetensors", "*.bin") for f in folder.glob(pat)) if folder.is_dir() else 0
    )
    return _CKPT_PER_FILE_BYTE * size


def resolve_output_dir(recipe: Recipe) -> Path:
    """The output dir: relative paths are relative to the current directory (where the user runs jointrl)."""
    return Path(os.path.expanduser(recipe.run.output_dir)).resolve()
