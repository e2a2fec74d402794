"""bench/vs_trl.py's jointrl-side pieces: arguments, recipe overrides, the shared task plan, the summary.

Fast (no model, no Ray, no TRL): the benchmark itself is run by hand (see bench/README.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import vs_trl  # noqa: E402


def test_defaults_are_the_issue_workload() -> None:
    a = vs_trl.parse([])
    assert (a.steps, a.prompts, a.group, a.max_new_tokens, a.beta, a.lr) == (12, 16, 4, 64, 0.04, 1e-5)
    assert a.device == "auto" and vs_trl.reward_k(a) == 6
    assert a.heldout == 50 and not a.async_run and vs_trl.parse(["--async"]).async_run
    assert vs_trl.reward_k(vs_trl.parse(["--steps", "2"])) == 1
    assert vs_trl.reward_k(vs_trl.parse(["--steps", "6", "--k", "3"])) == 3


@pytest.mark.parametrize(
    "bad", [["--steps", "0"], ["--group", "1"], ["--k", "13"], ["--device", "tpu"], ["--heldout", "-1"]]
)
def test_bad_arguments_exit(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        vs_trl.parse(bad)


def test_overrides_make_a_valid_recipe_and_plan(tmp_path: Path) -> None:
    from rl.config.recipe import load_recipe

    args = vs_trl.parse(["--steps", "3", "--jointrl-override", "algo.optim.max_grad_norm=0.5"])
    ov = vs_trl.jointrl_overrides(args, str(tmp_path / "out"), "cpu")
    assert not any(o.startswith("cluster.") for o in ov)
    cfg = load_recipe(args.recipe, ov)
    assert (cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens) == (16, 4, 64)
    assert (cfg.algo.kl.coef, cfg.algo.optim.lr, cfg.algo.optim.max_grad_norm, cfg.train.steps) == (0.04, 1e-5, 0.5, 3)
    assert cfg.model.path == "embedded:smollm2-135m-instruct" and cfg.model.autocast
    assert [r.cls for r in cfg.rewards] == ["rewards.toolcall.ToolCallReward"]
    # the measured workload, not whatever the quickstart is now: schema-prompt tasks, no stops, all-or-nothing args
    assert [Path(f).name for f in cfg.data.train_files] == ["toolcall_quickstart.train.jsonl"]
    assert cfg.rollout.stops() == {} and "args_credit" not in cfg.rewards[0].kwargs

    ids = vs_trl.plan_task_ids(cfg, 3)
    assert [len(s) for s in ids] == [16, 16, 16] and all(len(set(s)) == 16 for s in ids)
    assert ids == vs_trl.plan_task_ids(cfg, 3)  # deterministic: TRL gets what jointrl will draw
    plan = vs_trl.make_plan(args, cfg, "/model", ids, str(tmp_path), "cpu")
    json.dumps(plan)  # handed to the TRL venv as JSON
    assert plan["beta"] == 0.04 and plan["bf16"] and plan["learner_dtype"] == "float32" and plan["task_ids"] == ids
    assert all(Path(f).is_file() for f in plan["train_files"])
    train = {json.loads(line)["id"] for f in plan["train_files"] for line in Path(f).read_text().splitlines()}
    assert {t for s in ids for t in s} <= train


def test_gpu_overrides_share_one_gpu() -> None:
    args = vs_trl.parse(["--device", "cuda"])
    one = vs_trl.jointrl_overrides(args, "/o", "cuda", gpus=1)
    assert "cluster.device=gpu" in one and "cluster.engine_gpus=0.5" in one
    assert "cluster.engine_gpus=0.5" not in vs_trl.jointrl_overrides(args, "/o", "cuda", gpus=2)


def test_same_tasks_and_summary() -> None:
    plan = [["a", "b"], ["c", "d"]]
    assert vs_trl.same_tasks(plan, [["b", "a", "a", "b"], ["c", "c", "d", "d"]], 2)
    assert not vs_trl.same_tasks(plan, [["a", "a", "a", "b"], ["c", "c", "d", "d"]], 2)
    assert not vs_trl.same_tasks(plan, [["a", "a", "b", "b"]], 2)
    s = vs_trl.summarize([10.0, 30.0], [0.1, 0.4], [100.0, 300.0], 64, 1)
    assert s["mean_step_s"] == 20.0 and s["completions_s"] == 3.2 and s["tokens_s"] == 10.0
    assert s["reward_gain"] == pytest.approx(0.3)


def test_paired_difference_by_hand() -> None:
    a = {"t1": 0.5, "t2": 1.0, "t3": 0.2, "t4": None, "t5": 0.0}
    b = {"t1": 0.2, "t2": 1.0, "t3": 0.5, "t4": 1.0}  # t4 errored on a's side, t5 missing on b's
    d, se, n = vs_trl.paired_difference(a, b)
    # differences 0.3, 0.0, -0.3: mean 0, sample stdev 0.3, SE 0.3 / sqrt(3)
    assert n == 3 and d == pytest.approx(0.0) and se == pytest.approx(0.3 / 3**0.5)
    assert vs_trl.paired_difference({"x": 1.0}, {"y": 1.0})[2] == 0
