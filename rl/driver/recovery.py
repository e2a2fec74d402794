"""What the driver does about faults it can survive or must stop on, apart from the actors' own restarts.

``BadStepGuard`` stops a run whose updates keep coming out non-finite; ``free_dead_run``
frees the shared memory a SIGKILLed driver of the same output dir left behind (its
``.live.json``). Restarting dead actors is the actor groups' job (``rl.driver.actors``);
checkpoints are ``rl.driver.checkpoints``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from rl.driver.checkpoints import RunAborted, latest_checkpoint
from rl.trainer.shm import pid_alive


class BadStepGuard:
    """Stops the run after ``limit`` steps in a row whose update the learner skipped.

    The learner skips an optimizer step whose loss or gradient norm is not finite (weights and
    optimizer state stay as they were, ``learner/skipped_update`` > 0). One such step is logged
    with its reason and the run goes on; ``limit`` in a row means the run is broken (a
    diverged policy, a reward producing absurd values), so it stops before writing another
    checkpoint: the last checkpoint on disk is from before the streak.
    """

    def __init__(self, limit: int, out: Path) -> None:
        self.limit, self.out, self.streak = limit, out, 0

    def check(self, step: int, metrics: dict[str, float]) -> None:
        skipped = metrics.get("learner/skipped_update", 0.0)
        if not skipped > 0:
            self.streak = 0
            return
        self.streak += 1
        loss = metrics.get("loss/policy", float("nan"))
        why = "non-finite loss" if not _finite(loss) else "non-finite gradient norm"
        print(
            f"jointrl: step {step}: {skipped:.0%} of the optimizer updates skipped ({why}: loss/policy={loss}, "
            f"grad/norm={metrics.get('grad/norm')}); {self.streak} such step(s) in a row, the run stops at "
            f"{self.limit}",
            file=sys.stderr,
            flush=True,
        )
        if self.streak >= self.limit:
            last = latest_checkpoint(self.out)
            raise RunAborted(
                f"{self.streak} steps in a row (up to step {step}) skipped their update ({why}); "
                f"stopping (train.max_bad_steps={self.limit}). Metrics of every step are in "
                f"{self.out / 'metrics.jsonl'}; last good checkpoint: "
                f"{last if last is not None else 'none (set run.save_every)'}"
            )


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


LIVE_FILE = ".live.json"


# How long a resumed run waits for a killed run's engine processes to exit (vLLM's engine cores
# do not notice their worker's death; rollout.reaper kills them within a second of it) before it
# leaves their shared memory in place.
_DEAD_ENGINE_WAIT_S = 60.0


def free_dead_run(
    live: Path, sweep_on_node: Callable[[str, list[str], float], list[str] | None] | None = None
) -> list[str]:
    """Free the shared memory a dead driver's run left (its weights folder, its engines' segments).

    ``live`` is the run's ``.live.json`` (driver pid, weights folder, engine nodes and segments).
    Nothing is touched while that driver is still alive; segments some live process still
    maps are kept (``rollout.shm.unlink_unmapped``). ``sweep_on_node(node, segments, wait_s)``: the same
    on another node of a cluster that outlived the driver (``rl.driver.actors.cluster.sweep_on_node``), None
    when that node is not alive; without it (or for a node that is gone: the driver's own local cluster, gone
    with it) the segments are freed on this machine. Returns what was removed.
    """
    from rollout.shm import unlink_unmapped

    try:
        rec = json.loads(live.read_text())
    except (OSError, ValueError):
        return []
    if rec.get("pid") != os.getpid() and pid_alive(int(rec.get("pid", 0))):
        return []
    removed = []
    d = rec.get("shm_dir", "")
    if d.startswith("/dev/shm/jointrl-") and os.path.isdir(d):
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    for node, segments in rec.get("engines", []):
        swept = sweep_on_node(node, segments, _DEAD_ENGINE_WAIT_S) if sweep_on_node is not None else None
        removed += swept if swept is not None else unlink_unmapped(segments, wait_s=_DEAD_ENGINE_WAIT_S)
    live.unlink(missing_ok=True)
    left = [p for _, segs in rec.get("engines", []) for p in segs if p not in removed and os.path.exists(p)]
    if left:
        print(
            f"jointrl: shared memory of the killed run still in use after {_DEAD_ENGINE_WAIT_S:.0f} s, "
            f"left in place: {left}",
            file=sys.stderr,
        )
    if removed:
        print(f"jointrl: freed {len(removed)} shared-memory object(s) left by the killed run", file=sys.stderr)
    return removed


def raise_on_term(signum: int, frame: Any) -> None:
    """A SIGTERM handler: the signal becomes an exception, so that ``finally`` blocks shut engines down."""
    raise KeyboardInterrupt(f"signal {signum}")


class StopSignals:
    """SIGINT and SIGTERM while a run trains: a step's update is finished, never cut in half.

    Outside ``deferred()`` (drawing, generating, scoring a step: nothing of it is kept yet) a
    signal raises ``KeyboardInterrupt`` at once, and the step in progress is discarded. Inside
    (the learner's update, the weight sync, the step's eval, log and checkpoint) the first
    signal is held until the step is finished, then raised; a second one raises at once (the
    user insists), and the learner's state is then unknown (``rl.driver.loop`` does not save it).
    Used as a context manager in the main thread; the previous handlers come back on exit.
    """

    def __init__(self) -> None:
        self.held: int | None = None
        self._step: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._step is None or self.held is not None:
            raise KeyboardInterrupt(f"signal {signum}")
        self.held = signum
        print(
            f"\njointrl: stopping after step {self._step} is finished and checkpointed (signal again to stop now)",
            file=sys.stderr,
            flush=True,
        )

    def deferred(self, step: int) -> "_Deferred":
        """A context in which a first signal waits for its end (then raises ``KeyboardInterrupt``)."""
        return _Deferred(self, step)


class _Deferred:
    def __init__(self, signals: StopSignals, step: int) -> None:
        self.signals, self.step = signals, step

    def __enter__(self) -> None:
        self.signals._step = self.step

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.signals._step = None
        if exc_type is None and self.signals.held is not None:
            raise KeyboardInterrupt(f"signal {self.signals.held}")


def write_stopped(out: Path, status: str, step: int, checkpoint: Path | None, reason: str) -> None:
    """``STOPPED`` in the run folder: ``status`` (interrupted | crashed), the last finished ``step``, the
    newest ``checkpoint`` (a later ``run.resume=auto`` continues from it; none: from step 1) and why."""
    from rl.config.recipe import STOPPED_FILE

    rec = {"status": status, "step": step, "checkpoint": checkpoint.name if checkpoint else None, "reason": reason}
    try:
        (out / STOPPED_FILE).write_text(json.dumps(rec) + "\n")
    except OSError as e:  # a full disk: the message still says what happened
        print(f"jointrl: could not write {out / STOPPED_FILE}: {e}", file=sys.stderr)
