"""The whole training loop (``rl.driver.loop.train``) on the in-process runtime, in seconds: no Ray, no vLLM.

``LocalRuntime`` runs the tiny model's rollouts on ``rollout.hf_engine.HFEngine`` (seeded per
request), rewards in-process and the learner in-process, so everything the driver does
(draw, episodes, rewards, batch, update, weight sync, eval, logging, checkpoints, resume,
bad-step guard) runs exactly as on Ray. The Ray + vLLM tests (test_integration, test_faults,
test_resume) stay the end-to-end proof.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl.config.recipe import load_recipe, validate_recipe
from rl.driver.local_runtime import LocalRuntime
from rl.driver.loop import RunAborted, RunCrashed, latest_checkpoint, train
from runlog import comparable_steps

PARITY = '''
class Parity:
    """A reward with variance on a random model: 1 when the first sampled token id is even."""
    name = "parity"
    domains = ("tool_call",)
    def __call__(self, traj):
        return float(traj.response_ids[0] % 2 == 0) if traj.response_ids else 0.0
'''

FLAKY = '''
class Flaky:
    """Raises on samples whose first token id is divisible by 3; else the parity reward."""
    name = "flaky"
    domains = ("tool_call",)
    def __call__(self, traj):
        if traj.response_ids and traj.response_ids[0] % 3 == 0:
            raise ValueError("flaky reward")
        return float(traj.response_ids[0] % 2 == 0) if traj.response_ids else 0.0
'''

HUGE = '''
class Huge:
    """Finite Python floats whose Dr.GRPO advantages (r - group mean) are inf in float32: the loss is not finite."""
    name = "huge"
    domains = ("tool_call",)
    def __call__(self, traj):
        return 1e300 if traj.response_ids and traj.response_ids[0] % 2 else 0.0
'''


@pytest.fixture
def user_rewards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, src in (("parity_reward", PARITY), ("flaky_reward", FLAKY), ("huge_reward", HUGE)):
        (tmp_path / f"{name}.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _cfg(recipe_copy, reward: str = "parity_reward.Parity", out: str = "out", **sections: dict):
    """The tiny recipe, smaller (2 prompts x 4 samples, 16 tokens, 4 held-out tasks, one torch thread),
    deterministic (fp32 engine and learner), W&B off, ``sections`` merged in."""

    def edit(d: dict) -> None:
        d.setdefault("wandb", {})["mode"] = "disabled"
        d.setdefault("model", {}).update(engine_dtype="float32", autocast=False)
        d.setdefault("run", {})["threads"] = 1
        d.setdefault("rollout", {}).update(prompts_per_step=2, group_size=4, max_new_tokens=16)
        d.setdefault("data", {})["eval_limit"] = 4
        d["rewards"] = [{"cls": reward, "weight": 1.0, "domains": ["tool_call"], "kwargs": {}}]
        _merge(d, sections)

    cfg = load_recipe(recipe_copy("tiny.yaml", out=out, filename=f"{out}.yaml", edit=edit))
    validate_recipe(cfg)
    return cfg


def _merge(d: dict, extra: dict) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            _merge(d[k], v)
        else:
            d[k] = v


def local(cfg, model_path, out, verbose):
    return LocalRuntime(cfg, model_path, out, verbose)


def test_inprocess_run_writes_every_output(tmp_path: Path, recipe_copy, user_rewards) -> None:
    cfg = _cfg(recipe_copy, run={"save_every": 1, "keep_checkpoints": 2}, train={"steps": 3})
    out = train(cfg, progress=False, runtime=local)
    steps = comparable_steps(out / "metrics.jsonl")
    assert sorted(steps) == [0, 1, 2, 3]
    assert "eval/reward/mean" in steps[0] and "eval/reward/mean" in steps[3], "baseline and final held-out eval"
    assert "eval/reward/mean" not in steps[1]
    for s in (1, 2, 3):
        assert 0.0 < steps[s]["reward/mean"] < 1.0, "the parity reward has variance on the random model"
        assert steps[s]["learner/skipped_update"] == 0.0
    assert steps[1]["loss/policy"] != steps[2]["loss/policy"], "the updates change the policy's samples"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000002", "step_000003"], "rotation"
    assert (out / "DONE").is_file() and (out / "recipe.resolved.yaml").is_file()
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rollouts} >= {0, 1, 2, 3}


def test_inprocess_eval_at_start_off_skips_only_the_baseline(tmp_path: Path, recipe_copy, user_rewards) -> None:
    """``train.eval_at_start=false``: no step-0 record, no step-0 held-out rollouts; the final
    evaluation still runs (bench/seesaw.py pairs it with one shared baseline)."""
    cfg = _cfg(recipe_copy, train={"steps": 2, "eval_at_start": False})
    out = train(cfg, progress=False, runtime=local)
    steps = comparable_steps(out / "metrics.jsonl")
    assert sorted(steps) == [1, 2] and "eval/reward/mean" in steps[2]
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rollouts if r["split"] == "eval"} == {2}


def test_inprocess_resume_continues_exactly(tmp_path: Path, recipe_copy, user_rewards) -> None:
    """A run stopped by an exception after its step-2 checkpoint, resumed (``run.resume=auto``), logs for
    steps 3-4 exactly what the uninterrupted run logged."""
    common = dict(run={"save_every": 2, "keep_checkpoints": 3}, train={"steps": 4})
    full = train(_cfg(recipe_copy, out="a", **common), progress=False, runtime=local)

    class Crash(RuntimeError):
        pass

    def crashing(cfg, model_path, out, verbose):
        rt = LocalRuntime(cfg, model_path, out, verbose)
        step = rt.train_step
        calls = []

        def train_step(batch):
            calls.append(1)
            if len(calls) == 3:
                raise Crash("the driver dies in step 3")
            return step(batch)

        rt.train_step = train_step
        return rt

    cfg_b = _cfg(recipe_copy, out="b", **common)
    with pytest.raises(RunCrashed, match="step 3: Crash: the driver dies in step 3") as info:
        train(cfg_b, progress=False, runtime=crashing)
    assert isinstance(info.value.__cause__, Crash)
    b = Path(cfg_b.run.output_dir)
    assert latest_checkpoint(b).name == "step_000002" and not (b / "DONE").exists()
    stopped = json.loads((b / "STOPPED").read_text())
    assert stopped["status"] == "crashed" and stopped["checkpoint"] == "step_000002", "mid-update: not saved"
    cfg_b = _cfg(recipe_copy, out="b", run={**common["run"], "resume": "auto"}, train=common["train"])
    train(cfg_b, progress=False, runtime=local)
    want, got = comparable_steps(full / "metrics.jsonl"), comparable_steps(b / "metrics.jsonl")
    assert sorted(got) == [0, 1, 2, 3, 4]
    for s in (3, 4):
        assert got[s] == pytest.approx(want[s], rel=1e-5, abs=1e-7), f"step {s} differs after the resume"


def test_inprocess_reward_that_raises_is_counted_and_the_run_goes_on(tmp_path: Path, recipe_copy, user_rewards) -> None:
    cfg = _cfg(recipe_copy, reward="flaky_reward.Flaky", train={"steps": 2})
    out = train(cfg, progress=False, runtime=local)
    steps = comparable_steps(out / "metrics.jsonl")
    assert sorted(steps) == [0, 1, 2] and (out / "DONE").is_file()
    errors = sum(steps[s]["reward/flaky/errors"] for s in (1, 2))
    assert errors > 0, "some first tokens are divisible by 3 on the random model"
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    raised = [r for r in rollouts if r["split"] == "train" and r.get("reward_error")]
    assert steps[2]["eval/reward/flaky/errors"] == sum(
        1 for r in rollouts if r["split"] == "eval" and r["step"] == 2 and r.get("reward_error")
    ), "eval counted apart"
    assert len(raised) == errors and all("raised ValueError: flaky reward" in r["reward_error"] for r in raised)


def test_inprocess_non_finite_updates_stop_the_run_with_checkpoint_intact(
    tmp_path: Path, recipe_copy, user_rewards
) -> None:
    cfg = _cfg(
        recipe_copy,
        reward="huge_reward.Huge",
        run={"save_every": 1},
        train={"steps": 6, "max_bad_steps": 2},
        algo={"name": "dr_grpo"},
        data={"eval_files": []},
    )
    with pytest.raises(RunAborted, match=r"skipped their update.*train\.max_bad_steps=2"):
        train(cfg, progress=False, runtime=local)
    out = Path(cfg.run.output_dir)
    steps = comparable_steps(out / "metrics.jsonl")
    assert sorted(steps) == [0, 1, 2], "every step up to the stop is logged"
    assert all(steps[s]["learner/skipped_update"] == 1.0 for s in (1, 2))
    # Step 1 (one skip, the run goes on) was checkpointed; step 2 ended the run before its checkpoint.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]
    assert not (out / "DONE").exists()


def test_inprocess_weight_sync_reaches_the_engine(tmp_path: Path, recipe_copy, user_rewards) -> None:
    """After an update and a sync, the engine scores a continuation as the learner does, and not as before."""
    from transformers import AutoTokenizer

    from rl.algos.batch import build_batch
    from rl.algos.shaping import shape_step
    from rl.driver.loop import expand, load_task_sets, make_normalizer
    from rl.trainer.hub import resolve_model
    from envs.types import Sampling

    cfg = _cfg(recipe_copy, algo={"optim": {"lr": 3e-3}, "kl": {"coef": 0.0}})
    model = resolve_model(cfg.model.path)
    rt = LocalRuntime(cfg, model, Path(cfg.run.output_dir))
    rt.start()
    try:
        sources, _ = load_task_sets(cfg)
        tasks, groups, seeds = expand(sources[0].tasks[:4], 4, 0, 1)
        trajs = rt.score(rt.generate(tasks, groups, seeds, Sampling(24, 1.0, 1.0, 1, 1024)))
        tok = AutoTokenizer.from_pretrained(model)
        prompt, cont = tok("Hello there")["input_ids"], tok(" general Kenobi")["input_ids"]
        before = rt.worker.score(prompt, cont)
        assert before == pytest.approx(rt.learner.logprobs(prompt, cont), abs=1e-4), "same weights at the start"
        shaped, _ = shape_step(make_normalizer(cfg), trajs)
        batch, _ = build_batch(trajs, cfg.algo, shaped, ())
        rt.train_step(batch)
        rt.sync_weights()
        after = rt.worker.score(prompt, cont)
        assert after == pytest.approx(rt.learner.logprobs(prompt, cont), abs=1e-4), "the engine has the new weights"
        assert max(abs(a - b) for a, b in zip(after, before)) > 1e-4, "and they differ from the old ones"
    finally:
        rt.stop()


def test_cli_train_local_runs_in_this_process(tmp_path: Path, recipe_copy, user_rewards, capsys) -> None:
    """``jointrl train RECIPE --local``: the loop on the in-process runtime, from the command line."""
    import yaml

    from rl.cli.main import main

    cfg = _cfg(recipe_copy, train={"steps": 1}, data={"eval_files": []})
    recipe = Path(cfg.source)
    assert yaml.safe_load(recipe.read_text())["train"]["steps"] == 1
    assert main(["train", str(recipe), "--local", "run.save_every=1"]) == 0, capsys.readouterr().err
    out = Path(cfg.run.output_dir)
    assert sorted(comparable_steps(out / "metrics.jsonl")) == [0, 1] and (out / "DONE").is_file()
    assert (out / "checkpoints" / "step_000001" / "step.json").is_file()
    assert not (out / "placement.json").exists(), "no Ray actors were placed"
