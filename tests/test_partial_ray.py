"""Partial rollouts through the Ray rollout pool: ``RolloutPool.interrupt`` / ``sync_weights`` / ``resume`` while
the pool's ``generate`` runs on another driver thread (the actor serves them on its control thread while
``generate`` holds its main one). The worker's engine is the HF engine on the tiny model with a ``TripGate``
(tests/test_partial_rollouts.py), so the interrupt lands at a known token without vLLM."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from test_faults import ray_cpus  # noqa: F401 - the module's Ray cluster (2 CPUs)
from test_partial_rollouts import TASKS, TripGate, _in_thread

from rollout.pool import RolloutWorker

pytestmark = pytest.mark.slow


class HFTripWorker(RolloutWorker):
    """A rollout worker on the HF engine whose gate trips at its ``arm``-th check."""

    def __init__(self, model_path: str, env_specs: list, seed: int = 0, arm: int = 0, **kw) -> None:
        from rollout.hf_engine import HFEngine

        hf = HFEngine(model_path, dtype="float32")
        hf.gate = TripGate()
        hf.gate.arm(arm)
        super().__init__(model_path, env_specs, seed=seed, engine=hf, **kw)

    def tripped(self) -> bool:
        return self.engine.gate.tripped.is_set()


def _noisy(model_path: str, out: Path) -> str:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}  # tied weights: each under its own name
    g = torch.Generator().manual_seed(0)
    path = str(out / "new.safetensors")
    save_file({k: (v + 0.5 * torch.randn(v.shape, generator=g)).contiguous() for k, v in sd.items()}, path)
    return path


def _pool(tiny_model_path: str, worker_cls: type, **kw):
    """A one-worker pool on the tiny model's HF engine whose episodes are ``TalkEnv``'s."""
    from rl.driver.actors.rollout import RolloutPool

    return RolloutPool(
        1, tiny_model_path, [("talk", "test_partial_rollouts.TalkEnv", {})], num_cpus=0.1, worker_cls=worker_cls, **kw
    )


def _wait_tripped(pool) -> None:
    """Until the worker's gate has tripped (its episode stopped mid-turn); asked on the health thread."""
    import ray

    w, deadline = pool.workers[0], time.monotonic() + 120
    while not ray.get(w.tripped.options(concurrency_group="health").remote()):
        assert time.monotonic() < deadline, "the interrupt never came"
        time.sleep(0.1)


def _kill(victim: int) -> None:
    """SIGKILL a worker's process and wait until it is gone (or a zombie)."""
    os.kill(victim, signal.SIGKILL)
    while os.path.exists(f"/proc/{victim}") and open(f"/proc/{victim}/stat").read().split()[2] != "Z":
        time.sleep(0.05)


def test_the_pool_loads_new_weights_while_its_workers_generate(ray_cpus, tiny_model_path, tmp_path: Path) -> None:
    """Interrupted after 5 tokens of the first episode, new weights synced, resumed as version 5: the first episode's
    tokens are version 0 then 5, the second episode (not started) all 5; a replaced worker's tokens are version 5."""
    from test_partial_rollouts import S

    new = _noisy(tiny_model_path, tmp_path)
    pool = _pool(tiny_model_path, HFTripWorker, arm=6, partial_rollouts=True)
    try:
        s = replace(S, max_turns=1, max_new_tokens=12)
        done = _in_thread(lambda: pool.generate(TASKS, [0, 1], [11, 12], s))
        _wait_tripped(pool)
        pool.interrupt(60)
        pool.sync_weights(new)
        pool.resume(5)
        a, b = done()
        assert a.token_versions == [0] * 5 + [5] * (len(a.response_ids) - 5)
        assert set(b.token_versions) == {5}
        # A worker that dies is replaced on the newest weights, recorded as the last resume's version.
        _kill(pool.pids()[0])
        assert pool._call({0: ("policy_version", ())}) == {0: 5} and pool.restarts == 1
    finally:
        pool.shutdown()


class HFTripOnceWorker(HFTripWorker):
    """``HFTripWorker`` whose gate trips only in the first worker made (the file ``once`` marks it made): a
    replacement generates without tripping."""

    def __init__(self, model_path: str, env_specs: list, once: str, arm: int = 0, **kw) -> None:
        first = not os.path.exists(once)
        Path(once).touch()
        super().__init__(model_path, env_specs, arm=arm if first else 0, **kw)


def _versions_ok(trajs, new: int) -> None:
    for t in trajs:
        assert t.token_versions and set(t.token_versions) <= {0, new}, t.token_versions
        assert t.token_versions == sorted(t.token_versions), "a version went back"


def test_an_idle_dead_worker_is_passed_over_by_the_interrupt_and_replaced_interrupted_by_the_sync(
    ray_cpus, tiny_model_path, tmp_path: Path
) -> None:
    """A worker killed while idle: ``interrupt`` passes over it (it has nothing to stop), ``sync_weights`` meets
    its death and replaces it on the new weights, interrupted (a generate started before ``resume`` waits), and
    ``resume(5)`` lets it go: every token is version 5 and the pool replaced it once."""
    from test_partial_rollouts import S

    new = _noisy(tiny_model_path, tmp_path)
    pool = _pool(tiny_model_path, HFTripWorker)
    try:
        _kill(pool.pids()[0])
        pool.interrupt(60)
        pool.sync_weights(new)
        assert pool.restarts == 1
        s = replace(S, max_turns=1, max_new_tokens=12)
        box: list = []
        t = threading.Thread(target=lambda: box.append(pool.generate(TASKS, [0, 1], [11, 12], s)))
        t.start()
        t.join(timeout=3)
        assert t.is_alive() and not box, "the replacement generated before resume"
        pool.resume(5)
        t.join(timeout=120)
        assert box, "the episodes did not finish"
        assert all(set(x.token_versions) == {5} for x in box[0])
        assert pool.restarts == 1
    finally:
        pool.shutdown()


def test_a_worker_killed_mid_generation_survives_an_interrupt_sync_and_resume_from_another_thread(
    ray_cpus, tiny_model_path, tmp_path: Path
) -> None:
    """Partial rollouts' weight update while the pool's ``generate`` meets a dead worker on its own thread: the
    worker is SIGKILLed mid-episode, then at once interrupt, sync and resume run on this thread. Whichever
    thread meets the death first, the worker is replaced once, the episodes finish, their versions never go
    back, and the pool serves the new version."""
    from test_partial_rollouts import S

    new = _noisy(tiny_model_path, tmp_path)
    pool = _pool(tiny_model_path, HFTripOnceWorker, arm=6, once=str(tmp_path / "made"), partial_rollouts=True)
    try:
        s = replace(S, max_turns=1, max_new_tokens=12)
        victim = pool.pids()[0]  # asked first: generate holds the actor's main thread
        done = _in_thread(lambda: pool.generate(TASKS, [0, 1], [11, 12], s))
        _wait_tripped(pool)
        _kill(victim)
        pool.interrupt(60)
        pool.sync_weights(new)
        pool.resume(5)
        trajs = done()
        _versions_ok(trajs, 5)
        assert pool.restarts == 1, pool.failures
        assert pool._call({0: ("policy_version", ())}) == {0: 5}
    finally:
        pool.shutdown()
