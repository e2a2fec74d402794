"""The run's output directory and its checkpoints: prepare (fresh, overwrite or resume), write, rotate, restore.

A checkpoint is ``checkpoints/step_NNNNNN``: the learner's state (written by the runtime's
``save``) and the driver's (``driver.json``: the mixer's draw state, the reward normalizer's
statistics, the episode stream's in-flight draw) and ``step.json``, written last, which marks
it complete. The learner writes its sharded state asynchronously (``rl.trainer.checkpoint``): with
``write_checkpoint(..., wait=False)`` the folder stays ``.step_NNNNNN.tmp`` (pending) while training goes on,
and is published (``step.json``, then the rename) once the learner says its write ended (``dcp/.complete``):
by ``publish_written`` after a step, the next checkpoint, ``finish_pending`` when the run stops, or
``prepare_output_dir`` on a resume; a folder whose write was cut (a kill)
has no ``dcp/.complete``, is never published and is removed. This module does not start actors or train; the
runtime is given to it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rl.config.recipe import (
    STOPPED_FILE,
    Recipe,
    newest_checkpoint,
    output_dir_problem,
    recipe_to_dict,
    resolve_output_dir,
)
from rl.config.output_dir import written_unpublished

# Everything a run writes into its output dir that a later run could mistake for its own: an
# overwrite removes all of it (``checkpoints/`` above all: ``run.resume=auto`` would resume it, and
# rotation would sort the old run's steps with the new run's). ``.live.json`` stays: it names the
# shared memory of a killed driver, which the next start frees (rl.driver.recovery.free_dead_run).
RUN_FILES = (
    "metrics.jsonl",
    "rollouts.jsonl",
    "metrics.discarded.jsonl",
    "rollouts.discarded.jsonl",
    "DONE",
    "placement.json",
    "recipe.resolved.yaml",
    "eval_failures.jsonl",
    "wandb_run_id",  # rl.driver.logger.WANDB_ID_FILE: a new run gets a new W&B run
    STOPPED_FILE,
    "crash.log",
)
RUN_DIRS = ("checkpoints", "wandb", "stacks")


class RunAborted(RuntimeError):
    """The run cannot go on (e.g. too many skipped updates in a row); outputs so far are kept."""


def prepare_output_dir(cfg: Recipe) -> tuple[Path, Path | None]:
    """Create the output dir; return it and the checkpoint to resume from (``run.resume=auto``).

    Resuming from step S keeps the metrics and rollouts of steps <= S and moves the lines of
    later steps (logged after the last checkpoint, and about to be redone) to
    ``*.discarded.jsonl``, so nothing computed is lost and the logs hold each step once. A run
    that stopped (``STOPPED``: a signal or an error) before its first checkpoint starts again
    from step 1 under ``run.resume=auto``, every line of it moved to ``*.discarded.jsonl``.
    Other dirs holding a run are refused unless ``run.overwrite`` (``output_dir_problem``, the
    rule ``jointrl validate`` checks too). A run that starts afresh removes every output of the old
    run (``RUN_FILES``, ``RUN_DIRS``), also of one that stopped before logging a step.
    """
    out = resolve_output_dir(cfg)
    problem = output_dir_problem(cfg)
    if problem is not None:
        raise FileExistsError(problem)
    if cfg.run.resume == "auto":
        publish_finished(out)
    resume_from = latest_checkpoint(out) if cfg.run.resume == "auto" else None
    if resume_from is not None or (cfg.run.resume == "auto" and (out / STOPPED_FILE).is_file()):
        step = json.loads((resume_from / "step.json").read_text())["step"] if resume_from is not None else -1
        for name in ("metrics", "rollouts"):
            split_log(out / f"{name}.jsonl", out / f"{name}.discarded.jsonl", step)
        for name in ("DONE", STOPPED_FILE):
            (out / name).unlink(missing_ok=True)
    else:
        # A fresh start: run.overwrite (output_dir_problem refused other dirs holding a run), or a dir whose last
        # run logged no step (it stopped at start-up): either way nothing of an earlier run may stay beside this
        # one (its STOPPED and crash.log would describe this run as crashed once it is killed).
        remove_run(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.resolved.yaml").write_text(_yaml(recipe_to_dict(cfg)))
    return out, resume_from


def remove_run(out: Path) -> None:
    """Remove every output of the run in ``out`` (``run.overwrite``); files of the user's stay."""
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)
        if (out / name).exists():
            raise OSError(f"run.overwrite: could not remove {out / name} of the previous run")


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint (``checkpoints/step_N`` with its ``step.json``), if any."""
    return newest_checkpoint(out)


# checkpoints dir -> (tmp folder, step) of the checkpoint whose learner write is still in flight (this process)
_PENDING: dict[Path, tuple[Path, int]] = {}
COMPLETE = "dcp/.complete"  # rl.trainer.checkpoint.DONE_FILE: the learner's sharded state is all on disk


def write_checkpoint(
    runtime: Any,
    out: Path,
    step: int,
    keep: int,
    driver_state: dict[str, Any],
    wait: bool = True,
    export: bool = False,
) -> Path:
    """Atomically write ``checkpoints/step_NNNNNN`` (temp dir + rename); keep the newest ``keep``.

    ``runtime.save(path)`` writes the learner's state (model, optimizer, schedules, RNG);
    ``driver_state`` goes to ``driver.json``. ``wait=False``: the learner's sharded state is written while
    training goes on; the folder is published by the next ``write_checkpoint`` (module docstring), and the
    path returned is where it will be. ``export``: the learner also writes ``model/``, the policy as an HF folder
    in the engines' dtype (the run's last checkpoint; the others have none: ``jointrl export`` writes one). A
    checkpoint pending from before is published first (the learner finished it before starting this one). A failure (e.g. a full disk) leaves the previous checkpoint
    intact and raises :class:`RunAborted` naming it.
    """
    ck = out / "checkpoints"
    ck.mkdir(exist_ok=True)
    final, tmp = ck / f"step_{step:06d}", ck / f".step_{step:06d}.tmp"
    if _PENDING.get(ck, (None,))[0] == tmp:  # the same step again (a replay): the old write is not this one's
        settle_pending(out, keep)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        # keyword arguments only where they differ from the defaults, so a stand-in learner's save(path) serves
        runtime.save(str(tmp), **({} if wait else {"wait": False}), **({"export": True} if export else {}))
        _publish_pending(ck, keep)
        (tmp / "driver.json").write_text(json.dumps(driver_state))
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if type(e).__name__ == "LearnerFailure":  # rl.driver.runtime: the loop restarts the learners
            raise
        last = latest_checkpoint(out)
        err = getattr(e, "cause", None) or e  # a Ray task error carries the learner's exception
        raise RunAborted(
            f"could not write the step-{step} checkpoint into {ck}: {type(err).__name__}: "
            f"{err}; the previous checkpoint is intact: "
            f"{last if last is not None else 'none'}"
        ) from e
    if not wait:
        _PENDING[ck] = (tmp, step)
        return final
    return _publish(ck, tmp, step, keep)


def _publish(ck: Path, tmp: Path, step: int, keep: int) -> Path:
    """``step.json`` into ``tmp``, renamed to ``step_NNNNNN``; the oldest beyond ``keep`` removed."""
    final = ck / f"step_{step:06d}"
    (tmp / "step.json").write_text(json.dumps({"step": step}) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    done = sorted(p for p in ck.iterdir() if p.name.startswith("step_"))
    for old in done[: max(len(done) - max(keep, 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _publish_pending(ck: Path, keep: int) -> None:
    """Publish this process's pending checkpoint once the learner's write ended; one whose write never ended
    (its learners were replaced) is removed."""
    pending = _PENDING.pop(ck, None)
    if pending is None:
        return
    tmp, step = pending
    if (tmp / COMPLETE).is_file() and (tmp / "driver.json").is_file():
        _publish(ck, tmp, step, keep)
    else:
        print(f"jointrl: the step-{step} checkpoint's write did not finish; {tmp} removed", file=sys.stderr, flush=True)
        shutil.rmtree(tmp, ignore_errors=True)


def settle_pending(out: Path, keep: int) -> None:
    """After the learners failed, before they are replaced: publish this process's pending checkpoint if its write
    ended, else remove it. Its writers are gone, so it never ends later, and the replay writes that step's
    folder anew: left pending, it would be taken for the new write's and removed under it."""
    _publish_pending(out / "checkpoints", keep)


def publish_written(out: Path, keep: int) -> None:
    """Publish this process's pending checkpoint if its learner write has ended; otherwise leave it pending (no
    wait). The loop calls it after every step, so a checkpoint is published within a step of being written."""
    pending = _PENDING.get(out / "checkpoints")
    if pending is not None and (pending[0] / COMPLETE).is_file():
        _publish_pending(out / "checkpoints", keep)


def finish_pending(out: Path, keep: int, timeout_s: float) -> None:
    """When the run stops: wait up to ``timeout_s`` for the pending checkpoint's learner write to end
    (``dcp/.complete``), then publish it. Past the timeout the folder stays as it is: a resume publishes it
    if its write ended, or removes it (``publish_finished``)."""
    ck = out / "checkpoints"
    pending = _PENDING.get(ck)
    if pending is None:
        return
    deadline = time.monotonic() + timeout_s
    while not (pending[0] / COMPLETE).is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    if (pending[0] / COMPLETE).is_file():
        _publish_pending(ck, keep)
    else:
        _PENDING.pop(ck, None)


def publish_finished(out: Path, keep: int = 0) -> None:
    """On a resume: publish each ``.step_NNNNNN.tmp`` of the run before whose learner write ended (driver's part
    and ``dcp/.complete`` present: only ``step.json`` and the rename were left), remove the others (torn)."""
    ck = out / "checkpoints"
    if not ck.is_dir():
        return
    finished = written_unpublished(out)
    for tmp in sorted(ck.glob(".step_*.tmp")):
        try:
            step = int(tmp.name[len(".step_") : -len(".tmp")])
        except ValueError:
            continue
        if tmp in finished and not (ck / f"step_{step:06d}").exists():
            _publish(ck, tmp, step, keep or 1 << 30)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def read_checkpoint(ck: Path) -> tuple[int, dict[str, Any]]:
    """A checkpoint's step and driver state (``driver.json``)."""
    step = int(json.loads((ck / "step.json").read_text())["step"])
    return step, json.loads((ck / "driver.json").read_text())


def split_log(path: Path, discarded: Path, step: int) -> None:
    """Keep the lines of steps <= ``step`` in the JSON-lines log ``path``; append the others to ``discarded``."""
    if not path.exists():
        return
    keep, drop = [], []
    for line in path.read_text().splitlines():
        try:
            s = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by the crash
        (keep if s <= step else drop).append(line)
    if drop:
        with open(discarded, "a") as f:
            f.write("\n".join(drop) + "\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, path)


def _yaml(d: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(d, sort_keys=False)
