"""Driver-level resume: a run whose driver was SIGKILLed mid-step after its step-2
checkpoint (step 3 logged after that checkpoint, its log ending in a torn line), resumed
with ``run.resume=auto``, logs for steps 3-4 exactly what the uninterrupted run logged
(deterministic mode: fp32 engine and learner, per-request sampling seeds).

One killed-and-resumed run (``killed_run``) serves the two tests that read it: the resume
from a torn log with a step logged after the checkpoint, and the SIGKILLed driver's
leftovers freed by the resumed run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import recipe_copier
from runlog import comparable_steps

pytestmark = pytest.mark.slow

# vLLM's process layout, as `jointrl train` ships it: a killed run's engine processes and segments are recorded
# in its .live.json and freed by the resumed run (an in-process engine core's are not: tests/conftest.py).
_ENV = {**os.environ, "WANDB_MODE": "disabled", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}


def _recipe(recipe_copy, out: Path) -> Path:
    def edit(d: dict) -> None:
        d["run"].update(save_every=2, keep_checkpoints=3)
        d["model"].update(engine_dtype="float32", autocast=False)
        d["train"].update(steps=4)
        d["wandb"]["mode"] = "disabled"
        # A reward with variance on the random model, so that the updates are not all zero.
        d["rewards"].append(
            {
                "cls": "rewards.format.OverlongPenalty",
                "weight": 1.0,
                "domains": ["tool_call"],
                "kwargs": {"max_tokens": 24, "buffer_tokens": 20},
            }
        )

    return recipe_copy("tiny.yaml", out=out.name, filename=f"{out.name}.yaml", edit=edit)


def _run(recipe: Path, *overrides: str) -> None:
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run(
        [str(exe), "train", str(recipe), *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        env=_ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    """The uninterrupted 4-step run, shared by the tests below."""
    tmp = tmp_path_factory.mktemp("full")
    a = tmp / "a"
    _run(_recipe(recipe_copier(tmp), a))
    return a


def _assert_same_steps(resumed: dict[int, dict], full: dict[int, dict]) -> None:
    assert sorted(resumed) == [0, 1, 2, 3, 4], "each step once"
    for step in (3, 4):
        # Rewards, losses, KL, gradient norms, counts: identical. The engine-vs-learner logprob gap
        # (~2e-7 here) moves by ~1e-9 with vLLM's fp32 kernel noise, hence the absolute tolerance.
        assert resumed[step] == pytest.approx(full[step], rel=0, abs=1e-8), f"step {step} differs after resume"
        exact = {
            k
            for k in full[step]
            if k.startswith(("reward/", "loss/", "kl/", "grad/", "eval/reward/", "rollout/tokens"))
        }
        assert {k: resumed[step][k] for k in exact} == {k: full[step][k] for k in exact}


@dataclass
class KilledRun:
    out: Path  # the run's output folder, after the resume
    killed_log: list[str]  # metrics.jsonl as the SIGKILL left it (before the torn line was added)
    done_after_kill: bool  # DONE was written by the killed run
    leaked: set[str]  # what its .live.json names (weights folder, engine segments), there after the kill
    still: set[str]  # of those, the ones still there after the resume


def _kill_after_step_3(recipe: Path, out: Path) -> None:
    """``jointrl train recipe`` SIGKILLed (no cleanup code runs) as soon as its step-3 log line is
    complete: the step-2 checkpoint is on disk, step 4 is running, its checkpoint not yet written."""
    exe = Path(sys.executable).with_name("jointrl")
    proc = subprocess.Popen(
        [str(exe), "train", str(recipe)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_ENV,
        start_new_session=True,
    )
    log = out / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 500
        # Lines of steps 0-3, each ended by its newline (a line being written is not yet a step).
        while not (log.is_file() and log.read_text().count("\n") >= 4):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no step 3 logged"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory) -> KilledRun:
    """The 4-step run SIGKILLed while step 4 runs; its log then given a torn last line (a write the
    kill cut short: ``_kill_after_step_3`` waits for complete lines, so the kill itself rarely tears
    one); then resumed with ``run.resume=auto``."""
    tmp = tmp_path_factory.mktemp("killed")
    b = tmp / "b"
    recipe = _recipe(recipe_copier(tmp), b)
    _kill_after_step_3(recipe, b)
    killed_log = (b / "metrics.jsonl").read_text().splitlines()
    done_after_kill = (b / "DONE").exists()
    with (b / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reward')
    # Ray's own processes die with their driver; give them a moment before the next run starts.
    time.sleep(3)
    # The run's own shared memory, as its driver recorded it (another test's run beside this one has its own).
    live = json.loads((b / ".live.json").read_text())
    named = [live["shm_dir"]] + [p for _, segments in live.get("engines", []) for p in segments]
    leaked = {p for p in named if os.path.exists(p)}
    _run(recipe, "run.resume=auto")
    return KilledRun(b, killed_log, done_after_kill, leaked, {p for p in leaked if os.path.exists(p)})


def test_resume_auto_continues_exactly(killed_run: KilledRun, full_run: Path) -> None:
    """Killed after its step-3 log, before the step-4 checkpoint, the log ending in a torn line: the
    resumed run redoes steps 3-4 from the step-2 checkpoint, keeps the discarded step-3 line aside,
    and matches the uninterrupted run."""
    full = comparable_steps(full_run / "metrics.jsonl")
    assert sorted(full) == [0, 1, 2, 3, 4]
    assert any(v["grad/norm"] > 0 for s, v in full.items() if s)
    b = killed_run.out
    assert [json.loads(x)["step"] for x in killed_run.killed_log] == [0, 1, 2, 3], "killed while step 4 ran"
    _assert_same_steps(comparable_steps(b / "metrics.jsonl"), full)
    discarded = [json.loads(x)["step"] for x in (b / "metrics.discarded.jsonl").read_text().splitlines()]
    assert discarded == [3], "the step logged after the last checkpoint is kept aside, not lost"
    assert (b / "DONE").is_file()


def test_sigkilled_driver_resumes_exactly(killed_run: KilledRun, full_run: Path) -> None:
    """SIGKILL of the driver process (no cleanup code runs) once the step-2 checkpoint is on
    disk; the resumed run redoes step 3 onwards and matches the uninterrupted run, and what
    the killed run left in /dev/shm is freed by the resumed one."""
    b = killed_run.out
    assert not killed_run.done_after_kill
    assert killed_run.leaked, "a SIGKILLed run cannot clean up after itself"
    _assert_same_steps(comparable_steps(b / "metrics.jsonl"), comparable_steps(full_run / "metrics.jsonl"))
    # The killed run's weights folder is always freed; its engines' segments are freed once their
    # orphaned engine processes have exited (best effort, waited for up to 60 s, else a warning).
    assert not {p for p in killed_run.still if p.startswith("/dev/shm/jointrl-")}, (
        f"left in /dev/shm: {sorted(killed_run.still)}"
    )
    assert (b / "DONE").is_file()


def test_second_run_into_same_dir_is_refused(tmp_path: Path, recipe_copy) -> None:
    out = tmp_path / "x"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run([str(exe), "train", str(_recipe(recipe_copy, out))], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "already holds a run" in r.stderr and "run.resume=auto" in r.stderr
