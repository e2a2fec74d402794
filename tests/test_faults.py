"""Injected faults: a rollout worker killed by pid mid-call, a run whose updates keep
coming out non-finite, and a driver stopped with SIGTERM (issue #9).

The reward-worker faults (crash, hang, raise, NaN) are in tests/test_reward_service.py; a
rollout worker SIGKILLed in the middle of a whole `jointrl train` run is
tests/test_integration.py::test_training_run_survives_a_killed_rollout_worker (it shares that
file's CLI run); the SIGKILLed driver is in tests/test_resume.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import shm_files, shm_left_bytes, train_until_step_1
from rollout.reaper import start_time

from rl.driver.loop import BadStepGuard, RunAborted

# ---------------------------------------------------------------- BadStepGuard (no Ray)


def test_guard_counts_skipped_steps_in_a_row_and_resets(tmp_path: Path, capsys) -> None:
    g = BadStepGuard(3, tmp_path)
    g.check(1, {"learner/skipped_update": 1.0, "loss/policy": float("nan"), "grad/norm": float("nan")})
    g.check(2, {"learner/skipped_update": 0.5, "loss/policy": 0.1, "grad/norm": float("inf")})
    assert g.streak == 2
    err = capsys.readouterr().err
    assert "step 1" in err and "non-finite loss" in err
    assert "step 2" in err and "non-finite gradient norm" in err
    g.check(3, {"learner/skipped_update": 0.0, "loss/policy": 0.1})
    assert g.streak == 0, "a good step ends the streak"
    g.check(4, {"loss/policy": 0.1})  # no key: nothing skipped
    assert g.streak == 0


def test_guard_stops_after_the_limit_naming_the_last_checkpoint(tmp_path: Path) -> None:
    ck = tmp_path / "checkpoints" / "step_000002"
    ck.mkdir(parents=True)
    (ck / "step.json").write_text('{"step": 2}\n')
    g = BadStepGuard(2, tmp_path)
    bad = {"learner/skipped_update": 1.0, "loss/policy": float("nan")}
    g.check(3, bad)
    with pytest.raises(RunAborted, match=r"2 steps in a row \(up to step 4\).*max_bad_steps=2.*step_000002"):
        g.check(4, bad)


# ---------------------------------------------------------------- rollout worker killed (Ray + vLLM)


@pytest.fixture(scope="module")
def ray_cpus():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "env_vars": {
                "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "1",  # engine core processes, as in a run (tests/conftest.py)
                "JOINTRL_CACHE": os.environ["JOINTRL_CACHE"],
                "PYTHONPATH": os.pathsep.join(p for p in sys.path if os.path.isdir(p)),
            }
        },
    )
    yield
    ray.shutdown()


def _perturbed_weights(model_path: str, out: Path) -> str:
    """The tiny model's weights, every tensor shifted: an engine that loaded them scores differently."""
    import torch
    from safetensors.torch import load_file, save_file

    w = load_file(str(Path(model_path) / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    w = {k: (v.float() + 0.05 * torch.randn(v.shape, generator=g)).contiguous() for k, v in w.items()}
    if "lm_head.weight" not in w and "model.embed_tokens.weight" in w:
        w["lm_head.weight"] = w["model.embed_tokens.weight"].clone()
    path = out / "perturbed.safetensors"
    save_file(w, str(path))
    return str(path)


@pytest.mark.slow
def test_killed_rollout_worker_is_replaced_and_its_prompts_reissued(
    tmp_path: Path, tiny_model_path: str, ray_cpus
) -> None:
    from envs.io import load_tasks
    from envs.types import Sampling
    from rl.driver.actors.rollout import RolloutPool

    tasks = load_tasks(Path(__file__).parents[1] / "recipes" / "data" / "toolcall_quickstart.train.jsonl")[:12]
    groups, seeds = list(range(len(tasks))), [100 + i for i in range(len(tasks))]
    sampling = Sampling(256, 1.0, 1.0, 1, 1024)
    shm0 = shm_files()
    pool = RolloutPool(
        1,
        tiny_model_path,
        [("tool_call", "envs.toolcall.ToolCallEnv", {})],
        dtype="float32",
        max_model_len=1024,
        max_restarts=1,
    )
    try:
        pool.sync_weights(_perturbed_weights(tiny_model_path, tmp_path))
        prompt, cont = [1, 2, 3, 4], [5, 6, 7]
        synced = pool.score(prompt, cont)[0]
        before = pool.generate(tasks, groups, seeds, sampling)
        assert pool.metrics() == {"faults/rollout_restarts": 0.0}

        # 1. Killed while generating: the step still gets every trajectory, sampled as before.
        pid, (_, segments, procs) = pool.pids()[0], pool._placement[0]
        assert segments and procs, "the engine's shared memory and processes are recorded"
        killer = threading.Timer(0.3, os.kill, (pid, signal.SIGKILL))
        killer.start()
        after = pool.generate(tasks, groups, seeds, sampling)
        killer.join()
        assert pool.restarts == 1 and pool.pids()[0] != pid
        assert [t.response_ids for t in after] == [t.response_ids for t in before], "same seeds, same samples"
        assert not [s for s in segments if os.path.exists(s)], "the dead engine's shared memory is freed"
        assert not [p for p, st in procs if start_time(p) == st], "no process of the dead engine is left"
        # The replacement serves the synced weights, not the checkpoint on disk.
        assert pool.score(prompt, cont)[0] == pytest.approx(synced, abs=1e-5)
        assert pool.metrics() == {"faults/rollout_restarts": 1.0}
        assert pool.metrics() == {"faults/rollout_restarts": 0.0}, "counted once"

    finally:
        pool.shutdown()
    # Nothing of the dead engine is left in /dev/shm: its segments, and the named semaphore of its engine's
    # multiprocessing lock, which its mappings name only by a deleted temporary name (tests/test_shm_segments.py).
    assert shm_left_bytes(shm0) == 0, sorted(shm_files() - shm0)


def _engine_core_pids(worker_pid: int) -> list[int]:
    """The vLLM engine core processes under a rollout worker's process (``VLLM::EngineCore``)."""
    import psutil

    found = []
    for p in psutil.Process(worker_pid).children(recursive=True):
        try:
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
def test_killed_engine_core_process_is_detected_and_replaced(tmp_path: Path, tiny_model_path: str, ray_cpus) -> None:
    """The engine core process (not the actor) SIGKILLed mid-generate, as the OOM killer would: vLLM's client
    then waits forever; the pool's health probe sees the dead core, replaces the worker and re-issues the
    prompts, within a bound."""
    from envs.io import load_tasks
    from envs.types import Sampling
    from rl.driver.actors.rollout import RolloutPool

    tasks = load_tasks(Path(__file__).parents[1] / "recipes" / "data" / "toolcall_quickstart.train.jsonl")[:12]
    groups, seeds = list(range(len(tasks))), [100 + i for i in range(len(tasks))]
    sampling = Sampling(256, 1.0, 1.0, 1, 1024)
    pool = RolloutPool(
        1,
        tiny_model_path,
        [("tool_call", "envs.toolcall.ToolCallEnv", {})],
        dtype="float32",
        max_model_len=1024,
        max_restarts=1,
        probe_every_s=1.0,
        probe_timeout_s=30.0,
    )
    try:
        before = pool.generate(tasks, groups, seeds, sampling)
        worker = pool.pids()[0]
        cores = _engine_core_pids(worker)
        assert len(cores) == 1, f"one engine core under the worker {worker}: {cores}"
        import ray

        assert ray.get(pool.workers[0].engine_pids.remote()) == cores, "the engine knows its core's pid"
        killer = threading.Timer(0.3, os.kill, (cores[0], signal.SIGKILL))
        t0 = time.monotonic()
        killer.start()
        after = pool.generate(tasks, groups, seeds, sampling)
        elapsed = time.monotonic() - t0
        killer.join()
        assert pool.restarts == 1, "the worker with the dead engine core was replaced"
        print(f"engine core killed: recovered in {elapsed:.1f} s; {pool.failures}")
        ((i, why),) = pool.failures
        # The health probe saw it (vLLM's flag, or the core process's exit), or vLLM raised EngineDeadError.
        assert i == 0 and ("engine core" in why or "EngineDeadError" in why), why
        assert elapsed < 240, f"recovered in {elapsed:.0f} s (start-up of the replacement included)"
        assert [t.response_ids for t in after] == [t.response_ids for t in before], "same seeds, same samples"
        new_worker = pool.pids()[0]
        assert new_worker != worker and _engine_core_pids(new_worker) != cores
        assert pool.metrics() == {"faults/rollout_restarts": 1.0}
    finally:
        pool.shutdown()


class StandIn:
    """A rollout worker without an engine. The first instance of a test misbehaves as ``mode`` says (its call
    never returns; its health probe says the engine died / never answers); its replacements serve."""

    def __init__(self, model_path: str, env_specs: list, seed: int = 0, mode: str = "", flag: str = "") -> None:
        self.mode = "" if os.path.exists(flag) else mode
        Path(flag).touch()

    def generate(self, *args) -> list[str]:
        if self.mode:
            time.sleep(3600)
        return ["served"]

    def health(self) -> str | None:
        if self.mode == "no_answer":
            time.sleep(3600)
        return "engine core process 1234 (EngineCore_DP0) exited with code -9" if self.mode == "dead" else None

    def leftovers(self) -> tuple[list[str], list[tuple[int, int]]]:
        return [], []

    def pid(self) -> int:
        return os.getpid()


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, why",
    [
        ("stuck", "call ran past rollout call_timeout_s=4"),
        ("dead", "engine core process 1234 (EngineCore_DP0) exited"),
        ("no_answer", "no answer to the health probe within 2 s"),
    ],
)
def test_unresponsive_worker_is_replaced_and_its_call_reissued(tmp_path: Path, ray_cpus, mode: str, why: str) -> None:
    """The pool's deadline and death check without vLLM: a call that never returns is replaced at its deadline,
    one whose health probe reports a dead engine or does not answer is replaced at the next probe."""
    from rl.driver.actors.rollout import RolloutPool
    from rollout.pool import EngineFailure

    pool = RolloutPool(
        1,
        "unused",
        [],
        num_cpus=0.1,
        worker_cls=StandIn,
        mode=mode,
        flag=str(tmp_path / "flag"),
        max_restarts=1,
        call_timeout_s=4.0,
        probe_every_s=0.5,
        probe_timeout_s=2.0,
    )
    try:
        t0 = time.monotonic()
        assert pool._call({0: ("generate", ())}) == {0: ["served"]}
        elapsed = time.monotonic() - t0
        assert pool.restarts == 1 and len(pool.failures) == 1 and why in pool.failures[0][1], pool.failures
        assert elapsed < 30, f"replaced after {elapsed:.1f} s"
        # Beyond max_restarts within one call: a clear error, not a hang.
        (tmp_path / "flag").unlink()
        pool._kwargs[0]["mode"], pool.max_restarts = "stuck", 0
        pool._replace(0, RuntimeError("make the next worker misbehave"))
        with pytest.raises(EngineFailure, match="died 1 times in one call"):
            pool._call({0: ("generate", ())})
    finally:
        import ray

        for w in pool.workers:  # a stuck stand-in would hold its shutdown call for 60 s
            ray.kill(w)
        pool.shutdown()


@pytest.mark.slow
def test_a_worker_killed_again_in_the_same_call_is_a_clear_error(tmp_path: Path, ray_cpus) -> None:
    """A worker that dies again within the same call, beyond ``max_restarts``: a clear error, not a hang
    (SIGKILLed worker processes, stand-ins for vLLM workers: the pool's accounting is the same)."""
    from rl.driver.actors.rollout import RolloutPool
    from rollout.pool import EngineFailure

    pool = RolloutPool(1, "unused", [], num_cpus=0.1, worker_cls=StandIn, flag=str(tmp_path / "flag"), max_restarts=1)
    try:
        assert pool._call({0: ("generate", ())}) == {0: ["served"]}
        victim = pool.pids()[0]
        os.kill(victim, signal.SIGKILL)
        while os.path.exists(f"/proc/{victim}") and open(f"/proc/{victim}/stat").read().split()[2] != "Z":
            time.sleep(0.05)
        original_replace = pool._replace

        def replace_then_kill(i, why, dead=None):  # the replacement dies too before it can serve
            replaced = original_replace(i, why, dead)
            os.kill(pool.pids()[0], signal.SIGKILL)
            return replaced

        pool._replace = replace_then_kill
        with pytest.raises(EngineFailure, match="died 2 times in one call"):
            pool._call({0: ("generate", ())})
    finally:
        pool.shutdown()


HOLDER = "import mmap, sys, time; f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 0); print(1, flush=True); time.sleep(3600)"


def _holder(path: Path) -> subprocess.Popen:
    """A process that maps ``path`` (as a vLLM engine maps its /dev/shm ring buffers) and sleeps."""
    path.write_bytes(b"\0" * 4096)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"1\n"  # mapped
    return proc


def test_free_dead_engine_kills_the_orphans_then_unlinks(tmp_path: Path) -> None:
    """What a SIGKILLed worker's engine leaves: a process still mapping its segment. Recorded by (pid, start
    time), it is killed and the segment unlinked; a segment someone else maps is left and reported."""
    from rollout.pool import free_dead_engine

    ours, theirs = tmp_path / "psm_ours", tmp_path / "psm_theirs"
    orphan, stranger = _holder(ours), _holder(theirs)
    try:
        left = free_dead_engine([str(ours), str(theirs)], [(orphan.pid, start_time(orphan.pid))], wait_s=1.0)
        assert left == [str(theirs)] and not ours.exists() and theirs.exists()
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        assert stranger.poll() is None, "a process not recorded is never killed"
        # A recorded pid whose start time no longer matches (reused) is not killed either.
        assert free_dead_engine([], [(stranger.pid, start_time(stranger.pid) + 1)]) == []
        assert stranger.poll() is None
    finally:
        for p in (orphan, stranger):
            p.kill()
            p.wait()


class Leaky(StandIn):
    """A stand-in whose "engine" is a process mapping a segment, and whose shutdown fails (as a
    worker's does when its engine hangs past the pool's timeout)."""

    def __init__(self, model_path: str, env_specs: list, seed: int = 0, segment: str = "") -> None:
        super().__init__(model_path, env_specs)
        self.segment, self.proc = segment, _holder(Path(segment))

    def leftovers(self) -> tuple[list[str], list[tuple[int, int]]]:
        return [self.segment], [(self.proc.pid, start_time(self.proc.pid))]

    def pid(self) -> int:
        return self.proc.pid

    def shutdown(self) -> None:
        raise RuntimeError("engine shutdown timed out")


@pytest.mark.slow
def test_pool_shutdown_frees_engines_that_did_not_shut_down(tmp_path: Path, ray_cpus) -> None:
    """``RolloutPool.shutdown``: a worker killed because its engine did not shut down leaves neither the
    engine's processes nor its shared memory behind."""
    from rl.driver.actors.rollout import RolloutPool

    segment = tmp_path / "psm_engine"
    pool = RolloutPool(1, "unused", [], num_cpus=0.1, worker_cls=Leaky, segment=str(segment))
    engine = pool._call({0: ("pid", ())})[0]
    assert segment.exists() and start_time(engine) is not None
    pool.shutdown()
    assert not segment.exists(), "the segment is unlinked"
    assert start_time(engine) is None, "the engine's process is killed"


# ---------------------------------------------------------------- non-finite updates stop the run

HUGE = '''
class Huge:
    """Finite Python floats whose Dr.GRPO advantages (r - group mean) are inf in float32: the loss is not finite."""
    name = "huge"
    domains = ("tool_call",)
    def __call__(self, traj):
        return 1e300 if traj.response_ids and traj.response_ids[0] % 2 else 0.0
'''


@pytest.mark.slow
def test_non_finite_updates_stop_the_run_with_checkpoint_intact(tmp_path: Path, recipe_copy) -> None:
    (tmp_path / "huge_reward.py").write_text(HUGE)

    def edit(d: dict) -> None:
        d["run"].update(save_every=1)
        d["train"].update(steps=6, max_bad_steps=2)
        d["algo"].update(name="dr_grpo")
        d["wandb"]["mode"] = "disabled"
        d["data"]["eval_files"] = []
        d["rewards"] = [{"cls": "huge_reward.Huge", "weight": 1.0, "domains": ["tool_call"], "kwargs": {}}]

    recipe = recipe_copy("tiny.yaml", filename="huge.yaml", edit=edit)
    exe = Path(sys.executable).with_name("jointrl")
    env = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    r = subprocess.run([str(exe), "train", str(recipe)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 3, r.stderr[-3000:]
    assert "skipped their update" in r.stderr and "train.max_bad_steps=2" in r.stderr
    assert "Traceback" not in r.stderr
    out = tmp_path / "out"
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1, 2], "every step up to the stop is logged"
    assert all(s["learner/skipped_update"] == 1.0 for s in steps[1:])
    # Step 1 (one skip, the run goes on) was checkpointed; step 2 ended the run before its checkpoint.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]


# ---------------------------------------------------------------- disk full


def test_full_disk_at_start_is_a_recipe_error(recipe_copy, monkeypatch) -> None:
    import shutil as _shutil

    from rl.config.recipe import RecipeError, load_recipe, validate_recipe

    cfg = load_recipe(recipe_copy("tiny.yaml"))
    validate_recipe(cfg)
    usage = _shutil.disk_usage("/")
    monkeypatch.setattr("rl.config.output_dir.shutil.disk_usage", lambda p: usage._replace(free=5 * 2**20))
    with pytest.raises(RecipeError, match=r"run\.output_dir: only 5 MiB free under .*need about \d+ MiB"):
        validate_recipe(cfg)


def test_checkpoint_that_cannot_be_written_keeps_the_previous_one(tmp_path: Path, recipe_copy) -> None:
    import errno

    from rl.config.recipe import load_recipe
    from rl.driver.loop import checkpoint, latest_checkpoint, make_normalizer

    class Runtime:  # the learner's side of a checkpoint: a model file, then (once) a full disk
        def __init__(self) -> None:
            self.fail = False

        def save(self, path: str) -> None:
            Path(path).mkdir(parents=True)
            (Path(path) / "model.bin").write_bytes(b"x" * 10)
            if self.fail:
                raise OSError(errno.ENOSPC, "No space left on device")

    class Mixer:
        def state_dict(self) -> dict:
            return {}

    cfg = load_recipe(recipe_copy("tiny.yaml"))
    rt = Runtime()
    checkpoint(rt, tmp_path, 1, 2, Mixer(), make_normalizer(cfg))
    rt.fail = True
    with pytest.raises(RunAborted, match=r"step-2 checkpoint.*No space left on device.*intact: .*step_000001"):
        checkpoint(rt, tmp_path, 2, 2, Mixer(), make_normalizer(cfg))
    assert latest_checkpoint(tmp_path).name == "step_000001"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"], "no partial checkpoint"


# ---------------------------------------------------------------- SIGTERM


@pytest.mark.slow
def test_sigterm_shuts_down_and_keeps_outputs(tmp_path: Path, recipe_copy) -> None:
    def edit(d: dict) -> None:
        d["train"].update(steps=200)
        d["wandb"]["mode"] = "disabled"

    recipe = recipe_copy("tiny.yaml", edit=edit)
    out = tmp_path / "out"
    shm0 = shm_files()
    proc = train_until_step_1(recipe, out)
    try:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read().decode()
    assert rc == 130 and "interrupted; engines shut down, outputs so far kept" in err, err[-3000:]
    assert "Traceback" not in err
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[:2] == [0, 1] and steps == list(range(len(steps)))
    assert not (out / ".live.json").exists() and not (out / "DONE").exists()
    # The last finished step is checkpointed although save_every is 0, and the folder says so (#38).
    stopped = json.loads((out / "STOPPED").read_text())
    assert stopped["status"] == "interrupted" and stopped["step"] == steps[-1]
    assert stopped["checkpoint"] == f"step_{steps[-1]:06d}" and (out / "checkpoints" / stopped["checkpoint"]).is_dir()
    time.sleep(2)
    assert shm_left_bytes(shm0) < 50 * 2**20, "engines and the weights folder were freed"


class IPCStandIn(StandIn):
    """A stand-in that records the CUDA IPC export it was given (the pool's pairing, without a GPU)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.loaded: list = []

    def receive(self, update: dict) -> None:  # the pool hands every engine its update through receive
        self.loaded.append(update)

    def got(self) -> list:
        return self.loaded


@pytest.mark.slow
def test_ipc_sync_pairs_engine_i_with_learner_rank_i_also_after_a_restart(tmp_path: Path, ray_cpus) -> None:
    """``learner.weight_sync: ipc``: engine i maps learner rank i's buffer (they share a GPU when colocated), and
    a replaced engine maps its own rank's latest export as it starts, not rank 0's."""
    import ray

    from rl.driver.actors.rollout import RolloutPool

    pool = RolloutPool(2, "unused", [], num_cpus=0.1, worker_cls=IPCStandIn, flag=str(tmp_path / "flag"))
    try:
        pool.sync_weights_ipc([{"rank": 0, "step": 1}, {"rank": 1, "step": 1}])
        assert ray.get([w.got.remote() for w in pool.workers]) == [[{"rank": 0, "step": 1}], [{"rank": 1, "step": 1}]]
        pool._replace(1, RuntimeError("a killed engine"))
        assert ray.get(pool.workers[1].got.remote()) == [{"rank": 1, "step": 1}]
        with pytest.raises(ValueError, match="1 learner exports for 2 engines"):
            pool.sync_weights_ipc([{"rank": 0}])
    finally:
        pool.shutdown()
