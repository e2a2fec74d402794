"""``jointrl export RUN_DIR [--out DIR] [--step N] [--dtype D]``: a run's policy as a Hugging Face model folder.

Writes ``config.json``, ``model.safetensors`` (or shards), the generation config and the
tokenizer into ``DIR`` (default ``RUN_DIR/export/step_N``) in dtype ``D`` (default: the run's
``model.engine_dtype``, what its engines served), from the newest complete checkpoint
(``RUN_DIR/checkpoints/step_N`` with its ``step.json``) or step ``N``. The weights come from the
checkpoint's ``dcp/`` (``torch.distributed.checkpoint``; one learner or N sharded ones), on top of
the run's base model (``model.path`` of ``RUN_DIR/recipe.resolved.yaml``, resolved as at train
time: embedded, local, or the Hub cache); with LoRA (``learner.lora``) the adapters are merged
(``rl.trainer.learner.policy_from_checkpoint``). The folder loads in transformers and vLLM
(tests/test_export.py). It is written into a temporary folder and renamed, so a failed export
leaves nothing half-written; an existing non-empty ``DIR`` is refused.

Only a run's last checkpoint holds ``model/`` (the HF folder, written by the learner at the run's end);
``checkpoint_model`` gives ``jointrl eval`` and ``score`` a checkpoint's HF folder: its ``model/``, else its
export in ``RUN_DIR/export/step_N``, written on first use (see there why not into the checkpoint).

Bad input (no run dir, no checkpoint, no step N, a checkpoint without ``dcp/``, an unreadable
recipe) exits with code 2 and one message naming the file. This module does not train and does
not start Ray.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "export_run", "ExportError", "find_checkpoint", "checkpoint_model", "run_of_checkpoint"]

DTYPES = ("bfloat16", "float32", "float16")


class ExportError(Exception):
    """Bad input for ``jointrl export``; the message names the file and is for the user as is."""


def add_parser(sub: Any) -> None:
    """Add ``jointrl export RUN_DIR [--out DIR] [--step N] [--dtype D]`` to ``jointrl``'s subparsers."""
    p = sub.add_parser(
        "export",
        help="write a run's policy (final or step N) as a Hugging Face model folder",
        description="Write the policy of a run's checkpoint (full, sharded or LoRA-merged) as a Hugging Face "
        "folder (config, safetensors, tokenizer) that transformers and vLLM load.",
    )
    p.add_argument("run_dir", help="a run's output dir (holds checkpoints/ and recipe.resolved.yaml)")
    p.add_argument("--out", help="folder to write (default: RUN_DIR/export/step_N); must not hold files")
    p.add_argument("--step", type=int, help="the checkpoint of step N (default: the newest complete one)")
    p.add_argument(
        "--dtype", choices=DTYPES, help="weights dtype (default: the run's model.engine_dtype; bfloat16 for auto)"
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(run=run_export)


def run_export(args: argparse.Namespace) -> int:
    try:
        out = export_run(args.run_dir, args.out, args.step, args.dtype)
    except (ExportError, OSError) as e:
        if getattr(args, "debug", False):
            raise
        print(f"jointrl: error: {e}", file=sys.stderr)
        return 2
    print(f"exported: {out}")
    return 0


def find_checkpoint(run_dir: Path, step: int | None) -> tuple[Path, int]:
    """(checkpoint folder, step): step ``step``, or the newest complete one; ``ExportError`` naming the folder."""
    ck = run_dir / "checkpoints"
    done = sorted(p for p in ck.glob("step_*") if (p / "step.json").is_file()) if ck.is_dir() else []
    if not done:
        raise ExportError(
            f"{ck}: no checkpoint (no step_N/step.json): the run has written none yet "
            "(a run checkpoints every run.save_every steps and at its end)"
        )
    if step is None:
        path = done[-1]
    else:
        path = ck / f"step_{step:06d}"
        if path not in done:
            have = ", ".join(str(int(json.loads((p / "step.json").read_text())["step"])) for p in done)
            raise ExportError(f"{path}: no complete checkpoint of step {step} (steps with one: {have})")
    return path, int(json.loads((path / "step.json").read_text())["step"])


def _run_model(run_dir: Path) -> tuple[str, Any, str]:
    """(resolved base model folder, learner.lora, the HF export's dtype: ``model.engine_dtype``, bfloat16 for
    auto) from ``RUN_DIR/recipe.resolved.yaml``."""
    import yaml

    from rl.config.fields import FieldError, build
    from rl.driver.runtime import export_dtype
    from rl.config.recipe import LoraConfig, ModelConfig
    from rl.trainer.hub import resolve_model

    f = run_dir / "recipe.resolved.yaml"
    if not f.is_file():
        raise ExportError(f"{f}: not found (the run's recipe names its base model)")
    try:
        raw = yaml.safe_load(f.read_text()) or {}
        model = build(ModelConfig, raw.get("model") or {}, "model")
        lora_cfg = build(LoraConfig, (raw.get("learner") or {}).get("lora") or {}, "learner.lora")
    except (yaml.YAMLError, FieldError) as e:
        raise ExportError(f"{f}: {e}") from e
    src = raw.get("source") or ""
    try:
        base = resolve_model(model.path, Path(src).parent if src else None, model.revision)
    except FileNotFoundError as e:
        raise ExportError(f"{f}: model.path: {e}") from e
    return base, lora_cfg, export_dtype(model.engine_dtype)


def export_run(
    run_dir: str | Path, out: str | Path | None = None, step: int | None = None, dtype: str | None = None
) -> Path:
    """Write the policy of ``run_dir``'s checkpoint (newest, or ``step``) as an HF folder in ``dtype`` (None: the
    run's engine dtype); return the folder."""
    import torch

    from rl.trainer.learner import policy_from_checkpoint

    rd = Path(run_dir)
    if not rd.is_dir():
        raise ExportError(f"{rd}: not a run dir (no such folder)")
    ck, n = find_checkpoint(rd, step)
    dest = Path(out) if out else rd / "export" / f"step_{n:06d}"
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ExportError(f"{dest}: exists and is not empty; choose another --out or remove it")
    base, lora_cfg, engine_dtype = _run_model(rd)
    dtype = dtype or engine_dtype
    try:
        model = policy_from_checkpoint(ck, base, lora_cfg)
    except FileNotFoundError as e:
        raise ExportError(str(e)) from e
    except (RuntimeError, ValueError) as e:  # dcp: keys or shapes that do not match the run's model
        raise ExportError(f"{ck / 'dcp'}: does not match the run's model {base} (learner.lora as recorded): {e}") from e
    model.to(getattr(torch, dtype))  # save_pretrained records it as config.json "dtype"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        _tokenizer(ck, base).save_pretrained(tmp)
        if dest.exists():
            dest.rmdir()  # empty (checked above)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _tokenizer(ck: Path, base: str) -> Any:
    """The tokenizer the run trained with: the checkpoint's copy (``model/``), else the base model's (the learner
    trains with the base's tokenizer as it is)."""
    from transformers import AutoTokenizer

    saved = ck / "model"
    return AutoTokenizer.from_pretrained(saved if (saved / "tokenizer_config.json").is_file() else base)


def tokenizer_folder(path: Path) -> str | None:
    """The folder of the tokenizer a run trained with, for a checkpoint dir, its ``model/`` (which only the run's
    last checkpoint has) or a run dir (its newest checkpoint): the checkpoint's ``model/`` where it has one, else
    the run's base model (``_tokenizer``); None where ``path`` is none of those; ``ExportError`` for a run dir
    without a complete checkpoint. Nothing is exported: a tokenizer needs no weights."""
    if path.name == "model" and not (path / "config.json").is_file():
        path = path.parent
    ck = path if (path / "step.json").is_file() else None
    if ck is None and (path / "checkpoints").is_dir():
        ck = find_checkpoint(path, None)[0]  # a run dir: its newest complete checkpoint (ExportError: none)
    run = run_of_checkpoint(ck) if ck is not None else None
    if ck is None or run is None:
        return None
    if (ck / "model" / "tokenizer_config.json").is_file():
        return str(ck / "model")
    return _run_model(run)[0]


def run_of_checkpoint(ck: Path) -> Path | None:
    """The run dir of checkpoint folder ``ck`` (``RUN_DIR/checkpoints/step_N``), or None outside one."""
    return ck.parent.parent if ck.parent.name == "checkpoints" else None


def checkpoint_model(ck: Path, say: Any = None) -> Path:
    """The HF folder of checkpoint ``ck`` (``RUN_DIR/checkpoints/step_N``): its ``model/`` where the learner wrote
    one (a run's last checkpoint), else ``RUN_DIR/export/step_N``, exported from ``ck``'s ``dcp/`` now if it is
    not there yet (``say``: called with a line for the user first). Raises ``ExportError`` naming the command to
    run where that cannot be done.

    Not into ``ck`` itself: a live run publishes checkpoint folders by renaming them whole and removes the old
    ones (``run.keep_checkpoints``), so a folder written into one races with that and vanishes with it;
    ``RUN_DIR/export/step_N`` is where ``jointrl export`` writes by default, so the two share one copy."""
    if (ck / "model" / "config.json").is_file():
        return ck / "model"
    run = run_of_checkpoint(ck)
    if run is None or not (ck / "step.json").is_file():
        raise ExportError(
            f"{ck}: no model/ (the HF export is written at a run's end) and not a complete checkpoint of a run dir "
            "(RUN_DIR/checkpoints/step_N with step.json), so it cannot be exported here"
        )
    step = int(json.loads((ck / "step.json").read_text())["step"])
    dest = run / "export" / f"step_{step:06d}"
    cmd = f"jointrl export {run} --step {step}"
    if (dest / "config.json").is_file():
        if (dest / "config.json").stat().st_mtime < (ck / "step.json").stat().st_mtime:
            raise ExportError(
                f"{dest}: an export older than checkpoint {ck} (the step was written again since); remove it and "
                f"run: {cmd}"
            )
        return dest
    if say is not None:
        say(f"{ck} has no model/ (only a run's last checkpoint has one); exporting it into {dest} ({cmd})")
    try:
        return export_run(run, dest, step)
    except (ExportError, OSError) as e:
        raise ExportError(f"{ck}: no model/, and exporting it failed ({e}); run: {cmd} [--out DIR]") from e
