"""Checkpoints that do not stop training (``rl.trainer.checkpoint``'s asynchronous ``dcp/`` write and
``rl.driver.checkpoints``' publishing).

A save with ``wait=False`` returns while ``dcp/`` is written; a step taken meanwhile does not leak into it (the
state was staged before the call returned); the folder is published (``step.json``, renamed) only once the
learner's write ended. A run SIGKILLed while a slowed write is in flight never resumes from that folder:
the resume takes the previous complete checkpoint, and naming the torn folder fails with a message naming it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from test_learner import MODEL_CFG, make_batch

from rl.config.recipe import AlgoConfig, OptimConfig
from rl.config.output_dir import written_unpublished
from rl.driver.checkpoints import latest_checkpoint, publish_finished, publish_written, write_checkpoint
from rl.trainer import checkpoint
from rl.trainer.learner import Learner

ALGO = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2))


class _Runtime:
    """The driver's view of one in-process learner (what LocalRuntime.save does)."""

    def __init__(self, lrn: Learner) -> None:
        self.lrn = lrn

    def save(self, path: str, wait: bool = True) -> None:
        self.lrn.save_checkpoint(path, wait)


def _weights(lrn: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lrn.model.named_parameters()}


def test_async_save_holds_the_state_of_its_call_while_training_goes_on(tiny_model_path, tiny_tokenizer, tmp_path):
    """Saved without waiting, then a step taken at once: the checkpoint holds the weights of the save's call;
    it is published by the next checkpoint, and a load restores those weights exactly."""
    lrn = Learner(tiny_model_path, MODEL_CFG, ALGO, threads=1, shm_dir=str(tmp_path / "shm"))
    try:
        lrn.step(make_batch(tiny_tokenizer))
        at_save = _weights(lrn)
        out = tmp_path / "run"
        out.mkdir()
        final = write_checkpoint(_Runtime(lrn), out, 1, 3, {"k": 1}, wait=False)
        assert not final.exists() and latest_checkpoint(out) is None, "not published while pending"
        lrn.step(make_batch(tiny_tokenizer))  # training goes on while dcp/ is written
        moved = _weights(lrn)
        assert any(not torch.equal(moved[k], at_save[k]) for k in at_save)
        publish_written(out, 3)  # what the loop does after each step: published once written, not before
        checkpoint.finish(lrn)
        publish_written(out, 3)
        assert final.is_dir() and latest_checkpoint(out) == final
        write_checkpoint(_Runtime(lrn), out, 2, 3, {"k": 2})
        assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step_000001", "step_000002"]
        assert json.loads((final / "step.json").read_text()) == {"step": 1}
        assert (final / "dcp" / ".complete").is_file()
        lrn.load_checkpoint(str(final))
        for k, v in _weights(lrn).items():
            torch.testing.assert_close(v, at_save[k], rtol=0, atol=0)
    finally:
        lrn.shutdown()


CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, "tests")
    import torch.distributed.checkpoint.filesystem as fs
    from test_async_checkpoint import ALGO, _Runtime
    from test_learner import MODEL_CFG
    from rl.driver.checkpoints import write_checkpoint
    from rl.trainer import checkpoint
    from rl.trainer.learner import Learner

    model, out = sys.argv[1], __import__("pathlib").Path(sys.argv[2])
    lrn = Learner(model, MODEL_CFG, ALGO, threads=1, shm_dir=str(out / "shm"))
    write_checkpoint(_Runtime(lrn), out, 1, 3, {"step": 1}, wait=False)
    write_checkpoint(_Runtime(lrn), out, 2, 3, {"step": 2}, wait=False)  # publishes step 1
    checkpoint.finish(lrn)  # step 2's write ends before the writer is slowed
    write_item = fs._write_item

    def slow(*a, **k):  # the writer slowed: the kill lands mid-write
        time.sleep(600)
        return write_item(*a, **k)

    fs._write_item = slow
    write_checkpoint(_Runtime(lrn), out, 3, 3, {"step": 3}, wait=False)  # publishes step 2; 3 in flight
    print("saving", flush=True)
    time.sleep(600)
    """
)


def test_a_kill_during_an_async_save_resumes_from_the_previous_complete_checkpoint(tiny_model_path, tmp_path):
    """SIGKILL while step 3's ``dcp/`` is being written (slowed): step 3 is never published nor loaded; a resume
    publishes nothing torn and continues from step 2; naming the torn folder fails naming it."""
    out = tmp_path / "run"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, tiny_model_path, str(out)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        lines: list[str] = []
        while not lines or lines[-1] not in ("saving", ""):  # the learner's own lines come first
            lines.append(child.stdout.readline().strip())
        assert lines[-1] == "saving", lines
        time.sleep(0.5)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    torn = out / "checkpoints" / ".step_000003.tmp"
    assert (torn / "learner_state.pt").is_file() and not (torn / "dcp" / ".complete").exists()
    from rl.trainer.checkpoint import check_complete

    with pytest.raises(ValueError, match=rf"{torn}: a torn checkpoint"):
        check_complete(torn)
    lrn = Learner(tiny_model_path, MODEL_CFG, ALGO, threads=1, shm_dir=str(tmp_path / "shm"))
    try:
        with pytest.raises(ValueError, match=rf"{torn}: a torn checkpoint"):
            lrn.load_checkpoint(str(torn))
        publish_finished(out)
        assert not torn.exists(), "the torn folder is removed, not published"
        ck = latest_checkpoint(out)
        assert ck is not None and ck.name == "step_000002"
        assert json.loads((ck / "driver.json").read_text()) == {"step": 2}
        lrn.load_checkpoint(str(ck))
    finally:
        lrn.shutdown()


def test_a_finished_but_unpublished_checkpoint_is_published_on_resume(tmp_path):
    """A folder whose learner write ended (``dcp/.complete``) and whose driver part is there was only missing
    ``step.json`` and the rename: the resume publishes it; one without the marker is removed."""
    ck = tmp_path / "checkpoints"
    for step, complete in ((4, True), (5, False)):
        d = ck / f".step_{step:06d}.tmp" / "dcp"
        d.mkdir(parents=True)
        (d.parent / "driver.json").write_text("{}")
        if complete:
            (d / ".complete").write_text("complete\n")
    assert written_unpublished(tmp_path) == [ck / ".step_000004.tmp"], "what output_dir_problem lets resume"
    publish_finished(tmp_path)
    assert sorted(p.name for p in ck.iterdir()) == ["step_000004"]
    assert latest_checkpoint(tmp_path) == ck / "step_000004"


class _FakeAsync:
    """A runtime whose ``save(wait=False)`` makes the folder and leaves its write in flight until ``end`` (what the
    learner's ``dcp.async_save`` does; the driver only sees the folder and, later, ``dcp/.complete``)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def save(self, path: str, wait: bool = True) -> None:
        (Path(path) / "dcp").mkdir(parents=True, exist_ok=True)
        self.paths.append(path)
        if wait:
            self.end()

    def end(self) -> None:
        (Path(self.paths[-1]) / "dcp" / ".complete").write_text("complete\n")


@pytest.mark.parametrize("settle", [True, False])
def test_a_replayed_step_writes_its_checkpoint_over_the_failed_learners_pending_one(tmp_path, settle):
    """The learners die while the step-2 write is in flight; the run restarts them from step 1 and replays step 2,
    whose checkpoint goes into the same folder: the old pending write (never to end) must not be taken for the
    new one and removed under it (it was, and the run stopped: no ``driver.json``)."""
    from rl.driver.checkpoints import settle_pending

    rt = _FakeAsync()
    write_checkpoint(rt, tmp_path, 1, 3, {"s": 1}, wait=True)
    write_checkpoint(rt, tmp_path, 2, 3, {"s": 2}, wait=False)  # the learners die before this write ends
    if settle:  # what the loop's recovery does before restarting the learners
        settle_pending(tmp_path, 3)
        assert not (tmp_path / "checkpoints" / ".step_000002.tmp").exists(), "a write that never ends is removed"
    write_checkpoint(rt, tmp_path, 2, 3, {"s": "replayed"}, wait=False)
    rt.end()
    publish_written(tmp_path, 3)
    ck = latest_checkpoint(tmp_path)
    assert ck == tmp_path / "checkpoints" / "step_000002"
    assert json.loads((ck / "driver.json").read_text()) == {"s": "replayed"}
